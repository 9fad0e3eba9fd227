"""Semanticization of the warning bands: for each signal, the measured quantity its failure state is
decided on, the band between its healthy state and that failure, and the failure itself.

| signal | quantity | band (a warning) | failure |
|---|---|---|---|
| activation, ReLU family | share of units dead | ``drift_fraction`` .. ``dead_fraction`` | dead |
| activation, ReLU family | share of outputs firing | ``firing_drop`` x its early level .. ``silent_level`` | dead |
| activation, sigmoid/tanh | share of outputs saturated | ``drift_fraction`` .. ``saturated_fraction`` | saturated |
| gradient | relative gradient / the layers after it | ``diminishing_ratio`` .. ``vanishing_ratio`` | vanishing |
| update | largest update-to-weight ratio | ``update_creeping`` .. ``update_too_large`` | too large |
| attention | entropy, fraction of log(keys) | ``attention_narrowing`` .. ``attention_entropy`` | collapsed |
| input | mean or spread of the batch | ``input_drift`` .. ``input_scale`` | unscaled |
| weights | median layer's weight norm / its start | 1 / ``weight_shrinking`` .. 1 / ``weight_collapse`` | collapsing |
| scaler | GradScaler's loss scale | ``scale_falling`` halvings below its peak | none: skipping is a run |

A layer whose units are silenced together (a dropout rate or a penalty that grows, a normalised layer
pushed below zero) has no share of dead units to watch: every unit dies within a few steps of the others,
and the share jumps from none to all between two samples. What moves first is the share of its outputs
that fire: it falls for a hundred steps or more before. Its early level is the median of its first
``EARLY_SAMPLES`` samples past ``warning_settle``. Its failure is the dead state itself (the same samples as
the share of dead units'); the level it is forecast to reach is the share at which units firing alike show
no output > 0 in a batch that often (``silent_level``). A share can fall at a steady rate (a dropout rate
rising in steps of the same size) or by a steady factor (a shift walking into the tail of a normal
spread): its forecast covers both.

The bands are named drifting (activation, input), diminishing, creeping, narrowing, shrinking and
falling (the loss scale).
The quantities are the ones ``health`` compares with the failure thresholds, taken from the same
features, so a band's failure is the health state's (checked by the tests). Nothing here feeds the
events or the inference: a band is never a verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from .health import Features, first_finite, input_rows, row_median
from .states import (_State, ActState, AttnState, GradState, InputState, ScalerState, Signal, UpdateState,
                     WeightState)
from .thresholds import Thresholds
from .trace import GLOBAL_COLUMNS, Trace


class Scale(str, Enum):
    """The scale a quantity's trend is measured on: a ratio or a scale changes by factors (log10); a share
    of units past a level moving at a constant rate follows the CDF of their spread, near a straight line
    on the logit scale; anything else as it is."""

    LINEAR = "linear"
    LOG = "log"
    LOGIT = "logit"


_SHARE_EDGE = 1e-3   # a share of exactly 0 or 1 is read as this close to it on the logit scale


def _to(scale: Scale, v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(all="ignore"):
        if scale == Scale.LOG:
            return np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)
        if scale == Scale.LOGIT:
            p = np.clip(v, _SHARE_EDGE, 1 - _SHARE_EDGE)
            return np.log(p / (1 - p))
    return v


@dataclass
class BandSeries:
    """One signal's quantity over the samples, (samples, columns), with its band and its failure.

    ``rising``: the failure lies above the band (else below); ``scale``: what its trend is measured on;
    ``threshold``: the failure threshold (None: the failure is no level the quantity crosses)."""

    signal: Signal
    band: _State
    failure: _State
    quantity: str
    names: list[str]
    steps: np.ndarray
    values: np.ndarray
    threshold: float | None
    rising: bool
    scale: Scale
    percent: bool              # a share, written as a percentage
    in_band: np.ndarray        # (samples, columns) bool
    failed: np.ndarray         # (samples, columns) bool
    persist: int | None = None  # None: the thresholds' persistence (as for the signal's events)
    levels: np.ndarray | None = None  # per column, the failure's level where it differs between columns
    also: Scale | None = None  # a second scale the quantity may move on: forecasts cover both

    def level(self, col: int) -> float | None:
        """The failure's level for column ``col`` (None: no level)."""
        if self.threshold is None:
            return None
        return float(self.levels[col]) if self.levels is not None else self.threshold

    def trend_values(self, scale: Scale | None = None) -> np.ndarray:
        """The values the trend is measured on (on ``scale``, else the series'), oriented so that moving toward
        the failure is rising."""
        v = _to(self.scale if scale is None else scale, self.values)
        return v if self.rising else -v

    def toward(self, value: float, scale: Scale | None = None) -> float:
        """``value`` on the trend's scale (or ``scale``) and orientation."""
        v = float(_to(self.scale if scale is None else scale, np.array([value]))[0])
        return v if self.rising else -v


def _between(values: np.ndarray, start, end: float, rising: bool, reached: bool) -> tuple[np.ndarray, np.ndarray]:
    """(in the band, past the failure threshold) for values moving from ``start`` toward ``end``; ``reached``:
    a value equal to ``end`` is the failure (as the health state decides it)."""
    with np.errstate(invalid="ignore"):
        if rising:
            failed = values >= end if reached else values > end
            band = (values >= start) & ~failed
        else:
            failed = values <= end if reached else values < end
            band = (values < start) & ~failed
    ok = np.isfinite(values)
    return band & ok, failed & ok


def _series(signal, band, failure, quantity, names, steps, values, start, end, rising, scale, percent=False,
            persist=None, reached=False) -> BandSeries:
    if values.ndim == 1:
        values = values[:, None]
    in_band, failed = _between(values, start, end, rising, reached)
    return BandSeries(signal, band, failure, quantity, names, steps, values, end, rising, scale, percent, in_band,
                      failed, persist)


EARLY_SAMPLES = 5   # samples a share of outputs firing takes its early level from (their median)


def _early_level(steps: np.ndarray, values: np.ndarray, settle: int) -> np.ndarray:
    """Per column, the median of its first ``EARLY_SAMPLES`` finite values at steps from ``settle`` on."""
    out = np.full(values.shape[1], np.nan)
    later = values[steps >= settle].astype(np.float64)
    for c in range(values.shape[1]):
        v = later[:, c]
        v = v[np.isfinite(v)][:EARLY_SAMPLES]
        if len(v):
            out[c] = float(np.median(v))
    return out


def silent_level(positions: np.ndarray, dead_fraction: float) -> np.ndarray:
    """The share of outputs firing at which a unit with that many outputs in a batch shows none > 0 with
    probability ``dead_fraction`` (its outputs firing independently): where units firing alike are that share
    dead. 0 where the positions are not known."""
    with np.errstate(invalid="ignore", divide="ignore"):
        level = 1.0 - dead_fraction ** (1.0 / positions)
    return np.where(np.isfinite(level) & (positions >= 1), level, 0.0)


def activation_bands(f: Features, th: Thresholds) -> list[BandSeries]:
    out = []
    if len(f.ri):
        names = [f.names[i] for i in f.ri]
        dead = _series(Signal.ACTIVATION, ActState.DRIFTING, ActState.DEAD, "dead units", names, f.steps, f.dead,
                       th.drift_fraction, th.dead_fraction, rising=True, scale=Scale.LOGIT, percent=True,
                       reached=True)
        out.append(dead)
        start = th.firing_drop * _early_level(f.steps, f.firing, th.warning_settle)
        levels = silent_level(f.positions, th.dead_fraction)
        firing = f.firing.astype(np.float64)
        with np.errstate(invalid="ignore"):
            # between its start and the level it is forecast to reach (a unit with few outputs in a batch shows
            # none > 0 at a share that may lie above the start: no band; below the level, and not dead, the share
            # of dead units is the band to read)
            in_band = (firing < start[None, :]) & (firing > levels[None, :]) & ~dead.failed
        out.append(BandSeries(Signal.ACTIVATION, ActState.DRIFTING, ActState.DEAD, "outputs firing", names, f.steps,
                              firing, 0.0, rising=False, scale=Scale.LOG, percent=True, in_band=in_band,
                              failed=dead.failed.copy(), levels=levels, also=Scale.LINEAR))
    if len(f.bi):
        out.append(_series(Signal.ACTIVATION, ActState.DRIFTING, ActState.SATURATED, "saturated outputs",
                           [f.names[i] for i in f.bi], f.steps, f.sat, th.drift_fraction, th.saturated_fraction,
                           rising=True, scale=Scale.LOGIT, percent=True, reached=True))
    return out


def gradient_band(f: Features, th: Thresholds) -> list[BandSeries]:
    if not len(f.gi):
        return []
    with np.errstate(all="ignore"):
        attenuation = np.where(f.later > 0, f.rel / f.later, np.nan)
    start = max(th.diminishing_ratio, th.vanishing_ratio)
    return [_series(Signal.GRADIENT, GradState.DIMINISHING, GradState.VANISHING, "gradient vs the layers after it",
                    [f.names[i] for i in f.gi], f.steps, attenuation, start, th.vanishing_ratio, rising=False,
                    scale=Scale.LOG)]


def update_band(f: Features, th: Thresholds) -> list[BandSeries]:
    r = f.update_ratio
    if not r.shape[1]:
        return []
    largest = np.where(np.isfinite(r), r, -np.inf).max(axis=1)
    largest = np.where(np.isfinite(largest), largest, np.nan)
    # (a layer's ratio above the threshold is the failure: the largest one says when any layer is)
    with np.errstate(invalid="ignore"):
        largest = np.where(largest > 0, largest, np.nan)
    return [_series(Signal.UPDATE, UpdateState.CREEPING, UpdateState.TOO_LARGE, "largest update/weight", [""],
                    f.steps, largest, th.update_creeping, th.update_too_large, rising=True, scale=Scale.LOG)]


def attention_band(f: Features, th: Thresholds) -> list[BandSeries]:
    if not len(f.ai):
        return []
    return [_series(Signal.ATTENTION, AttnState.NARROWING, AttnState.COLLAPSED, "attention entropy",
                    [f.names[i] for i in f.ai], f.steps, f.entropy, th.attention_narrowing, th.attention_entropy,
                    rising=False, scale=Scale.LINEAR, percent=True)]


def input_band(trace: Trace, f: Features, th: Thresholds) -> list[BandSeries]:
    g = trace.globals.data
    if not len(g):
        return []
    col = GLOBAL_COLUMNS.index
    # (with the unsampled steps whose input was read at a loss spike, as the health states have them)
    steps, (mean, sd) = input_rows(trace, f.steps, [g[:, col("input_mean")], g[:, col("input_std")]])
    scale = np.fmax(np.abs(mean), sd).astype(np.float64)
    band = _series(Signal.INPUT, InputState.DRIFTING, InputState.UNSCALED, "input scale", ["input"], steps, scale,
                   th.input_drift, th.input_scale, rising=True, scale=Scale.LOG, persist=1)
    with np.errstate(invalid="ignore"):
        band.failed |= (scale < th.input_tiny)[:, None]   # out of scale the other way (no band leads there)
    return [band]


def weight_band(f: Features, th: Thresholds) -> list[BandSeries]:
    if not f.wnu.shape[1]:
        return []
    with np.errstate(all="ignore"):
        shrink = row_median(np.where(f.wnu > 0, f.wnu / first_finite(f.wnu), np.nan))
    return [_series(Signal.WEIGHTS, WeightState.SHRINKING, WeightState.COLLAPSING, "weights vs their start", [""],
                    f.steps, shrink, 1.0 / th.weight_shrinking, 1.0 / th.weight_collapse, rising=False,
                    scale=Scale.LOG)]


def scaler_band(trace: Trace, f: Features, th: Thresholds) -> list[BandSeries]:
    """The loss scale against its peak since its calibration (the first samples over which it falls at
    every sample: a GradScaler finding its scale); halving ``scale_falling`` times below it is the band.
    No level is a failure: skipping is a run of skipped steps."""
    if not trace.globals.n:
        return []
    scale = trace.global_column("loss_scale").astype(np.float64)
    known = np.isfinite(scale) & (scale > 0)
    if known.sum() < 2:
        return []
    idx = np.nonzero(known)[0]
    settled = idx[0]
    for a, b in zip(idx[:-1], idx[1:]):  # the calibration: the leading samples, each lower than the one before
        if scale[b] >= scale[a]:
            break
        settled = b
    peak = np.full(len(scale), np.nan)
    after = np.arange(len(scale)) >= settled
    peak[after] = np.fmax.accumulate(np.where(after & known, scale, np.nan)[after])
    start = peak / 2.0 ** th.scale_falling
    with np.errstate(invalid="ignore"):
        in_band = (known & after & (scale <= start))[:, None]
    values = np.where(known, scale, np.nan)[:, None]
    return [BandSeries(Signal.SCALER, ScalerState.FALLING, ScalerState.SKIPPING, "loss scale", [""], f.steps,
                       values, None, rising=False, scale=Scale.LOG, percent=False, in_band=in_band,
                       failed=np.zeros_like(in_band), persist=None)]


def compute(trace: Trace, f: Features, th: Thresholds) -> list[BandSeries]:
    """Every signal's band series (columns that are never measured included; callers skip them)."""
    return (activation_bands(f, th) + gradient_band(f, th) + update_band(f, th) + attention_band(f, th)
            + input_band(trace, f, th) + weight_band(f, th) + scaler_band(trace, f, th))
