"""A spectral norm computes the weight a layer uses as W / sigma(W) from the raw weight the optimizer steps on:
a step large against that raw weight says nothing of how far the weight in use moves. Read as updates too
large, a spectrally normalised net at its best rate was told to lower it 10x, which makes it 3x worse."""
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
def test_large_steps_on_spectrally_normed_raw_weights_are_no_verdict(seed):
    """At its best rate (a sweep: 0.05 beats 0.005-0.02 and 0.1), the raw weights under the spectral norm
    move by up to ~18x their norm a step; the loss comes down ~10x. It read as learning_rate_too_high 0.88."""
    dbg = _train(seed, lr=0.05)
    loss = dbg.trace.loss.data
    assert loss[-30:].mean() < 0.3 * loss[:10].mean()  # it learned
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_the_same_net_at_ten_times_the_rate_diverges_and_is_named():
    dbg = _train(0, lr=0.5, steps=150)
    top = dbg.explain()[0]
    assert (top.cause, top.confidence >= CONFIDENT) == (Cause.LEARNING_RATE_TOO_HIGH, True), dbg.report()


def test_a_spectrally_normed_layer_is_marked_in_both_forms_and_kept_in_a_saved_trace():
    from neuraldbg.layers import LayerInfo, describe

    new = describe(0, "a", parametrizations.spectral_norm(nn.Linear(4, 4)))
    old = describe(1, "b", torch.nn.utils.spectral_norm(nn.Linear(4, 4)))
    plain = describe(2, "c", nn.Linear(4, 4))
    flags = [info.extra.get("scale_free") for info in (new, old, plain)]
    assert flags == [True, True, None]
    assert LayerInfo.from_dict(new.to_dict()).extra.get("scale_free") is True
