"""A regression head that ends in a bounded activation, trained against targets outside its range (a sigmoid
output for targets of 0-100, a ReLU output for targets of both signs): one element's squared error within a
sigmoid's or tanh's range is at most (hi - lo)^2, so a loss that never comes below that says the targets are
out of the outputs' reach; for any bound, a ReLU's 0 too, most of the loss's gradient at the output sitting on
outputs held at the bound it pushes past says the same. Named with the output's fix, where targets inside
the range stay quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, losspath
from zoo import Run, train

CONFIDENT = 0.5


def _targets(scale: float, shift: float, seed: int = 0):
    w = torch.randn(16, generator=torch.Generator().manual_seed(seed))

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, torch.sigmoid(x @ w / 4) * scale + shift
    return data


def _run(last: nn.Module, scale: float, shift: float, seed: int = 0, data=None, optimizer=torch.optim.Adam,
         lr: float = 1e-3, loss=F.mse_loss):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), last, nn.Flatten(0))
    return train(Run(model, optimizer(model.parameters(), lr=lr), data or _targets(scale, shift, seed),
                     loss=loss, steps=300))


def _signed(seed: int = 0, noise: float = 0.0, floor: float | None = None):
    """Targets of a linear teacher, half of them negative; with ``floor``, those below it raised to it (the
    targets of a ReLU teacher), and ``noise`` added after."""
    w = torch.randn(16, generator=torch.Generator().manual_seed(seed))

    def data(step: int):
        g = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randn(64, 16, generator=g)
        y = x @ w
        y = y if floor is None else y.clamp_min(floor)
        return x, y + noise * torch.randn(64, generator=g)
    return data


class _FunctionalReLU(nn.Module):
    def forward(self, x):
        return F.relu(x)


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


@pytest.mark.parametrize("last", [nn.ReLU(), _FunctionalReLU()], ids=["module", "functional"])
@pytest.mark.parametrize("seed", [0, 1])
def test_targets_below_a_relu_output_are_named_from_the_blocked_gradient(last, seed):
    dbg = _run(last, 1.0, 0.0, seed=seed, data=_signed(seed))
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("remove the final relu") and "shift the targets to 0 and above" in top.suggestion
    assert "learning rate" not in top.suggestion
    shares = [share for _, share in dbg.trace.meta["output_blocked"]]
    assert max(shares[len(shares) // 2:]) > 0.5


@pytest.mark.parametrize("optimizer, lr, loss", [(torch.optim.SGD, 1e-2, F.mse_loss),
                                                 (torch.optim.Adam, 1e-3, F.l1_loss)])
def test_targets_below_a_relu_output_are_named_under_other_optimizers_and_losses(optimizer, lr, loss):
    hyps = _run(nn.ReLU(), 1.0, 0.0, data=_signed(), optimizer=optimizer, lr=lr, loss=loss).explain()
    top = hyps[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("remove the final relu")
    # the output held at 0 is what the targets do to it: in the chain, not a verdict of its own
    assert not [h for h in hyps[1:] if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("data", [
    _signed(floor=0.0),                     # a ReLU teacher's targets: 0 where the output stops
    _signed(floor=0.0, noise=0.1),          # and noise around them: a few targets a little below 0
    _signed(floor=1.0, noise=0.3),          # all well above 0
], ids=["relu_teacher", "noisy_zeros", "above"])
def test_targets_a_relu_output_reaches_stay_quiet(data):
    dbg = _run(nn.ReLU(), 1.0, 0.0, data=data)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_binary_targets_of_a_sigmoid_output_under_a_squared_error_stay_quiet():
    w = torch.randn(16, generator=torch.Generator().manual_seed(0))

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        return x, (x @ w > 0).float()
    assert not [h for h in _run(nn.Sigmoid(), 1.0, 0.0, data=data).explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("path, op, expected", [
    (["MseLoss", "Relu"], "", ("Relu", 0.0, float("inf"))),
    (["Mean", "MseLoss", "Softplus"], "", ("Softplus", 0.0, float("inf"))),
    (["MseLoss@sum", "View"], "Sigmoid", ("Sigmoid", 0.0, 1.0)),
    (["Mean", "Pow", "Sub", "Relu"], "", ("Relu", 0.0, float("inf"))),   # ((out - y) ** 2).mean()
    (["MseLoss", "Addmm"], "", None),
    (["Add", "MseLoss", "Relu"], "", None),          # another term shares the gradient
    (["NllLoss", "LogSoftmax", "Relu"], "", None),   # a classification
])
def test_the_regression_bound_is_read_from_the_path(path, op, expected):
    assert losspath.regression_bound([path], op) == expected


def test_an_activation_the_loss_applies_to_an_output_of_a_view_is_not_read_as_the_outputs():
    """``F.mse_loss(torch.sigmoid(model(x)), y)`` on a model that ends in a view: the sigmoid bounds what the
    loss sees, while the model's output is the logits before it; they are not read against [0, 1]."""
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))

    def images(step: int):
        x = (torch.randn(64, 8, generator=torch.Generator().manual_seed(step)) @ w / 2 - 1.5).clamp(0, 1)
        return x, x.view(64, 1, 8, 8)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64), nn.Unflatten(1, (1, 8, 8)))
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), images,
                    loss=lambda o, y: F.mse_loss(torch.sigmoid(o), y), steps=300))
    assert not dbg.trace.meta.get("output_blocked")
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_a_loss_given_as_the_pass_output_is_not_read_as_a_bounded_output():
    w = torch.randn(16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.ReLU())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(150):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(64, 16, generator=g)
            y = (0.1 * torch.sigmoid(x @ w) + 0.02 * torch.randn(64, generator=g)).clamp_min(0)
            dbg.begin_pass(x)
            loss = F.mse_loss(model(x).squeeze(-1), y)
            dbg.end_forward(loss)   # the pass's output is the loss itself (a trainer's step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert not dbg.trace.meta.get("output_blocked")
