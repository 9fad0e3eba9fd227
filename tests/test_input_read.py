"""What each weight layer reads, on sampled passes: the output of the module that made its input, or, for an
input no module returned (a concatenation, a sum of branches, a module's output applied again), that
input's scale measured where the layer reads it. A layer's gain is its output's scale over that, not over
the output of whatever module ran just before it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.states import GainState, Signal

CONFIDENT = 0.5


class Shared(nn.Module):
    """One weight matrix applied ``times`` times (ALBERT-style sharing)."""

    def __init__(self, std: float | None, times: int = 12, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp, self.block, self.head = nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 1)
        nn.init.normal_(self.block.weight, std=std if std is not None else math.sqrt(2 / 64))
        self.times = times

    def forward(self, x):
        h = F.relu(self.inp(x))
        for _ in range(self.times):
            h = F.relu(self.block(h))
        return self.head(h)


def _regress(model, sgd: bool, steps: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(1234 + seed)
    w = torch.randn(8, 1, generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if sgd else torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 8, generator=g)
            y = torch.sin(x @ w)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            if not torch.isfinite(loss):
                break
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_block_applied_many_times_with_weights_too_large_is_named_not_the_layer_after_it(seed):
    """Its later applications are no module's output the hooks see: the head read their scale as its own
    gain (2e4x) and was named, with a fix on the head's bias."""
    top = _regress(Shared(std=0.5, seed=seed), sgd=True, seed=seed).explain()[0]
    assert (top.cause, top.layer) == ("bad_initialization", "block"), top
    assert top.confidence >= CONFIDENT


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_block_at_a_kaiming_scale_is_quiet(seed):
    dbg = _regress(Shared(std=None, seed=seed), sgd=False, seed=seed)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


class Concat(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(17, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x, c):
        return self.net(torch.cat([x, c], 1))


def test_a_feature_concatenated_inside_the_forward_is_read_as_the_layers_input():
    """A raw feature (a timestep, a count) joined to the input in the forward: the first layer reads the
    joined tensor, whose scale is the feature's; it was read as a weight scale 200x too large."""
    model = Concat()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 4, generator=g)
    read = []
    with NeuralDbg(model, optimizer=opt, every=10) as dbg:
        for step in range(100):
            x = torch.randn(64, 16, generator=g)
            c = torch.rand(64, 1, generator=g) * 1000
            if step % 10 == 0:
                read.append(float(torch.cat([x, c], 1).pow(2).mean().sqrt()))
            opt.zero_grad()
            loss = F.cross_entropy(model(x, c), (x @ w).argmax(1))
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    st = dbg.trace.stats
    first = [l.name for l in dbg.trace.layers].index("net.0")
    assert np.allclose(st.data[:, first, Stat.IN_RMS], read, rtol=1e-4)
    assert not [e for e in dbg.events if e.signal == Signal.GAIN and e.after == GainState.AMPLIFIES]


def test_a_layer_reads_the_output_of_the_module_that_made_its_input():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    with NeuralDbg(model, optimizer=opt, every=5) as dbg:
        for _ in range(20):
            x = torch.randn(64, 16, generator=g) * 3 + 1
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    data, glob = dbg.trace.stats.data, dbg.trace.globals.data
    rms = np.hypot(data[:, :, Stat.ACT_MEAN], data[:, :, Stat.ACT_STD])
    inp = np.hypot(glob[:, 1], glob[:, 2])  # the input's mean and spread
    assert np.allclose(data[:, 0, Stat.IN_RMS], inp, rtol=1e-5)
    assert np.allclose(data[:, 2, Stat.IN_RMS], rms[:, 1], rtol=1e-5)
    assert np.allclose(data[:, 4, Stat.IN_RMS], rms[:, 3], rtol=1e-5)
    assert np.isnan(data[:, [1, 3], Stat.IN_RMS]).all()  # no weights: not read


class _Scaled(nn.Module):
    """Its forward changes what a layer reads in place, or scales its own input before the first layer."""

    def __init__(self, how: str):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.how = nn.Linear(8, 32), nn.Linear(32, 4), how

    def forward(self, x):
        if self.how == "input":
            return self.b(F.relu(self.a(x * 1e-3)))
        h = self.a(x)
        h.mul_(30.0)  # after `a` was measured
        return self.b(F.relu(h)) if self.how == "relu" else self.b(h)


def test_an_output_changed_in_place_after_it_was_measured_is_read_as_it_is_read():
    model = _Scaled("inplace")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    truth = []
    model.b.register_forward_pre_hook(lambda m, args: truth.append(float(args[0].pow(2).mean().sqrt())))
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(64, 8, generator=g)).pow(2).mean().backward()
            opt.step()
    assert np.allclose(dbg.trace.stats.data[:, 1, Stat.IN_RMS], truth, rtol=1e-4)


def test_an_input_the_forward_scales_down_is_no_data_fault():
    """The batch is at unit scale; the forward divides it by 1000 before the first layer: the data is fine."""
    model = _Scaled("input")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, generator=g)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(200):
            x = torch.randn(64, 8, generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x @ w).argmax(1))
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert not [h for h in dbg.explain() if h.cause == "data" and h.confidence >= CONFIDENT], dbg.report()
