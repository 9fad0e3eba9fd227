"""Spikes between sampled steps: caught from what the recorder reads every step anyway, followed by a
burst of sampled steps that names the layer whose updates spiked first."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.schedule import LossTurn, SpikeWatch


def test_spike_watch():
    grad = SpikeWatch(10.0, window=4)
    assert [grad(v) for v in (1.0, 2.0, 1.0, 2.0, 12.0, 30.0, 1.5)] == [False] * 5 + [True, False]
    assert not grad(float("nan")) and not grad(0.0)


def test_loss_turn_fires_once_when_the_smoothed_loss_gives_back_half_its_progress():
    rng = np.random.default_rng(0)
    falling = [2.0 * 0.97 ** k for k in range(60)]
    rising = [falling[-1] + 0.05 * k for k in range(1, 40)]
    turn = LossTurn(warmup=8)
    fired = [k for k, v in enumerate(falling + rising + rising[::-1]) if turn(v)]
    assert len(fired) == 1 and 60 < fired[0] < 99
    # batch noise around a falling loss, and a loss that hardly came down, do not turn
    noisy, flat = LossTurn(warmup=8), LossTurn(warmup=8)
    assert not any(noisy(v * (1 + 0.2 * rng.standard_normal())) for v in falling)
    assert not any(flat(1.0 + 0.02 * rng.standard_normal()) for _ in range(200))
    assert not LossTurn()(float("nan"))


def test_a_loss_turning_back_up_starts_a_burst_of_samples():
    """The recorded loss climbs back between sparse samples (a term of it grows; nothing in the gradients
    spikes): the next steps are sampled."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 8)
    y = (x[:, 0] > 0).long()
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss.item() + 0.05 * max(0, step - 120))
    sampled = [int(s) for s in dbg.trace.stats.steps]
    after = [s for s in sampled if 120 < s < 150]
    assert len(after) >= 6 and max(np.diff(after)) == 1, sampled


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
