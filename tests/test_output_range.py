"""A regression head that ends in a sigmoid or tanh, trained against targets outside its range (a sigmoid
output for targets of 0-100): one element's squared error within the range is at most (hi - lo)^2, so a loss
that never comes below that says the targets are out of the outputs' reach. Named with the output's fix,
where targets inside the range stay quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import losspath
from zoo import Run, train

CONFIDENT = 0.5


def _targets(scale: float, shift: float, seed: int = 0):
    w = torch.randn(16, generator=torch.Generator().manual_seed(seed))

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, torch.sigmoid(x @ w / 4) * scale + shift
    return data


def _run(last: nn.Module, scale: float, shift: float, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), last, nn.Flatten(0))
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _targets(scale, shift, seed),
                     loss=F.mse_loss, steps=300))


@pytest.mark.parametrize("last, name", [(nn.Sigmoid(), "sigmoid"), (nn.Tanh(), "tanh")])
@pytest.mark.parametrize("seed", [0, 1])
def test_targets_outside_a_bounded_regression_output_are_named(last, name, seed):
    top = _run(last, scale=100.0, shift=0.0, seed=seed).explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT
    assert top.suggestion.startswith(f"remove the final {name}")
    assert "learning rate" not in top.suggestion


@pytest.mark.parametrize("last, shift", [(nn.Sigmoid(), 0.0), (nn.Tanh(), -0.5)])
def test_targets_inside_the_range_stay_quiet(last, shift):
    assert not [h for h in _run(last, scale=1.0, shift=shift).explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("path, expected", [
    (["MseLoss", "Sigmoid", "Addmm"], ("Sigmoid", 0.0, 1.0)),
    (["L1Loss", "View", "Tanh", "Addmm"], ("Tanh", -1.0, 1.0)),
    (["MseLoss@sum", "Sigmoid", "Addmm"], None),     # summed: the bound is one element's
    (["MseLoss", "Addmm"], None),
    (["NllLoss", "LogSoftmax", "Tanh"], None),
])
def test_the_bounded_output_is_read_from_the_path(path, expected):
    assert losspath.bounded_output([path]) == expected


def test_the_op_that_made_the_output_is_read_past_the_shape_ops_at_its_end():
    x = torch.randn(4, 3, requires_grad=True)
    out = torch.sigmoid(x @ torch.randn(3, 1)).flatten(0)
    assert losspath.made_by(out.grad_fn) == "Sigmoid"
    assert losspath.bounded_output([["MseLoss", "View"]], "Sigmoid") == ("Sigmoid", 0.0, 1.0)
    assert losspath.made_by((x * 2).grad_fn) == "Mul"
