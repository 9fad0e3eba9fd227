"""A gradient that vanishes from the first step to the last in a deep stack of sigmoids: the layers near the
input hardly train, and the loss comes down only by what the head learns (the labels' prior). The loss then
comes down, but hardly: no plateau, yet the failure is the gradient's."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import Cause, NeuralDbg

CONFIDENT = 0.5


def _multilabel(seed: int, act: type[nn.Module], steps: int = 400) -> tuple[NeuralDbg, nn.Sequential]:
    """Ten labels, each on for ~20% of the inputs, of a random two-layer function; an MLP of six hidden
    Linear(64) layers with ``act`` after each, under a binary cross-entropy and Adam at 1e-3."""
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(2048, 32, generator=g)
    w1 = torch.randn(32, 32, generator=g) / math.sqrt(32)
    w2 = torch.randn(32, 10, generator=g)
    z = torch.tanh(x @ w1 * 2) @ w2
    y = (z > z.quantile(0.8, dim=0)).float()
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = 32
    for _ in range(6):
        layers += [nn.Linear(width, 64), act()]
        width = 64
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            i = torch.randint(0, len(x), (64,), generator=g)
            loss = F.binary_cross_entropy_with_logits(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg, model


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gradient_that_vanishes_all_along_accounts_for_a_loss_that_hardly_comes_down(seed):
    dbg, model = _multilabel(seed, nn.Sigmoid)
    top = dbg.explain()[0]
    assert (top.cause, top.confidence >= CONFIDENT) == (Cause.VANISHING_GRADIENTS, True), dbg.report()
    first_half = {str(i) for i in range(6)}  # the Linear layers 0, 2 and 4: near the input
    assert top.layer in first_half and top.step == 0, dbg.report()
    assert "larger learning rate" not in top.suggestion and "raise" not in top.suggestion
    assert "replace the Sigmoid activations" in top.suggestion, top.suggestion  # the stack's own activations


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_stack_with_relu_is_healthy(seed):
    dbg, _ = _multilabel(seed, nn.ReLU)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()
