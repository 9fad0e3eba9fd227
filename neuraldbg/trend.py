"""Trends of a sampled signal: is it moving beyond its noise (the Mann-Kendall test), and how fast (the
Theil-Sen slope, with its confidence interval after Sen, 1968). Both read only the order of the values
and the slopes between pairs of them, so a spike or a noisy sample moves them little, and neither
assumes a distribution of the noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# the fewest samples a trend is measured on (below it, even a perfectly monotone run is no evidence)
MIN_SAMPLES = 5


def _variance(n: np.ndarray | int, ties: float = 0.0):
    """The variance of the Mann-Kendall statistic of ``n`` values that only move by noise."""
    return (n * (n - 1) * (2 * n + 5) - ties) / 18


def rising_z(v: np.ndarray) -> float:
    """Mann-Kendall z of an upward trend: how many standard deviations more later values are above earlier
    ones than below them, against values that only move by noise (about 2: clearly rising). Equal values
    narrow the spread (their correction); NaN values are left out."""
    v = np.asarray(v, dtype=np.float64)
    v = v[np.isfinite(v)]
    n = len(v)
    if n < 2:
        return 0.0
    s = float(np.sign(v[None, :] - v[:, None])[np.triu_indices(n, 1)].sum())  # later minus earlier
    _, t = np.unique(v, return_counts=True)
    var = _variance(n, float((t * (t - 1) * (2 * t + 5)).sum()))
    return s / math.sqrt(var) if var > 0 else 0.0


def rolling_rising_z(values: np.ndarray, rows: np.ndarray, cols: np.ndarray, window: int,
                     chunk: int = 4096) -> np.ndarray:
    """Mann-Kendall z of an upward trend over the last ``window`` samples up to each (row, column) asked for
    (fewer at the start; NaN values left out, and no correction for ties, which makes it conservative).
    NaN where fewer than ``MIN_SAMPLES`` values are known."""
    t, _ = values.shape
    w = int(window)
    padded = np.concatenate([np.full((w - 1, values.shape[1]), np.nan), values.astype(np.float64)], axis=0)
    iu = np.triu_indices(w, 1)
    out = np.full(len(rows), np.nan)
    offsets = np.arange(w)
    for lo in range(0, len(rows), chunk):
        r, c = rows[lo:lo + chunk], cols[lo:lo + chunk]
        win = padded[r[:, None] + offsets[None, :], c[:, None]]            # (m, w), the oldest first
        with np.errstate(invalid="ignore"):
            pairs = np.sign(win[:, iu[1]] - win[:, iu[0]])                 # later minus earlier
        s = np.nansum(pairs, axis=1)
        n = np.isfinite(win).sum(axis=1)
        var = _variance(n)
        with np.errstate(all="ignore"):
            out[lo:lo + chunk] = np.where(n >= MIN_SAMPLES, s / np.sqrt(var), np.nan)
    return out


@dataclass(frozen=True)
class Slope:
    """A Theil-Sen line through (x, y): the median of the pairwise slopes, its confidence interval
    (``low`` .. ``high``) and the line's value at ``x_last``."""

    slope: float
    low: float
    high: float
    level: float       # the line at the last x (robust: a last sample off the trend does not move it)
    scatter: float     # the samples' robust spread around the line (1.4826 x the median absolute deviation)


def median_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The median of the slopes between every pair of points (NaN with none)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(len(x), 1)
    keep = (x[j] != x[i]) & np.isfinite(y[i]) & np.isfinite(y[j])
    return float(np.median((y[j] - y[i])[keep] / (x[j] - x[i])[keep])) if keep.any() else float("nan")


def theil_sen(x: np.ndarray, y: np.ndarray, z: float) -> Slope | None:
    """The Theil-Sen slope of ``y`` against ``x`` and its confidence interval at ``z`` standard deviations
    (Sen's ranks of the sorted pairwise slopes: (N - C) / 2 and (N + C) / 2 + 1, C = z * sd(S)).
    None with fewer than ``MIN_SAMPLES`` finite points."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n < MIN_SAMPLES:
        return None
    i, j = np.triu_indices(n, 1)
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return None
    slopes = np.sort((y[j] - y[i])[keep] / dx[keep])
    m = len(slopes)
    med = float(np.median(slopes))
    c = z * math.sqrt(_variance(n))
    lo = int(np.clip(round((m - c) / 2) - 1, 0, m - 1))
    hi = int(np.clip(round((m + c) / 2), 0, m - 1))
    resid = y - med * x
    intercept = float(np.median(resid))
    scatter = 1.4826 * float(np.median(np.abs(resid - intercept)))
    return Slope(slope=med, low=float(slopes[lo]), high=float(slopes[hi]), level=intercept + med * float(x[-1]),
                 scatter=scatter)
