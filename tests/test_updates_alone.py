"""Updates large against the weights they change are no failure by themselves: weights whose scale the
forward divides out (a spectral norm, a normalisation after them) take large relative steps and train. They
are one where the loss fails with them (it diverges, oscillates, spikes) or they produce what fails."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

from neuraldbg import Cause, NeuralDbg

CONFIDENT = 0.5


class SpectralNet(nn.Module):
    """An MLP with a spectral norm on every Linear (as a GAN's critic or a Lipschitz regressor has), and a
    learned output scale."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(parametrizations.spectral_norm(nn.Linear(8, 128)), nn.LeakyReLU(0.2),
                                 parametrizations.spectral_norm(nn.Linear(128, 128)), nn.LeakyReLU(0.2),
                                 parametrizations.spectral_norm(nn.Linear(128, 1)))
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return self.net(x) * self.scale


def _train(seed: int, lr: float, steps: int = 300) -> NeuralDbg:
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(8, 1, generator=g)
    x = torch.randn(2400, 8, generator=g)
    y = torch.sin(x @ w) + 0.3 * x[:, :1] ** 2 + 0.3 * x[:, 1:2]
    y = (y - y.mean()) / y.std()
    torch.manual_seed(seed)
    model = SpectralNet()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    batches = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            i = torch.randint(0, len(x), (64,), generator=batches)
            loss = F.mse_loss(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_large_steps_on_spectrally_normed_weights_in_a_run_that_learns_are_no_verdict(seed):
    """At its best rate (a sweep: 0.05 beats 0.005-0.02 and 0.1), the raw weights under the spectral norm
    move by up to ~18x their norm a step; the loss comes down ~10x. It read as learning_rate_too_high 0.88
    with "lower the learning rate 10x", which makes the model 3x worse."""
    dbg = _train(seed, lr=0.05)
    loss = dbg.trace.loss.data
    assert loss[-30:].mean() < 0.3 * loss[:10].mean()  # it learned
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_the_same_net_at_ten_times_the_rate_diverges_and_is_named():
    dbg = _train(0, lr=0.5, steps=150)
    top = dbg.explain()[0]
    assert (top.cause, top.confidence >= CONFIDENT) == (Cause.LEARNING_RATE_TOO_HIGH, True), dbg.report()
