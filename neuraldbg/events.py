"""Semanticization, part 2: health states -> semantic events (state transitions, with hysteresis).

A state becomes an event only after it has held for ``Thresholds.persist`` consecutive samples;
the event's step is the first of them. Shorter excursions are ignored, so a layer that flickers
between two states produces no events. The event list is bounded: at most ``MAX_PER_SERIES``
transitions per (signal, layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .formatting import number
from .health import HealthTable, StateSeries
from .states import (_State, ActState, AttnState, FiniteState, GainState, GradState, InputState, LossState,
                     LrState, RangeState, ScalerState, Signal, SpikeState, TargetState, UpdateState, WeightState)
from .thresholds import Thresholds

MAX_PER_SERIES = 16
# event values that are flags, shown only when set (a loss that left its plateau, coming down)
_FLAGS = frozenset({"left_plateau"})
# values the wording reads, not shown with the event (the loss's progress at the run's end)
_UNSHOWN = frozenset({"progress_end"})

_STATE_OF: dict[Signal, type[_State]] = {
    Signal.ACTIVATION: ActState, Signal.GRADIENT: GradState, Signal.GAIN: GainState, Signal.FINITE: FiniteState,
    Signal.UPDATE: UpdateState, Signal.INPUT: InputState, Signal.LOSS: LossState, Signal.TARGET: TargetState,
    Signal.LR: LrState, Signal.ATTENTION: AttnState, Signal.RANGE: RangeState, Signal.SPIKE: SpikeState,
    Signal.SCALER: ScalerState, Signal.WEIGHTS: WeightState}


@dataclass
class SemanticEvent:
    """A state transition: ``layer`` went from ``before`` to ``after`` at ``step``.

    ``layer`` is the module name, ``""`` for the model as a whole (updates, loss) or ``"input"``.
    ``values`` holds the numbers behind it at the onset; ``end`` is the step it left the state
    (None while it still holds at the end of the trace). ``rank``: the process it was seen on, in a
    multi-process run (None: one process, or every rank alike).
    """

    step: int
    layer: str
    signal: Signal
    before: _State
    after: _State
    values: dict = field(default_factory=dict)
    end: int | None = None
    rank: int | None = None

    @property
    def bad(self) -> bool:
        return not self.after.healthy

    def describe(self) -> str:
        where = {"": "the model", "input": "the input"}.get(self.layer, f"`{self.layer}`")
        if self.rank is not None:
            where += f" on rank {self.rank}"
        if self.signal == Signal.FINITE:
            return f"step {self.step}: " + (f"NaN/Inf appears in {where}" if self.bad else f"{where} is finite again")
        # (a flag that is not set says nothing)
        nums = ", ".join(f"{k} {number(v)}" for k, v in self.values.items()
                         if k not in _UNSHOWN and not (k in _FLAGS and not v))
        what = "loss (its classification term)" if self.values.get("term") else str(self.signal)
        text = f"step {self.step}: {what} {self.before} -> {self.after} in {where}"
        return text + (f" ({nums})" if nums else "")

    def __str__(self) -> str:
        return self.describe()


def debounce(codes: np.ndarray, persist: int, cut: np.ndarray | None = None) -> np.ndarray:
    """Hysteresis along axis 0: a code is accepted once it holds ``persist`` consecutive rows, or holds up to
    a row where ``cut`` is set (after which what was measured no longer exists: the model was replaced);
    until then the previously accepted code (initially 0, the healthy state) stands. A negative
    code means "not measured" and continues the state before it."""
    codes = np.asarray(codes)
    squeeze = codes.ndim == 1
    c = codes[:, None] if squeeze else codes
    t = c.shape[0]
    k = max(int(persist), 1)
    if t == 0:
        return codes.copy()
    if (c < 0).any():  # no information at a sample (nothing measured): the last known state goes on
        idx = np.maximum.accumulate(np.where(c >= 0, np.arange(t)[:, None], -1), axis=0)
        c = np.where(idx >= 0, np.take_along_axis(c, np.maximum(idx, 0), axis=0), 0).astype(c.dtype)
    ok = np.ones(c.shape, dtype=bool)
    held = np.ones(c.shape, dtype=bool)   # the code of row r still holds at row r + i
    ended = np.zeros(c.shape, dtype=bool)  # ... up to a cut, before ``persist`` rows
    cut = np.zeros(t, dtype=bool) if cut is None else np.asarray(cut, dtype=bool)
    for i in range(1, k):
        ended |= held & np.roll(cut, -(i - 1))[:, None] & (np.arange(t) + i - 1 < t)[:, None]
        same = np.zeros(c.shape, dtype=bool)
        if i < t:
            same[:t - i] = c[i:] == c[:t - i]
        held &= same
        ok &= same
    ok |= ended & (c != 0)
    idx = np.where(ok, np.arange(t)[:, None], -1)
    idx = np.maximum.accumulate(idx, axis=0)
    out = np.where(idx >= 0, np.take_along_axis(c, np.maximum(idx, 0), axis=0), 0).astype(c.dtype)
    return out[:, 0] if squeeze else out


def transitions(stable: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(row, column, from code, to code) for every change of a debounced (T, K) array, starting from 0."""
    prev = np.concatenate([np.zeros((1, stable.shape[1]), dtype=stable.dtype), stable[:-1]], axis=0)
    rows, cols = np.nonzero(stable != prev)
    return [(int(r), int(c), int(prev[r, c]), int(stable[r, c])) for r, c in zip(rows, cols)]


def _series_events(series: StateSeries, stable: np.ndarray, cols: np.ndarray) -> list[SemanticEvent]:
    enum = _STATE_OF[series.signal]
    steps = series.steps
    out: list[SemanticEvent] = []
    count: dict[int, int] = {}
    last_open: dict[int, SemanticEvent] = {}
    for r, j, a, b in sorted(transitions(stable), key=lambda e: (e[1], e[0])):
        c = int(cols[j])
        if c in last_open:
            last_open.pop(c).end = int(steps[r])
        if count.get(c, 0) >= MAX_PER_SERIES:
            continue
        count[c] = count.get(c, 0) + 1
        after = enum.of(b)
        glob = _global(series)
        values = {k: (f(r) if glob else f(r, c)) for k, f in series.values.get(after, {}).items()}
        ev = SemanticEvent(step=int(steps[r]), layer=series.names[c], signal=series.signal, before=enum.of(a),
                           after=after, values=values)
        out.append(ev)
        if b != 0:
            last_open[c] = ev
    return out


def _global(series: StateSeries) -> bool:
    return series.signal in (Signal.UPDATE, Signal.INPUT, Signal.LOSS, Signal.TARGET, Signal.LR, Signal.SCALER,
                             Signal.WEIGHTS)


def _cut(steps: np.ndarray, replaced: np.ndarray) -> np.ndarray:
    """Rows after which the model was replaced: a replacing update at their step or before the next row."""
    if not len(replaced) or not len(steps):
        return np.zeros(len(steps), dtype=bool)
    nxt = np.append(steps[1:], np.iinfo(np.int64).max)
    at = np.searchsorted(replaced, steps, side="left")
    return (at < len(replaced)) & (replaced[np.minimum(at, len(replaced) - 1)] < nxt)


def detect(table: HealthTable, th: Thresholds) -> list[SemanticEvent]:
    """All events of a health table, in step order (ties: forward order of the layers)."""
    events: list[SemanticEvent] = []
    for series in table.series:
        codes = series.codes
        if codes.size == 0:
            continue
        cols = np.nonzero(codes.any(axis=0))[0]  # columns that ever leave the healthy state
        if len(cols) == 0:
            continue
        persist = th.persist if series.persist is None else series.persist
        stable = debounce(codes[:, cols], persist, _cut(series.steps, table.replaced))
        events += _series_events(series, stable, cols)
    rank = {l.name: int(o) for l, o in zip(table.layers, table.order)}
    events.sort(key=lambda e: (e.step, rank.get(e.layer, -1)))
    return events
