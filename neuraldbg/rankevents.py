"""Semanticization across ranks: the rank axis of a run -> states -> events naming the rank.

What is compared, at the same global step on every rank (the steps are the same by construction):
- replicas: each layer's weight checksum, against the value most ranks share (ties: the lowest rank);
  data-parallel replicas are bit-identical, so any difference beyond ``replica_divergence`` is real;
- batches: fingerprints equal on several ranks at the same step (every rank trains on the same data),
  or equal on one rank at a fixed distance of two steps or more (the same batches in the same order
  every epoch; a distance of one step is full-batch training, by design);
- input scale: the RMS of a rank's batches against the median rank's (of two, the one further from unit
  scale is the odd one): its own shard out of scale;
- BatchNorm: running means (in running standard deviations) and variances, rank against rank;
- gradient scale: the gradient after the all-reduce against the mean of the ranks' own gradients, both
  projected on fixed sign patterns (linear, so an average gives exactly 1, a sum the world size);
- NaN/Inf: where each rank first saw one, and which rank saw it first.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from .events import SemanticEvent, debounce
from .layers import LayerInfo
from .ranktrace import PHASES, RankLayout, RankSeries
from .states import _State
from .thresholds import Thresholds
from .trace import NonFiniteOrigin, Trace


class RankSignal(str, Enum):
    """What a rank event is about."""

    REPLICA = "replica"
    BATCH = "batch"
    RANK_INPUT = "rank input"
    BN_RANKS = "batchnorm across ranks"
    GRAD_SCALE = "gradient scale"

    def __str__(self) -> str:
        return self.value


class ReplicaState(_State):
    SYNCED = "synced"
    DIVERGED = "diverged"


class BatchState(_State):
    DISTINCT = "distinct"
    SHARED = "shared across ranks"
    REPEATED = "repeated every epoch"


class RankInputState(_State):
    MATCHED = "matched"
    OUT_OF_SCALE = "out of scale"


class BnRankState(_State):
    MATCHED = "matched"
    DIFFERENT = "different"


class GradScaleState(_State):
    AVERAGED = "averaged"
    SUMMED = "summed"


# Fingerprints closer than this (relative) are the same batch: float32 sums of the same values differ
# in their last bits when reduced in another order; different batches differ by far more.
SAME_BATCH = 1e-6


@dataclass
class RankEvidence:
    """What the rules read about the other ranks. ``rank``: the rank whose trace is being analysed."""

    world: int
    present: list[int]
    events: list[SemanticEvent] = field(default_factory=list)
    origins: dict[int, NonFiniteOrigin] = field(default_factory=dict)
    shared: list[tuple[int, ...]] = field(default_factory=list)   # groups of ranks that share batches
    rank: int | None = None

    def for_rank(self, rank: int) -> "RankEvidence":
        return replace(self, rank=rank)

    @property
    def first(self) -> tuple[int, NonFiniteOrigin] | None:
        """The rank whose NaN/Inf came first (earliest step, then the phase that produces the next)."""
        if not self.origins:
            return None
        r = min(self.origins, key=lambda r: (self.origins[r].step, _phase(self.origins[r].phase), r))
        return r, self.origins[r]

    def nonfinite(self, own: NonFiniteOrigin | None) -> NonFiniteOrigin | None:
        """Where the run's NaN/Inf came from: the first rank's origin, which reaches the others through the
        all-reduce; this rank's own when no rank's is known."""
        first = self.first
        return first[1] if first is not None else own

    def of(self, signal: RankSignal) -> list[SemanticEvent]:
        return [e for e in self.events if e.signal == signal]


def _phase(phase: str) -> int:
    return PHASES.index(phase) if phase in PHASES else len(PHASES)


def evidence(series: RankSeries | None, traces: dict[int, Trace], layers: list[LayerInfo],
             th: Thresholds) -> RankEvidence:
    world = series.world if series is not None else max(traces) + 1
    present = sorted(traces)
    ev = RankEvidence(world=world, present=present)
    ev.origins = {r: t.nonfinite for r, t in traces.items() if t.nonfinite is not None}
    if series is None:
        return ev
    names = [l.name for l in layers]
    _origins_from_rows(ev, series, names)
    events: list[SemanticEvent] = []
    with warnings.catch_warnings():  # ranks and layers with nothing measured are NaN by design
        warnings.simplefilter("ignore", RuntimeWarning)
        if series.rows.n:
            events += _replicas(series, names, th)
            events += _batchnorm(series, names, th)
            events += _grad_scale(series, th)
        if series.batches.n:
            shared, ev.shared = _shared_batches(series, th)
            events += shared + _repeated_batches(series, th) + _input_scale(series, th)
    order = {l.name: (l.order if l.order is not None else 1 << 30) for l in layers}
    events.sort(key=lambda e: (e.step, order.get(e.layer, -1), -1 if e.rank is None else e.rank))
    ev.events = events
    return ev


def _origins_from_rows(ev: RankEvidence, series: RankSeries, names: list[str]) -> None:
    """NaN/Inf origins of ranks whose trace is not here, from the rows gathered or merged."""
    lay = series.layout
    for r in range(series.world):
        if r in ev.origins:
            continue
        steps = lay.tail(series.rows.data[:, r], "nonfinite_step")
        ok = np.nonzero(np.isfinite(steps))[0]
        if not len(ok):
            continue
        row = series.rows.data[ok[0], r]
        phase = int(lay.tail(row, "nonfinite_phase"))
        layer = int(lay.tail(row, "nonfinite_layer"))
        ev.origins[r] = NonFiniteOrigin(step=int(steps[ok[0]]), layer=names[layer] if 0 <= layer < len(names) else "",
                                        phase=PHASES[phase] if 0 <= phase < len(PHASES) else "unknown",
                                        detail="from the statistics gathered across ranks")


def _event(step, layer, signal, before, after, rank, **values) -> SemanticEvent:
    return SemanticEvent(step=int(step), layer=layer, signal=signal, before=before, after=after,
                         values={k: float(v) for k, v in values.items()}, rank=rank)


def _onsets(codes: np.ndarray, persist: int) -> list[tuple[int, int]]:
    """(row, column) where each column first holds code > 0 for ``persist`` rows (NaN-free int codes)."""
    stable = debounce(codes, persist)
    out = []
    for c in range(stable.shape[1]):
        rows = np.nonzero(stable[:, c] > 0)[0]
        if len(rows):
            out.append((int(rows[0]), c))
    return out


# -- replicas --------------------------------------------------------------------------------------

def _reference(values: np.ndarray, scale: np.ndarray, tol: float) -> np.ndarray:
    """Per layer, the rank whose value most ranks share within ``tol * scale`` (ties: the lowest rank).
    ``values``: (W, L) at one row."""
    close = np.abs(values[:, None, :] - values[None, :, :]) <= tol * np.nan_to_num(scale, nan=0.0)[None, None, :]
    votes = np.where(np.isfinite(values), close.sum(axis=1), -1)            # (W, L)
    return np.argmax(votes, axis=0)                                          # (L,): the first maximum


def _replicas(series: RankSeries, names: list[str], th: Thresholds) -> list[SemanticEvent]:
    lay, data, steps = series.layout, series.rows.data, series.rows.steps
    ck, wn = lay.block(data, "checksum"), lay.block(data, "wnorm")          # (T, W, L)
    red = lay.block(data, "grad_reduced")                                   # (T, W, P, L)
    t_rows, w, n = ck.shape
    rel, grel, refs = np.zeros((t_rows, w, n)), np.zeros((t_rows, w, n)), np.zeros((t_rows, n), dtype=int)
    cols = np.arange(n)
    for t in range(t_rows):  # one row at a time: (W, W, L) comparisons, whatever the run's length
        wmax = np.nanmax(np.where(np.isfinite(wn[t]), wn[t], np.nan), axis=0)
        ref = _reference(ck[t], wmax, th.replica_divergence)
        refs[t] = ref
        scale = wn[t][ref, cols]
        rel[t] = np.abs(ck[t] - ck[t][ref, cols]) / np.where(scale > 0, scale, np.nan)
        red_ref = red[t][ref, :, cols].T                                    # (P, L)
        gscale = np.sqrt(np.nanmean(red_ref ** 2, axis=0))
        grel[t] = np.nanmax(np.abs(red[t] - red_ref[None]), axis=1) / np.where(gscale > 0, gscale, np.nan)
    out = []
    for r in range(series.world):
        codes = (np.nan_to_num(rel[:, r], nan=0.0) > th.replica_divergence).astype(np.int8)
        for i, l in _onsets(codes, 1):
            out.append(_event(steps[i], names[l], RankSignal.REPLICA, ReplicaState.SYNCED, ReplicaState.DIVERGED, r,
                              divergence=rel[i, r, l], grad_divergence=np.nan_to_num(grel[i, r, l], nan=0.0),
                              reference_rank=refs[i, l]))
    return out


# -- batches ---------------------------------------------------------------------------------------

def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) <= SAME_BATCH * np.maximum(np.maximum(np.abs(a), np.abs(b)), 1.0)


def _shared_batches(series: RankSeries, th: Thresholds) -> tuple[list[SemanticEvent], list[tuple[int, ...]]]:
    fp, steps = series.batches.data[:, :, 0], series.batches.steps                  # (T, W)
    known = np.isfinite(fp)
    compared = known.sum(axis=1) >= 2
    if not compared.any():
        return [], []
    pair = _same(fp[:, :, None], fp[:, None, :]) & known[:, :, None] & known[:, None, :]
    w = series.world
    pair[:, np.arange(w), np.arange(w)] = False
    both = (known[:, :, None] & known[:, None, :]).sum(axis=0)
    share = pair.sum(axis=0) / np.maximum(both, 1)                                   # (W, W)
    linked = share >= th.duplicate_batches
    if not linked.any():
        return [], []
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for r in range(w):
        if r in seen or not linked[r].any():
            continue
        g = tuple(sorted({r, *np.nonzero(linked[r])[0].tolist()}))
        seen.update(g)
        groups.append(g)
    in_group = np.zeros(w, dtype=bool)
    in_group[[r for g in groups for r in g]] = True
    hit = (pair[:, in_group][:, :, in_group]).any(axis=(1, 2))
    first = int(np.nonzero(hit)[0][0])
    overall = float(hit[compared].mean())
    ranks_sharing = int(in_group.sum())
    return [_event(steps[first], "input", RankSignal.BATCH, BatchState.DISTINCT, BatchState.SHARED, None,
                   share=overall, ranks=ranks_sharing)], groups


def _repeated_batches(series: RankSeries, th: Thresholds) -> list[SemanticEvent]:
    fp, steps = series.batches.data[:, :, 0], series.batches.steps
    out = []
    for r in range(series.world):
        ok = np.isfinite(fp[:, r])
        s, v = steps[ok], fp[ok, r]
        if len(s) < 4:
            continue
        last: dict[float, int] = {}
        lags: list[tuple[int, int]] = []       # (step, distance to the same batch before it)
        for step, value in zip(s.tolist(), v.tolist()):
            key = float(f"{value:.6g}")
            if key in last:
                lags.append((step, step - last[key]))
            last[key] = step
        if not lags:
            continue
        dist, counts = np.unique([d for _, d in lags], return_counts=True)
        period = int(dist[np.argmax(counts)])
        if period < 2:
            continue  # the same batch every step: full-batch training
        repeats = [st for st, d in lags if d == period]
        eligible = int((s >= s[0] + period).sum())
        share = len(repeats) / max(eligible, 1)
        if len(repeats) >= 2 and share >= th.duplicate_batches:
            out.append(_event(repeats[0], "input", RankSignal.BATCH, BatchState.DISTINCT, BatchState.REPEATED, r,
                              period=period, share=share))
    return out


def _input_scale(series: RankSeries, th: Thresholds) -> list[SemanticEvent]:
    rms, steps = series.batches.data[:, :, 1], series.batches.steps              # (T, W)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(np.where(rms > 0, rms, np.nan))
    w = series.world
    if w < 2:
        return []
    if w == 2:
        ref = log[:, ::-1]
        # of two ranks, the odd one is the one further from unit scale
        odd = np.abs(log) >= np.abs(ref)
    else:  # the median rank's scale: what most ranks' data looks like
        ref = np.repeat(np.nanmedian(log, axis=1, keepdims=True), w, axis=1)
        odd = np.ones_like(log, dtype=bool)
    dev = log - ref
    codes = ((np.abs(np.nan_to_num(dev, nan=0.0)) > math.log(th.rank_input_scale)) & odd).astype(np.int8)
    out = []
    for i, r in _onsets(codes, th.persist):
        out.append(_event(steps[i], "input", RankSignal.RANK_INPUT, RankInputState.MATCHED, RankInputState.OUT_OF_SCALE,
                          r, input_rms=rms[i, r], others_rms=math.exp(ref[i, r]), ratio=math.exp(dev[i, r])))
    return out


# -- BatchNorm -------------------------------------------------------------------------------------

def _batchnorm(series: RankSeries, names: list[str], th: Thresholds) -> list[SemanticEvent]:
    lay: RankLayout = series.layout
    if not lay.bn:
        return []
    data, steps = series.rows.data, series.rows.steps
    mean, var = lay.bn_block(data, "mean"), lay.bn_block(data, "var")           # (T, W, B, S)
    t_rows, w, b, _ = mean.shape
    dist = np.full((t_rows, w, w, b), np.nan)
    for t in range(t_rows):  # rank against rank, one row at a time
        sd = np.sqrt(np.nanmean(var[t], axis=0))                                 # (B, S)
        dm = (mean[t][:, None] - mean[t][None, :]) / sd                          # (W, W, B, S)
        lv = np.log(var[t][:, None] / var[t][None, :])
        dist[t] = np.sqrt(np.nanmean(np.maximum(dm ** 2, lv ** 2), axis=-1))
    known = np.isfinite(dist)
    spread = np.where(known, dist, -np.inf).max(axis=(1, 2))                       # (T, B)
    codes = (spread > th.bn_rank_spread).astype(np.int8)
    out = []
    for i, j in _onsets(codes, th.persist):
        d = np.where(known[i, :, :, j], dist[i, :, :, j], np.nan)
        per_rank = np.nanmean(d, axis=1)
        # with three ranks or more, the one furthest from the others; of two, neither
        rank = int(np.nanargmax(per_rank)) if w > 2 and np.isfinite(per_rank).sum() > 2 else None
        out.append(_event(steps[i], names[lay.bn[j][0]], RankSignal.BN_RANKS, BnRankState.MATCHED,
                          BnRankState.DIFFERENT, rank, spread=spread[i, j]))
    return out


# -- gradient scale --------------------------------------------------------------------------------

def _grad_scale(series: RankSeries, th: Thresholds) -> list[SemanticEvent]:
    lay, data, steps = series.layout, series.rows.data, series.rows.steps
    local, red = lay.block(data, "grad_local"), lay.block(data, "grad_reduced")     # (T, W, P, L)
    every_rank = np.isfinite(local).any(axis=(2, 3)).all(axis=1)                    # every rank's own gradient known
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(local, axis=1) if every_rank.any() else np.full(local[:, 0].shape, np.nan)  # (T, P, L)
        after = np.nanmedian(red, axis=1) if np.isfinite(red).any() else np.full(red[:, 0].shape, np.nan)
    ok = np.isfinite(mean) & np.isfinite(after)
    # the least-squares slope of the projections after the all-reduce on the mean of the ranks' own
    x, y = np.where(ok, mean, 0.0), np.where(ok, after, 0.0)
    sxx = (x * x).sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(every_rank & (sxx > 0), (x * y).sum(axis=(1, 2)) / sxx, np.nan)
    codes = (np.nan_to_num(ratio, nan=0.0) > th.grad_world_ratio).astype(np.int8)[:, None]
    return [_event(steps[i], "", RankSignal.GRAD_SCALE, GradScaleState.AVERAGED, GradScaleState.SUMMED, None,
                   ratio=ratio[i], world=series.world) for i, _ in _onsets(codes, th.persist)]
