"""A loss that is NaN while every gradient of the step is finite: a mean over no element (every target equal
to ``ignore_index``, an empty mask). The NaN never reaches the model; the weights get no update. Named the
data's from the first NaN loss, where a run whose batches hold real targets stays quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _run(loss, seed: int = 0, steps: int = 120, adam: bool = False):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if adam else torch.optim.SGD(model.parameters(), lr=0.05)
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), loss=loss, steps=steps))


def every_target_ignored(out, y):
    return F.cross_entropy(out, torch.full_like(y, -100))


def masked_mean(out, y):
    keep = torch.zeros_like(y, dtype=torch.bool)  # a mask that keeps nothing
    return F.cross_entropy(out[keep], y[keep])


@pytest.mark.parametrize("loss", [every_target_ignored, masked_mean])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_averaged_over_no_target_is_the_datas(loss, seed):
    dbg = _run(loss, seed)
    assert dbg.trace.nonfinite is None  # no gradient was NaN: nothing for the hunt
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0)
    assert top.confidence >= CONFIDENT
    assert "ignore_index" in top.suggestion


def test_batches_with_real_targets_stay_quiet():
    some_ignored = lambda out, y: F.cross_entropy(out, torch.where(y == 0, torch.full_like(y, -100), y))  # noqa: E731
    assert not [h for h in _run(some_ignored).explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("adam", [False, True])
def test_targets_ignored_from_a_later_step_on_are_dated_there(adam):
    """Under Adam the weights go on moving a while on the momentum of the steps before, with no gradient: what
    tells the empty mean from a loss out of its domain is the gradient, 0, not the updates."""
    def late(out, y, calls=[0]):  # noqa: B006 (counts the steps)
        calls[0] += 1
        return F.cross_entropy(out, y if calls[0] <= 60 else torch.full_like(y, -100))
    top = _run(late, adam=adam).explain()[0]
    assert (top.cause, top.layer) == ("data", "input")
    assert 60 <= top.step <= 70


def test_a_squared_error_that_overflows_with_finite_gradients_stays_the_learning_rates():
    """SGD above the stability limit on a regression: the loss reaches Inf while its gradient is still finite
    (and large): not an empty mean."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 1))
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))

    def data(step):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        return x, x @ w
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=1.5), data, loss=F.mse_loss, steps=60))
    assert not torch.isfinite(torch.tensor(dbg.trace.loss.data)).all()
    top = dbg.explain()[0]
    assert top.cause == "learning_rate_too_high"
    assert not [h for h in dbg.explain() if h.cause == "data" and h.confidence >= CONFIDENT]
