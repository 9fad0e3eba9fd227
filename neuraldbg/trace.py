"""The bounded trace: compact per-layer time series whose memory does not grow with run length.

Each series keeps at most ``capacity`` rows. When full, the older half is thinned to every
other row, so recent steps stay at full resolution and older ones become progressively
sparser: a 1M-step run costs the same memory as a 10k-step one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .layers import LayerInfo
from .stats import N_STATS, Stat

if TYPE_CHECKING:
    from .ranktrace import RankSeries


class BoundedSeries:
    """Rows indexed by step, in fixed memory. The buffer starts small and doubles as rows come, up to
    ``capacity`` rows (a short run does not pay for the memory of a long one)."""

    _FIRST_ROWS = 64
    # indices on the rows' last axis of measurements not taken on every row: when two rows are thinned to
    # one, the one kept takes the other's where it has none (so every other row holding them never loses them)
    carry: tuple[int, ...] = ()

    def __init__(self, row_shape: tuple[int, ...], capacity: int, dtype=np.float32):
        if capacity < 4:
            raise ValueError("capacity must be at least 4")
        self.capacity = int(capacity)
        rows = min(self.capacity, self._FIRST_ROWS)
        self._steps = np.zeros(rows, dtype=np.int64)
        self._data = np.full((rows, *row_shape), np.nan, dtype=dtype)
        self._width = row_shape[0] if row_shape else None
        self.n = 0

    def _grow(self) -> None:
        rows = min(self.capacity, 2 * len(self._steps))
        steps = np.zeros(rows, dtype=np.int64)
        steps[:self.n] = self._steps[:self.n]
        data = np.full((rows, *self._data.shape[1:]), np.nan, dtype=self._data.dtype)
        data[:self.n] = self._data[:self.n]
        self._steps, self._data = steps, data

    def widen(self, width: int) -> None:
        """Grow the first axis of the rows to ``width`` (new entries NaN): a layer table that gained
        layers. The buffer grows geometrically, so a few new layers cost one copy."""
        if self._width is None or width <= self._width:
            return
        if width > self._data.shape[1]:
            grown = np.full((len(self._steps), max(width, 2 * self._data.shape[1]), *self._data.shape[2:]), np.nan,
                            dtype=self._data.dtype)
            grown[:self.n, :self._width] = self._data[:self.n, :self._width]
            self._data = grown
        self._width = width

    def append(self, step: int, row) -> None:
        if self.n == self.capacity:
            self._thin()
        elif self.n == len(self._steps):
            self._grow()
        self._steps[self.n] = step
        if self._width is None or self._width == self._data.shape[1]:
            self._data[self.n] = row
        else:
            self._data[self.n, :self._width] = row
        self.n += 1

    def _thin(self) -> None:
        half = self.capacity // 2
        keep = np.arange(0, half, 2)
        k = len(keep)
        self._steps[:k] = self._steps[keep]
        if self.carry:
            cols = list(self.carry)
            kept, dropped = self._data[keep][..., cols], self._data[keep + 1][..., cols]
            self._data[:k] = self._data[keep]
            self._data[:k, ..., cols] = np.where(np.isnan(kept), dropped, kept)
        else:
            self._data[:k] = self._data[keep]
        rest = self.n - half
        self._steps[k:k + rest] = self._steps[half:self.n]
        self._data[k:k + rest] = self._data[half:self.n]
        self._data[k + rest:] = np.nan
        self.n = k + rest

    @property
    def steps(self) -> np.ndarray:
        return self._steps[:self.n]

    @property
    def data(self) -> np.ndarray:
        if self._width is None or self._width == self._data.shape[1]:
            return self._data[:self.n]
        return self._data[:self.n, :self._width]

    @property
    def nbytes(self) -> int:
        return self._steps.nbytes + self._data.nbytes

    def copy(self) -> "BoundedSeries":
        """The rows so far, copied (the copy does not change when this series does)."""
        return BoundedSeries.from_arrays(self.steps.copy(), self.data.copy(), self.capacity)

    @classmethod
    def from_arrays(cls, steps: np.ndarray, data: np.ndarray, capacity: int) -> "BoundedSeries":
        s = cls(data.shape[1:], max(capacity, len(steps), 4), dtype=data.dtype)
        while len(s._steps) < len(steps):
            s._grow()
        s._steps[:len(steps)] = steps
        s._data[:len(steps)] = data
        s.n = len(steps)
        return s


# Columns of the per-step "global" series, recorded with each sampled step ("loss_scale": the
# GradScaler's scale when one is given, the gradients recorded are divided by it; NaN otherwise).
# input_spread: the largest distance of a batch's samples from its first (0: every sample the same)
GLOBAL_COLUMNS = ("lr", "input_mean", "input_std", "input_absmax", "input_nonfinite", "loss_scale", "input_spread")


@dataclass
class NonFiniteOrigin:
    """Where NaN/Inf first appeared: ``phase`` is one of input, forward, backward, loss, weights.

    ``op``: the operation that made it, when it is not the module's whole computation ("torch.log"),
    with its ``relation`` to ``layer`` ("in" its forward, or "after" it, on its output); ``dtype``:
    the dtype it was computed in ("float16" under autocast: an overflow of its range). In the loss (the model's
    output finite), ``reach``: the output's largest magnitude and largest spread within a row (over dimension
    1), which say whether a probability taken of it rounds to 0 or 1; ``rows``: the share of the output's rows
    whose gradient is NaN/Inf, the share of the other rows whose spread they reach (a softmax rounds first in
    the widest), and whether they lie past every other toward a sigmoid's rounding (1.0, else 0.0)."""

    step: int
    layer: str
    phase: str
    detail: str = ""
    op: str = ""
    relation: str = ""
    dtype: str = ""
    reach: tuple[float, ...] = ()  # (largest magnitude, largest spread within a row); () not measured
    rows: tuple[float, ...] = ()   # (share of rows NaN/Inf, rank of their spread, past the others); () not measured

    def where(self) -> str:
        where = f"`{self.layer}`" if self.layer else "the model"
        return f"{self.op} {self.relation or 'in'} {where}" if self.op else where

    def to_dict(self) -> dict:
        return {"step": self.step, "layer": self.layer, "phase": self.phase, "detail": self.detail, "op": self.op,
                "relation": self.relation, "dtype": self.dtype, "reach": [float(v) for v in self.reach],
                "rows": [float(v) for v in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> "NonFiniteOrigin":
        return cls(step=int(d["step"]), layer=str(d["layer"]), phase=str(d["phase"]), detail=str(d.get("detail", "")),
                   op=str(d.get("op", "")), relation=str(d.get("relation", "")), dtype=str(d.get("dtype", "")),
                   reach=tuple(float(v) for v in d.get("reach", ()))[:2],
                   rows=tuple(float(v) for v in d.get("rows", ()))[:3])


@dataclass
class Trace:
    """Everything the analysis stages read: layer table, per-layer statistics, loss, lr, NaN origin."""

    layers: list[LayerInfo]
    capacity: int = 2048
    loss_capacity: int = 8192
    # made in __post_init__ when not given (their shapes come from the layer table)
    stats: BoundedSeries = None  # type: ignore[assignment]    # rows of shape (n_layers, N_STATS)
    globals: BoundedSeries = None  # type: ignore[assignment]  # rows of (len(GLOBAL_COLUMNS),), steps as stats
    loss: BoundedSeries = None  # type: ignore[assignment]     # rows of shape (), one per recorded loss
    # steps whose optimizer step was skipped (NaN/Inf gradients, e.g. by a GradScaler), with the loss scale then
    skipped: BoundedSeries = None  # type: ignore[assignment]
    nonfinite: NonFiniteOrigin | None = None
    overflow: NonFiniteOrigin | None = None   # where the NaN/Inf of the first skipped step came from
    meta: dict = field(default_factory=dict)
    ranks: RankSeries | None = None      # the rank axis of a multi-process run

    def __post_init__(self):
        if self.stats is None:
            self.stats = BoundedSeries((len(self.layers), N_STATS), self.capacity)
        self.stats.carry = (int(Stat.GRAD_RMS), int(Stat.GRAD_NONFINITE))  # measured on some samples only
        if self.globals is None:
            self.globals = BoundedSeries((len(GLOBAL_COLUMNS),), self.capacity)
        if self.loss is None:
            self.loss = BoundedSeries((), self.loss_capacity)
        if self.skipped is None:
            self.skipped = BoundedSeries((), self.loss_capacity)

    def copy(self) -> "Trace":
        """What is recorded so far, copied: a trace another thread can analyse while this one grows."""
        return Trace([dataclasses.replace(l, extra=dict(l.extra)) for l in self.layers], capacity=self.capacity,
                     loss_capacity=self.loss_capacity, stats=self.stats.copy(), globals=self.globals.copy(),
                     loss=self.loss.copy(), skipped=self.skipped.copy(), nonfinite=self.nonfinite,
                     overflow=self.overflow, meta=dict(self.meta),
                     ranks=self.ranks.copy() if self.ranks is not None else None)

    def add_layers(self, layers: list[LayerInfo]) -> None:
        """Append layers found while watching (functional operations); their past rows are NaN."""
        self.layers.extend(layers)
        self.stats.widen(len(self.layers))

    # -- writing -------------------------------------------------------------------------------
    def add_sample(self, step: int, row: np.ndarray, global_row: np.ndarray) -> None:
        self.stats.append(step, row)
        self.globals.append(step, global_row)

    def add_loss(self, step: int, value: float) -> None:
        self.loss.append(step, value)

    def add_skipped(self, step: int, scale: float) -> None:
        self.skipped.append(step, scale)

    # -- reading -------------------------------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        return [l.name for l in self.layers]

    def execution_order(self) -> list[LayerInfo]:
        """Layers seen in a forward pass, in the order they ran (unseen layers are left out)."""
        return sorted((l for l in self.layers if l.order is not None), key=lambda l: -1 if l.order is None else l.order)

    def unobserved(self) -> dict[str, str]:
        """Watched modules never observed, by name, with why: their forward never ran, or it only
        returned its input (an identity, a dropout at p=0 or in eval mode)."""
        return {l.name: ("returns its input unchanged" if l.extra.get("passthrough") else "its forward never ran")
                for l in self.layers if l.order is None}

    def observed_layers(self) -> list[LayerInfo]:
        """What a view of the trace shows: the layers seen, in forward order, then the ones not observed."""
        return self.execution_order() + [l for l in self.layers if l.order is None]

    def layer(self, name: str) -> LayerInfo:
        for l in self.layers:
            if l.name == name:
                return l
        raise KeyError(name)

    def global_column(self, name: str) -> np.ndarray:
        return self.globals.data[:, GLOBAL_COLUMNS.index(name)]

    @property
    def nbytes(self) -> int:
        return self.stats.nbytes + self.globals.nbytes + self.loss.nbytes + self.skipped.nbytes
