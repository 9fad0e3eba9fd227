"""Semanticization, part 1: statistics -> health states, per layer and sampled step, vectorised.

Everything here is a ratio or a fraction, so one set of thresholds fits many models:
- activation: share of dead units (ReLU family), share of saturated outputs (bounded family, except
  the model's own output, where a confident sigmoid is the goal), growth of the output spread;
- gradient: the relative weight gradient |dW|/|W| of a layer against the largest one after it in
  forward order (attenuation toward the input) and against its own start (growth over time);
- gain: output scale (RMS) over input scale of a weight layer (what its weight scale does to the signal),
  and the scale compounded since the input or the last normalisation layer;
- update: the optimizer's update-to-weight ratio; input: the batch's scale and finiteness;
- loss: smoothed curve against its start (progress of the latest window over the first, rise, oscillation).

States are decided with comparisons only; the numbers behind a state (ratios, fractions) are
computed on demand, at the few places where an event or the latest health needs them. That keeps
re-analysis of a long trace of a large model interactive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import math
import weakref

import numpy as np

from . import losspath
from .layers import GAIN_KINDS, GRADIENT_KINDS, Kind, LayerInfo
from .mixing import TINY as MIXING_TINY
from .states import (ActState, AttnState, GainState, GradState, InputState, LossState, LrState, RangeState,
                     ScalerState, Signal, SpikeState, TargetState, UpdateState, WeightState)
from .stats import Stat
from .thresholds import Thresholds
from .trace import GLOBAL_COLUMNS, Trace
from .trend import rising_z

Value = Callable[..., float]  # (row, column) -> float for layer series, (row,) -> float for global ones


@dataclass
class LayerHealth:
    """One layer's health at one sampled step, with the numbers behind it (NaN: not measured)."""

    layer: str
    step: int
    act: ActState
    grad: GradState
    nonfinite: bool
    gain: GainState = GainState.NORMAL
    values: dict = field(default_factory=dict)


@dataclass
class StateSeries:
    """State codes of one signal: (samples, columns), each column a layer (or the model, or the input).

    ``names`` labels the columns; ``values[state]`` maps a number's name to a function of (row, column).
    """

    signal: Signal
    steps: np.ndarray
    codes: np.ndarray
    names: list[str]
    values: dict = field(default_factory=dict)
    persist: int | None = None   # None: the thresholds' persistence


@dataclass
class HealthTable:
    steps: np.ndarray
    layers: list[LayerInfo]
    order: np.ndarray
    series: list[StateSeries]
    latest: dict[str, LayerHealth]
    # steps whose update replaced the model (the median layer's update at least ``update_replaces`` times its
    # weights): what was measured before one of them was measured on a model that no longer exists
    replaced: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def _ratio(a: np.ndarray, b: np.ndarray) -> Value:
    """a / b at one place; a 1-D ``b`` beside a 2-D ``a`` holds one value per column."""
    def value(r, c=None):
        num = a[r] if c is None else a[r, c]
        den = b[r] if a.ndim == 1 else (b[c] if b.ndim == 1 else b[r, c])
        with np.errstate(all="ignore"):
            return float(num / den) if den > 0 else (0.0 if num == 0 else float("nan"))
    return value


def _at(a: np.ndarray) -> Value:
    return lambda r, c=None: float(a[r] if c is None else a[r, c])


def first_finite(x: np.ndarray) -> np.ndarray:
    """Per column, the first finite positive value (NaN when none); cheap when row 0 has it.
    A zero start (a zero-initialised layer) is no baseline to grow from."""
    if x.shape[0] == 0:
        return np.full(x.shape[1], np.nan, dtype=np.float32)
    out = np.array(x[0], dtype=np.float32)
    missing = np.nonzero(~(np.isfinite(out) & (out > 0)))[0]
    if len(missing):
        sub = x[:, missing]
        ok = np.isfinite(sub) & (sub > 0)
        first = ok.argmax(axis=0)
        out[missing] = np.where(ok.any(axis=0), sub[first, np.arange(len(missing))], np.nan)
    return out


def _later_max(rel: np.ndarray) -> np.ndarray:
    """Along axis 1 (forward order), the largest finite value strictly after each column."""
    t, k = rel.shape
    if k == 0:
        return rel.copy()
    acc = np.fmax.accumulate(rel[:, ::-1], axis=1)[:, ::-1]
    return np.concatenate([acc[:, 1:], np.full((t, 1), np.nan, dtype=rel.dtype)], axis=1)


class _Columns:
    """Contiguous copies of a trace's statistics, each read from the (T, L, S) array once."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self._full: dict[int, np.ndarray] = {}

    def full(self, stat: Stat) -> np.ndarray:
        if int(stat) not in self._full:
            self._full[int(stat)] = np.ascontiguousarray(self.x[:, :, int(stat)])
        return self._full[int(stat)]

    def __call__(self, idx: np.ndarray, stat: Stat) -> np.ndarray:
        return self.full(stat)[:, idx]


@dataclass
class Features:
    """The threshold-independent arrays the states are decided on, contiguous per statistic.

    Built once per trace version and reused while only the thresholds change (slider moves)."""

    key: tuple
    steps: np.ndarray
    names: list[str]
    order: np.ndarray
    by_order: np.ndarray
    std: np.ndarray            # (T, L) output spread
    base: np.ndarray           # (L,) first finite spread
    act_nf: np.ndarray         # (T, L) bool
    dead_all: np.ndarray       # (T, L) view, for numbers
    sat_all: np.ndarray
    ri: np.ndarray             # ReLU columns, their dead fraction and the fraction of their outputs firing
    dead: np.ndarray
    firing: np.ndarray
    positions: np.ndarray      # per ReLU column: outputs per unit in a batch (NaN: not known)
    bi: np.ndarray             # bounded (non-output) columns and their saturated fraction
    sat: np.ndarray
    gi: np.ndarray             # weight layers in forward order, relative gradient and what follows
    rel: np.ndarray
    # (T, len(gi)) bool: a trainable weight layer that ran holds no gradient at a sample where another one does
    # (the backward pass never reached it)
    unreached: np.ndarray
    later: np.ndarray
    rel0: np.ndarray
    wi: list[int]              # gain layers, their spread and the spread before them
    own: np.ndarray
    prev: np.ndarray
    origin: np.ndarray         # the scale each gain layer's compounding starts from (input or last norm)
    offset: np.ndarray         # per gain layer: |mean| / spread of its output (a bias far off shows here)
    segment: list[int]         # per gain layer: how many normalisation layers ran before it
    rscale: np.ndarray         # per gain layer: recurrent weight scale vs the default init (NaN: not recurrent)
    wscale: np.ndarray         # per gain layer: its weights' spread vs the default init when watching started
    reads_input: np.ndarray    # per sample and gain layer: 1.0 where the model's input is what it reads
    bias_rms: np.ndarray       # per gain layer: the RMS of its bias when watching started (NaN: none)
    nonfinite: np.ndarray      # (T, L) bool
    ui: np.ndarray             # updated layers: their columns, update and weight norms, ratio (NaN: not usable)
    wu: np.ndarray
    wnu: np.ndarray
    update_ratio: np.ndarray
    update_count: np.ndarray   # (T,) layers with a usable ratio
    growth: np.ndarray         # (T, L) output spread / first spread
    has_params: np.ndarray     # (L,) bool
    observed: np.ndarray       # (L,) bool: seen in a forward pass (not: never ran, or only passed its input on)
    ai: np.ndarray             # attention computations: their columns, entropy, largest logit and its first value
    entropy: np.ndarray
    logit: np.ndarray
    logit0: np.ndarray
    range_: np.ndarray         # (T, L) largest |output| over the largest value of its dtype
    absmax: np.ndarray         # (T, L) largest |output|
    loops: list[list[int]]     # functional sites called in a loop of the forward, in the order of their calls
    grad_rms: np.ndarray       # (T, L) the RMS of each layer's output gradient


def _key(trace: Trace) -> tuple:
    st = trace.stats
    return (id(st), st.n, int(st.steps[-1]) if st.n else -1, id(trace.globals), trace.globals.n,
            tuple(l.order for l in trace.layers), tuple(l.n_trainable for l in trace.layers))


_CACHE: dict[int, tuple[weakref.ref, Features]] = {}
_CACHE_SIZE = 4


def features(trace: Trace) -> Features:
    key = _key(trace)
    hit = _CACHE.get(id(trace))
    if hit is not None and hit[0]() is trace and hit[1].key == key:
        return hit[1]
    f = _build_features(trace, key)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    key_id = id(trace)

    def forget(ref, key_id=key_id):  # a dropped trace frees its features (they hold views of its arrays)
        entry = _CACHE.get(key_id)
        if entry is not None and entry[0] is ref:
            del _CACHE[key_id]

    _CACHE[key_id] = (weakref.ref(trace, forget), f)
    return f


def _build_features(trace: Trace, key: tuple) -> Features:
    x = trace.stats.data
    g = trace.globals.data
    mixed = float((trace.meta.get("batch_mixing") or {}).get("spread", 0.0)) > MIXING_TINY
    if len(g) == len(x) and not mixed:
        # a unit is dead when no sample of the batch makes it positive: a batch of one sample repeated shows
        # only which units that one input turns off. Not an input of one value (ones for featureless nodes,
        # usually meant), nor a model found mixing its samples (a graph's messages), where units still see many
        with np.errstate(invalid="ignore"):
            same = (g[:, GLOBAL_COLUMNS.index("input_spread")] == 0) & (g[:, GLOBAL_COLUMNS.index("input_std")] > 0)
        if same.any():
            x = x.copy()
            x[same, :, int(Stat.ACT_DEAD)] = np.nan
    cols = _Columns(x)
    layers = trace.layers
    t = x.shape[0]
    kinds = [l.kind for l in layers]
    order = np.array([-1 if l.order is None else l.order for l in layers])
    seen = order >= 0
    last = order.max() if seen.any() else -1
    by_order = np.argsort(np.where(seen, order, np.iinfo(np.int64).max), kind="stable")[:int(seen.sum())]
    last_i = int(by_order[-1]) if len(by_order) else -1
    # the signal's path: a functional operation run inside a module (attention's softmax, an op in a
    # block's forward) is no step of it, one applied to a module's output is
    path = np.array([by_order[k] for k in range(len(by_order)) if layers[by_order[k]].extra.get("relation") != "in"],
                    dtype=np.int64)
    std = cols.full(Stat.ACT_STD)
    act_nf = cols.full(Stat.ACT_NONFINITE) > 0
    ri = np.nonzero([k == Kind.RELU for k in kinds])[0]
    bi = np.nonzero(np.array([k == Kind.BOUNDED for k in kinds], dtype=bool) & (order != last))[0]
    trainable = np.array([l.n_trainable > 0 and k in GRADIENT_KINDS for l, k in zip(layers, kinds)], dtype=bool)
    gi = by_order[trainable[by_order]] if len(by_order) else by_order
    wg = cols(gi, Stat.W_GRAD_NORM)
    wn = cols(gi, Stat.W_NORM)
    with np.errstate(all="ignore"):
        rel = np.where(wn > 0, wg / wn, np.float32(np.nan)).astype(np.float32)
    reached = np.isfinite(wg)
    unreached = (~reached & np.isfinite(wn) & reached.any(axis=1, keepdims=True)
                 & (order[gi] >= 0)[None, :] if len(gi) else np.zeros((len(wg), 0), dtype=bool))
    weighty = np.array([l.n_params > 0 and k in GAIN_KINDS for l, k in zip(layers, kinds)], dtype=bool)
    pos = {int(i): p for p, i in enumerate(path)}
    wi = [int(i) for i in path if weighty[i]]
    # the scale a weight layer passes on is the RMS of the signal, offset included: a bias of +50 on
    # outputs of small spread is as far out of scale as a spread of 50. Not for the model's own output,
    # whose bias may rightly sit at the targets' mean (a prior): there, the spread
    g = trace.globals.data
    input_rms = np.hypot(g[:, GLOBAL_COLUMNS.index("input_mean")], g[:, GLOBAL_COLUMNS.index("input_std")])
    mean = cols.full(Stat.ACT_MEAN)
    rms = np.hypot(mean, std)
    prev = (np.stack([input_rms if pos[i] == 0 else rms[:, path[pos[i] - 1]] for i in wi], axis=1)
            if wi else np.zeros((t, 0), dtype=np.float32))
    # what each one read, where the recorder saw it (a sum of branches, a concatenation, the output of a module
    # applied again are no module's output: the module before it in the path is not its input)
    read = cols.full(Stat.IN_RMS)[:, wi] if wi else prev
    with np.errstate(invalid="ignore"):
        # the first in the path reads the model's input, unless what it was seen to read is something else (an
        # input the forward scaled before it)
        first = np.array([pos[i] == 0 for i in wi], dtype=bool)[None, :] if wi else np.zeros((1, 0), dtype=bool)
        reads_input = (first & (~np.isfinite(read) | np.isclose(read, input_rms[:, None], rtol=1e-3))).astype(
            np.float64)
    prev = np.where(np.isfinite(read), read, prev)
    own = np.stack([std[:, i] if i == last_i else rms[:, i] for i in wi], axis=1) if wi else np.zeros((t, 0))
    with np.errstate(all="ignore"):
        offset = np.abs(mean[:, wi]) / std[:, wi] if wi else np.zeros((t, 0))
    # the scale compounds from the input, or from the last normalisation layer that ran (it resets it;
    # one whose output is exactly zero, a zero-initialised gain, does not). Token ids have no scale:
    # there it compounds from the first weight layer's input
    refs: list[np.ndarray] = []
    segment: list[int] = []
    ref, seg, first_of_input = input_rms, 0, True
    for i in path:
        if kinds[i] == Kind.NORM:
            r = rms[:, i]
            ref, seg, first_of_input = np.where(np.isfinite(r) & (r > 0), r, ref), seg + 1, False
        elif weighty[i]:
            if first_of_input:
                usable = np.isfinite(input_rms) & (input_rms > 0)
                ref = np.where(usable, input_rms, prev[:, len(refs)])
                first_of_input = False
            refs.append(ref)
            segment.append(seg)
    origin = np.stack(refs, axis=1) if refs else np.zeros((t, 0), dtype=np.float32)
    rscale = np.array([layers[i].extra.get("recurrent_scale", np.nan) for i in wi], dtype=np.float64)
    wscale = np.array([layers[i].extra.get("weight_scale", np.nan) for i in wi], dtype=np.float64)
    nonfinite = act_nf | (cols.full(Stat.GRAD_NONFINITE) > 0)
    if len(gi):
        nonfinite[:, gi] |= np.isinf(wg) | np.isinf(wn)
    ui = np.nonzero([l.n_trainable > 0 for l in layers])[0]  # (kept in Features: the update spikes' columns)
    wu, wnu = cols(ui, Stat.W_UPDATE_NORM), cols(ui, Stat.W_NORM)
    # a layer whose weights started at zero (a deliberate zero init) is being built up: its ratio to a
    # weight that was 0 a few steps ago says nothing about the learning rate
    started_at_zero = wnu[0] == 0 if len(wnu) else np.zeros(wnu.shape[1], dtype=bool)
    with np.errstate(all="ignore"):
        has = np.isfinite(wu) & (wnu > 0) & ~started_at_zero
        ratio = np.where(has, wu / np.where(has, wnu, 1.0), np.float32(np.nan)).astype(np.float32)
        growth = std / first_finite(std)
    ent_all = cols.full(Stat.ATTN_ENTROPY)
    ai = np.nonzero(np.isfinite(ent_all).any(axis=0))[0] if t else np.zeros(0, dtype=np.int64)
    logit = cols(ai, Stat.ATTN_LOGIT_MAX)
    return Features(key=key, steps=trace.stats.steps.copy(), names=[l.name for l in layers], order=order,
                    by_order=by_order, std=std, base=first_finite(std), act_nf=act_nf,
                    dead_all=x[:, :, int(Stat.ACT_DEAD)], sat_all=x[:, :, int(Stat.ACT_SATURATED)],
                    ri=ri, dead=cols(ri, Stat.ACT_DEAD), firing=cols(ri, Stat.ACT_FIRING),
                    positions=np.array([layers[i].extra.get("positions", np.nan) for i in ri], dtype=np.float64),
                    bi=bi, sat=cols(bi, Stat.ACT_SATURATED),
                    gi=gi, rel=rel, unreached=unreached, later=_later_max(rel), rel0=first_finite(rel), wi=wi, own=own,
                    prev=prev,
                    origin=origin, offset=offset, segment=segment, rscale=rscale, wscale=wscale,
                    reads_input=reads_input,
                    bias_rms=np.array([layers[i].extra.get("bias_rms", np.nan) for i in wi], dtype=np.float64),
                    nonfinite=nonfinite, ui=ui, wu=wu, wnu=wnu, update_ratio=ratio, update_count=has.sum(axis=1),
                    growth=growth, has_params=np.array([l.n_params > 0 for l in layers], dtype=bool), observed=seen,
                    ai=ai, entropy=cols(ai, Stat.ATTN_ENTROPY), logit=logit, logit0=first_finite(logit),
                    range_=cols.full(Stat.ACT_RANGE), absmax=cols.full(Stat.ACT_ABSMAX),
                    loops=loop_chains(layers), grad_rms=cols.full(Stat.GRAD_RMS))


def loop_profile(f: Features, chain: list[int]) -> list[tuple[int, int, np.ndarray]]:
    """A loop's output gradients per sampled pass that read it: (row, the first call's place in ``chain``, the
    gradient at each call from there on). The calls that ran in that pass (a loop may run fewer times in one
    pass than in another: its first ones); leading calls that no gradient reaches at any sample left out (a
    gate applied to a zero initial state passes none, by construction). Passes with fewer than two calls, or
    with no gradient at all, are left out."""
    g = f.grad_rms[:, chain].astype(np.float64)
    read = np.isfinite(g)
    never = (np.where(read, g, 0.0) == 0).all(axis=0)
    lead = int(np.argmin(never)) if not never.all() else len(chain)
    out = []
    for r in range(len(g)):
        ran = read[r, lead:]
        n = int(np.argmin(ran)) if not ran.all() else len(ran)
        v = g[r, lead:lead + n]
        if n >= 2 and v.max() > 0:
            out.append((r, lead, v))
    return out


def loop_chains(layers: list) -> list[list[int]]:
    """Functional sites called in a loop of the forward, each call reading what the one before made (the sites
    that ``follow`` one another, see ``Recorder._find_loops``): per loop, its sites' indices in call order."""
    after = {str(l.extra["follows"]): l.index for l in layers if l.extra.get("follows")}
    out = []
    for first in layers:
        if first.name not in after or first.extra.get("follows"):
            continue
        chain, name = [first.index], first.name
        while name in after and len(chain) <= len(layers):
            chain.append(after[name])
            name = layers[chain[-1]].name
        out.append(chain)
    return out


def _max_ahead(reach: np.ndarray, segment: list[int]) -> np.ndarray:
    """Per column, the largest value at it or after it before the next normalisation layer."""
    out = reach.copy()
    for k in range(reach.shape[1] - 2, -1, -1):
        if segment[k + 1] == segment[k]:
            out[:, k] = np.fmax(out[:, k], out[:, k + 1])
    return out


def layer_series(f: Features, th: Thresholds) -> tuple[list[StateSeries], dict[str, LayerHealth]]:
    steps, names, std, t = f.steps, f.names, f.std, len(f.steps)
    out: list[StateSeries] = []

    # -- activations (all layers)
    with np.errstate(invalid="ignore"):
        act = np.where((f.growth > th.activation_growth) | f.act_nf, np.int8(ActState.ANOMALOUS.code), np.int8(0))
    if len(f.ri):
        sub = act[:, f.ri]
        sub[(f.dead >= th.dead_fraction) & (sub == 0)] = ActState.DEAD.code
        act[:, f.ri] = sub
    if len(f.bi):
        sub = act[:, f.bi]
        sub[(f.sat >= th.saturated_fraction) & (sub == 0)] = ActState.SATURATED.code
        act[:, f.bi] = sub
    # the worst share from a sample on (units that keep dying after the state began count at their worst)
    dead_peak, sat_peak = (np.fmax.accumulate(x[::-1], axis=0)[::-1] if len(x) else x
                           for x in (f.dead_all, f.sat_all))
    act_values = {ActState.DEAD: {"dead_fraction": _at(f.dead_all), "dead_peak": _at(dead_peak)},
                  ActState.SATURATED: {"saturated_fraction": _at(f.sat_all), "saturated_peak": _at(sat_peak)},
                  ActState.ANOMALOUS: {"act_std": _at(std), "act_growth": _ratio(std, f.base)}}
    out.append(StateSeries(Signal.ACTIVATION, steps, act, names, act_values))

    # -- gradients (weight layers, in forward order)
    rel, later = f.rel, f.later
    grad = np.zeros(rel.shape, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        grad[rel < later * max(th.diminishing_ratio, th.vanishing_ratio)] = GradState.DIMINISHING.code
        grad[rel < later * th.vanishing_ratio] = GradState.VANISHING.code
        # far above the layers after it, or far above its own start while no smaller than them, from a start that
        # was not attenuated itself (a gradient that started far below the layers after it, as attention's
        # queries and keys do at a small init, and grew to their level has recovered, not exploded)
        started_low = f.rel0 < first_finite(later) * max(th.diminishing_ratio, th.vanishing_ratio)
        grad[(rel > later * th.exploding_ratio)
             | ((rel > f.rel0 * th.exploding_ratio) & ~(rel < later) & ~started_low)] = GradState.EXPLODING.code
    grad[f.unreached] = GradState.UNREACHED.code
    grad_values = {GradState.VANISHING: {"attenuation": _ratio(rel, later), "relative_grad": _at(rel)},
                   GradState.DIMINISHING: {"attenuation": _ratio(rel, later), "relative_grad": _at(rel)},
                   GradState.EXPLODING: {"attenuation": _ratio(rel, later), "grad_growth": _ratio(rel, f.rel0),
                                         "relative_grad": _at(rel)}}
    out.append(StateSeries(Signal.GRADIENT, steps, grad, [names[i] for i in f.gi], grad_values))

    # -- gain of weight layers: output scale (RMS) / scale of the layer that ran just before. A layer is
    # out of scale when its gain passes the threshold, or when it passes its square root while the
    # scale compounded since the input (or the last normalisation layer) passes the threshold squared: several
    # layers each a few times too large add up to the same fault as one far too large. When the
    # compounded scale passes the threshold squared further on, every layer on the way that
    # amplifies at all has its share in it (twelve layers of gain 1.5 compound to 130x)
    gain = np.zeros(f.own.shape, dtype=np.int8)
    root = math.sqrt(th.layer_gain)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (f.prev > 0) & (f.own > 0)  # an exactly-zero output is a deliberate zero init, not a scale
        reach = f.own / f.origin
        ahead = _max_ahead(np.where(np.isfinite(reach), reach, np.nan), f.segment)
        big, small = th.layer_gain, 1.0 / th.layer_gain
        # (not mirrored for shrinking: PyTorch's default init itself shrinks the signal ~0.6x per layer,
        # and a deep default-initialised net trains)
        shrinks = (f.own < f.prev * small) | ((f.own < f.prev / root) & (reach < small * small))
        # a recurrent layer's output is bounded and gated (a gate in (0, 1) times a tanh of its state in an
        # LSTM: at PyTorch's default init it sits ~0.06x its input's spread): it shrinks the signal by design,
        # so only a shrink past the threshold squared says more than its gating
        gated = np.isfinite(f.rscale)[None, :]
        shrinks &= ~gated | (f.own < f.prev * small * small)
        amplifies = ((f.own > f.prev * big) | ((f.own > f.prev * root) & (reach > big * big))
                     | ((f.own > f.prev) & (ahead > big * big)))
        gain[ok & shrinks] = GainState.SHRINKS.code
        gain[ok & amplifies] = GainState.AMPLIFIES.code
        # a recurrent layer's hidden-to-hidden weights act once per time step: their initial scale far
        # from the default explodes or erases the state through time, whatever the output spread says
        gain[:, f.rscale < small] = GainState.SHRINKS.code
        gain[:, f.rscale > big] = GainState.AMPLIFIES.code
        # weights started far below the default init's spread: the signal then rides on the biases, and the
        # gradient through the weights vanishes, whatever the output's spread says (measured at the start only)
        first = np.arange(len(gain)) < th.persist
        gain[np.ix_(first, f.wscale < small)] = GainState.SHRINKS.code
    after_norm = np.broadcast_to(np.array(f.segment, dtype=np.float64) > 0, gain.shape).astype(np.float64)
    g_value = {"gain": _ratio(f.own, f.prev), "compounded": _at(reach), "offset": _at(f.offset),
               "after_norm": _at(after_norm),
               "recurrent_scale": _at(np.broadcast_to(f.rscale, gain.shape)),
               "weight_scale": _at(np.broadcast_to(f.wscale, gain.shape)), "input_rms": _at(f.prev),
               "reads_input": _at(f.reads_input),
               "bias_rms": _at(np.broadcast_to(f.bias_rms, gain.shape))}
    out.append(StateSeries(Signal.GAIN, steps, gain, [names[i] for i in f.wi],
                           {GainState.SHRINKS: g_value, GainState.AMPLIFIES: g_value}))

    # -- non-finite values anywhere in the layer's row (no hysteresis: one NaN is a fact)
    out.append(StateSeries(Signal.FINITE, steps, f.nonfinite.view(np.int8), names, {}, persist=1))
    out += attention_series(f, th)
    out.append(range_series(f, th))
    out += update_spike_series(f, th)

    # -- the latest state of every layer (param-less layers show the next weight layer's gradient)
    latest: dict[str, LayerHealth] = {}
    if t:
        g_last = {int(i): int(c) for i, c in zip(f.gi, grad[-1])}
        gain_last = {i: int(c) for i, c in zip(f.wi, gain[-1])}
        col_of = {int(i): k for k, i in enumerate(f.gi)}
        nxt = 0
        for i in f.by_order[::-1]:
            i = int(i)
            if i in g_last:
                nxt = g_last[i]
            elif not f.has_params[i]:  # frozen or sparse weight layers keep "healthy": no gradient by design
                g_last[i] = nxt
        # a loop's calls (no weights of their own): the gradient at each against the most any call of the loop gets
        for chain in f.loops:
            profile = loop_profile(f, chain)  # its latest reading
            if not profile:
                continue
            _, lead, g = profile[-1]
            for i, v in zip(chain[lead:], g / g.max()):
                if v < th.vanishing_ratio:
                    g_last[i] = GradState.VANISHING.code
                elif v < max(th.diminishing_ratio, th.vanishing_ratio):
                    g_last[i] = GradState.DIMINISHING.code
        for i, name in enumerate(names):
            if not f.observed[i]:
                continue  # never ran, or only returned its input: nothing to show as healthy
            k = col_of.get(i)
            values = {"act_std": float(std[-1, i]), "dead_fraction": float(f.dead_all[-1, i]),
                      "saturated_fraction": float(f.sat_all[-1, i]),
                      "relative_grad": float(rel[-1, k]) if k is not None else float("nan"),
                      "attenuation": _ratio(rel, later)(t - 1, k) if k is not None else float("nan")}
            latest[name] = LayerHealth(layer=name, step=int(steps[-1]), act=ActState.of(act[-1, i]),
                                       grad=GradState.of(g_last.get(i, 0)), nonfinite=bool(f.nonfinite[-1, i]),
                                       gain=GainState.of(gain_last.get(i, 0)), values=values)
    return out, latest


# A logit's unit: a softmax's weights differ by e per nat. Logits that start below one nat (a small init's) and
# grow to a few nats are attention that learns to look somewhere, not growth without bound: growth is counted
# from one nat at least.
LOGIT_NAT = 1.0


def attention_series(f: Features, th: Thresholds) -> list[StateSeries]:
    """Per attention computation: collapsed (entropy over the keys below its threshold) or growing (the
    largest logit many times its first value, or than one nat when it started below), else normal."""
    if not len(f.ai):
        return []
    codes = np.zeros(f.entropy.shape, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        codes[f.logit > np.maximum(f.logit0, LOGIT_NAT) * th.attention_logit_growth] = AttnState.GROWING.code
        codes[f.entropy < th.attention_entropy] = AttnState.COLLAPSED.code
    values = {"entropy": _at(f.entropy), "max_logit": _at(f.logit),
              "first_logit": _at(np.broadcast_to(f.logit0, f.logit.shape)),
              "logit_growth": _ratio(f.logit, f.logit0)}
    return [StateSeries(Signal.ATTENTION, f.steps, codes, [f.names[i] for i in f.ai],
                        {AttnState.COLLAPSED: values, AttnState.GROWING: values})]


def update_spike_series(f: Features, th: Thresholds) -> list[StateSeries]:
    """Per updated layer: its update-to-weight ratio ``spike_factor`` times or more the one at the sample
    before (no hysteresis: a spike is one step)."""
    r = f.update_ratio
    if r.shape[0] < 2 or not r.shape[1]:
        return []
    before = np.concatenate([np.full((1, r.shape[1]), np.nan, dtype=r.dtype), r[:-1]], axis=0)
    with np.errstate(invalid="ignore"):
        codes = np.where((before > 0) & (r > before * th.spike_factor), np.int8(SpikeState.SPIKE.code), np.int8(0))
    values = {"update_ratio": _at(r), "before": _at(before), "spike": _ratio(r, before)}
    return [StateSeries(Signal.SPIKE, f.steps, codes, [f.names[i] for i in f.ui], {SpikeState.SPIKE: values},
                        persist=1)]


def range_series(f: Features, th: Thresholds) -> StateSeries:
    """Per layer: an output within ``range_margin`` of the largest value its dtype holds (no hysteresis:
    one step near float16's limit is one step from Inf)."""
    with np.errstate(invalid="ignore"):
        # (an output already Inf is the finite state's: this is the warning before it)
        codes = np.where(np.isfinite(f.range_) & (f.range_ > 1.0 / th.range_margin),
                         np.int8(RangeState.NEAR_LIMIT.code), np.int8(0))
    x = f.range_
    return StateSeries(Signal.RANGE, f.steps, codes, f.names,
                       {RangeState.NEAR_LIMIT: {"range_used": _at(x), "act_absmax": _at(f.absmax)}}, persist=1)


def global_series(trace: Trace, f: Features, th: Thresholds) -> list[StateSeries]:
    """Model-level update state and input state per sample."""
    g = trace.globals.data
    steps = f.steps
    ratio, cnt = f.update_ratio, f.update_count
    with np.errstate(invalid="ignore"):
        high = (ratio > th.update_too_large).sum(axis=1)
        notlow = (ratio >= th.update_negligible).sum(axis=1)
    upd = np.zeros(len(steps), dtype=np.int8)
    upd[high > 0] = UpdateState.TOO_LARGE.code                       # some layer's weights change too much
    upd[cnt == 0] = -1                                                # nothing measured (NaN weights, no step)
    upd[(cnt > 0) & (notlow == 0)] = UpdateState.NEGLIGIBLE.code     # even the largest one is negligible

    def ratios(r):
        u = ratio[r]
        return u[np.isfinite(u)]

    col = GLOBAL_COLUMNS.index
    lr = g[:, col("lr")]
    upd_values = {"update_median": lambda r: float(np.median(ratios(r))) if len(ratios(r)) else float("nan"),
                  "update_max": lambda r: float(ratios(r).max()) if len(ratios(r)) else float("nan"),
                  "lr": _at(lr)}
    # the run as a whole, whatever the thresholds: the largest update-to-weight ratio of each sample
    largest = np.where(np.isfinite(ratio), ratio, -np.inf).max(axis=1, initial=-np.inf)
    largest = largest[np.isfinite(largest)]
    peak = float(largest.max()) if len(largest) else float("nan")
    typical = float(np.median(largest)) if len(largest) else float("nan")
    upd_by_state = {s: upd_values for s in UpdateState}
    # the last step of the stretch in which the updates stay at least in their warning band: updates that fall
    # back just under the threshold are still near it (what they do then is still theirs)
    with np.errstate(invalid="ignore"):
        near = (high > 0) | ((ratio > th.update_creeping).sum(axis=1) > 0)
    stretch = np.cumsum(~near)
    last = np.zeros(int(stretch.max(initial=0)) + 1, dtype=np.int64)
    np.maximum.at(last, stretch, np.arange(len(near)))
    upd_by_state[UpdateState.TOO_LARGE] = {**upd_values, "update_peak": lambda r: peak,
                                           "near_until": lambda r: float(steps[last[stretch[r]]])}
    upd_by_state[UpdateState.NEGLIGIBLE] = {**upd_values, "update_typical": lambda r: typical}
    in_steps, (mean, sd, absmax, in_nf, spread) = input_rows(trace, steps, [g[:, col(c)] for c in (
        "input_mean", "input_std", "input_absmax", "input_nonfinite", "input_spread")])
    inp = np.zeros(len(in_steps), dtype=np.int8)
    with np.errstate(invalid="ignore"):
        inp[np.fmax(np.abs(mean), sd) > th.input_scale] = InputState.UNSCALED.code
        inp[np.fmax(np.abs(mean), sd) < th.input_tiny] = InputState.UNSCALED.code   # out of scale the other way
        # no spread at all (zeros, ones, one value repeated), or every sample of the batch the same one (a
        # dataset that ignores its index): not a scale to normalise, nothing to tell the samples apart by
        inp[(sd == 0) | (spread == 0)] = InputState.CONSTANT.code
        # samples that differ by a sliver of the values they share (an offset far larger than the differences):
        # as good as one sample repeated to a model that must first scale those differences up (an input out of
        # scale already, a raw feature in the thousands, says more as such)
        flat = (spread > 0) & (spread < th.input_flat * absmax) & (inp != InputState.UNSCALED.code)
        inp[flat] = InputState.CONSTANT.code
    inp[in_nf > 0] = InputState.NONFINITE.code
    in_values = {"input_mean": _at(mean), "input_std": _at(sd), "input_absmax": _at(absmax),
                 "input_spread": _at(spread)}
    # the weights against their start (the median trainable layer): a collapse toward zero
    with np.errstate(all="ignore"):
        shrink = row_median(np.where(f.wnu > 0, f.wnu / first_finite(f.wnu), np.nan))
    # hysteresis on the level: weights once collapsed stay so while they are still shrunk past the warning band
    # (weights held around the threshold by a weight decay are one collapse, not several)
    with np.errstate(invalid="ignore"):
        collapsed = held(shrink < 1.0 / th.weight_collapse, shrink < 1.0 / th.weight_shrinking)
    wts = np.where(collapsed, np.int8(WeightState.COLLAPSING.code), np.int8(0))
    # the sample from which they shrank without a break (below their start at every sample since: a weight
    # decay pulls from the first step, long before its collapse is past the threshold)
    with np.errstate(invalid="ignore"):
        below = shrink < 1.0
    mark = np.cumsum(~below)
    since = np.full(int(mark.max(initial=0)) + 1, max(len(below) - 1, 0), dtype=np.int64)
    np.minimum.at(since, mark, np.arange(len(below)))   # each stretch's first row: the last not below its start
    wts_values = {"weight_scale": _at(shrink), "shrinking_since": lambda r: float(steps[since[mark[r]]])}
    return [StateSeries(Signal.UPDATE, steps, upd[:, None], [""], upd_by_state),
            StateSeries(Signal.WEIGHTS, steps, wts[:, None], [""], {WeightState.COLLAPSING: wts_values}),
            StateSeries(Signal.INPUT, in_steps, inp[:, None], ["input"], {s: in_values for s in InputState},
                        persist=1)]


def input_rows(trace: Trace, steps: np.ndarray, columns: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The input's statistics (the first ``len(columns)`` of mean, std, absmax, nonfinite, spread) at the sampled
    steps and at the unsampled steps whose loss spiked (read then, from the input the step still held), in step
    order (a statistic a row does not hold, from a file written before it was read, is NaN)."""
    sampled = set(int(x) for x in steps)  # a sampled step's own row comes first
    extra = [r for r in trace.meta.get("input_at_spikes") or [] if len(r) >= 5 and int(r[0]) not in sampled]
    if not extra:
        return steps, columns
    all_steps = np.concatenate([steps, np.array([r[0] for r in extra], dtype=steps.dtype)])
    order = np.argsort(all_steps, kind="stable")
    merged = [np.concatenate([c, np.array([r[1 + i] if 1 + i < len(r) else np.nan for r in extra],
                                          dtype=np.float64)])[order]
              for i, c in enumerate(columns)]
    return all_steps[order], merged


def held(entered: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Level hysteresis along the samples: True from a row where ``entered`` is set for as long as ``near``
    (the quantity still past the healthy side of its warning band) holds without a break."""
    entered = np.asarray(entered, dtype=bool)
    keep = entered | np.asarray(near, dtype=bool)
    stretch = np.cumsum(~keep)                       # rows of one unbroken stretch share a number
    first = np.full(int(stretch.max(initial=0)) + 1, len(keep), dtype=np.int64)
    np.minimum.at(first, stretch[entered], np.nonzero(entered)[0])
    return keep & (np.arange(len(keep)) >= first[stretch])


def row_median(x: np.ndarray) -> np.ndarray:
    """The median of each row's finite values (NaN for a row with none), without numpy's NaN warnings."""
    if x.shape[1] == 0:
        return np.full(x.shape[0], np.nan)
    s = np.sort(np.where(np.isfinite(x), x, np.inf), axis=1)
    k = np.isfinite(x).sum(axis=1)
    lo, hi = np.maximum((k - 1) // 2, 0), np.maximum(k // 2, 0)
    rows = np.arange(x.shape[0])
    med = (s[rows, np.minimum(lo, x.shape[1] - 1)] + s[rows, np.minimum(hi, x.shape[1] - 1)]) / 2
    return np.where(k > 0, med, np.nan)


def _rolling_median(v: np.ndarray, w: int) -> np.ndarray:
    """Median of the last ``w`` values at each point (fewer at the start): a single spike moves nothing."""
    n = len(v)
    if n == 0:
        return v.copy()
    out = np.empty(n, dtype=np.float64)
    head = min(w - 1, n)
    for i in range(head):  # the first windows are short
        out[i] = np.median(v[:i + 1])
    if n >= w:
        out[w - 1:] = np.median(np.lib.stride_tricks.sliding_window_view(v, w), axis=1)
    return out


def _rolling_mean(v: np.ndarray, w: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(1, len(v) + 1)
    lo = np.maximum(i - w, 0)
    return (c[i] - c[lo]) / (i - lo)


@dataclass(frozen=True)
class LossCurve:
    """A recorded loss read on its own scale: ``smooth`` is its rolling median, ``progress`` at each
    point how far the latest losses are below the first ones, in units of ``scale``."""

    filled: np.ndarray      # non-finite values carry the last finite one
    ok: np.ndarray          # which values were finite
    smooth: np.ndarray
    start: float
    best: np.ndarray
    scale: np.ndarray
    progress: np.ndarray
    chance: float = math.nan   # the loss of predicting the classes' frequencies, when known (see chance_level)
    trained: bool = False      # it starts far below that chance level: a model trained already (a second run)


_MEAN_CLASS_LOSSES = frozenset({"NllLoss", "BinaryCrossEntropyWithLogits"})  # losses whose chance is known


def chance_level(trace: Trace, th: Thresholds | None = None) -> float:
    """See ``chance_levels``: the first of the two."""
    return chance_levels(trace, th or Thresholds())[0]


def chance_levels(trace: Trace, th: Thresholds) -> tuple[float, float]:
    """The loss of a model that predicts the classes' frequencies and nothing of the input: their entropy
    (nats), from the classes of the sampled batches (meta ``batch_classes``), for a recorded loss that is a
    cross-entropy averaged over the batch and nothing else (a binary one with logits included; summed, with
    terms added or label smoothing, it is not known), and the loss of a uniform prediction over the classes
    seen (log of their number: where a model initialised as usual starts). NaNs when not known."""
    if not mean_class_loss(trace.meta.get("loss_paths") or []):
        return math.nan, math.nan
    return class_chance(trace, th)


def mean_class_loss(paths: list) -> bool:
    """The recorded loss is a class loss and nothing else (its graph's paths, see ``losspath``): a
    cross-entropy, or a binary one with logits, with no term added and no scale."""
    return bool(paths) and all(p and p[0] in _MEAN_CLASS_LOSSES for p in paths)


def class_chance(trace: Trace, th: Thresholds) -> tuple[float, float]:
    """``chance_levels`` of the classes read off the output's gradient, whatever the loss adds to them."""
    rows = trace.meta.get("batch_classes") or []
    if len(rows) < th.batch_order_window:
        return math.nan, math.nan
    counts: dict = {}
    for _, found, n, *_ in rows:
        for c, k in zip(found, n):
            counts[c] = counts.get(c, 0) + k
    p = np.array(list(counts.values()), dtype=np.float64)
    p = p / p.sum()
    return (float(-(p * np.log(p)).sum()), math.log(len(p))) if len(p) >= 2 else (math.nan, math.nan)


def loss_floor(trace: Trace) -> tuple[float, float]:
    """The least the recorded loss can reach, where the recorder read it (meta ``loss_floor``: the entropy of a
    cross-entropy's targets, above 0 under label smoothing or soft targets), as the median reading, and the
    loss of a uniform prediction over its classes (log of their number); NaNs if not read."""
    rows = [r for r in trace.meta.get("loss_floor") or [] if len(r) >= 3 and math.isfinite(float(r[1]))]
    if not rows:
        return math.nan, math.nan
    return float(np.median([float(r[1]) for r in rows])), math.log(max(int(rows[-1][2]), 1))


def loss_curve(values: np.ndarray, th: Thresholds, chance: float = math.nan, uniform: float = math.nan,
               least: float = math.nan) -> LossCurve:
    """``chance``: the loss of predicting the classes' frequencies; ``uniform``: of predicting every class
    alike (where a usual initialisation starts; above chance when the classes are imbalanced). A loss that
    starts ``above_chance`` times above both or more (outputs of a large initial scale, a heavy dropout's
    noise) counts its progress from chance, not from its start: coming down to chance is learning the
    classes' frequencies, nothing of the input. ``least``: the least the loss can reach, when known
    (``loss_floor``). Where that floor is more than ``loss_progress`` of the start, the loss's way down is from
    its start (or from a uniform prediction's loss, where lower) to that floor, and its progress is counted
    along it: a cross-entropy under a label smoothing of 0.9 can come down only ~2% of its start, and a model
    that learns its classes does so (one that learns nothing stays at the uniform prediction's loss)."""
    v = values.astype(np.float64)
    n = len(v)
    ok = np.isfinite(v)
    w = max(5, min(th.plateau_steps // 4, n // 10))
    # carry the last finite value over non-finite ones for smoothing (the first one back over those before it: a
    # loss that is NaN on its first steps and then finite did not start at 0)
    first = int(np.argmax(ok)) if ok.any() else 0
    idx = np.maximum.accumulate(np.where(ok, np.arange(n), first))
    filled = np.where(ok, v, v[idx]) if ok.any() else np.zeros(n)
    filled = np.where(np.isfinite(filled), filled, 0.0)
    smooth = _rolling_median(filled, w)
    start = float(np.median(filled[:w]))
    d = np.abs(np.diff(filled, prepend=filled[0]))
    best = np.minimum.accumulate(smooth)
    # the loss's own scale: its start, or, for a loss that starts near zero or crosses it (a Gaussian
    # NLL), the batch-to-batch change at the start or the way it has come down, whichever is larger
    noise = float(np.median(d[1:w + 1])) if n > 1 else 0.0
    top, reach = start, abs(start)
    if least == least and least > th.loss_progress * abs(start):
        # (an initialisation's noise above the uniform prediction is then no small share of the way down; targets
        # as uniform as the prediction, a label smoothing of 1, leave no way down at all)
        top = min(start, uniform) if uniform == uniform else start
        reach = max(top - least, 0.0)
    scale = np.maximum(max(reach, noise), start - best) + 1e-12
    # progress: the start against the median of the latest losses, over a window wide enough that
    # batch noise does not pass for progress (a running minimum would take the deepest noisy dip of a
    # flat curve as an improvement)
    wp = max(w, min(th.plateau_steps // 2, n // 4))
    recent = _rolling_median(filled, wp)
    progress = (top - recent) / scale
    # from its very first value (a loss that climbs above chance at its second step diverged; it did not start there)
    floor = max(chance, uniform) if uniform == uniform else chance
    from_chance = chance > 0 and min(start, float(filled[0])) > th.above_chance * floor
    if from_chance:
        progress = (chance - recent) / chance
    # a loss that starts far below chance is a model trained already (the cell run again, a checkpoint): a flat
    # stretch is where its training ends, not a plateau
    trained = chance > 0 and start < th.loss_trained * chance
    return LossCurve(filled=filled, ok=ok, smooth=smooth, start=start, best=best, scale=scale, progress=progress,
                     chance=chance if from_chance else math.nan, trained=trained)


# the trend test reads at most this many losses, evenly spaced (its cost is quadratic)
TREND_POINTS = 256


def falling_z(v: np.ndarray) -> float:
    """Mann-Kendall z of a downward trend: how many standard deviations more later losses are below
    earlier ones than above them, against a loss that only moves by noise (about 2: clearly falling)."""
    v = v[np.linspace(0, len(v) - 1, min(len(v), TREND_POINTS)).astype(int)]
    return rising_z(-v)  # equal losses (a loss at exactly 0) narrow the spread


def loss_series(trace: Trace, th: Thresholds, curve: LossCurve | None = None) -> list[StateSeries]:
    """A state per recorded loss: non-finite, diverging, oscillating, plateau, stalled or improving."""
    steps, values = trace.loss.steps, trace.loss.data
    n = len(values)
    if n == 0:
        return []
    c = curve if curve is not None else loss_curve(values, th)
    smooth, scale = c.smooth, c.scale
    d = np.abs(np.diff(c.filled, prepend=c.filled[0]))
    rise = (smooth - c.best) / scale
    osc = _rolling_mean(d, th.plateau_steps) / scale
    lag = np.maximum(np.arange(n) - th.plateau_steps, 0)
    window_progress = (smooth[lag] - smooth) / scale
    enough = (np.arange(n) + 1 >= th.plateau_steps) & (not c.trained)
    state = np.zeros(n, dtype=np.int8)
    state[enough & (c.progress < th.slow_progress)] = LossState.SLOW.code
    state[enough & (c.progress < th.loss_progress)] = LossState.PLATEAU.code
    # hysteresis: a plateau holds until the loss clearly improves (past slow_progress), so a loss hovering at
    # the plateau threshold is one plateau, not a flicker between flat and slow; or until it has come down from
    # where the plateau began by as much again as a plateau allows, past ``plateau_exit`` times its
    # batch-to-batch change (``osc``, on the same scale), and comes down steadily from there to the stretch's end
    # (a falling trend, ``trend_z``): it left the plateau and is on its way down, a slow start out of a small
    # initialisation's saddle, not a flat loss's noise
    flat = state != 0
    seg = np.cumsum(~flat)  # rows of one flat stretch share a number
    was = np.zeros(n, dtype=bool)
    left_rows = np.zeros(n, dtype=bool)  # rows of a stretch after the loss left its plateau that way
    if n:
        plateau_rows = state == LossState.PLATEAU.code
        first_of = np.full(int(seg.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first_of, seg[plateau_rows], np.nonzero(plateau_rows)[0])
        begun = first_of[seg]
        was = np.arange(n) >= begun
        # the plateau's level: its progress where it began, or none (a loss that starts above chance and comes
        # down to it has not left a plateau at chance)
        level = np.maximum(c.progress[np.minimum(begun, n - 1)], 0.0)
        left = was & (c.progress >= level + th.loss_progress + th.plateau_exit * osc)
        # from the first row that left it, on to the end of the stretch, when the loss goes on falling from there
        # (one drop, then flat again, is still the plateau's)
        left_at = np.full(int(seg.max()) + 1, n, dtype=np.int64)
        np.minimum.at(left_at, seg[left], np.nonzero(left)[0])
        for k in np.unique(seg[left]):
            rows = np.nonzero(seg == k)[0]
            if falling_z(c.filled[left_at[k]:rows[-1] + 1]) < th.trend_z:
                left_at[k] = n
        left_rows = flat & (np.arange(n) >= left_at[seg])
        was &= ~left_rows
    state[flat & was & (state == LossState.SLOW.code)] = LossState.PLATEAU.code
    state[enough & (osc > th.loss_oscillation) & (window_progress < th.loss_progress)] = LossState.OSCILLATING.code
    # a run too short for a plateau: a loss that has not come down, or moves only by its batch noise
    finite = values[c.ok].astype(np.float64)
    z = math.nan
    if th.min_losses <= len(finite) < th.plateau_steps:
        z = falling_z(finite)
        if (c.progress[-1] < th.loss_progress or z < th.trend_z) and not c.trained:
            state[state == 0] = LossState.STALLED.code
    state[rise > th.loss_rise] = LossState.DIVERGING.code
    state[~c.ok] = LossState.NONFINITE.code
    left_rows &= state == LossState.SLOW.code  # (a divergence or a NaN after it is no way down)
    start = c.start
    chance = c.chance  # known here only when the progress is counted from it
    values_ = {"loss": _at(values), "start": lambda r: start, "best": _at(c.best), "progress": _at(c.progress),
               "oscillation": _at(osc), "progress_end": lambda r: float(c.progress[-1]),
               "left_plateau": _at(left_rows.astype(np.float64))}
    if chance > 0:
        values_.update({"chance": lambda r: chance, "latest": lambda r: float(smooth[-1]),
                        "from_chance": lambda r: 1.0})
    stalled = {"loss": _at(values), "start": lambda r: start, "best": _at(c.best),
               "progress": lambda r: float(c.progress[-1]), "trend_z": lambda r: z}
    # spikes: a loss far above its recent level (its rolling median), by spike_factor times its typical
    # step-to-step change there and by at least what counts as progress on its own scale (a converged loss
    # at 1e-5 that jumps to 1e-3 has not spiked); one step is enough
    w = max(5, min(th.plateau_steps // 4, n // 10))
    level, noise = np.roll(smooth, 1), np.roll(_rolling_median(d, w), 1)
    with np.errstate(invalid="ignore"):
        rise = c.filled - level
        spike = ((np.arange(n) > w) & (rise > th.spike_factor * noise) & (rise > th.loss_progress * scale)
                 & (noise > 0) & c.ok)
    spike_values = {"loss": _at(values[:, None]), "before": _at(level[:, None])}
    return [StateSeries(Signal.LOSS, steps, state[:, None], [""], {s: (stalled if s == LossState.STALLED else values_)
                                                                  for s in LossState}),
            StateSeries(Signal.SPIKE, steps, spike.astype(np.int8)[:, None], [""], {SpikeState.SPIKE: spike_values},
                        persist=1)]


def _loss_reach(trace: Trace) -> tuple[float, float, float]:
    """At the first step: the loss, the RMS of the model's output (the last layer to run), and how far the
    loss is out of the output's reach, sqrt(loss) / RMS, or loss / RMS for a loss that grows linearly with the
    error (an absolute error, Huber: ``losspath.linear_error``). Regression losses on targets of a scale the
    outputs do not have start far above 1; a classification loss starts near it."""
    order = trace.execution_order()
    if not trace.loss.n or not trace.stats.n or not order or trace.loss.steps[0] != trace.stats.steps[0]:
        return math.nan, math.nan, math.nan
    row = trace.stats.data[0, order[-1].index]
    rms = math.hypot(float(row[Stat.ACT_MEAN]), float(row[Stat.ACT_STD]))
    loss = float(trace.loss.data[0])
    if not (math.isfinite(loss) and math.isfinite(rms) and rms > 0):
        return loss, rms, math.nan
    error = abs(loss) if losspath.linear_error(trace.meta.get("loss_paths")) else math.sqrt(abs(loss))
    return loss, rms, error / rms


def target_series(trace: Trace, th: Thresholds) -> list[StateSeries]:
    """What the loss says of the targets: a first loss whose errors' scale (its square root, or itself for a
    loss linear in the error) is beyond the input-scale threshold and that many times the outputs' RMS squared
    (a regression against targets on a scale the outputs do not have); a loss that falls below zero, past its
    own early scale, and on without slowing (a cross-entropy against targets outside its range is unbounded
    below; a likelihood that may go negative, a Gaussian NLL, slows down as it converges)."""
    steps, v = trace.loss.steps, trace.loss.data.astype(np.float64)
    n = len(v)
    if n == 0:
        return []
    state = np.zeros(n, dtype=np.int8)
    loss0, rms, reach = _loss_reach(trace)
    if reach == reach and reach > th.input_scale ** 2 and reach * rms > th.input_scale:
        state[0] = TargetState.OUT_OF_REACH.code
    fall = {"start": math.nan, "lowest": math.nan, "depth": math.nan, "still_falling": 0.0}
    ok = np.isfinite(v)
    fv, fsteps = v[ok], steps[ok]
    if len(fv) >= 12:
        w = max(5, min(th.plateau_steps // 4, len(fv) // 10))
        smooth = _rolling_median(fv, w)
        below = np.nonzero(smooth < 0)[0]
        if len(below):
            # a loss per element is of order one nat or unit at most at the start: the floor keeps a loss
            # that starts at ~0 (a negative cosine, a Gaussian NLL) from being deep below zero at -1
            scale = max(abs(float(fv[0])), float(np.median(np.abs(np.diff(fv[:w + 1])))), 1.0)
            q = len(fv) // 4
            second, fourth = smooth[q] - smooth[2 * q], smooth[len(fv) - 1 - q] - smooth[-1]
            depth = float(-smooth.min() / scale)
            fall = {"start": float(fv[0]), "lowest": float(smooth.min()), "depth": depth,
                    "still_falling": float(second > 0 and fourth >= 0.7 * second)}
            if depth >= th.loss_below_zero and fall["still_falling"]:
                # from where the steady fall began: targets out of range pull the loss down from the start
                i = int(below[0])
                while i > 0 and smooth[i - 1] >= smooth[i]:
                    i -= 1
                state[(steps >= int(fsteps[i])) & ok] = TargetState.UNBOUNDED.code
    reach_values = {"loss": lambda r: loss0, "output_rms": lambda r: rms, "reach": lambda r: reach}
    fall_values = {k: (lambda r, x=x: x) for k, x in fall.items()}
    return [StateSeries(Signal.TARGET, steps, state[:, None], [""],
                        {TargetState.OUT_OF_REACH: reach_values, TargetState.UNBOUNDED: fall_values}, persist=1)]


def order_series(trace: Trace, th: Thresholds) -> list[StateSeries]:
    """How far each sampled batch's classes are from the mix of the whole run (read off the output's
    gradient, meta ``batch_classes``): Pearson's chi-square of its class counts against the run's
    shares, per degree of freedom. Batches drawn at random from the data hold ~1 whatever their size and
    the classes' balance; batches that hold one class each (data sorted by label, read without shuffling)
    hold about their size. The median of ``batch_order_window`` batches past ``batch_order`` is the state."""
    rows = [r for r in trace.meta.get("batch_classes", ()) if sum(r[2]) >= 2]
    window = th.batch_order_window
    if len(rows) < window or _one_batch(rows):
        return []
    classes = sorted({c for r in rows for c in r[1]})
    if len(classes) < 2:
        return _one_class(trace, rows, th)
    col = {c: i for i, c in enumerate(classes)}
    counts = np.zeros((len(rows), len(classes)))
    for j, (_, found, n, *_) in enumerate(rows):
        counts[j, [col[c] for c in found]] = n
    size = counts.sum(1)
    # (the run's mix: of every sampled batch, as often as it was read)
    share = counts.sum(0) / counts.sum()
    expected = size[:, None] * share[None, :]
    ratio = ((counts - expected) ** 2 / expected).sum(1) / (len(classes) - 1)
    # a batch read again (the same fingerprint: a data set read in a fixed order, sampled at a multiple of its
    # length) is one batch: its classes are one reading of the data's order, however often it is sampled
    first = _first_readings(rows)
    if len(first) < window:
        return []
    rows, ratio, counts, size = [rows[i] for i in first], ratio[first], counts[first], size[first]
    level = _rolling_median(ratio, window)
    level[:window - 1] = np.nan  # too few batches yet
    with np.errstate(invalid="ignore"):
        state = np.where(level >= th.batch_order, TargetState.ORDERED.code, 0).astype(np.int8)
    held = (counts > 0).sum(1)
    # the classes a batch of this size would hold if drawn at random, on average
    random_held = (1.0 - (1.0 - share[None, :]) ** size[:, None]).sum(1)
    values = {"ratio": _at(level), "classes": lambda r: float(len(classes)),
              "batch_classes": lambda r: float(np.mean(held)), "random_classes": lambda r: float(np.mean(random_held)),
              "batch": lambda r: float(np.median(size))}
    steps = np.array([r[0] for r in rows], dtype=np.int64)
    return [StateSeries(Signal.TARGET, steps, state[:, None], [""], {TargetState.ORDERED: values})]


def _first_readings(rows: list) -> list[int]:
    """The indices of ``rows`` (meta ``batch_classes``) but those of a batch read before (its fingerprint seen
    already)."""
    seen: set[float] = set()
    out = []
    for i, r in enumerate(rows):
        p = r[3] if len(r) > 3 else math.nan
        if p == p and p in seen:
            continue
        seen.add(p)
        out.append(i)
    return out


def _one_batch(rows: list) -> bool:
    """Every sampled pass whose classes were read had the same input (the fingerprint the recorder keeps
    with them: a weighted sum of evenly spaced input values, integer ones too): one batch, the whole data set
    at every step (a graph's nodes, full-batch training). Its classes have no order to be read in; those
    read off the output's gradient change only with what the model fits."""
    prints = [r[3] for r in rows if len(r) > 3]
    return (len(rows) >= 2 and len(prints) == len(rows) and all(math.isfinite(p) for p in prints)
            and len(set(prints)) == 1)


# ops that make an output with a learned offset (a linear or convolutional layer with its bias): the offset alone
# fits targets of one class; logits made of similarities (a contrastive loss's, divided by a temperature) have none
_AFFINE_HEADS = frozenset({"Addmm", "Linear", "Convolution", "ConvolutionOverrideable", "MkldnnConvolution"})


def _one_class(trace: Trace, rows: list, th: Thresholds) -> list[StateSeries]:
    """Every target read off the output's gradient is one class (``rows``: the sampled batches' [step, classes,
    counts]), and the loss falls below ``one_class_fit`` of its first value: the model needs only a constant
    to fit them (labels read as one value, a class that all but never shows), through the offset of a
    linear or convolutional head (``output_op``). Once ``one_class_targets`` targets were read, the state
    holds from the first batch read. A contrastive loss whose positive is always class 0 (its logits are
    similarities, with no offset to fit it by) and one sample fitted over and over (the same input at every
    sample: one class by design) are left alone."""
    if not rows or not trace.loss.n or str(trace.meta.get("output_op") or "") not in _AFFINE_HEADS:
        return []
    loss = trace.loss.data
    finite = loss[np.isfinite(loss)]
    if not len(finite) or not finite[0] > 0 or finite.min() > th.one_class_fit * finite[0]:
        return []
    if trace.globals.n:  # one sample trained on over and over (a check that the model can fit it) has one class
        mean, spread = trace.global_column("input_mean"), trace.global_column("input_spread")
        mean = mean[np.isfinite(mean)]
        if len(mean) and np.all(mean == mean[0]) and not np.any(spread > 0):
            return []
    read = np.cumsum([sum(r[2]) for r in rows])
    if read[-1] < th.one_class_targets:
        return []
    state = np.full(len(rows), TargetState.ONE_CLASS.code, dtype=np.int8)  # one class from the first batch read
    values = {"class": lambda r: float(rows[0][1][0]), "targets": lambda r: float(read[-1]),
              "batches": lambda r: float(len(rows)), "loss_first": lambda r: float(finite[0]),
              "loss_min": lambda r: float(finite.min())}
    steps = np.array([r[0] for r in rows], dtype=np.int64)
    return [StateSeries(Signal.TARGET, steps, state[:, None], [""], {TargetState.ONE_CLASS: values}, persist=1)]


def skip_run(steps: np.ndarray) -> tuple[int, int]:
    """The longest run of skipped optimizer steps with at most one applied step between two of them
    (skips share the step number of the next applied step): (its first step, its length)."""
    best, start, length = (0, 0), 0, 0
    for i, s in enumerate(steps):
        if i and s - steps[i - 1] <= 1:
            length += 1
        else:
            start, length = int(s), 1
        if length > best[1]:
            best = (start, length)
    return best


def scaler_series(trace: Trace, th: Thresholds) -> list[StateSeries]:
    """SKIPPING from the first step of the longest run of skipped optimizer steps when it is longer than
    ``skipped_steps`` (a few at the start are a GradScaler's calibration, not a fault)."""
    steps, scales = trace.skipped.steps, trace.skipped.data.astype(np.float64)
    if not len(steps):
        return []
    start, length = skip_run(steps)
    codes = np.zeros(len(steps), dtype=np.int8)
    if length >= th.skipped_steps:
        codes[steps >= start] = ScalerState.SKIPPING.code
    low = float(np.nanmin(scales)) if np.isfinite(scales).any() else math.nan
    values = {"run_start": lambda r: float(start), "run_length": lambda r: float(length), "lowest_scale": lambda r: low}
    return [StateSeries(Signal.SCALER, steps, codes[:, None], [""], {ScalerState.SKIPPING: values}, persist=1)]


def lr_series(trace: Trace, f: Features, th: Thresholds) -> list[StateSeries]:
    """RAISED where the learning rate rises ``lr_jump`` times or more between sampled steps from a rate
    that held steady before it (a warm-up ramp is no jump). DECAYED over a decline from its peak that takes it
    ``lr_decayed`` times or more below that peak, from the first sample ``lr_jump`` times below the peak on,
    for as long as it stays below the peak."""
    lr = trace.global_column("lr").astype(np.float64) if trace.globals.n else np.zeros(0)
    state = np.zeros(len(lr), dtype=np.int8)
    if len(lr) >= 3:
        before, prior = lr[1:-1], lr[:-2]
        with np.errstate(invalid="ignore"):
            jump = (before > 0) & (lr[2:] >= th.lr_jump * before) & (np.abs(prior - before) <= th.lr_steady * before)
        state[2:][jump] = LrState.RAISED.code
    peak = np.fmax.accumulate(np.where(lr > 0, lr, 0.0)) if len(lr) else lr
    with np.errstate(invalid="ignore"):
        below = (peak > 0) & (lr < peak)
        deep = below & (lr * th.lr_decayed <= peak)
    # a decline is an unbroken run of samples below the running peak; it counts once it goes deep enough, from
    # where it is clearly under way (``lr_jump`` times below the peak: a cosine has barely begun before mid-run)
    decline = np.cumsum(~below)
    deep_runs = np.unique(decline[deep])
    with np.errstate(invalid="ignore"):
        under_way = below & (lr * th.lr_jump <= peak)
    started = np.zeros(len(lr), dtype=bool)
    for run in deep_runs:
        rows = np.nonzero((decline == run) & under_way)[0]
        started[rows[0]:] |= decline[rows[0]:] == run
    decayed = below & started
    state[decayed & (state == 0)] = LrState.DECAYED.code
    low = np.minimum.accumulate(np.where(np.isfinite(lr), lr, np.inf)[::-1])[::-1] if len(lr) else lr
    values = {"lr_before": lambda r: float(lr[r - 1]) if r > 0 else math.nan, "lr": _at(lr)}
    decay_values = {"lr_peak": _at(peak), "lr": _at(lr), "lr_low": _at(low)}
    return [StateSeries(Signal.LR, f.steps, state[:, None], [""], {LrState.RAISED: values,
                                                                   LrState.DECAYED: decay_values}, persist=1)]


def class_term_series(trace: Trace, th: Thresholds, curve: LossCurve | None) -> list[StateSeries]:
    """The classification term of a loss that adds other terms to it (meta ``class_term``: its value on sampled
    passes, read off the output's gradient), read as the plain loss is: the loss as a whole may fall with its
    other terms (a weight penalty shrinking the weights) while this one learns nothing. Its progress is counted
    from its start (from chance, when it starts ``above_chance`` times above it). A plateau from the sample on
    which its running median (over ``persist`` samples) has made less than ``loss_progress`` of it, to the end,
    over ``2 * persist + 1`` samples and ``plateau_steps`` steps or more, while the loss as a whole ends no lower
    than that level (the other terms add to it: a whole loss below it says the term came down since its last
    sample), and that level has not come ``loss_learned`` of its way down from chance (a term that stays low was
    learned before: a model fine-tuned, fitting its classes from the start). None when the loss as a whole is
    flat itself: its own plateau says so."""
    rows = trace.meta.get("class_term") or []
    least = 2 * th.persist + 1
    if curve is None and trace.loss.n:
        curve = loss_curve(trace.loss.data, th)
    if len(rows) < least or curve is None or not len(curve.progress) or curve.progress[-1] < th.loss_progress:
        return []
    chance, uniform = class_chance(trace, th)
    steps = np.array([int(r[0]) for r in rows], dtype=np.int64)
    v = np.array([float(r[1]) for r in rows], dtype=np.float64)
    smooth = _rolling_median(v, th.persist)
    start = float(np.median(v[:th.persist]))
    floor = max(chance, uniform) if uniform == uniform else chance
    base = chance if chance > 0 and start > th.above_chance * floor else start
    if not base > 0:
        return []
    progress = (base - smooth) / base
    flat = progress < th.loss_progress
    state = np.zeros(len(v), dtype=np.int8)
    if flat[-1]:
        i = int(np.nonzero(~flat)[0][-1]) + 1 if (~flat).any() else 0
        level = float(smooth[-1])
        # come at least ``loss_learned`` of its way down from chance (NaN chance: not known)
        learned = chance > 0 and level < chance * (1.0 - th.loss_learned)
        if (len(v) - i >= least and steps[-1] - steps[i] >= th.plateau_steps and not learned
                and float(curve.smooth[-1]) >= level * (1.0 - th.loss_progress)):
            state[i:] = LossState.PLATEAU.code
    values = {"loss": _at(smooth), "start": lambda r: start, "best": lambda r: float(smooth.min()),
              "progress": lambda r: float(progress[-1]), "chance": lambda r: chance,
              "latest": lambda r: float(smooth[-1]), "from_chance": lambda r: float(chance == chance),
              "term": lambda r: 1.0, "whole_start": lambda r: float(curve.start)}
    return [StateSeries(Signal.LOSS, steps, state[:, None], [""], {LossState.PLATEAU: values})]


def compute(trace: Trace, th: Thresholds, curve: LossCurve | None = None) -> HealthTable:
    f = features(trace)
    series, latest = layer_series(f, th)
    series += global_series(trace, f, th)
    series += lr_series(trace, f, th)
    series += loss_series(trace, th, curve)
    series += class_term_series(trace, th, curve)
    series += target_series(trace, th)
    series += order_series(trace, th)
    series += scaler_series(trace, th)
    with np.errstate(invalid="ignore"):
        median = row_median(f.update_ratio)
    replaced = f.steps[median >= th.update_replaces]
    return HealthTable(steps=f.steps, layers=trace.layers, order=f.order, series=series, latest=latest,
                       replaced=replaced)
