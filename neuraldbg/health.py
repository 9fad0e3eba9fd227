"""Semanticization, part 1: statistics -> health states, per layer and sampled step, vectorised.

Everything here is a ratio or a fraction, so one set of thresholds fits many models:
- activation: share of dead units (ReLU family), share of saturated outputs (bounded family, except
  the model's own output, where a confident sigmoid is the goal), growth of the output spread;
- gradient: the relative weight gradient |dW|/|W| of a layer against the largest one after it in
  forward order (attenuation toward the input) and against its own start (growth over time);
- gain: output spread over input spread of a weight layer (what its weight scale does to the signal);
- update: the optimizer's update-to-weight ratio; input: the batch's scale and finiteness;
- loss: smoothed curve against its start (progress, rise, oscillation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .layers import Kind, LayerInfo
from .states import ActState, FiniteState, GainState, GradState, InputState, LossState, UpdateState
from .stats import Stat
from .thresholds import Thresholds
from .trace import GLOBAL_COLUMNS, Trace

# Layers whose relative weight gradient is comparable along depth (embeddings see sparse rows and
# norm layers have their own scale, so neither is a yardstick for attenuation).
_GRAD_KINDS = frozenset(Kind) - {Kind.EMBEDDING, Kind.NORM}
# Layers whose output spread is set by their weight scale.
_GAIN_KINDS = frozenset({Kind.LINEAR, Kind.CONV, Kind.RECURRENT, Kind.ATTENTION})


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
class HealthTable:
    """State codes and the numbers behind them, (samples, layers) or (samples,) arrays."""

    steps: np.ndarray
    layers: list[LayerInfo]
    order: np.ndarray          # forward position of each layer, -1 if never seen
    act: np.ndarray
    grad: np.ndarray
    gain: np.ndarray
    finite: np.ndarray
    update: np.ndarray
    input: np.ndarray
    numbers: dict              # name -> array, the values the states were decided on
    loss_steps: np.ndarray
    loss: np.ndarray
    loss_numbers: dict

    def layer_health(self, i: int, t: int = -1) -> LayerHealth:
        n = self.numbers
        values = {k: float(n[k][t, i]) for k in ("dead_fraction", "saturated_fraction", "act_std", "act_growth",
                                                 "attenuation", "grad_growth", "relative_grad", "gain",
                                                 "update_ratio")}
        return LayerHealth(layer=self.layers[i].name, step=int(self.steps[t]), act=ActState.of(self.act[t, i]),
                           grad=GradState.of(self.grad[t, i]), nonfinite=bool(self.finite[t, i]),
                           gain=GainState.of(self.gain[t, i]), values=values)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((b > 0) & np.isfinite(b), a / np.where(b > 0, b, 1.0), np.nan)


def _first_finite(x: np.ndarray) -> np.ndarray:
    """Per column, the first finite value (NaN when none)."""
    ok = np.isfinite(x)
    first = ok.argmax(axis=0)
    vals = x[first, np.arange(x.shape[1])]
    return np.where(ok.any(axis=0), vals, np.nan)


def _fill_from_right(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Along axis 1, replace invalid entries by the nearest valid one to their right (else keep)."""
    n = x.shape[1]
    idx = np.where(valid, np.arange(n), n)
    idx = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]
    padded = np.concatenate([x, x[:, -1:]], axis=1) if n else x
    out = np.take_along_axis(padded, np.minimum(idx, n), axis=1) if n else x
    return np.where(idx < n, out, x)


def _previous_finite(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Along axis 1, the nearest finite value strictly to the left; ``first`` (T,) for column 0."""
    t, n = x.shape
    full = np.concatenate([first[:, None], x], axis=1)
    valid = np.isfinite(full) & (full > 0)
    idx = np.where(valid, np.arange(n + 1), -1)
    idx = np.maximum.accumulate(idx, axis=1)
    vals = np.take_along_axis(full, np.maximum(idx, 0), axis=1)
    vals = np.where(idx >= 0, vals, np.nan)
    return vals[:, :n]  # column j of x sees entries 0..j of full = first + x[:, :j]


def layer_states(trace: Trace, th: Thresholds) -> tuple[dict, dict]:
    """State codes and numbers for every layer and sample."""
    x = trace.stats.data
    layers = trace.layers
    t, n = x.shape[0], len(layers)
    kinds = [l.kind for l in layers]
    order = np.array([-1 if l.order is None else l.order for l in layers])
    seen = order >= 0
    last = order.max() if seen.any() else -1

    # -- activations
    relu = np.array([k == Kind.RELU for k in kinds])
    bounded = np.array([k == Kind.BOUNDED for k in kinds]) & (order != last)
    dead = x[:, :, Stat.ACT_DEAD]
    sat = x[:, :, Stat.ACT_SATURATED]
    std = x[:, :, Stat.ACT_STD]
    growth = _div(std, _first_finite(std)[None, :])
    act_nonfinite = x[:, :, Stat.ACT_NONFINITE] > 0
    act = np.zeros((t, n), dtype=np.int8)
    act[bounded & (sat >= th.saturated_fraction)] = ActState.SATURATED.code
    act[relu & (dead >= th.dead_fraction)] = ActState.DEAD.code
    act[(growth > th.activation_growth) | act_nonfinite] = ActState.ANOMALOUS.code

    # -- gradients, along forward order
    perm = np.argsort(np.where(seen, order, np.iinfo(np.int64).max), kind="stable")[:int(seen.sum())]
    trainable = np.array([l.n_trainable > 0 and k in _GRAD_KINDS for l, k in zip(layers, kinds)])
    rel = np.where(trainable[None, :], _div(x[:, :, Stat.W_GRAD_NORM], x[:, :, Stat.W_NORM]), np.nan)
    rel_o = rel[:, perm]
    later = np.fmax.accumulate(rel_o[:, ::-1], axis=1)[:, ::-1]
    later = np.concatenate([later[:, 1:], np.full((t, 1), np.nan)], axis=1) if len(perm) else later
    atten_o = _div(rel_o, later)
    atten_o = np.where(np.isfinite(rel_o) & (later > 0) & (rel_o == 0), 0.0, atten_o)
    ggrowth = _div(rel, _first_finite(rel)[None, :])
    ggrowth_o = ggrowth[:, perm]
    grad_o = np.full((t, len(perm)), -1, dtype=np.int8)
    measured = np.isfinite(rel_o)
    grad_o[measured] = GradState.HEALTHY.code
    grad_o[measured & (atten_o < th.vanishing_ratio)] = GradState.VANISHING.code
    grad_o[measured & ((atten_o > th.exploding_ratio) | (ggrowth_o > th.exploding_ratio))] = GradState.EXPLODING.code
    # a layer without weights shows the state of the next weight layer after it
    grad_o = _fill_from_right(grad_o, grad_o >= 0)
    grad = np.zeros((t, n), dtype=np.int8)
    grad[:, perm] = np.maximum(grad_o, 0)
    atten = np.full((t, n), np.nan)
    atten[:, perm] = atten_o

    # -- gain of weight layers: output spread / spread of what came before
    std_o = std[:, perm]
    input_std = trace.globals.data[:, GLOBAL_COLUMNS.index("input_std")] if t else np.zeros(0)
    prev_o = _previous_finite(std_o, input_std)
    gain_o = _div(std_o, prev_o)
    gain = np.full((t, n), np.nan)
    gain[:, perm] = gain_o
    weighty = np.array([l.n_params > 0 and k in _GAIN_KINDS for l, k in zip(layers, kinds)])
    gain = np.where(weighty[None, :], gain, np.nan)
    gain_s = np.zeros((t, n), dtype=np.int8)
    gain_s[gain < 1.0 / th.layer_gain] = GainState.SHRINKS.code
    gain_s[gain > th.layer_gain] = GainState.AMPLIFIES.code

    # -- non-finite anywhere in the layer's row
    wn = x[:, :, [Stat.W_NORM, Stat.W_GRAD_NORM]]
    finite = act_nonfinite | (x[:, :, Stat.GRAD_NONFINITE] > 0) | np.isinf(wn).any(axis=2)

    # -- updates
    updated = np.array([l.n_trainable > 0 for l in layers])
    upd = np.where(updated[None, :], _div(x[:, :, Stat.W_UPDATE_NORM], x[:, :, Stat.W_NORM]), np.nan)
    states = dict(act=act, grad=grad, gain=gain_s, finite=finite.astype(np.int8), order=order)
    numbers = dict(dead_fraction=dead, saturated_fraction=sat, act_std=std, act_growth=growth,
                   attenuation=atten, grad_growth=ggrowth, relative_grad=rel, gain=gain, update_ratio=upd)
    return states, numbers


def global_states(trace: Trace, upd: np.ndarray, th: Thresholds) -> tuple[dict, dict]:
    """Model-level update state and input state per sample."""
    g = trace.globals.data
    t = g.shape[0]
    has = np.isfinite(upd)
    if upd.size and has.any():
        with np.errstate(all="ignore"):
            srt = np.sort(np.where(has, upd, np.inf), axis=1)
            cnt = has.sum(axis=1)
            mid = np.take_along_axis(srt, np.maximum((cnt - 1) // 2, 0)[:, None], axis=1)[:, 0]
            mid = np.where(cnt > 0, mid, np.nan)
            top = np.where(cnt > 0, np.nanmax(np.where(has, upd, -np.inf), axis=1), np.nan)
    else:
        mid = top = np.full(t, np.nan)
    update = np.zeros(t, dtype=np.int8)
    update[mid > th.update_too_large] = UpdateState.TOO_LARGE.code
    update[top < th.update_negligible] = UpdateState.NEGLIGIBLE.code
    col = GLOBAL_COLUMNS.index
    mean, sd, absmax = g[:, col("input_mean")], g[:, col("input_std")], g[:, col("input_absmax")]
    scale = np.fmax(np.abs(mean), sd)
    inp = np.zeros(t, dtype=np.int8)
    inp[scale > th.input_scale] = InputState.UNSCALED.code
    inp[g[:, col("input_nonfinite")] > 0] = InputState.NONFINITE.code
    return (dict(update=update, input=inp),
            dict(update_median=mid, update_max=top, input_mean=mean, input_std=sd, input_absmax=absmax,
                 input_scale=scale, lr=g[:, col("lr")]))


def _rolling_mean(v: np.ndarray, w: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(v)])
    i = np.arange(1, len(v) + 1)
    lo = np.maximum(i - w, 0)
    return (c[i] - c[lo]) / (i - lo)


def loss_states(steps: np.ndarray, values: np.ndarray, th: Thresholds) -> tuple[np.ndarray, dict]:
    """A state per recorded loss: non-finite, diverging, oscillating, plateau or improving."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int8), {}
    v = values.astype(np.float64)
    ok = np.isfinite(v)
    w = max(3, min(th.plateau_steps // 2, n // 10 if n >= 30 else 3))
    # carry the last finite value over non-finite ones for smoothing
    idx = np.maximum.accumulate(np.where(ok, np.arange(n), 0))
    filled = np.where(ok, v, v[idx]) if ok.any() else np.zeros(n)
    smooth = _rolling_mean(filled, w)
    start = float(np.median(filled[:w]))
    scale = abs(start) + 1e-12
    best = np.minimum.accumulate(smooth)
    rise = (smooth - best) / scale
    progress = (start - best) / scale
    d = np.abs(np.diff(filled, prepend=filled[0]))
    osc = _rolling_mean(d, th.plateau_steps) / scale
    lag = np.maximum(np.arange(n) - th.plateau_steps, 0)
    window_progress = (smooth[lag] - smooth) / scale
    enough = np.arange(n) + 1 >= th.plateau_steps
    state = np.zeros(n, dtype=np.int8)
    state[enough & (progress < th.loss_progress)] = LossState.PLATEAU.code
    state[enough & (osc > th.loss_oscillation) & (window_progress < th.loss_progress)] = LossState.OSCILLATING.code
    state[rise > th.loss_rise] = LossState.DIVERGING.code
    state[~ok] = LossState.NONFINITE.code
    return state, dict(smooth=smooth, start=start, best=best, rise=rise, progress=progress, oscillation=osc)


def compute(trace: Trace, th: Thresholds) -> HealthTable:
    states, numbers = layer_states(trace, th)
    gstates, gnumbers = global_states(trace, numbers["update_ratio"], th)
    numbers.update(gnumbers)
    loss_steps, loss_values = trace.loss.steps, trace.loss.data
    lstate, lnumbers = loss_states(loss_steps, loss_values, th)
    lnumbers["value"] = loss_values
    return HealthTable(steps=trace.stats.steps.copy(), layers=trace.layers, order=states["order"],
                       act=states["act"], grad=states["grad"], gain=states["gain"], finite=states["finite"],
                       update=gstates["update"], input=gstates["input"], numbers=numbers,
                       loss_steps=loss_steps.copy(), loss=lstate, loss_numbers=lnumbers)


def latest(table: HealthTable) -> dict[str, LayerHealth]:
    """Each measured layer's health at the last sample."""
    if len(table.steps) == 0:
        return {}
    return {l.name: table.layer_health(i) for i, l in enumerate(table.layers)}
