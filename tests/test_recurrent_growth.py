"""Recurrent weights whose scale through time, not their spread, is wrong at the start: a ReLU RNN with its
hidden-to-hidden weights set to 1.3 x the identity (about the spread of an orthogonal init, a spectral
radius of 1.3). The gradient at its first time step is ~30x the one at its last; the first update is many
times the weights and the run ends in NaN. Was `learning_rate_too_high` "lower the learning rate"; named
now at the recurrent layer's init, with the learning rate's reading in its chain. The identity itself (an
IRNN) trains quietly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, train

CONFIDENT = 0.5


class ReluRnn(nn.Module):
    def __init__(self, gain: float, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.rnn = nn.RNN(8, 32, batch_first=True, nonlinearity="relu")
        self.out = nn.Linear(32, 4)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(gain * torch.eye(32))

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1])


def _data(seed: int):
    def data(step: int):
        x = torch.randn(64, 16, 8, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, x[:, -3:, :4].sum(1).argmax(1)
    return data


def _run(gain, seed: int = 0, lr: float = 0.05):
    model = ReluRnn(gain, seed)
    return train(Run(model, torch.optim.SGD(model.parameters(), lr=lr), _data(seed), loss=F.cross_entropy,
                     steps=200))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_state_that_grows_through_time_from_the_start_is_the_recurrent_init(seed):
    hs = _run(1.3, seed).explain()
    top = hs[0]
    assert (top.cause, top.layer, top.step) == ("bad_initialization", "rnn", 0) and top.confidence >= CONFIDENT
    assert "orthogonal_" in top.suggestion and "lower the learning rate" not in top.suggestion
    assert any("back through its 16 time steps" in line for line in top.chain)
    assert not [h for h in hs[1:] if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_identity_that_keeps_the_state_trains_quietly(seed):
    hs = _run(1.0, seed, lr=0.01).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]
