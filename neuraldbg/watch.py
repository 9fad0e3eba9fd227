"""Early warnings: signals in their warning band that keep moving toward their failure state, each with
a forecast of when it will get there. Listed apart from the hypotheses: a warning is never a verdict, and
nothing here changes one.

A sample of a signal is a warning when its value lies in the band (``bands``), its last
``warning_window`` samples (at least five, none from the first ``warning_settle`` steps) move toward the
failure by a Mann-Kendall z of ``warning_z`` or more, and even at the slowest rate their slope's
confidence interval allows it would get there within ``warning_horizon`` times the steps those samples
span: a layer that sits at 40% dead units and stays there is no warning, nor one unit that dies in a
long while, nor a narrow layer whose units die and come back one by one; a layer climbing from 25% to
45% is. A warning shows once this holds for ``warning_persist`` samples in a row (a share of units, which
moves by whole units, for ``persist`` samples, as a state becomes an event), and ends once it has not held
for as many; none shows at a sample past the failure's level.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import bands as bands_mod
from .bands import BandSeries
from .events import debounce
from .forecast import Forecast, forecast, window, within_horizon
from .formatting import number
from .health import features
from .states import _State, Signal
from .thresholds import Thresholds
from .trace import Trace
from .trend import rolling_rising_z, theil_sen


@dataclass(frozen=True)
class Trend:
    """How a signal moved over its recent samples: from ``start`` at step ``since`` to its value at step ``until``, with
    its Mann-Kendall ``z`` toward the failure and its Theil-Sen ``slope`` per step (in log10 units for a
    ratio or a scale; NaN when it could not be measured)."""

    since: int
    start: float
    until: int
    z: float
    slope: float


# model-wide signals are named by what they measure
_SUBJECTS = {Signal.UPDATE: "the updates", Signal.WEIGHTS: "the weights", Signal.SCALER: "the loss scale",
             Signal.INPUT: "the input"}


@dataclass(frozen=True)
class EarlyWarning:
    """A signal between healthy and failing, heading for failure.

    ``signal`` and ``layer`` say what (``""``: the model as a whole, ``"input"``: the data); ``state`` is
    its warning band (``ActState.DRIFTING``, ``GradState.DIMINISHING``, ``UpdateState.CREEPING``,
    ``AttnState.NARROWING``, ``InputState.DRIFTING``, ``WeightState.SHRINKING``, ``ScalerState.FALLING``)
    and ``failure`` the state it leads to; ``step`` the step it was first seen; ``value`` the
    ``quantity`` now, ``threshold`` the failure's level (None: no level); ``trend`` how it moved over the
    recent samples; ``forecast`` when it reaches the failure at that rate (None: no significant trend at
    the latest sample, or no level to reach)."""

    signal: Signal
    layer: str
    state: _State
    failure: _State
    quantity: str
    step: int
    value: float
    threshold: float | None
    trend: Trend
    forecast: Forecast | None
    percent: bool = False
    also: tuple[str, ...] = ()  # other calls of the same loop of the forward with the same warning

    @property
    def where(self) -> str:
        return {"": "the model", "input": "the input"}.get(self.layer, f"`{self.layer}`")

    @property
    def subject(self) -> str:
        """What is warned of: "`blocks.3` activation", "the updates", "the input"."""
        if self.signal in _SUBJECTS:
            return _SUBJECTS[self.signal]
        return f"{self.where} {self.signal}"

    def reads(self, v: float) -> str:
        """A value of the quantity as text (a share as a percentage)."""
        if self.percent and v == v:  # (a share near none with its first digits: 0.05%, not 0%)
            return f"{v:.0%}" if v >= 0.01 or v == 0 else f"{100 * v:.2g}%"
        return number(v)

    @property
    def title(self) -> str:
        """What, where and where to: "`blocks.3` activation drifting toward dead"."""
        toward = f" toward {str(self.failure).replace('_', ' ')}" if self.threshold is not None else ""
        return f"{self.subject} {self.state}{toward}"

    @property
    def outlook(self) -> str:
        """``dead units 12% -> 38% over 400 steps; at this rate it reaches 60% near step 900 (700-1200)``."""
        t = self.trend
        text = f"{self.quantity} {self.reads(t.start)} -> {self.reads(self.value)} over {t.until - t.since} steps"
        if self.forecast is not None and self.threshold is not None:
            text += f"; at this rate it reaches {self.reads(self.threshold)} {self.forecast.describe()}"
        elif self.threshold is None:
            text += ", still falling (no level of it is a failure: no forecast)"
        else:
            text += " (no significant trend at the latest sample: no forecast)"
        if self.also:
            text += f"; the same in {len(self.also)} more calls of its loop"
        return text

    def describe(self) -> str:
        return f"{self.title}: {self.outlook}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class Episode:
    """The first warning of one signal in a run, as it showed (``shown_at``: the step it was first listed,
    its forecast made then), and the failure that followed: ``crossed`` the step the failure state began
    (None: not in the run), known to lie after the sample at ``crossed_after``."""

    warning: EarlyWarning
    shown_at: int
    crossed: int | None
    crossed_after: int | None

    @property
    def forecast_right(self) -> bool | None:
        """The crossing lies in the forecast's range (None: no forecast, or no crossing to judge it by)."""
        f = self.warning.forecast
        if f is None or self.crossed is None:
            return None
        return f.covers(self.crossed_after + 1 if self.crossed_after is not None else self.crossed, self.crossed)


@dataclass
class _Scan:
    """One band series with the samples at which each of its columns warns."""

    series: BandSeries
    trend: np.ndarray          # (samples, columns): the values a trend is read on (NaN: not read)
    cols: np.ndarray           # the columns that ever warn
    on: np.ndarray             # (samples, len(cols)) bool: a warning at the sample


def warning_persistence(series: BandSeries, th: Thresholds) -> int:
    """Samples a warning's conditions must hold before it shows."""
    return max(int(th.persist), int(th.warning_persist)) if series.percent else int(th.warning_persist)


def _scan(series: BandSeries, th: Thresholds) -> _Scan | None:
    trend = series.trend_values()
    trend[series.steps < th.warning_settle] = np.nan
    # a sample past the failure's level that has not held for the failure's persistence is no failure yet:
    # still heading there, it does not break a warning off
    heading = series.in_band | (series.failed & ~_failed(series, th))
    rows, cols = np.nonzero(heading & np.isfinite(trend))
    if not len(rows):
        return None
    z = rolling_rising_z(trend, rows, cols, th.warning_window)
    with np.errstate(invalid="ignore"):
        hit = z >= th.warning_z
    if series.threshold is not None:  # heading there soon enough: within the horizon of what was seen
        for i in np.nonzero(hit)[0]:
            hit[i] = within_horizon(series, trend[:, cols[i]], int(rows[i]), th.warning_window, th.warning_horizon,
                                    th.warning_z, int(cols[i]))
    raw_all = np.zeros(series.in_band.shape, dtype=bool)
    raw_all[rows[hit], cols[hit]] = True
    # shown once it holds for warning_persist samples; a share of units moves by whole units, so one sample of
    # it is one unit more, not yet a trend's confirmation: as many samples as a state takes to become an event
    raw_all = debounce(raw_all.astype(np.int8), warning_persistence(series, th)).astype(bool)
    # none at a sample past the failure's level, nor where the failure holds: that is a state, not a warning
    raw_all &= ~(series.failed | _failed(series, th))
    keep = np.nonzero(raw_all.any(axis=0))[0]
    if not len(keep):
        return None
    raw = raw_all[:, keep]
    return _Scan(series, trend, keep, raw)


def scans(trace: Trace, th: Thresholds) -> list[_Scan]:
    if not trace.stats.n:
        return []
    out = []
    for series in bands_mod.compute(trace, features(trace), th):
        s = _scan(series, th)
        if s is not None:
            out.append(s)
    return out


def _warning(scan: _Scan, k: int, row: int, first: int, th: Thresholds) -> EarlyWarning:
    """Column ``k`` of ``scan`` as seen at ``row`` (from the samples up to it), first seen at row ``first``."""
    s = scan.series
    col = int(scan.cols[k])
    trend = scan.trend[:, col]
    rows = window(trend, row, th.warning_window)
    z = float(rolling_rising_z(scan.trend, np.array([row]), np.array([col]), th.warning_window)[0])
    fc = forecast(s, trend, row, th.warning_z, th.warning_window, col) if scan.on[row, k] else None
    fit = theil_sen(s.steps[rows], trend[rows], th.warning_z)
    return EarlyWarning(signal=s.signal, layer=s.names[col], state=s.band, failure=s.failure, quantity=s.quantity,
                        step=int(s.steps[first]), value=float(s.values[row, col]), threshold=s.level(col),
                        trend=Trend(since=int(s.steps[rows[0]]), start=float(s.values[rows[0], col]),
                                    until=int(s.steps[row]), z=z, slope=fit.slope if fit is not None else float("nan")),
                        forecast=fc, percent=s.percent)


def _starts(on: np.ndarray) -> np.ndarray:
    """Rows where a boolean column turns on."""
    prev = np.concatenate([[False], on[:-1]])
    return np.nonzero(on & ~prev)[0]


def warnings(trace: Trace, th: Thresholds) -> list[EarlyWarning]:
    """The warnings that hold at the latest sample, the soonest forecast first (those without one last)."""
    out = []
    for scan in scans(trace, th):
        last = scan.on.shape[0] - 1
        for k in np.nonzero(scan.on[-1])[0]:
            first = int(_starts(scan.on[:, k])[-1])
            out.append(_warning(scan, int(k), last, first, th))
    return _one_per_loop(_one_each(sorted(out, key=_soonest)), trace)


def _one_per_loop(ordered: list[EarlyWarning], trace: Trace) -> list[EarlyWarning]:
    """The calls of one loop of the forward (``health.loop_chains``) warned of alike: the first warning in
    ``ordered`` stands for them all, naming the others (``also``)."""
    f = features(trace)
    loop_of = {f.names[i]: chain[0] for chain in f.loops for i in chain}
    if not loop_of:
        return ordered
    first: dict[tuple, int] = {}
    folded: dict[int, list[str]] = {}
    out: list[EarlyWarning] = []
    for w in ordered:
        key = (w.signal, loop_of.get(w.layer), w.failure)
        if key[1] is not None and key in first:
            folded.setdefault(first[key], []).append(w.layer)
            continue
        first[key] = len(out)
        out.append(w)
    return [dataclasses.replace(w, also=tuple(folded[i])) if i in folded else w for i, w in enumerate(out)]


_FAR = 1 << 62


def _soonest(w: EarlyWarning) -> tuple:
    return (w.forecast.step if w.forecast is not None else _FAR, w.step)


def _one_each(ordered: list) -> list:
    """The first of each signal, layer and failure in ``ordered`` (warnings or episodes): a failure two bands
    lead to (a layer's share of dead units and of outputs firing) is warned of once."""
    seen, out = set(), []
    for x in ordered:
        w = x if isinstance(x, EarlyWarning) else x.warning
        key = (w.signal, w.layer, w.failure)
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out


def episodes(trace: Trace, th: Thresholds) -> list[Episode]:
    """Every signal's first warning in the run, as it showed at the time: at the sample where it had held
    for the samples a warning needs, with its forecast from the samples up to then; and the failure that
    followed it, if any: what the forecast is judged against."""
    out = []
    for scan in scans(trace, th):
        s = scan.series
        failed = _failed(s, th)
        for k in range(len(scan.cols)):
            first = int(_starts(scan.on[:, k])[0])
            # where it had held for the samples a warning needs (none shows at a sample past the failure's level:
            # then the next one it shows at)
            on = np.nonzero(scan.on[:, k])[0]
            held = on[on >= first + max(warning_persistence(s, th), 1) - 1]
            if not len(held):
                continue
            shown = int(held[0])
            col = int(scan.cols[k])
            after = _starts(failed[:, col])
            after = after[after > shown]
            crossed = int(s.steps[after[0]]) if len(after) else None
            before = int(s.steps[after[0] - 1]) if len(after) else None
            out.append(Episode(_warning(scan, k, shown, first, th), int(s.steps[shown]), crossed, before))
    # (of two bands toward one failure, the warning shown first; at the same sample, the soonest forecast)
    return _one_each(sorted(out, key=lambda e: (e.shown_at, _soonest(e.warning))))


def _failed(s: BandSeries, th: Thresholds) -> np.ndarray:
    """The samples in the failure state, with the persistence its events have (a sample where the signal
    was not measured continues the state before it, as for the events)."""
    codes = np.where(np.isfinite(s.values), s.failed.astype(np.int8), np.int8(-1))
    return debounce(codes, th.persist if s.persist is None else s.persist) > 0


Crossing = tuple[Signal, str, _State, int, int]


def crossings(trace: Trace, th: Thresholds) -> list[Crossing]:
    """Every failure of a band's signal that begins after a healthy start: (signal, layer, failure state,
    the step it began, the sample step before it), in step order."""
    out: dict[tuple, Crossing] = {}
    if not trace.stats.n:
        return []
    for s in bands_mod.compute(trace, features(trace), th):
        failed = _failed(s, th)
        for col in np.nonzero(failed.any(axis=0))[0]:
            starts = _starts(failed[:, col])
            starts = starts[starts > 0]
            if len(starts):  # (a failure two bands lead to is one crossing)
                r = int(starts[0])
                out.setdefault((s.signal, s.names[col], s.failure),
                               (s.signal, s.names[col], s.failure, int(s.steps[r]), int(s.steps[r - 1])))
    return sorted(out.values(), key=lambda c: c[3])


def longest(trace: Trace, th: Thresholds) -> int:
    """The most consecutive samples any one signal warned for in the run (0: none ever did)."""
    best = 0
    for scan in scans(trace, th):
        for k in range(scan.on.shape[1]):
            on = scan.on[:, k]
            starts, ends = _starts(on), _starts(~on)
            for a in starts:
                later = ends[ends > a]
                best = max(best, int((later[0] if len(later) else len(on)) - a))
    return best

