"""Semanticization, part 2: health states -> semantic events (state transitions, with hysteresis).

A state becomes an event only after it has held for ``Thresholds.persist`` consecutive samples;
the event's step is the first of them. Shorter excursions are ignored, so a layer that flickers
between two states produces no events. The event list is bounded: at most ``MAX_PER_SERIES``
transitions per (signal, layer).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .health import HealthTable
from .states import ActState, FiniteState, GainState, GradState, InputState, LossState, Signal, UpdateState
from .thresholds import Thresholds

MAX_PER_SERIES = 16

_STATE_OF = {Signal.ACTIVATION: ActState, Signal.GRADIENT: GradState, Signal.GAIN: GainState,
             Signal.FINITE: FiniteState, Signal.UPDATE: UpdateState, Signal.INPUT: InputState,
             Signal.LOSS: LossState}


@dataclass
class SemanticEvent:
    """A state transition: ``layer`` went from ``before`` to ``after`` at ``step``.

    ``layer`` is the module name, ``""`` for the model as a whole (updates, loss) or ``"input"``.
    ``values`` holds the numbers behind it at the onset; ``end`` is the step it left the state
    (None while it still holds at the end of the trace).
    """

    step: int
    layer: str
    signal: Signal
    before: object
    after: object
    values: dict = field(default_factory=dict)
    end: int | None = None

    @property
    def bad(self) -> bool:
        return not self.after.healthy

    def describe(self) -> str:
        where = {"": "the model", "input": "the input"}.get(self.layer, f"`{self.layer}`")
        nums = ", ".join(f"{k} {_fmt(v)}" for k, v in self.values.items())
        return f"step {self.step}: {self.signal} {self.before} -> {self.after} in {where}" + (f" ({nums})" if nums else "")

    def __str__(self) -> str:
        return self.describe()


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    a = abs(v)
    return f"{v:.3g}" if (a == 0 or 1e-3 <= a < 1e4) else f"{v:.2e}"


def debounce(codes: np.ndarray, persist: int) -> np.ndarray:
    """Hysteresis along axis 0: a code is accepted once it holds ``persist`` consecutive rows;
    until then the previously accepted code (initially 0, the healthy state) stands."""
    codes = np.asarray(codes)
    squeeze = codes.ndim == 1
    c = codes[:, None] if squeeze else codes
    t = c.shape[0]
    k = max(int(persist), 1)
    if t == 0:
        return codes.copy()
    ok = np.ones(c.shape, dtype=bool)
    for i in range(1, k):
        same = np.zeros(c.shape, dtype=bool)
        if i < t:
            same[:t - i] = c[i:] == c[:t - i]
        ok &= same
    idx = np.where(ok, np.arange(t)[:, None], -1)
    idx = np.maximum.accumulate(idx, axis=0)
    out = np.where(idx >= 0, np.take_along_axis(c, np.maximum(idx, 0), axis=0), 0).astype(c.dtype)
    return out[:, 0] if squeeze else out


def transitions(stable: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(row, column, from code, to code) for every change of a debounced (T, K) array, starting from 0."""
    prev = np.concatenate([np.zeros((1, stable.shape[1]), dtype=stable.dtype), stable[:-1]], axis=0)
    rows, cols = np.nonzero(stable != prev)
    return [(int(r), int(c), int(prev[r, c]), int(stable[r, c])) for r, c in zip(rows, cols)]


def _series_events(stable: np.ndarray, steps: np.ndarray, signal: Signal, names: list[str],
                   values_of) -> list[SemanticEvent]:
    enum = _STATE_OF[signal]
    out: list[SemanticEvent] = []
    count: dict[int, int] = {}
    last_open: dict[int, SemanticEvent] = {}
    for r, c, a, b in sorted(transitions(stable), key=lambda e: (e[1], e[0])):
        if c in last_open:
            last_open.pop(c).end = int(steps[r])
        if count.get(c, 0) >= MAX_PER_SERIES:
            continue
        count[c] = count.get(c, 0) + 1
        ev = SemanticEvent(step=int(steps[r]), layer=names[c], signal=signal, before=enum.of(a), after=enum.of(b),
                           values=values_of(r, c, enum.of(b)))
        out.append(ev)
        if b != 0:
            last_open[c] = ev
    return out


_LAYER_VALUES = {
    Signal.ACTIVATION: {ActState.DEAD: ("dead_fraction",), ActState.SATURATED: ("saturated_fraction",),
                        ActState.ANOMALOUS: ("act_std", "act_growth")},
    Signal.GRADIENT: {GradState.VANISHING: ("attenuation", "relative_grad"),
                      GradState.EXPLODING: ("attenuation", "grad_growth", "relative_grad")},
    Signal.GAIN: {GainState.SHRINKS: ("gain",), GainState.AMPLIFIES: ("gain",)},
    Signal.FINITE: {},
}


def detect(table: HealthTable, th: Thresholds) -> list[SemanticEvent]:
    """All events of a health table, in step order (ties: forward order of the layers)."""
    n = table.numbers
    names = [l.name for l in table.layers]
    steps = table.steps
    events: list[SemanticEvent] = []
    for signal, codes in ((Signal.ACTIVATION, table.act), (Signal.GRADIENT, table.grad), (Signal.GAIN, table.gain),
                          (Signal.FINITE, table.finite)):
        keys = _LAYER_VALUES[signal]
        persist = 1 if signal == Signal.FINITE else th.persist

        def values_of(r, c, state, keys=keys):
            return {k: float(n[k][r, c]) for k in keys.get(state, ())}

        events += _series_events(debounce(codes, persist), steps, signal, names, values_of)

    def global_values(*keys):
        return lambda r, c, state: {k: float(n[k][r]) for k in keys}

    events += _series_events(debounce(table.update, th.persist)[:, None], steps, Signal.UPDATE, [""],
                             global_values("update_median", "update_max", "lr"))
    events += _series_events(debounce(table.input, 1)[:, None], steps, Signal.INPUT, ["input"],
                             global_values("input_mean", "input_std", "input_absmax"))
    ln = table.loss_numbers
    if len(table.loss):
        def loss_values(r, c, state):
            return {"loss": float(ln["value"][r]), "start": float(ln["start"]), "best": float(ln["best"][r])}
        events += _series_events(debounce(table.loss, th.persist)[:, None], table.loss_steps, Signal.LOSS, [""],
                                 loss_values)
    rank = {name: int(o) for name, o in zip(names, table.order)}
    events.sort(key=lambda e: (e.step, rank.get(e.layer, -1)))
    return events
