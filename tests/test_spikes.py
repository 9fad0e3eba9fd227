"""Spikes between sampled steps: caught from what the recorder reads every step anyway, followed by a
burst of sampled steps that names the layer whose updates spiked first."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.schedule import SpikeWatch


def test_spike_watch():
    grad = SpikeWatch(10.0, window=4)
    assert [grad(v) for v in (1.0, 2.0, 1.0, 2.0, 12.0, 30.0, 1.5)] == [False] * 5 + [True, False]
    assert not grad(float("nan")) and not grad(0.0)


def train(glitch: int | None, seed: int, steps: int = 300):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed + 7))
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x @ w).argmax(dim=1))
            # a loss multiplied by mistake on one step: its gradient, and so its update, 300x too large
            (loss * (300.0 if step == glitch else 1.0)).backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_spike_between_sampled_steps_is_measured_and_its_first_layer_named(seed):
    calm, spiked = train(None, seed), train(200, seed)
    steps = spiked.trace.stats.steps.tolist()
    assert set(range(200, 208)) <= set(steps)  # a burst of sampled steps from the spike on
    # the spiking step itself was caught after its forward pass: its updates measured, not its outputs
    row = spiked.trace.stats.data[steps.index(200)]
    assert np.isfinite(row[:, Stat.W_UPDATE_NORM]).any() and np.isnan(row[:, Stat.ACT_STD]).all()
    assert not [h for h in calm.explain() if h.confidence >= 0.5]
    top = spiked.explain()[0]
    assert (str(top.cause), top.layer, top.step) == ("learning_rate_too_high", "", 200)
    assert top.chain[0].startswith("the updates of `") and "spike first, at step 200" in top.chain[0]
    assert "the loss spikes at step" in " ".join(top.chain) and "clip" in top.suggestion
