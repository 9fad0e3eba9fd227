"""Forecasts: when a signal in its warning band will cross into its failure state at its recent rate.

The rate is the Theil-Sen slope of the signal's last ``warning_window`` samples against their steps (on
a log scale for ratios and scales, which change by factors, and a logit scale for shares of units); the
line is extrapolated to the failure threshold. The range is where the rates the samples allow get there:
the slope's confidence interval (at ``warning_z``) and the rate of each half of the window (a trend that
changed pace within it), starting from as near or as far as the samples scatter around the line (at
``warning_z`` times their robust spread); the fastest gives the earliest step, the slowest the latest
(none when the slowest rate is not toward the failure at all), and the range is never narrower than the
sampling interval on either side. A quantity that may move on a second scale (a share of outputs firing,
which can fall at a steady rate or by a steady factor) is forecast on both: the range covers both ranges
and the step lies between the two. The forecast is made from the samples already recorded, so it costs
nothing during training beyond reading them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bands import BandSeries, Scale
from .trend import median_slope, theil_sen

_FAR = 10 ** 12   # a forecast step beyond this is no step at all


@dataclass(frozen=True)
class Forecast:
    """The step at which the signal reaches its failure ``threshold`` at its recent rate, with the range
    ``low``..``high`` of its rate's confidence interval (``high`` None: no upper bound: the slowest rate
    in it does not get there), made from the samples up to step ``made_at``."""

    step: int
    low: int
    high: int | None
    threshold: float
    made_at: int

    def covers(self, first: int, last: int | None = None) -> bool:
        """The range meets the steps ``first``..``last`` (a crossing known to lie between two samples)."""
        last = first if last is None else last
        return self.low <= last and (self.high is None or self.high >= first)

    def describe(self) -> str:
        high = "..." if self.high is None else str(self.high)
        return f"near step {self.step} ({self.low}-{high})"


def window(trend: np.ndarray, row: int, size: int) -> np.ndarray:
    """The rows of the last ``size`` finite samples up to ``row``."""
    rows = np.nonzero(np.isfinite(trend[:row + 1]))[0]
    return rows[-int(size):]


def _at(made_at: int, distance: float, slope: float) -> int:
    return int(min(made_at + distance / slope, _FAR))


def _on(series: BandSeries, trend: np.ndarray, col: int, scale: Scale | None) -> np.ndarray:
    """The trend values of column ``col`` on ``scale`` (None: the ones given), read where ``trend`` is."""
    if scale is None:
        return trend
    return np.where(np.isfinite(trend), series.trend_values(scale)[:, col], np.nan)


def _scales(series: BandSeries) -> tuple:
    return (None,) if series.also is None else (None, series.also)


def _one(series: BandSeries, trend: np.ndarray, row: int, z: float, size: int, target: float) -> Forecast | None:
    rows = window(trend, row, size)
    fit = theil_sen(series.steps[rows], trend[rows], z)
    if fit is None or fit.slope <= 0 or not np.isfinite(target):
        return None
    made_at = int(series.steps[row])
    distance = target - fit.level
    if distance <= 0:
        return None
    # a trend that changed pace within the window widens the range: each half's own rate is in it
    fastest, slowest = max(fit.high, fit.slope), min(fit.low, fit.slope)
    half = len(rows) // 2
    for part in (rows[:len(rows) - half], rows[half:]):
        rate = median_slope(series.steps[part], trend[part])
        if rate == rate:
            fastest, slowest = max(fastest, rate), min(slowest, rate)
    step = _at(made_at, distance, fit.slope)
    # the samples scatter around the line: one may cross as soon as the line is that close to the threshold,
    # or only once it is that far past it
    near, far = max(distance - z * fit.scatter, 0.0), distance + z * fit.scatter
    # no finer than the sampling: a crossing is seen at the first sample past it
    gap = int(np.median(np.diff(series.steps[rows]))) if len(rows) > 1 else 0
    low = max(min(_at(made_at, near, fastest), step - gap), made_at)
    high = max(_at(made_at, far, slowest), step + gap) if slowest > 0 else None
    return Forecast(step=step, low=low, high=high, threshold=0.0, made_at=made_at)


def forecast(series: BandSeries, trend: np.ndarray, row: int, z: float, size: int, col: int = 0) -> Forecast | None:
    """The forecast for column ``col`` of ``series`` from its trend values (``trend``: NaN where not to be
    read) up to ``row``; None when the failure is no level (``threshold`` None), the line does not move toward
    it, or too few samples are known. A series that may move on a second scale (``also``) is forecast on
    both: the range covers both, and the step lies between them (their distances' geometric mean)."""
    level = series.level(col)
    if level is None:
        return None
    made = [f for f in (_one(series, _on(series, trend, col, sc), row, z, size, series.toward(level, sc))
                        for sc in _scales(series)) if f is not None]
    if not made:
        return None
    made_at = made[0].made_at
    step = made_at + int(round(float(np.exp(np.mean([np.log(max(f.step - made_at, 1)) for f in made])))))
    highs = [f.high for f in made if f.high is not None]
    high = max(highs) if len(highs) == len(made) else None
    return Forecast(step=min(step, _FAR), low=min(f.low for f in made), high=high, threshold=float(level),
                    made_at=made_at)


def within_horizon(series: BandSeries, trend: np.ndarray, row: int, size: int, horizon: float, z: float,
                   col: int = 0) -> bool:
    """Even at the slowest rate its last ``size`` samples up to ``row`` allow (the low end of their slope's
    confidence interval at ``z``), the signal reaches its failure within ``horizon`` times the steps those
    samples span, on its scale or its second one: a share that steps up by one unit and back, or a noisy
    ratio, has no such rate."""
    level = series.level(col)
    if level is None:
        return False
    for sc in _scales(series):
        values = _on(series, trend, col, sc)
        rows = window(values, row, size)
        x = series.steps[rows]
        fit = theil_sen(x, values[rows], z)
        target = series.toward(level, sc)
        if fit is not None and fit.low > 0 and np.isfinite(target) and (
                (target - fit.level) / fit.low <= horizon * float(x[-1] - x[0])):
            return True
    return False
