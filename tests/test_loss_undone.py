"""A loss that came down, then rose back and stays flat: the model could learn at its learning rate, so a
fix may not tell the user to raise it; it points at what changed after the loss was at its best."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import Cause, NeuralDbg
from zoo import pixels


def _train(seed: int, grows: bool) -> NeuralDbg:
    """A CNN with BatchNorm on a learnable task, with an L1 penalty on its second block's output whose
    weight doubles every 25 steps (``grows``), or stays at its first value: the penalty comes to outweigh
    the classification, and the loss goes back up to chance (the normalised units shrink, none die)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    data = pixels(batch=32, seed=seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(400):
            x, y = data(step)
            h = model[:6](x)
            weight = 1e-3 * 2 ** (step / 25) if grows else 1e-3
            loss = F.cross_entropy(model[6:](h), y) + weight * h.abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_rose_back_is_not_told_to_raise_the_learning_rate(seed):
    dbg = _train(seed, grows=True)
    v = dbg.explain()
    assert v and v[0].confidence >= 0.5, v
    lr_low = [h for h in v if h.cause == Cause.LEARNING_RATE_TOO_LOW]
    assert not lr_low, lr_low
    for h in v:
        assert "larger learning rate" not in h.suggestion, h.suggestion
    plateau = [h for h in v if h.cause == Cause.LOSS_PLATEAU]
    assert plateau and "rose back" in plateau[0].suggestion, v


def test_the_same_run_without_the_growing_term_is_healthy():
    assert _train(0, grows=False).explain().healthy
