"""The rank axis of a trace: what each rank of a multi-process run records for comparison with the others.

Two bounded series, both with a leading rank axis of ``world`` columns (NaN where a rank's values are
not known here; a rank fills its own column, rank 0 also the ones gathered from the others):

- ``rows``: at merge steps, one fixed-length float64 row per rank (see ``RankLayout``): per layer a
  signed checksum of the weights and the norm it is measured against, and projections of the rank's
  own (local) gradient and of the gradient after the all-reduce on ``PROJECTIONS`` fixed sign patterns
  (linear: the mean of the ranks' projections is the projection of their mean); a few channels of
  each BatchNorm's running mean and variance; where the rank's first NaN/Inf came from.
- ``batches``: at every step, per rank, a fingerprint of the batch (equal batches, equal fingerprints)
  and the RMS of the values it was taken from.

Float64 so that checksums of replicas that should be bit-identical compare exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace import BoundedSeries

# BatchNorm channels compared per layer (an evenly strided subset of them).
BN_SLOTS = 16

# Fixed sign patterns each gradient is projected on.
PROJECTIONS = 2

# What a row holds at the end, after the per-layer blocks and the BatchNorm channels.
TAIL = ("nonfinite_step", "nonfinite_phase", "nonfinite_layer", "passes")

# Phases of a NaN/Inf origin, coded in a row (the order in which a phase explains the next).
PHASES = ("input", "forward", "loss", "backward", "weights", "unknown")

# The layout of a row; a file whose rank section has another is read without it.
LAYOUT_VERSION = 1

ROW_CAPACITY = 256
BATCH_CAPACITY = 4096
MAX_CAPACITY = 1 << 20   # what a file may declare (a larger one is not a trace this writes)
MAX_WORLD = 1 << 16


@dataclass(frozen=True)
class RankLayout:
    """Where each quantity sits in a row. ``bn``: (layer index, channel count, channels compared)."""

    n_layers: int
    bn: tuple[tuple[int, int, tuple[int, ...]], ...] = ()

    # per-layer blocks and how many values each holds per layer
    BLOCKS = (("checksum", 1), ("wnorm", 1), ("grad_local", PROJECTIONS), ("grad_reduced", PROJECTIONS))

    @property
    def _per_layer(self) -> int:
        return sum(w for _, w in self.BLOCKS) * self.n_layers

    @property
    def length(self) -> int:
        return self._per_layer + 2 * BN_SLOTS * len(self.bn) + len(TAIL)

    def block(self, row: np.ndarray, name: str) -> np.ndarray:
        """One per-layer block of a row (or of rows: the last axis is the row): (..., n_layers), or
        (..., PROJECTIONS, n_layers) for the gradient projections."""
        k = 0
        for block, width in self.BLOCKS:
            if block == name:
                part = row[..., k:k + width * self.n_layers]
                return part if width == 1 else part.reshape(*part.shape[:-1], width, self.n_layers)
            k += width * self.n_layers
        raise KeyError(name)

    def bn_block(self, row: np.ndarray, which: str) -> np.ndarray:
        """Running ``mean`` or ``var`` of the BatchNorm layers: (..., n_bn, BN_SLOTS)."""
        k = self._per_layer + (0 if which == "mean" else BN_SLOTS * len(self.bn))
        part = row[..., k:k + BN_SLOTS * len(self.bn)]
        return part.reshape(*part.shape[:-1], len(self.bn), BN_SLOTS)

    def tail(self, row: np.ndarray, name: str) -> np.ndarray:
        return row[..., self.length - len(TAIL) + TAIL.index(name)]

    def to_dict(self) -> dict:
        return {"n_layers": self.n_layers, "bn": [[i, c, list(p)] for i, c, p in self.bn]}

    @classmethod
    def from_dict(cls, d: dict) -> "RankLayout":
        return cls(n_layers=int(d["n_layers"]),
                   bn=tuple((int(i), int(c), tuple(int(x) for x in p)) for i, c, p in d.get("bn", [])))


def bn_channels(n: int) -> tuple[int, ...]:
    """The channels of an ``n``-channel BatchNorm that are compared across ranks."""
    if n <= BN_SLOTS:
        return tuple(range(n))
    return tuple(int(i) for i in np.linspace(0, n - 1, BN_SLOTS).round())


class RankSeries:
    """The rank axis of one trace (see the module docstring)."""

    def __init__(self, layout: RankLayout, world: int, rank: int, *, rows: BoundedSeries | None = None,
                 batches: BoundedSeries | None = None):
        self.layout = layout
        self.world = int(world)
        self.rank = int(rank)
        self.rows = rows or BoundedSeries((self.world, layout.length), ROW_CAPACITY, dtype=np.float64)
        self.batches = batches or BoundedSeries((self.world, 2), BATCH_CAPACITY, dtype=np.float64)

    # -- writing ---------------------------------------------------------------------------------
    def add_row(self, step: int, rows: dict[int, np.ndarray]) -> None:
        full = np.full((self.world, self.layout.length), np.nan)
        for r, row in rows.items():
            full[r] = row
        self.rows.append(step, full)

    def add_batches(self, steps: np.ndarray, values: dict[int, np.ndarray]) -> None:
        """``values[r]``: (len(steps), 2) fingerprints and RMS of rank r at ``steps``."""
        for i, s in enumerate(steps):
            full = np.full((self.world, 2), np.nan)
            for r, v in values.items():
                full[r] = v[i]
            self.batches.append(int(s), full)

    def fill(self, rank: int, step: int, row: np.ndarray, steps: np.ndarray, batches: np.ndarray) -> None:
        """Another rank's row at merge ``step`` and its batches at ``steps``, into rows and batches kept
        already (those thinned away meanwhile are skipped)."""
        at = np.nonzero(self.rows.steps == step)[0]
        if len(at):
            self.rows.data[at[-1], rank] = row
        if len(steps) and self.batches.n:
            have = self.batches.steps
            idx = np.searchsorted(have, steps)
            ok = (idx < len(have)) & (have[np.minimum(idx, len(have) - 1)] == steps)
            self.batches.data[idx[ok], rank] = batches[ok]

    def copy(self) -> "RankSeries":
        """The rows and batches so far, copied (the copy does not change when this series does)."""
        return RankSeries(self.layout, self.world, self.rank, rows=self.rows.copy(), batches=self.batches.copy())

    # -- reading ---------------------------------------------------------------------------------
    def ranks_with_rows(self) -> list[int]:
        known = np.isfinite(self.rows.data).any(axis=(0, 2)) if self.rows.n else np.zeros(self.world, bool)
        return [int(r) for r in np.nonzero(known)[0]]

    # -- files -----------------------------------------------------------------------------------
    def header(self) -> dict:
        return {"version": LAYOUT_VERSION, "layout": self.layout.to_dict(), "world": self.world, "rank": self.rank,
                "row_capacity": self.rows.capacity, "batch_capacity": self.batches.capacity}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"rank_row_steps": self.rows.steps.astype("<i8"), "rank_rows": self.rows.data.astype("<f8"),
                "rank_batch_steps": self.batches.steps.astype("<i8"),
                "rank_batches": self.batches.data.astype("<f8")}

    @classmethod
    def from_arrays(cls, header: dict, arrays: dict[str, np.ndarray], n_layers: int) -> "RankSeries":
        layout = RankLayout.from_dict(header["layout"])
        world, rank = int(header["world"]), int(header["rank"])
        if not 0 <= rank < world or world > MAX_WORLD:
            raise ValueError(f"rank {rank} of a world of {world}")
        if layout.n_layers != n_layers or any(not 0 <= i < n_layers or len(p) > BN_SLOTS for i, _, p in layout.bn):
            raise ValueError("the rank layout does not match the layers")
        caps = (int(header["row_capacity"]), int(header["batch_capacity"]))
        if not all(4 <= c <= MAX_CAPACITY for c in caps):
            raise ValueError(f"rank series capacities {caps} out of range")
        rows, batches = arrays["rank_rows"], arrays["rank_batches"]
        if (rows.shape[1:] != (world, layout.length) or batches.shape[1:] != (world, 2)
                or len(rows) != len(arrays["rank_row_steps"]) or len(batches) != len(arrays["rank_batch_steps"])):
            raise ValueError("rank arrays have inconsistent shapes")
        return cls(layout, world, rank,
                   rows=BoundedSeries.from_arrays(arrays["rank_row_steps"], rows, caps[0]),
                   batches=BoundedSeries.from_arrays(arrays["rank_batch_steps"], batches, caps[1]))

    @classmethod
    def combine(cls, parts: list["RankSeries"], rank: int = 0) -> "RankSeries":
        """One series from the series of several files of the same run: each rank's column from its own
        file where there is one, else from any other file that gathered it. Steps are the union."""
        world, layout = parts[0].world, parts[0].layout
        merged: list[dict[int, np.ndarray]] = [{}, {}]
        widths = (layout.length, 2)
        for own_pass in (True, False):  # each rank's own measurements first, copies gathered by others after
            for p in parts:
                for target, series, width in zip(merged, (p.rows, p.batches), widths):
                    for s, data in zip(series.steps, series.data):
                        full = target.setdefault(int(s), np.full((world, width), np.nan))
                        for c in range(world):
                            if (c == p.rank) == own_pass and np.isnan(full[c]).all() and not np.isnan(data[c]).all():
                                full[c] = data[c]
        out = cls(layout, world, rank)
        out.rows = _series(merged[0], (world, layout.length), max(ROW_CAPACITY, len(merged[0])))
        out.batches = _series(merged[1], (world, 2), max(BATCH_CAPACITY, len(merged[1])))
        return out


def _series(by_step: dict[int, np.ndarray], shape: tuple[int, ...], capacity: int) -> BoundedSeries:
    steps = np.array(sorted(by_step), dtype=np.int64)
    data = np.stack([by_step[int(s)] for s in steps]) if len(steps) else np.zeros((0, *shape))
    return BoundedSeries.from_arrays(steps, data.astype(np.float64), capacity)
