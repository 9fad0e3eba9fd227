"""Targets on a scale the outputs do not have (prices in the thousands under a head that starts near 0): the
first loss says so, read as the errors' scale, its square root for a squared error and the loss itself for one
linear in the error (an absolute error, Huber). Read as a square root, a Huber loss of 2.5e3 once said targets
of ~50 and stayed below confidence. Inputs and targets both raw (values predicted from values): the fix
standardises both."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import losspath
from zoo import Run, train

CONFIDENT = 0.5


def _table(seed: int, x_scale: float = 1.0, x_shift: float = 0.0, y_scale: float = 800.0, y_shift: float = 2500.0):
    g = torch.Generator().manual_seed(100 + seed)
    w = torch.randn(6, generator=g)

    def batch(step: int):
        x = torch.randn(64, 6, generator=g)
        y = (x @ w + torch.sin(x[:, 0]) + 0.1 * torch.randn(64, generator=g)) / w.norm()
        return x * x_scale + x_shift, (y * y_scale + y_shift)[:, None]
    return batch


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def _run(loss, data, seed: int, lr: float = 1e-4, steps: int = 300):
    model = _mlp(seed)
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=lr), data, loss=loss, steps=steps))


def _l1_by_hand(out, y):
    return (out - y).abs().mean()


@pytest.mark.parametrize("loss", [F.huber_loss, F.l1_loss, _l1_by_hand], ids=["huber", "l1", "l1_by_hand"])
@pytest.mark.parametrize("seed", [0, 1])
def test_raw_targets_under_a_loss_linear_in_the_error_are_named(loss, seed):
    top = _run(loss, _table(seed), seed).explain()[0]
    assert top.cause == "data" and top.layer == "input" and top.step == 0 and top.confidence >= CONFIDENT
    said = re.search(r"the targets are ~([0-9.e+]+)", " ".join(top.chain))
    assert said and 1e3 <= float(said.group(1)) <= 1e4   # the errors' scale, not its square root
    assert top.suggestion.startswith("standardise the targets")


@pytest.mark.parametrize("loss", [F.huber_loss, F.mse_loss], ids=["huber", "mse"])
def test_standardised_targets_stay_quiet(loss):
    dbg = _run(loss, _table(0, y_scale=1.0, y_shift=0.0), 0, lr=1e-3)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


class Forecaster(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def _sales(step: int):
    """Windows of 16 daily sales (~3000, a weekly cycle and noise) and the next day's, all as they are."""
    g = torch.Generator().manual_seed(step)
    t = torch.arange(17.0) + 7 * torch.rand(64, 1, generator=g)
    series = 3000 + 400 * torch.sin(2 * torch.pi * t / 7) + 100 * torch.randn(64, 17, generator=g)
    return series[:, :16, None], series[:, 16:]


@pytest.mark.parametrize("seed", [0, 1])
def test_raw_inputs_and_raw_targets_are_both_standardised(seed):
    """An LSTM forecaster fed raw sales and trained on raw sales: its outputs, under the LSTM's tanh, cannot
    reach the targets, and an input normalised alone leaves them as far."""
    torch.manual_seed(seed)
    model = Forecaster()
    top = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _sales, loss=F.mse_loss,
                    steps=150)).explain()[0]
    assert top.cause == "data" and top.layer == "input" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("normalise the input")
    assert "the targets too" in top.suggestion


@pytest.mark.parametrize("path, linear", [
    (["HuberLoss", "Addmm"], True),
    (["Mean", "Abs", "Sub", "Addmm"], True),                    # (out - y).abs().mean()
    (["SmoothL1Loss", "Squeeze", "Addmm"], True),
    (["MseLoss", "Addmm"], False),
    (["Mean", "Pow", "Sub", "Addmm"], False),                   # ((out - y) ** 2).mean()
    (["Add", "HuberLoss", "Addmm"], False),                     # another term beside it
    (["NllLoss", "LogSoftmax", "Addmm"], False),
    (["L1Loss@sum", "Addmm"], False),                          # a sum over the batch: not one error's scale
    (["Sum", "Abs", "Sub", "Addmm"], False),
])
def test_a_loss_linear_in_its_error_is_read_from_the_path(path, linear):
    assert losspath.linear_error([path]) is linear
