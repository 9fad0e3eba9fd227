"""A symmetric contrastive loss (CLIP's: a cross-entropy over the similarity matrix's rows and one over its
columns, ``logits.t()``): the loss reads the output's columns as rows too, so no class, target or
classification term is read off the output's gradient as if its rows were samples with classes. A run that
learns (the loss from 5.6 to ~0.01) stays quiet; it used to read as a classification term stuck "not clearly
below chance", a plateau."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, losspath

CONFIDENT = 0.5


class TwoTowers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.text = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, a, b):
        return self.logit_scale.exp() * F.normalize(self.image(a), dim=-1) @ F.normalize(self.text(b), dim=-1).t()


def _clip(seed: int, steps: int = 300) -> tuple[NeuralDbg, list[float]]:
    torch.manual_seed(seed)
    mix = torch.randn(16, 32)
    model = TwoTowers()
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(100 + seed)
    losses = []
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            b = torch.randn(64, 16, generator=g)
            a = b @ mix + 0.5 * torch.randn(64, 32, generator=g)
            logits = model(a, b)
            pairs = torch.arange(64)
            loss = (F.cross_entropy(logits, pairs) + F.cross_entropy(logits.t(), pairs)) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            losses.append(loss.item())
    return dbg, losses


@pytest.mark.parametrize("seed", [0, 1])
def test_a_symmetric_contrastive_loss_that_learns_stays_quiet(seed):
    dbg, losses = _clip(seed)
    assert losses[-1] < 0.05 * losses[0]   # it learns
    for key in ("class_term", "batch_classes", "loss_floor"):
        assert key not in dbg.trace.meta
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("path, kept", [
    (["NllLoss", "LogSoftmax", "Addmm"], True),
    (["NllLoss", "LogSoftmax", "View", "Addmm"], True),
    (["Div", "Add", "NllLoss", "LogSoftmax", "T", "Mm"], False),       # ce(logits.t(), ...)
    (["NllLoss", "LogSoftmax", "Transpose", "Addmm"], False),
    (["NllLoss", "LogSoftmax", "Permute"], True),                      # the output's own node: it is the output
])
def test_a_loss_that_moves_the_outputs_dimensions_is_read_so(path, kept):
    assert losspath.rows_kept(path) is kept
