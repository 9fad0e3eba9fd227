"""Inference on synthetic traces: one evidence model, roots by causality, symptoms in their root's chain,
fixes that never point the other way of the run's evidence."""
from __future__ import annotations

import math

import pytest

from neuraldbg import Cause, Stat, Thresholds
from neuraldbg.inference import evidence
from neuraldbg.inference.evidence import Candidate, past_fraction, past_ratio
from neuraldbg.trace import NonFiniteOrigin
from test_analysis import make_trace, run


def loud(a) -> list[tuple[str, str]]:
    return [(str(h.cause), h.layer) for h in a.hypotheses if h.confidence >= 0.5]


# -- the evidence model ------------------------------------------------------------------------------------------

def test_severity_is_measured_from_the_threshold():
    assert past_ratio(0.1, 0.1) == 0.0 and past_ratio(1.0, 0.1) == pytest.approx(1.0)
    assert past_ratio(1e9, 0.1) == evidence.RATIO_CAP and past_ratio(math.inf, 0.1) == evidence.RATIO_CAP
    assert past_ratio(math.nan, 0.1) == 0.0 and past_ratio(0.05, 0.1) == 0.0
    assert past_fraction(0.6, 0.6) == 0.0 and past_fraction(1.0, 0.6) == pytest.approx(1.0)


def _ctx(has_loss=True):
    from neuraldbg.inference.context import Context
    return Context(events=[], links=[], layers={}, rank={}, first_step=0, last_step=100, nonfinite=None,
                   overflow=None, lr=0.1, lr_first=0.1, lr_peak=0.1, th=Thresholds(), has_loss=has_loss)


def test_confidence_grows_with_each_kind_of_evidence_and_is_one_function_for_every_cause():
    from neuraldbg.events import SemanticEvent
    from neuraldbg.states import LossState, Signal
    ctx = _ctx()
    plateau = SemanticEvent(step=50, layer="", signal=Signal.LOSS, before=LossState.IMPROVING, after=LossState.PLATEAU)

    def conf(cause, **kw):
        c = Candidate(cause, "", 0, "k", [], **kw)
        return evidence.confidence(c, ctx)

    for cause in (Cause.DEAD_UNITS, Cause.LEARNING_RATE_TOO_HIGH, Cause.VANISHING_GRADIENTS):
        base = conf(cause, severity=0.2, persistence=0.5)
        assert conf(cause, severity=1.0, persistence=0.5) > base
        assert conf(cause, severity=0.2, persistence=1.0) > base
        assert conf(cause, severity=0.2, persistence=0.5, symptoms=[plateau]) > base
        with_loss = Candidate(cause, "", 0, "k", [], severity=0.2, persistence=0.5)
        with_loss.loss = [plateau]
        assert evidence.confidence(with_loss, ctx) > base
    # the same evidence gives the same confidence whatever the cause: no formula per cause
    assert conf(Cause.DEAD_UNITS, severity=0.7, persistence=0.3) == conf(Cause.DATA, severity=0.7, persistence=0.3)
    # a measurement that is no failure by itself counts in part until harm shows
    assert conf(Cause.BAD_INITIALIZATION, severity=1.5, persistence=1.0, needs_harm=True) < 0.5


def test_confidence_does_not_grow_with_the_number_of_symptom_layers():
    """Gradients blocked in 2 or in 8 layers behind a dead layer: the same failure, the same confidence."""
    def dead_behind(depth):
        types = ["Linear", "ReLU"] * depth + ["Linear"]
        dead = 2 * depth - 1

        def fill(row, t):
            row[dead, Stat.ACT_DEAD] = 1.0
            for i in range(0, dead, 2):
                row[i, Stat.W_GRAD_NORM] = 0.0
        return run(make_trace(types, 20, fill, loss=lambda s: 1.0))

    shallow, deep = dead_behind(2).hypotheses[0], dead_behind(8).hypotheses[0]
    assert (shallow.cause, deep.cause) == (Cause.DEAD_UNITS, Cause.DEAD_UNITS)
    assert shallow.confidence == pytest.approx(deep.confidence, abs=0.02)


# -- roots and symptoms --------------------------------------------------------------------------------------------

def test_after_the_first_nan_later_states_are_symptoms_of_its_root():
    """Updates 5x the weights, a NaN at step 6, then gradients that vanish and updates that stop: one verdict,
    the learning rate, with the rest in its chain; no fix that raises the learning rate."""
    def fill(row, t):
        row[[0, 2], Stat.W_UPDATE_NORM] = 25.0 if t < 6 else 0.0
        if t >= 6:
            row[:, Stat.ACT_NONFINITE] = 1.0
        if t >= 8:
            row[0, Stat.W_GRAD_NORM] = 0.0
    trace = make_trace(["Linear", "Tanh", "Linear"], 30, fill, loss=lambda s: 1.0 * 4 ** s if s < 6 else math.nan)
    trace.nonfinite = NonFiniteOrigin(6, "net.2", "forward")
    a = run(trace)
    assert loud(a) == [("learning_rate_too_high", "")]
    top = a.hypotheses[0]
    assert any("NaN/Inf" in line for line in top.chain)
    assert not [h for h in a.hypotheses if "raise the learning rate" in h.suggestion
                or "larger learning rate" in h.suggestion]


def test_a_dead_layer_from_the_start_accounts_for_the_bias_that_feeds_it():
    """A layer whose bias pushes every unit of the ReLU after it below zero: dead_units at the ReLU, its chain
    and fix naming the layer before it; not a separate initialisation verdict."""
    def fill(row, t):
        row[0, Stat.ACT_MEAN] = -40.0  # the offset makes the layer amplify its input's scale
        row[1, Stat.ACT_DEAD] = 1.0
        row[0, Stat.W_GRAD_NORM] = 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear", "ReLU", "Linear"], 20, fill, loss=lambda s: 1.0))
    assert loud(a) == [("dead_units", "net.1")]
    top = a.hypotheses[0]
    assert "`net.0`" in top.suggestion and any("net.0" in line for line in top.chain)


def test_units_killed_by_an_update_are_the_learning_rate():
    def fill(row, t):
        row[[0, 2], Stat.W_UPDATE_NORM] = 10.0 if t >= 3 else 5e-3
        if t >= 6:
            row[1, Stat.ACT_DEAD] = 1.0
            row[0, Stat.W_GRAD_NORM] = 0.0
    a = run(make_trace(["Linear", "ReLU", "Linear"], 30, fill, loss=lambda s: 1.0))
    assert loud(a) == [("learning_rate_too_high", "")]
    assert a.hypotheses[0].step == 3
    assert any("output 0" in line for line in a.hypotheses[0].chain)


def test_a_cause_cannot_start_after_its_effect():
    """Gradients vanish from step 2; a layer dies at step 10: the dead layer does not explain what came first."""
    def fill(row, t):
        if t >= 2:
            row[0, Stat.W_GRAD_NORM] = 5e-7
        if t >= 10:
            row[3, Stat.ACT_DEAD] = 1.0
    a = run(make_trace(["Linear", "Tanh", "Linear", "ReLU", "Linear"], 40, fill, loss=lambda s: 1.0))
    vanishing = [h for h in a.hypotheses if h.cause == Cause.VANISHING_GRADIENTS]
    assert vanishing and vanishing[0].step == 2


def test_negligible_updates_once_the_gradient_stops_are_no_low_learning_rate():
    def fill(row, t):
        if t >= 4:
            row[1, Stat.ACT_DEAD] = 1.0
            row[0, Stat.W_GRAD_NORM] = 0.0
            row[[0, 2], Stat.W_UPDATE_NORM] = 5e-12
    a = run(make_trace(["Linear", "ReLU", "Linear"], 60, fill, loss=lambda s: 1.0))
    assert loud(a) == [("dead_units", "net.1")]
    assert not [h for h in a.hypotheses if h.cause == Cause.LEARNING_RATE_TOO_LOW and h.confidence >= 0.5]


def test_a_flat_loss_under_large_updates_never_gets_a_larger_learning_rate():
    def fill(row, t):
        row[[0, 2], Stat.W_UPDATE_NORM] = 1.0  # 0.2x the weights per step
    a = run(make_trace(["Linear", "ReLU", "Linear"], 80, fill, loss=lambda s: 1.0))
    assert a.hypotheses and all("larger learning rate" not in h.suggestion and "raise the learning rate"
                                not in h.suggestion for h in a.hypotheses)


def test_a_layer_that_dies_after_the_loss_went_flat_does_not_account_for_it():
    """The loss is flat from the start (a plateau as soon as one can be seen); a layer dies at step 100: the
    dead layer cannot be why the loss never came down. It is reported, with no failure of the loss in its
    chain, and less confident than the same layer dying before the plateau."""
    def dying_at(step):
        def fill(row, t):
            if t >= step:
                row[1, Stat.ACT_DEAD] = 1.0
                row[0, Stat.W_GRAD_NORM] = 0.0
        a = run(make_trace(["Linear", "ReLU", "Linear"], 150, fill, loss=lambda s: 1.0))
        return next(h for h in a.hypotheses if h.cause == Cause.DEAD_UNITS)
    late, early = dying_at(100), dying_at(20)
    assert late.step == 100 and not any("loss" in line for line in late.chain)
    assert any("loss stays flat" in line for line in early.chain) and early.confidence > late.confidence


def test_with_a_learning_rate_too_low_no_fix_lowers_it():
    """Negligible updates all run long, and one layer's updates jumping for a sample: the verdict raises the
    learning rate, and no hypothesis shown proposes a smaller one."""
    def fill(row, t):
        row[[0, 2], Stat.W_UPDATE_NORM] = 5e-7
        if t == 30:
            row[2, Stat.W_UPDATE_NORM] = 5e-5
    a = run(make_trace(["Linear", "ReLU", "Linear"], 60, fill, loss=lambda s: 1.0))
    assert loud(a)[:1] == [("learning_rate_too_low", "")]
    assert not [h for h in a.hypotheses if "lower the learning rate" in h.suggestion]
