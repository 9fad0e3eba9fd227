"""A loss whose code gives the model's outputs no gradient: a cross-entropy of one output column (binary
labels given as a float column: its softmax is 1, the loss 0 at every step), or a loss of ``torch.round``
of the outputs. No learning rate moves weights that get no gradient: this is the loss's own plateau, with
the fix on its code, never "raise the learning rate". A path that still carries a gradient beside the flat
one stays quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import losspath
from zoo import Run, train

CONFIDENT = 0.5


def _classes(seed: int):
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, (x @ w).argmax(1)
    return data


def _values(seed: int):
    w = torch.randn(16, generator=torch.Generator().manual_seed(seed))

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, (x @ w).round()
    return data


def _model(outputs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, outputs))


def _run(outputs: int, data, loss, seed: int, opt=torch.optim.Adam, lr: float = 1e-3):
    model = _model(outputs, seed)
    return train(Run(model, opt(model.parameters(), lr=lr), data, loss=loss, steps=200))


@pytest.mark.parametrize("seed, opt, lr", [(0, torch.optim.Adam, 1e-3), (1, torch.optim.SGD, 0.05)])
def test_a_cross_entropy_of_one_output_column_is_the_losss_own(seed, opt, lr):
    # binary labels as float columns, the shape a one-logit head is trained with: read as class probabilities
    def data(step: int):
        x, y = _classes(seed)(step)
        return x, (y % 2).float().unsqueeze(1)
    hyps = _run(1, data, F.cross_entropy, seed, opt, lr).explain()
    top = hyps[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT
    assert "one output per class" in top.suggestion
    # the updates it leaves negligible are its consequence, not a learning rate to raise
    assert not [h for h in hyps if h.cause == "learning_rate_too_low"]
    assert all("raise the learning rate" not in h.suggestion for h in hyps)


def test_a_loss_of_rounded_outputs_is_named_with_the_round():
    hyps = _run(1, _values(0), lambda out, y: F.mse_loss(torch.round(out.squeeze(1)), y), 0).explain()
    top = hyps[0]
    assert (top.cause, top.step) == ("loss_plateau", 0) and top.confidence >= CONFIDENT
    assert "torch.round" in top.suggestion
    assert not [h for h in hyps if h.cause == "learning_rate_too_low"]


@pytest.mark.parametrize("outputs, data, loss", [
    (4, _classes(0), F.cross_entropy),
    (1, _values(0), lambda out, y: F.mse_loss(out.squeeze(1), y)),
    # a rounded term beside one that carries the gradient: the model learns through the other
    (1, _values(0), lambda out, y: F.mse_loss(torch.round(out.squeeze(1)), y) + F.mse_loss(out.squeeze(1), y)),
])
def test_losses_that_carry_a_gradient_stay_quiet(outputs, data, loss):
    assert not [h for h in _run(outputs, data, loss, 0).explain() if h.confidence >= CONFIDENT]


def test_the_walk_marks_a_softmax_over_one_entry():
    out = (torch.randn(8, 5, requires_grad=True) @ torch.randn(5, 1))
    one = F.cross_entropy(out, torch.zeros(8, dtype=torch.long))
    assert losspath.no_gradient(losspath.paths(one.grad_fn, [out.grad_fn])) == "single"
    out = (torch.randn(8, 5, requires_grad=True) @ torch.randn(5, 3))
    three = F.cross_entropy(out, torch.zeros(8, dtype=torch.long))
    assert losspath.no_gradient(losspath.paths(three.grad_fn, [out.grad_fn])) == ""


@pytest.mark.parametrize("seed", [0, 1])
def test_a_softmax_over_one_output_under_a_regression_loss_is_removed_not_widened(seed):
    """``nn.Softmax(dim=-1)`` after a one-output head, then a squared error: the output is 1 whatever the
    input, so nothing learns. The fix takes the softmax away; it is no cross-entropy that wants more columns."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Softmax(dim=-1))
    values = _values(seed)

    def data(step: int):
        x, y = values(step)
        return x, y.unsqueeze(1)
    hyps = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=F.mse_loss,
                     steps=200)).explain()
    top = hyps[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT
    assert "remove the softmax" in top.suggestion
    assert "nn.Linear(..., num_classes)) for cross_entropy" not in top.suggestion
    assert all("raise the learning rate" not in h.suggestion for h in hyps)


@pytest.mark.parametrize("paths, expected", [
    ([["MseLoss", "Round", "Addmm"]], "Round"),
    ([["MseLoss", "Sign", "View", "Addmm"]], "Sign"),
    ([["NllLoss", "LogSoftmax@single", "Addmm"]], "single"),
    ([["NllLoss", "LogSoftmax@single", "Softmax@single", "Addmm"]], "single"),  # cross_entropy of nn.Softmax
    ([["MseLoss", "Softmax@single", "Addmm"]], "single_softmax"),
    ([["BinaryCrossEntropy", "Squeeze", "Softmax@single", "Addmm"]], "single_softmax"),
    ([["Add", "MseLoss", "Round", "Addmm"], ["Add", "MseLoss", "Addmm"]], ""),   # one path carries it
    ([["NllLoss", "LogSoftmax", "Addmm"]], ""),
    (None, ""),
])
def test_no_gradient_is_read_from_every_path(paths, expected):
    assert losspath.no_gradient(paths) == expected


def test_paths_cut_short_by_the_walk_say_nothing():
    """The walk keeps at most MAX_PATHS paths: one it did not keep may carry the gradient."""
    paths = [["MseLoss", "Round", "Addmm"]] * losspath.MAX_PATHS
    assert losspath.no_gradient(paths) == ""
