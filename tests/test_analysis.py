"""Health states, events and hysteresis on synthetic traces; thresholds metadata; report and Mermaid text."""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch

import neuraldbg
from neuraldbg import ActState, CausalHypothesis, Cause, GradState, SemanticEvent, Stat, Thresholds
from neuraldbg.analysis import analyze
from neuraldbg.events import MAX_PER_SERIES, debounce
from neuraldbg.layers import Kind, LayerInfo
from neuraldbg.report import render_mermaid, render_report
from neuraldbg.states import Signal
from neuraldbg.stats import N_STATS
from neuraldbg.trace import GLOBAL_COLUMNS, NonFiniteOrigin, Trace

# -- a synthetic trace builder ------------------------------------------------------------------------------

_KIND = {"Linear": Kind.LINEAR, "ReLU": Kind.RELU, "Tanh": Kind.BOUNDED, "Sigmoid": Kind.BOUNDED, "Custom": Kind.OTHER,
         "LayerNorm": Kind.NORM, "Embedding": Kind.EMBEDDING}


def make_trace(types: list[str], n_samples: int, fill=None, frozen: tuple[int, ...] = (),
               loss=lambda step: 2.0 * math.exp(-step / 10), inputs=(0.0, 1.0)) -> Trace:
    """Layers ``types`` in forward order, healthy statistics at every sample; ``fill(row, t)`` edits a row."""
    layers = []
    for i, t in enumerate(types):
        params = 1000 if t == "Linear" else 0
        layers.append(LayerInfo(index=i, name=f"net.{i}", type_name=t, kind=_KIND[t],
                                bounds=(-1.0, 1.0) if t == "Tanh" else (0.0, 1.0) if t == "Sigmoid" else None,
                                n_params=params, n_trainable=0 if i in frozen else params, order=i))
    trace = Trace(layers, capacity=max(64, n_samples))
    lin = np.array([t == "Linear" for t in types])
    for step in range(n_samples):
        row = np.full((len(types), N_STATS), np.nan, dtype=np.float32)
        row[:, Stat.ACT_MEAN] = 0.0
        row[:, Stat.ACT_STD] = 1.0
        row[:, Stat.ACT_ABSMAX] = 3.0
        row[:, Stat.ACT_NONFINITE] = 0.0
        row[:, Stat.GRAD_RMS] = 1e-2
        row[:, Stat.GRAD_NONFINITE] = 0.0
        row[[t == "ReLU" for t in types], Stat.ACT_DEAD] = 0.05
        row[[t in ("Tanh", "Sigmoid") for t in types], Stat.ACT_SATURATED] = 0.01
        row[lin, Stat.W_NORM] = 5.0
        row[lin, Stat.W_GRAD_NORM] = 0.05
        row[lin, Stat.W_UPDATE_NORM] = 5e-3
        for i in frozen:
            row[i, Stat.W_GRAD_NORM] = np.nan
            row[i, Stat.W_UPDATE_NORM] = 0.0
        if fill is not None:
            fill(row, step)
        g = np.full(len(GLOBAL_COLUMNS), np.nan, dtype=np.float32)
        g[:5] = [0.01, inputs[0], inputs[1], 4.0, 0.0]  # lr, input mean, std, absmax, non-finite
        trace.add_sample(step, row, g)
        trace.add_loss(step, loss(step))
    return trace


def run(trace: Trace, **changes):
    return analyze(trace, Thresholds().replace(**changes), steps=int(trace.stats.steps[-1]) + 1)


# -- hysteresis ----------------------------------------------------------------------------------------------

def test_debounce_accepts_a_state_only_after_it_persists():
    codes = np.array([0, 1, 0, 1, 1, 1, 0, 0])
    assert debounce(codes, 2).tolist() == [0, 0, 0, 1, 1, 1, 0, 0]
    assert debounce(codes, 3).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]  # the final 0s are too short to count
    assert debounce(codes, 1).tolist() == codes.tolist()


def test_a_state_cut_short_by_a_replacing_update_still_counts():
    codes = np.array([1, 0, 0, 2, 0, 0, 3, 3])
    cut = np.array([True, False, False, False, False, False, False, False])
    # row 0's state held as long as the model it was measured on: an update replaced it after that row
    assert debounce(codes, 2, cut).tolist() == [1, 0, 0, 0, 0, 0, 3, 3]
    # a cut elsewhere does not excuse a one-row excursion (row 3)
    assert debounce(codes, 2, np.roll(cut, 1)).tolist() == [0, 0, 0, 0, 0, 0, 3, 3]
    # nor does it accept a return to healthy early
    assert debounce(np.array([2, 2, 0, 2]), 2, np.array([False, False, True, False])).tolist() == [2, 2, 2, 2]


def test_a_flapping_layer_makes_no_events():
    def fill(row, t):
        row[1, Stat.ACT_DEAD] = 0.95 if t % 2 else 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear"], 20, fill))
    assert not [e for e in a.events if e.signal == Signal.ACTIVATION]
    assert not [h for h in a.hypotheses if h.confidence >= 0.5]


def test_persisting_dead_layer_is_one_event_at_its_onset_with_the_numbers():
    def fill(row, t):
        if t >= 5:
            row[1, Stat.ACT_DEAD] = 0.95
            row[0, Stat.W_GRAD_NORM] = 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear"], 20, fill))
    dead = [e for e in a.events if e.signal == Signal.ACTIVATION]
    assert len(dead) == 1
    ev = dead[0]
    assert (ev.layer, ev.step, ev.before, ev.after, ev.end) == ("net.1", 5, ActState.NORMAL, ActState.DEAD, None)
    assert ev.values["dead_fraction"] == pytest.approx(0.95)
    assert a.health["net.1"].act == ActState.DEAD and a.health["net.1"].step == 19
    assert a.health["net.0"].grad == GradState.VANISHING
    top = a.hypotheses[0]
    assert (top.cause, top.layer, top.step) == (Cause.DEAD_UNITS, "net.1", 5)
    assert all(isinstance(e, SemanticEvent) for e in top.evidence)


def test_recovery_closes_the_event():
    def fill(row, t):
        if 4 <= t < 10:
            row[1, Stat.ACT_DEAD] = 0.95
    a = run(make_trace(["Linear", "ReLU", "Linear"], 20, fill))
    evs = [e for e in a.events if e.signal == Signal.ACTIVATION]
    assert [(e.step, str(e.after), e.end) for e in evs] == [(4, "dead", 10), (10, "normal", None)]
    assert a.health["net.1"].act == ActState.NORMAL


def test_thresholds_move_the_verdict_without_new_data():
    def fill(row, t):
        row[1, Stat.ACT_DEAD] = 0.95
    trace = make_trace(["Linear", "ReLU", "Linear"], 12, fill)
    assert run(trace).hypotheses[0].cause == Cause.DEAD_UNITS
    assert not [h for h in run(trace, dead_fraction=0.97).hypotheses if h.cause == Cause.DEAD_UNITS]
    assert not [e for e in run(trace, persist=20).events if e.signal == Signal.ACTIVATION]


def test_event_list_is_bounded():
    def fill(row, t):
        row[1, Stat.ACT_DEAD] = 0.95 if (t // 3) % 2 else 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear"], 600, fill))
    assert 0 < len([e for e in a.events if e.signal == Signal.ACTIVATION]) <= MAX_PER_SERIES


# -- health states ---------------------------------------------------------------------------------------------

def test_saturated_output_is_not_a_failure_but_a_saturated_hidden_layer_is():
    def fill(row, t):
        row[1, Stat.ACT_SATURATED] = 0.95
        row[3, Stat.ACT_SATURATED] = 0.99
    a = run(make_trace(["Linear", "Tanh", "Linear", "Sigmoid"], 12, fill))
    assert a.health["net.1"].act == ActState.SATURATED
    assert a.health["net.3"].act == ActState.NORMAL  # the model's own output: a confident classifier


def test_vanishing_is_measured_against_the_layers_after_it_and_frozen_layers_are_ignored():
    def fill(row, t):
        row[0, Stat.W_GRAD_NORM] = np.nan   # frozen stem: no gradient by design
        row[2, Stat.W_GRAD_NORM] = 5e-8     # relative gradient 1e-8 vs 1e-2 after it
    a = run(make_trace(["Linear", "ReLU", "Linear", "ReLU", "Linear"], 12, fill, frozen=(0,)))
    assert a.health["net.0"].grad == GradState.HEALTHY
    assert a.health["net.2"].grad == GradState.VANISHING
    assert a.health["net.4"].grad == GradState.HEALTHY
    # a ReLU shows the state of the next weight layer after it
    assert (a.health["net.1"].grad, a.health["net.3"].grad) == (GradState.VANISHING, GradState.HEALTHY)
    top = a.hypotheses[0]
    assert (top.cause, top.layer) == (Cause.VANISHING_GRADIENTS, "net.2")
    assert top.evidence[0].values["attenuation"] == pytest.approx(1e-6, rel=1e-3)


def test_gain_counts_the_offset_of_a_layer_not_only_its_spread():
    """A Linear whose outputs sit at ~50 with a small spread (a bias of +50) is the layer out of scale,
    not the next one, which only passes the offset on."""
    def fill(row, t):
        row[2, Stat.ACT_MEAN], row[2, Stat.ACT_STD] = 50.0, 0.2
        row[3, Stat.ACT_MEAN], row[3, Stat.ACT_STD] = 50.0, 0.2
        row[4, Stat.ACT_MEAN], row[4, Stat.ACT_STD] = 0.0, 1.0
    a = run(make_trace(["Linear", "ReLU", "Linear", "ReLU", "Linear"], 12, fill))
    assert [a.health[f"net.{i}"].gain.value for i in (0, 2, 4)] == ["normal", "amplifies", "shrinks"]


class _LSTMClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 32, batch_first=True)
        self.fc = torch.nn.Linear(32, 2)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


def _lstm_gain_events(scale: float) -> list:
    torch.manual_seed(0)
    model = _LSTMClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    with neuraldbg.NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for _ in range(6):
            x = torch.randn(16, 10, 4, generator=g) * scale
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), (x[:, :, 0].sum(1) > 0).long())
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return [e for e in dbg.analysis().events if e.signal == Signal.GAIN and e.layer == "rnn"]


def test_an_lstm_at_the_default_init_does_not_shrink_the_signal_but_raw_inputs_do():
    # its gated, bounded output sits well below its input's spread by design: no bad scale at the default init
    assert _lstm_gain_events(1.0) == []
    # inputs in raw units saturate its gates: the output is a tiny fraction of the input, a shrink
    assert [e.after.value for e in _lstm_gain_events(128.0)] == ["shrinks"]


def _mlp_run(steps: int, step_every: int | None) -> "neuraldbg.NeuralDbg":
    """An MLP trained with SGD whose optimizer steps every ``step_every`` passes (None: never)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    with neuraldbg.NeuralDbg(model, optimizer=opt) as dbg:
        for i in range(steps):
            x = torch.randn(64, 20, generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
            loss.backward()
            if step_every is not None and i % step_every == step_every - 1:
                opt.step()
                opt.zero_grad()
            dbg.record_loss(loss)
    return dbg


def test_an_optimizer_that_never_steps_is_named_not_its_learning_rate():
    hyps = _mlp_run(60, None).explain()
    assert hyps and hyps[0].confidence >= 0.5 and hyps[0].cause == Cause.LOSS_PLATEAU
    assert "optimizer.step()" in hyps[0].suggestion and "never changed" in hyps[0].chain[0]
    assert not any("larger learning rate" in h.suggestion or h.cause == Cause.LEARNING_RATE_TOO_LOW for h in hyps)
    # gradients accumulated over four passes, then one step: steps are counted, nothing is wrong
    accumulated = _mlp_run(240, 4)
    assert accumulated.step == 60 and accumulated.explain().healthy


def _zeroing_run(zero: str, adam: bool = False, steps: int = 120, seed: int = 0) -> "neuraldbg.NeuralDbg":
    """SGD with momentum (or Adam, lr 1e-3) on an MLP; ``zero``: where the loop zeroes the gradients ("before"
    the forward, "between" forward and backward, or "never")."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 2))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-3) if adam else
           torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    g = torch.Generator().manual_seed(1 + seed)
    with neuraldbg.NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 20, generator=g)
            if zero == "before":
                opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), (x[:, :3].sum(1) > 0).long())
            if zero == "between":
                opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_gradients_never_zeroed_are_named_in_the_fix_and_the_chain():
    hyps = _zeroing_run("never").explain()
    top = hyps[0]
    assert top.cause == Cause.LEARNING_RATE_TOO_HIGH and top.confidence >= 0.5
    assert "zero_grad()" in top.suggestion and "never zeroed" in top.chain[0]
    # zeroed before the forward, or between the forward and the backward: nothing carried over, a healthy run
    for where in ("before", "between"):
        hyps = _zeroing_run(where).explain()
        assert hyps.healthy and not any("zero_grad" in h.suggestion for h in hyps), (where, hyps)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_settles_after_the_divergence_is_in_the_root_s_chain(seed):
    """Under Adam, gradients never zeroed first train, then the summed gradients take the loss up and it settles
    high: the flat stretch after the divergence is the divergence's, in the root's chain (in the order things
    happened), not a plateau of its own."""
    dbg = _zeroing_run("never", adam=True, steps=300, seed=seed)
    hyps = dbg.explain()
    top = hyps[0]
    assert top.cause == Cause.LEARNING_RATE_TOO_HIGH and top.confidence >= 0.5 and "zero_grad()" in top.suggestion
    assert not any(h.cause == Cause.LOSS_PLATEAU and h.confidence >= 0.5 for h in hyps)
    dated = [int(m.group(1)) for m in (re.search(r"from step (\d+)", line) for line in top.chain[1:]) if m]
    assert dated and dated == sorted(dated)


def test_small_gains_compound_until_a_normalisation_layer():
    """Twelve layers of gain 1.5 compound to 130x: each has its share. After a normalisation layer the
    scale starts over, so the same gains there stay normal."""
    n = 12
    growth = lambda k: 1.5 ** (k + 1)  # noqa: E731

    def fill(row, t):
        row[:n, Stat.ACT_STD] = [growth(k) for k in range(n)]
        row[n, Stat.ACT_STD] = 1.0                                   # the LayerNorm
        row[n + 1:, Stat.ACT_STD] = [growth(k) for k in range(4)]   # four more layers of gain 1.5: 5x
    a = run(make_trace(["Linear"] * n + ["LayerNorm"] + ["Linear"] * 4, 12, fill))
    gains = [a.health[f"net.{i}"].gain.value for i in range(n + 5) if i != n]
    assert gains == ["amplifies"] * n + ["normal"] * 4
    # with half the depth the scale reaches 11x: within what default inits and residual sums do
    a = run(make_trace(["Linear"] * 6, 12, lambda row, t: row.__setitem__((slice(None), Stat.ACT_STD),
                                                                        [growth(k) for k in range(6)])))
    assert all(h.gain.value == "normal" for h in a.health.values())


def test_the_compounded_scale_keeps_a_sound_reference():
    """The model's output may sit at the targets' mean (its bias a prior); a normalisation layer whose
    output is exactly zero (a zero-initialised gain) resets nothing; token ids have no scale, so the
    scale compounds from the first weight layer's input."""
    def prior(row, t):
        row[:3, Stat.ACT_STD] = [1.2, 1.44, 1.73]
        row[3, Stat.ACT_MEAN], row[3, Stat.ACT_STD] = 150.0, 2.0
    a = run(make_trace(["Linear"] * 4, 12, prior))
    assert all(h.gain.value == "normal" for h in a.health.values())

    def zero_norm(row, t):
        row[0, Stat.ACT_STD] = 2.0
        row[1, Stat.ACT_STD] = 0.0      # LayerNorm with weight 0
        row[2, Stat.ACT_STD] = 5.0
        row[3, Stat.ACT_STD] = 20.0     # 4x its input, 20x the scale before the zero norm
    a = run(make_trace(["Linear", "LayerNorm", "Linear", "Linear"], 12, zero_norm))
    assert a.health["net.3"].gain.value == "normal"

    def chain(row, t):
        row[:, Stat.ACT_STD] = [1.5 ** k for k in range(13)]  # the embedding's output, then 12 Linears
    tokens = run(make_trace(["Embedding"] + ["Linear"] * 12, 12, chain, inputs=(float("nan"), float("nan"))))
    assert [tokens.health[f"net.{k}"].gain.value for k in range(1, 13)] == ["amplifies"] * 12


def test_a_noisy_flat_loss_is_a_plateau_and_a_noisy_falling_one_is_not():
    """Progress is the latest window's median against the first one's: the deepest dip of a noisy flat
    curve is not progress, a steady fall under the same noise is."""
    noise = np.random.default_rng(0).normal(0.0, 0.06, 200)
    flat = run(make_trace(["Linear", "ReLU", "Linear"], 60, loss=lambda s: 1.1 * (1 + noise[s])))
    falling = run(make_trace(["Linear", "ReLU", "Linear"], 60, loss=lambda s: (1.1 - 0.006 * s) * (1 + noise[s])))
    plateau = [e for e in flat.events if e.signal == Signal.LOSS and e.after.value == "plateau"]
    assert plateau and plateau[0].step <= 60
    assert not [e for e in falling.events if e.signal == Signal.LOSS and e.after.value == "plateau"]
    # a loss that falls from 2.1 to 0.1 in ten steps and then stays there has converged: no plateau
    converged = run(make_trace(["Linear", "ReLU", "Linear"], 150, loss=lambda s: 0.1 + 2 * math.exp(-s / 2)))
    assert not [e for e in converged.events if e.signal == Signal.LOSS]


def test_a_loss_that_starts_near_zero_is_measured_on_its_own_scale():
    """A loss that starts at 0.17 and goes negative (a Gaussian NLL) with batch noise of +-0.2 is not
    diverging; the same start rising to 5 is."""
    noise = np.random.default_rng(1).normal(0.0, 0.2, 80)
    crossing = run(make_trace(["Linear", "ReLU", "Linear"], 80, loss=lambda s: 0.17 - 1.2 * (1 - math.exp(-s / 20))
                              + noise[s]))
    assert not [e for e in crossing.events if e.signal == Signal.LOSS and e.bad]
    rising = run(make_trace(["Linear", "ReLU", "Linear"], 80, loss=lambda s: 0.17 + (0.06 * s if s > 40 else 0)
                            + noise[s]))
    diverging = [e for e in rising.events if e.signal == Signal.LOSS and e.after.value == "diverging"]
    assert diverging and 40 < diverging[0].step < 60


def test_a_loss_falling_without_bound_below_zero_points_at_the_targets():
    """Falling through zero and on at a steady rate (BCE against 0/255 masks) is data; a likelihood that
    settles a few units below zero is not, nor one that goes deep but slows down as it converges."""
    noise = np.random.default_rng(2).normal(0.0, 0.2, 80)

    def data(loss):
        hyps = run(make_trace(["Linear", "ReLU", "Linear"], 80, loss=loss)).hypotheses
        return [(h.layer, h.confidence >= 0.5) for h in hyps if h.cause == Cause.DATA]

    assert data(lambda s: 0.3 - 2.0 * s + noise[s]) == [("input", True)]
    assert data(lambda s: 0.3 - 0.05 * s + 0.1 * noise[s]) == [("input", True)]  # shallow, but on without slowing
    assert data(lambda s: 0.15 - 1.2 * (1 - math.exp(-s / 15)) + noise[s]) == []
    assert data(lambda s: -(1 - math.exp(-s / 10)) + 0.05 * noise[s]) == []  # a negative cosine, bounded at -1
    assert data(lambda s: 0.3 - 400 * (1 - math.exp(-s / 8)) + noise[s]) == []  # deep, but converging


def test_weights_that_do_not_move_in_a_run_too_short_for_a_plateau():
    """Updates of 1e-9 x the weights over 30 steps: a loss that moves only by batch noise, or rises, makes
    it a learning rate too low; a loss that clearly falls under the same noise, or too few losses, a weak
    lead only."""
    noise = np.random.default_rng(3).normal(0.0, 0.08, 40)

    def lr_low(loss, n=30):
        def fill(row, t):
            row[[0, 2], Stat.W_UPDATE_NORM] = 5e-9
        hyps = run(make_trace(["Linear", "ReLU", "Linear"], n, fill, loss=loss)).hypotheses
        return max((h.confidence for h in hyps if h.cause == Cause.LEARNING_RATE_TOO_LOW), default=0.0)

    assert lr_low(lambda s: 0.7 * (1 + noise[s])) >= 0.5
    assert lr_low(lambda s: (0.7 + 0.002 * s) * (1 + noise[s])) >= 0.5
    assert lr_low(lambda s: (0.7 - 0.01 * s) * (1 + noise[s])) < 0.5
    assert lr_low(lambda s: 0.7 * (1 + noise[s]), n=8) < 0.5


def test_weights_that_stop_moving_after_convergence_are_not_a_low_learning_rate():
    """A long run whose loss fell in ten steps and then sits at a noisy floor while a schedule anneals the
    updates to ~0 has converged: the short-run trend test does not apply to it."""
    def lr_low(trace):
        return max((h.confidence for h in run(trace).hypotheses if h.cause == Cause.LEARNING_RATE_TOO_LOW),
                   default=0.0)

    for n, seed in ((400, 1), (1000, 1), (400, 4)):
        noise = np.random.default_rng(seed).normal(0.0, 0.1, n)

        def annealed(row, t, n=n):
            if t >= 3 * n // 4:
                row[[0, 2], Stat.W_UPDATE_NORM] = 5e-9
        assert lr_low(make_trace(["Linear", "ReLU", "Linear"], n, annealed,
                                 loss=lambda s, noise=noise: (2.0 * math.exp(-s / 2) + 0.02) * (1 + noise[s]))) < 0.5


def test_uniform_scale_change_is_not_a_gradient_fault():
    """Gradients 1000x smaller everywhere (a loss scaled down) are not vanishing: states are ratios."""
    def fill(row, t):
        row[:, Stat.GRAD_RMS] *= 1e-3
        row[[0, 2], Stat.W_GRAD_NORM] *= 1e-3
        row[[0, 2], Stat.W_UPDATE_NORM] *= 1e-3
    a = run(make_trace(["Linear", "ReLU", "Linear"], 12, fill))
    assert all(h.grad == GradState.HEALTHY for h in a.health.values())


def test_nonfinite_from_replay_drives_the_verdict():
    def fill(row, t):
        if t >= 6:
            row[:, Stat.ACT_NONFINITE] = 1.0
    trace = make_trace(["Linear", "ReLU", "Custom", "Linear"], 10, fill)

    def top_with(origin):
        trace.nonfinite = origin
        h = run(trace).hypotheses[0]
        return h.cause, h.layer, h.step

    # a custom module's own operation left its domain
    assert top_with(NonFiniteOrigin(6, "net.2", "forward")) == (Cause.NON_FINITE, "net.2", 6)
    # a Linear layer cannot: finite inputs and weights overflowed, grown by the updates
    assert top_with(NonFiniteOrigin(6, "net.3", "forward"))[:2] == (Cause.LEARNING_RATE_TOO_HIGH, "")
    # an update made the weights NaN
    assert top_with(NonFiniteOrigin(6, "net.0", "weights"))[:2] == (Cause.LEARNING_RATE_TOO_HIGH, "")
    assert any("NaN/Inf" in c for c in run(trace).hypotheses[0].chain)
    assert top_with(NonFiniteOrigin(6, "input", "input")) == (Cause.DATA, "input", 6)
    assert top_with(NonFiniteOrigin(6, "", "loss")) == (Cause.DATA, "input", 6)


def test_large_updates_alone_do_not_take_the_blame_for_a_domain_error():
    """Updates of 0.5 x the weights per step walk a custom module's learned divisor to 0: with nothing
    growing out of scale before the NaN, the module's operation is the root; with a loss diverging
    first, the learning rate is."""
    def fill(row, t):
        row[[0, 3], Stat.W_UPDATE_NORM] = 2.5
        if t >= 8:
            row[2:, Stat.ACT_NONFINITE] = 1.0

    def top(loss):
        trace = make_trace(["Linear", "ReLU", "Custom", "Linear"], 12, fill, loss=loss)
        trace.nonfinite = NonFiniteOrigin(8, "net.2", "forward")
        h = run(trace).hypotheses[0]
        return h.cause, h.layer

    assert top(lambda s: 1.0 - 0.02 * s if s < 8 else math.nan) == (Cause.NON_FINITE, "net.2")
    assert top(lambda s: 1.0 * 3 ** s if s < 8 else math.nan) == (Cause.LEARNING_RATE_TOO_HIGH, "")



def test_updates_larger_than_the_weights_take_the_blame_for_a_nan_however_soon_it_comes():
    """Updates of 5x the weights overflow a hand-written softmax at step 2, before any loss can diverge:
    the learning rate is the root, not the softmax."""
    def fill(row, t):
        row[[0, 3], Stat.W_UPDATE_NORM] = 25.0
        if t >= 2:
            row[2:, Stat.ACT_NONFINITE] = 1.0
    trace = make_trace(["Linear", "ReLU", "Custom", "Linear"], 12, fill, loss=lambda s: 1.0 if s < 2 else math.nan)
    trace.nonfinite = NonFiniteOrigin(2, "net.2", "forward")
    top = run(trace).hypotheses[0]
    assert (top.cause, top.layer) == (Cause.LEARNING_RATE_TOO_HIGH, "")


def test_healthy_synthetic_trace_is_quiet_and_says_so():
    trace = make_trace(["Linear", "ReLU", "Linear", "Tanh", "Linear"], 30)
    a = run(trace)
    assert not [h for h in a.hypotheses if h.confidence >= 0.5]
    assert "Verdict: healthy" in render_report(a, trace, step=30)



def test_a_run_with_no_sample_yet_has_an_empty_analysis():
    # a session stopped before its first step (or a cell interrupted at once) is explained, not an error
    import torch.nn as nn
    from neuraldbg import NeuralDbg
    dbg = NeuralDbg(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)))
    with dbg:
        pass
    assert dbg.explain() == [] and dbg.health() == {} and dbg.events == []
    # zero steps is not "healthy": nothing was trained, and every output says so
    assert "Verdict: nothing was trained" in dbg.report() and "healthy" not in dbg.report()
    assert str(dbg.explain()) == "nothing was trained (0 steps)" and not dbg.explain().healthy
    assert "Nothing was trained" in dbg.explain().html() and "nothing was trained" in dbg.explain().markdown()
    assert dbg.reanalyze(dead_fraction=0.5) == []

# -- thresholds -----------------------------------------------------------------------------------------------

def test_every_threshold_has_slider_metadata_and_a_default_in_range():
    t = Thresholds()
    for f in dataclasses.fields(Thresholds):
        md = f.metadata
        assert {"label", "scale", "min", "max", "doc"} <= set(md), f.name
        assert md["scale"] in ("log", "linear")
        assert md["min"] <= getattr(t, f.name) <= md["max"], f.name
        if md["scale"] == "log":
            assert md["min"] > 0
    assert Thresholds.from_dict(t.to_dict()) == t
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.dead_fraction = 0.1  # type: ignore[misc]


def test_public_names_are_exported():
    for name in ("CausalHypothesis", "SemanticEvent", "ActState", "GradState", "Thresholds", "Cause"):
        assert name in neuraldbg.__all__
    fields = {f.name for f in dataclasses.fields(CausalHypothesis)}
    assert {"cause", "layer", "step", "confidence", "chain", "evidence", "suggestion"} <= fields


# -- Mermaid ----------------------------------------------------------------------------------------------------

def test_mermaid_draws_root_then_chain():
    def fill(row, t):
        row[1, Stat.ACT_DEAD] = 1.0
        row[0, Stat.W_GRAD_NORM] = 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear"], 12, fill))
    text = render_mermaid(a)
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert "dead_units in net.1 from step 0" in lines[1] and ":::root" in lines[1]
    assert "h0 --> h0c0" in text and "h0c0 --> h0c1" in text and "-.-> h0fix" in text
    assert '"' not in "".join(l.split('["', 1)[1].rsplit('"]', 1)[0] for l in lines if '["' in l)
    assert "healthy" in render_mermaid(run(make_trace(["Linear"], 5)))


def test_level_hysteresis_holds_a_state_until_its_quantity_leaves_the_band():
    from neuraldbg.health import held
    entered = np.array([0, 1, 0, 0, 0, 0, 1, 0], dtype=bool)
    near = np.array([0, 1, 1, 1, 0, 1, 1, 1], dtype=bool)
    # held from the entry while near; a break ends it; being near without an entry is nothing
    assert held(entered, near).tolist() == [False, True, True, True, False, False, True, True]
    assert not held(np.zeros(3, bool), np.ones(3, bool)).any()
