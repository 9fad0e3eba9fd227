"""The analysis pipeline after extraction: health states -> events -> links -> hypotheses.

``analyze`` runs the three stages on a stored trace; re-analysis with new thresholds is just
another call (the model is not needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import events as events_mod
from . import health as health_mod
from . import patterns as patterns_mod
from .events import SemanticEvent
from .health import LayerHealth
from .hypothesis import CausalHypothesis
from .patterns import Link
from .reasoner import infer
from .rules import Context
from .stats import Stat
from .thresholds import Thresholds
from .trace import Trace


@dataclass
class Analysis:
    """``health``: each layer's latest state; ``events`` in step order; ``hypotheses`` best first."""

    health: dict[str, LayerHealth] = field(default_factory=dict)
    events: list[SemanticEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    hypotheses: list[CausalHypothesis] = field(default_factory=list)
    steps: int = 0


def _last_lr(trace: Trace) -> float:
    if trace.globals.n == 0:
        return math.nan
    lr = trace.global_column("lr")
    ok = np.isfinite(lr)
    return float(lr[ok][-1]) if ok.any() else math.nan


def _loss_reach(trace: Trace) -> tuple[float, float, float]:
    """At the first step: the loss, the RMS of the model's output (the last layer to run), and how far the
    loss is out of the output's reach, sqrt(loss) / RMS. Squared-error losses on targets of a scale the
    outputs do not have start far above 1; a classification loss starts near it."""
    order = trace.execution_order()
    if not trace.loss.n or not trace.stats.n or not order or trace.loss.steps[0] != trace.stats.steps[0]:
        return math.nan, math.nan, math.nan
    row = trace.stats.data[0, order[-1].index]
    rms = math.hypot(float(row[Stat.ACT_MEAN]), float(row[Stat.ACT_STD]))
    loss = float(trace.loss.data[0])
    if not (math.isfinite(loss) and math.isfinite(rms) and rms > 0):
        return loss, rms, math.nan
    return loss, rms, math.sqrt(abs(loss)) / rms


@dataclass(frozen=True)
class LossFall:
    """How far below zero the smoothed loss has gone, in units of its own scale at the start (the larger
    of its first value's magnitude, its batch-to-batch change there, and 1), and whether it is still
    falling as fast."""

    start: float
    lowest: float
    depth: float            # -lowest / scale
    below_from: int         # first step of the smoothed loss below zero
    still_falling: bool     # the last quarter of the run falls at 0.7x the rate of the second, or faster


def _loss_fall(trace: Trace, th: Thresholds) -> LossFall | None:
    v = trace.loss.data.astype(np.float64)
    ok = np.isfinite(v)
    v, steps = v[ok], trace.loss.steps[ok]
    n = len(v)
    if n < 12:
        return None
    w = max(5, min(th.plateau_steps // 4, n // 10))
    smooth = health_mod._rolling_median(v, w)
    below = np.nonzero(smooth < 0)[0]
    if not len(below):
        return None
    # a loss per element is of order one nat or unit at most at the start: the floor keeps a loss that
    # starts at ~0 (a negative cosine, a Gaussian NLL) from being deep below zero at -1
    scale = max(abs(float(v[0])), float(np.median(np.abs(np.diff(v[:w + 1])))), 1.0)
    q = n // 4
    second, fourth = smooth[q] - smooth[2 * q], smooth[n - 1 - q] - smooth[-1]
    return LossFall(start=float(v[0]), lowest=float(smooth.min()), depth=float(-smooth.min() / scale),
                    below_from=int(steps[below[0]]), still_falling=bool(second > 0 and fourth >= 0.7 * second))


# fewer finite losses than this say nothing of progress
MIN_LOSSES = 10


# the trend test reads at most this many losses, evenly spaced (its cost is quadratic)
TREND_POINTS = 256


def _falling(v: np.ndarray) -> float:
    """Mann-Kendall z of a downward trend: how many standard deviations more later losses are below
    earlier ones than above them, against a loss that only moves by noise (about 2: clearly falling)."""
    v = v[np.linspace(0, len(v) - 1, min(len(v), TREND_POINTS)).astype(int)]
    n = len(v)
    s = float(np.sign(v[:, None] - v[None, :])[np.triu_indices(n, 1)].sum())  # earlier minus later
    _, ties = np.unique(v, return_counts=True)  # equal losses (a loss at exactly 0) narrow the spread
    var = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18
    return s / math.sqrt(var) if var > 0 else 0.0


def _loss_trend(trace: Trace, curve: health_mod.LossCurve | None, th: Thresholds) -> tuple[float, float]:
    """How far the latest losses are below the first ones, in units of the loss's scale, and how clearly
    they fall beyond batch noise (NaN, NaN when too few are recorded): the test of a run too short for a
    plateau."""
    v = trace.loss.data.astype(np.float64)
    ok = np.isfinite(v)
    if curve is None or not MIN_LOSSES <= int(ok.sum()) < th.plateau_steps:
        return math.nan, math.nan  # too few to say, or long enough for the plateau state to say it
    return float(curve.progress[-1]), _falling(v[ok])


def analyze(trace: Trace, thresholds: Thresholds, steps: int = 0, ranks=None) -> Analysis:
    """``ranks``: a ``rankevents.RankEvidence`` when ``trace`` is one rank of a multi-process run (its NaN/Inf
    origin is then the run's first, wherever it came from)."""
    curve = health_mod.loss_curve(trace.loss.data, thresholds) if trace.loss.n else None
    table = health_mod.compute(trace, thresholds, curve)
    events = events_mod.detect(table, thresholds)
    rank = {l.name: int(l.order) for l in trace.layers if l.order is not None}
    first = int(table.steps[0]) if len(table.steps) else 0
    links = patterns_mod.detect(events, rank, first)
    nonfinite = trace.nonfinite if ranks is None else ranks.nonfinite(trace.nonfinite)
    ctx = Context(events=events, links=links, layers={l.name: l for l in trace.layers}, rank=rank, first_step=first,
                  nonfinite=nonfinite, lr=_last_lr(trace), th=thresholds, has_loss=trace.loss.n > 0,
                  attenuation=health_mod.attenuation_series(trace),
                  lr_series=(trace.globals.steps, trace.global_column("lr")), loss_reach=_loss_reach(trace),
                  loss_fall=_loss_fall(trace, thresholds), loss_trend=_loss_trend(trace, curve, thresholds),
                  loss_progress=float(curve.progress[-1]) if curve is not None else math.nan,
                  skipped=(trace.skipped.steps, trace.skipped.data), overflow=trace.overflow, ranks=ranks)
    hypotheses = infer(ctx)
    return Analysis(health=table.latest, events=events, links=links, hypotheses=hypotheses, steps=steps)
