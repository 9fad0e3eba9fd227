"""The analysis pipeline after extraction: health states -> events -> links -> hypotheses.

``analyze`` runs the three stages on a stored trace; re-analysis with new thresholds is just
another call (the model is not needed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import events as events_mod
from . import health as health_mod
from . import losspath
from . import patterns as patterns_mod
from .events import SemanticEvent
from .health import LayerHealth
from .hypothesis import CausalHypothesis
from .patterns import Link
from .inference import Context, infer
from .stats import Stat
from .thresholds import Thresholds
from .trace import Trace


@dataclass
class Analysis:
    """``health``: each layer's latest state; ``events`` in step order; ``hypotheses`` best first."""

    health: dict[str, LayerHealth] = field(default_factory=dict)
    events: list[SemanticEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    hypotheses: list[CausalHypothesis] = field(default_factory=list)
    steps: int = 0


def _lr(trace: Trace) -> tuple[float, float, float]:
    """The learning rate at the last sample, at the first and its largest (NaN when unknown)."""
    if trace.globals.n == 0:
        return math.nan, math.nan, math.nan
    lr = trace.global_column("lr")
    known = lr[np.isfinite(lr)]
    if not len(known):
        return math.nan, math.nan, math.nan
    return float(known[-1]), float(known[0]), float(known.max())


def _lr_rising(trace: Trace, th: Thresholds) -> float:
    """How many times over the schedule has raised the learning rate since the first sample, when it is still
    raising it at the end of the run: the last sample is its peak, past ``lr_steady`` above the rate a quarter
    of the run earlier, and ``lr_jump`` times above the first (a warm-up that never ends, a growth factor above
    1). NaN otherwise (a warm-up that reached its peak and held, a decay)."""
    if trace.globals.n < 3:
        return math.nan
    lr, steps = trace.global_column("lr"), trace.globals.steps
    ok = np.isfinite(lr) & (lr > 0)
    lr, steps = lr[ok], steps[ok]
    if len(lr) < 3 or lr[-1] < lr.max():
        return math.nan
    earlier = lr[steps <= steps[-1] - (steps[-1] - steps[0]) / 4]
    if not len(earlier) or lr[-1] < (1 + th.lr_steady) * earlier[-1] or lr[-1] < th.lr_jump * lr[0]:
        return math.nan
    return float(lr[-1] / lr[0])


def _unupdated(trace: Trace, th: Thresholds) -> tuple[str, ...]:
    """The trainable layers whose weights hold a gradient and never move, at every sampled step where updates
    were read and another layer's weights did move (at least ``persist`` of them), in forward order: no
    optimizer steps them (left out of the optimizer's parameters, a module added after it was made, a
    group whose learning rate is 0). A layer part of whose parameters no group holds (meta ``left_out``: its
    weight left out while its bias is stepped) is one of them once its gradient is read as often, though its
    update is not 0: that update moves only what the optimizer holds, and the weights left out stand still.
    One whose weights have moved from where they started all the same (meta ``weights_moved``) is stepped by
    another optimizer, between the watched one's steps (a GAN's discriminator held in the same model). A layer
    none of whose parameters a group holds (meta ``unheld``) needs no other layer to move: the rest may be
    frozen (a head replaced after the optimizer was made from the whole model)."""
    st = trace.stats
    if st.n == 0:
        return ()
    up, grad = st.data[:, :, int(Stat.W_UPDATE_NORM)], st.data[:, :, int(Stat.W_GRAD_NORM)]
    trainable = [i for i, layer in enumerate(trace.layers) if layer.n_trainable > 0]
    if len(trainable) < 2 and not _unheld(trace):
        return ()
    left_out, unheld = _left_out(trace), set(_unheld(trace))
    elsewhere = {name for name, d in (trace.meta.get("weights_moved") or {}).get("layers", {}).items() if d > 0}
    with np.errstate(invalid="ignore"):
        moved = (up[:, trainable] > 0).sum(axis=1)
    out = []
    for i in trainable:
        name = trace.layers[i].name
        with np.errstate(invalid="ignore"):  # read, and another layer moved (or no group holds it: nothing need)
            rows = np.isfinite(up[:, i]) & ((moved - (up[:, i] > 0) > 0) | (name in unheld))
        still = name in left_out or bool(np.all(up[rows, i] == 0)) and name not in elsewhere
        if rows.sum() >= th.persist and still and bool(np.all(grad[rows, i] > 0)):
            out.append(i)
    layers = trace.layers
    out.sort(key=lambda i: (layers[i].order is None, layers[i].order or 0))
    return tuple(layers[i].name for i in out)


def _padding_counted(rows) -> tuple[int, float, int]:
    """(the first sampled step, the median share of the positions the loss reads that are padding, the
    positions read then) over the sampled passes that had padding (meta ``padding_counted``); share NaN when
    none was read."""
    rows = [r for r in rows or [] if len(r) >= 3]
    if not rows:
        return 0, math.nan, 0
    shares = sorted(float(r[1]) for r in rows)
    return int(rows[0][0]), shares[len(shares) // 2], int(rows[0][2])


def _left_out(trace: Trace) -> dict[str, tuple[str, ...]]:
    """The layers part of whose parameters that require a gradient no group of the optimizer holds, while it
    holds the rest (meta ``left_out``): layer -> the names of those it leaves out."""
    info = trace.meta.get("left_out")
    names = {layer.name for layer in trace.layers}
    if not isinstance(info, dict):
        return {}
    return {str(k): tuple(str(n) for n in v) for k, v in info.items() if k in names and isinstance(v, list)}


def _unheld(trace: Trace) -> tuple[str, ...]:
    """The layers none of whose parameters that require a gradient a group of the optimizer holds (meta
    ``unheld``)."""
    info = trace.meta.get("unheld")
    names = {layer.name for layer in trace.layers}
    return tuple(str(k) for k in info if k in names) if isinstance(info, list) else ()


def _unregistered(trace: Trace, th: Thresholds) -> dict | None:
    """Weights the forward pass uses that are not the model's parameters and that stayed the same at
    ``persist`` or more sampled steps, in a run whose own weights did move (an optimizer steps the rest): no
    optimizer holds them, as ``model.parameters()`` does not list them (modules in a plain Python list or
    dict, a tensor made with ``requires_grad=True``); or that were freed by a later sample (``renewed``: the
    forward makes new ones at every pass, a layer created inside ``forward``). None otherwise."""
    info = trace.meta.get("unregistered")
    if not isinstance(info, dict) or trace.stats.n == 0 or (int(info.get("still", 0)) < th.persist
                                                            and not info.get("renewed")):
        return None
    with np.errstate(invalid="ignore"):
        moved = bool(np.any(trace.stats.data[:, :, int(Stat.W_UPDATE_NORM)] > 0))
    return dict(info) if moved else None


def _remade(trace: Trace, th: Thresholds, steps: int) -> dict | None:
    """The optimizer was made again inside the loop, at about every step (at least half the run's steps, and
    ``persist`` times), and it keeps a state from step to step (momentum buffers, an adaptive optimizer's
    moments): that state starts from zero at every step. None otherwise (made again once an epoch, or an
    optimizer with no state: nothing lost)."""
    count, stateful = trace.meta.get("optimizer_remade") or (0, False)
    steps = max(steps, int(trace.globals.steps[-1]) + 1 if trace.globals.n else 0)
    if not stateful or count < th.persist or count < steps / 2:
        return None
    return {"made": int(count) + 1, "steps": steps, "optimizer": str(trace.meta.get("optimizer") or "")}


def _eval_mode(trace: Trace, th: Thresholds) -> dict | None:
    """The model ran its training passes in eval mode (``model.eval()`` left on) on most of the sampled ones
    (``persist`` at least), with batch normalisations that then read their running statistics: the meta's
    ``eval_mode`` (see the recorder's ``_note_mode``). None otherwise (an odd pass validated with gradients on)."""
    seen = trace.meta.get("eval_mode") or {}
    passes, sampled = int(seen.get("passes", 0)), int(seen.get("sampled", 0))
    if not seen.get("norms") or passes < th.persist or 2 * passes < sampled:
        return None
    return {"passes": passes, "sampled": sampled, "step": int(seen.get("step", 0)), "norms": list(seen["norms"])}


def _foreign_steps(trace: Trace) -> int:
    """Optimizer steps on weights none of which are the model's, in a run whose own weights never changed
    (the same norm at every sample) and that was given no optimizer of its own: the optimizer steps another
    model's weights (one made before the model was re-created). 0 otherwise."""
    steps = int(trace.meta.get("foreign_steps", 0))
    if not steps or trace.meta.get("optimizer") is not None or trace.stats.n < 2:
        return 0
    norms = trace.stats.data[:, [i for i, layer in enumerate(trace.layers) if layer.n_trainable > 0],
                             int(Stat.W_NORM)]
    known = np.isfinite(norms).all(axis=0)
    if not known.any() or not np.all(norms[:, known] == norms[0, known]):
        return 0
    return steps


def _grad_rms(trace: Trace) -> float:
    """The median over sampled steps of the trainable layers' median gradient RMS per weight entry (what an
    adaptive optimizer's second moment holds the square of); NaN when unknown."""
    st = trace.stats
    idx = [i for i, layer in enumerate(trace.layers) if layer.n_trainable > 0]
    if st.n == 0 or not idx:
        return math.nan
    size = np.sqrt(np.array([trace.layers[i].n_trainable for i in idx], dtype=np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = st.data[:, idx, int(Stat.W_GRAD_NORM)].astype(np.float64) / size
    rms = np.where(np.isfinite(rms) & (rms > 0), rms, np.nan)
    per_step = rms[np.isfinite(rms).any(axis=1)]
    if not len(per_step):
        return math.nan
    return float(np.median(np.nanmedian(per_step, axis=1)))


def _loss_at_start(trace: Trace, chance: float, uniform: float, width: float) -> tuple[float, float]:
    """The loss recorded at the first step, before any update, and the loss a uniform guess gives over the
    classes seen or over the model's outputs (``width``: the log of their number), whichever is higher, or
    chance where higher still; NaNs when either is not known, or the loss is no mean class loss (summed,
    scaled, or more than a cross-entropy)."""
    paths = trace.meta.get("loss_paths") or []
    if not health_mod.mean_class_loss(paths) or losspath.summed(paths):
        return math.nan, math.nan
    floor = max((v for v in (chance, uniform, width) if v == v), default=math.nan)
    if not trace.loss.n or int(trace.loss.steps[0]) != 0 or not floor > 0:
        return math.nan, math.nan
    first = float(trace.loss.data[0])
    return (first, floor) if math.isfinite(first) else (math.nan, math.nan)


def _outputs_read(trace: Trace, th: Thresholds) -> dict[str, tuple[str, ...]]:
    """Per layer, on each sampled step (as ``Context.sampled``), what its recorded output held: "zero" (exactly 0
    for every value: its largest |value| is 0), with "zero_weights" when its own parameters are all 0 too;
    "positive" (values above 0: a mean above minus ``source_spread`` standard deviations); "" (neither, or not
    read). What a ReLU reading it can make of it: nothing but 0 from a "zero" source, some units firing from
    a "positive" one."""
    st = trace.stats
    if st.n == 0:
        return {}
    data = st.data.astype(np.float64)
    mean, std = data[:, :, int(Stat.ACT_MEAN)], data[:, :, int(Stat.ACT_STD)]
    top, weights = data[:, :, int(Stat.ACT_ABSMAX)], data[:, :, int(Stat.W_NORM)]
    with np.errstate(invalid="ignore"):
        zero = top == 0
        positive = (std > 0) & (mean > -th.source_spread * std) & ~zero
        still = zero & (weights == 0)
    out = {}
    for i, layer in enumerate(trace.layers):
        col = np.where(still[:, i], "zero_weights", np.where(zero[:, i], "zero", np.where(positive[:, i], "positive",
                                                                                            "")))
        if col.any():
            out[layer.name] = tuple(str(v) for v in col)
    return out


def _loops(trace: Trace) -> dict[str, list[list]]:
    """Operations applied in a loop of the forward, each call reading what the one before made
    (``health.loop_chains``: a recurrence written by hand, a stack of layers applied in a ``for``): per loop, by
    its first call's name, one row per sampled pass as for a recurrent module's time steps
    (``Context.through_time``): [step, the gradient at the first call's output / the most any call's gets,
    calls, calls up to the last one that gets any gradient, the first's against that last one's]."""
    f = health_mod.features(trace)
    out: dict[str, list[list]] = {}
    for chain in f.loops:
        rows = []
        for r, lead, v in health_mod.loop_profile(f, chain):
            reached = int(np.nonzero(v > 0)[0][-1]) + 1
            rows.append([int(f.steps[r]), float(v[0] / v.max()), len(v), reached, float(v[0] / v[reached - 1])])
        if rows:
            out[f.names[chain[0]]] = rows
    return out


def _layers_moved(trace: Trace) -> dict[str, float]:
    """How far each trainable layer's weights moved over the run against their norm, up to the first NaN/Inf:
    their distance from where they started, where the recorder read it (meta ``weights_moved``: steps that
    cancel, a noisy SGD's, do not add up), else the sum of its update-to-weight ratios, each sampled step's
    counting for the steps since the sample before (an upper bound: steps that cancel count in full). Empty
    when fewer than two sampled steps measured one."""
    f = health_mod.features(trace)
    ratio, steps = f.update_ratio, f.steps
    if trace.nonfinite is not None:
        keep = steps < trace.nonfinite.step
        ratio, steps = ratio[keep], steps[keep]
    measured = np.isfinite(ratio).any(axis=1) if ratio.size else np.zeros(len(steps), dtype=bool)
    if measured.sum() < 2:
        return {}
    gaps = np.diff(steps, prepend=steps[0] - 1).astype(np.float64)
    moved = (np.nan_to_num(ratio.astype(np.float64)) * gaps[:, None]).sum(axis=0)
    out = {f.names[i]: float(v) for i, v, seen in zip(f.ui, moved, np.isfinite(ratio).any(axis=0)) if seen}
    read = trace.meta.get("weights_moved") or {}
    if trace.nonfinite is None or read.get("step", 1 << 62) < trace.nonfinite.step:
        out.update({name: float(read["layers"][name]) for name in out if name in read.get("layers", {})})
    return out


def _lr_groups(meta: dict) -> tuple:
    """(learning rate, layers) of each parameter group of the optimizer, as last read; () with one group."""
    return tuple((float(g[0]), tuple(g[1])) for g in meta.get("lr_groups") or [] if len(g) == 2 and g[1])


def _nonfinite_loss_gradient(trace: Trace) -> float:
    """The largest weight-gradient norm of any layer on the sampled steps whose recorded loss is NaN/Inf: 0 when
    the loss gave no gradient there (a mean over no element), more when it did (an operation of the loss out of
    its domain on some samples); NaN when no such step was sampled."""
    if not trace.loss.n or not trace.stats.n:
        return math.nan
    bad = set(trace.loss.steps[~np.isfinite(trace.loss.data)].tolist())
    rows = [i for i, s in enumerate(trace.stats.steps.tolist()) if s in bad]
    if not rows:
        return math.nan
    norms = trace.stats.data[rows][:, :, int(Stat.W_GRAD_NORM)]
    return float(np.nanmax(norms)) if np.isfinite(norms).any() else math.nan


def _loss_min(trace: Trace) -> float:
    """The lowest finite loss recorded (NaN: none)."""
    v = trace.loss.data
    v = v[np.isfinite(v)] if len(v) else v
    return float(v.min()) if len(v) else math.nan


def _loss_learned_at(trace: Trace, curve, th: Thresholds) -> int | None:
    """The first step at which the smoothed loss had come ``loss_learned`` of its way down, from where it
    started (its first value or its start, the lower: updates too large in the first steps lift it at once; or
    chance, for a loss that starts far above it) to its best; None where it came down by no more than
    ``loss_progress`` of that start."""
    if curve is None or not len(curve.smooth):
        return None
    top = min(curve.start, float(curve.filled[0]))
    top = min(top, curve.chance) if curve.chance == curve.chance else top
    fall = top - float(curve.best[-1])
    if not (fall > th.loss_progress * abs(top)):
        return None
    i = int(np.argmax(curve.smooth <= top - th.loss_learned * fall))
    return int(trace.loss.steps[i])


def _loss_ahead(curve, th: Thresholds) -> np.ndarray:
    """At each recorded loss, the median of it and the losses after it over a window (``plateau_steps`` / 2,
    at most a quarter of the run; fewer at the end): its level from there, batch noise aside."""
    if curve is None or not len(curve.filled):
        return np.zeros(0)
    w = max(2, min(th.plateau_steps // 2, len(curve.filled) // 4))
    # the rolling median of the losses read backward, turned forward again
    return health_mod._rolling_median(curve.filled[::-1], w)[::-1]


def _loss_stopped(trace: Trace, curve, ahead: np.ndarray, th: Thresholds) -> tuple | None:
    """The first step from which the loss's level (``_loss_ahead``) stays within ``loss_progress`` (of its
    scale) of where it ends, at every later step, over ``plateau_steps`` or more, when it came down by more than
    that before: (step, its level there, its start). A loss that converged has stopped too; what stopped it is
    the reasoner's to say."""
    if curve is None or len(ahead) < 2:
        return None
    steps, n = np.asarray(trace.loss.steps), len(ahead)
    w = max(2, min(th.plateau_steps // 2, n // 4))
    tol = th.loss_progress * float(curve.scale[-1])
    end = ahead[max(n - w, 0)]
    # (a loss that rises away and comes back, or falls and then rises, has not stopped)
    settled = np.maximum.accumulate(np.abs(ahead - end)[::-1])[::-1] <= tol
    ok = settled & (curve.start - ahead > tol) & (steps[-1] - steps >= th.plateau_steps)
    first = np.nonzero(ok)[0]
    if not len(first):
        return None
    i = int(first[0])
    return int(steps[i]), float(ahead[i]), float(curve.start)


LOSS_ROWS = 512  # the loss's level kept for the reasoner, at most this many rows


def _loss_rows(trace: Trace, ahead: np.ndarray) -> tuple:
    """(step, the loss's level there, see ``_loss_ahead``) at up to ``LOSS_ROWS`` evenly spaced losses."""
    if not len(ahead):
        return ()
    idx = np.unique(np.linspace(0, len(ahead) - 1, min(len(ahead), LOSS_ROWS)).astype(int))
    steps = np.asarray(trace.loss.steps)
    return tuple((int(steps[i]), float(ahead[i])) for i in idx)


def _output_blocked(trace: Trace, start: float) -> dict:
    """The share of the loss's gradient at the output that the output's bound blocks (``output_blocked``, read
    on sampled passes), over the second half of the run: its median ("share"), and the median of the loss it
    holds there (share times the loss at its step) over the loss's start ("floor"), with the activation and its
    bounds ("activation", "low", "high"). Empty: not read."""
    rows = trace.meta.get("output_blocked") or []
    bound = losspath.regression_bound(trace.meta.get("loss_paths"), str(trace.meta.get("output_op") or ""))
    if not rows or bound is None or not trace.loss.n or not (start > 0):
        return {}
    steps = np.array([r[0] for r in rows], dtype=np.int64)
    share = np.array([r[1] for r in rows], dtype=np.float64)
    late = steps >= (int(steps[-1]) + int(trace.loss.steps[0])) / 2
    at = np.clip(np.searchsorted(trace.loss.steps, steps[late]), 0, trace.loss.n - 1)
    held = share[late] * trace.loss.data[at]
    held = held[np.isfinite(held)]
    if not len(held):
        return {}
    return {"activation": bound[0], "low": bound[1], "high": bound[2], "share": float(np.median(share[late])),
            "floor": float(np.median(held)) / start, "reads": int(late.sum())}


def _cleared(counts, clip) -> tuple[int, int]:
    """(steps checked, steps whose gradients were cleared before the optimizer stepped): set to None, as
    counted on every step, or zeroed in place, as read on the sampled steps whose gradients are read again as
    the optimizer steps (a norm of exactly 0 where the backward pass left one: a clip leaves a share of it).
    Whichever reading finds the larger share."""
    checked, cleared = (int(counts[0]), int(counts[1])) if counts else (0, 0)
    read = [r for r in clip or [] if len(r) >= 2 and r[0] > 0]
    zeroed = sum(r[1] == 0 for r in read)
    if zeroed * max(checked, 1) > cleared * len(read):
        return len(read), zeroed
    return checked, cleared


def _carried(counts) -> float:
    """The share of checked optimizer steps whose next backward pass started on their gradients."""
    if not counts or len(counts) != 2 or int(counts[0]) < 2:
        return 0.0
    return int(counts[1]) / int(counts[0])


def _power_of_two(x: float, at_least: float) -> bool:
    if not (x >= at_least and math.isfinite(x)):
        return False
    k = math.log2(x)
    return abs(k - round(k)) < 1e-4


def _loss_scaled(meta: dict, th: Thresholds, summed: bool) -> float:
    """The factor by which a loss scaler multiplied the loss before backward (``scaler.scale(loss)``, a GradScaler
    the session was not given): the loss's gradient read at a classifier's output is a power of two of at least
    ``loss_scale`` times a mean's. NaN when not so, or not read."""
    typical = _loss_factor(meta, summed)
    return typical if _power_of_two(typical, th.loss_scale) else math.nan


def _loss_factor(meta: dict, summed: bool) -> float:
    """The loss's gradient at a classifier's output against a mean's, typically (NaN when not read, or the
    loss sums)."""
    factors = sorted(float(f) for f in meta.get("loss_gradient_factor") or [])
    return factors[len(factors) // 2] if factors and not summed else math.nan


def _step_factor(meta: dict, summed: bool) -> float:
    """The loss's gradient at a classifier's output against a mean's, as each optimizer step gets it: under
    gradient accumulation the backward passes of a step add up (a loss divided by their number is a mean
    again). NaN when not read, when the loss sums or weighs its classes or samples (a weighted mean's rows
    are no 1/N each)."""
    factor = _loss_factor(meta, summed)
    if losspath.weighted(meta.get("loss_paths")):
        return math.nan
    return factor * max(float(meta.get("passes_per_step", 1.0)), 1.0)


def _scaler_scale(trace: Trace) -> float:
    """The median scale of the GradScaler the session was given, over the sampled steps (NaN: none)."""
    if not trace.globals.n:
        return math.nan
    scales = trace.global_column("loss_scale")
    scales = scales[np.isfinite(scales) & (scales > 0)]
    return float(np.median(scales)) if len(scales) else math.nan


def _scaled_steps(meta: dict, scaled: float) -> float:
    """``scaled`` (see ``_loss_scaled``) when nothing divides the gradients back before the step
    (``optimizer.step()`` called where ``scaler.step(optimizer)`` was meant): at every sampled step read
    again as the optimizer steps, their norm is more than half of their norm at backward end. NaN else."""
    clip = [r for r in meta.get("grad_clip") or [] if len(r) >= 2 and r[0] > 0]
    return scaled if clip and all(r[1] / r[0] > 0.5 for r in clip) else math.nan


def _clip_rows(meta: dict) -> list[list[float]]:
    """The gradients' norm at backward end and as the optimizer steps, for the sampled steps read twice; a
    pair whose ratio is exactly a power of two is a loss scaler's unscale (a GradScaler the session was not
    given), which no clip gives, and is left out."""
    rows = [list(r) for r in meta.get("grad_clip") or []]
    return [r for r in rows if not (len(r) >= 2 and r[0] > 0 and r[1] > 0 and _power_of_two(r[0] / r[1], 2.0))]


def analyze(trace: Trace, thresholds: Thresholds, steps: int = 0, ranks=None) -> Analysis:
    """``ranks``: a ``rankevents.RankEvidence`` when ``trace`` is one rank of a multi-process run (its NaN/Inf
    origin is then the run's first, wherever it came from)."""
    curve = None
    least, classes_uniform = health_mod.loss_floor(trace)
    chance, uniform = math.nan, math.nan
    if trace.loss.n:
        chance, uniform = health_mod.chance_levels(trace, thresholds)
        curve = health_mod.loss_curve(trace.loss.data, thresholds, chance,
                                      uniform if uniform == uniform else classes_uniform, least)
    ahead = _loss_ahead(curve, thresholds)
    table = health_mod.compute(trace, thresholds, curve)
    events = events_mod.detect(table, thresholds)
    rank = {l.name: int(l.order) for l in trace.layers if l.order is not None}
    first = int(table.steps[0]) if len(table.steps) else 0
    links = patterns_mod.detect(events, rank, first)
    lr, lr_first, lr_peak = _lr(trace)
    last = max([int(table.steps[-1]) if len(table.steps) else 0, int(trace.loss.steps[-1]) if trace.loss.n else 0,
                steps - 1])
    # one rank of a multi-process run: its NaN/Inf origin is the run's first, wherever it came from
    nonfinite = trace.nonfinite if ranks is None else ranks.nonfinite(trace.nonfinite)
    summed = losspath.summed(trace.meta.get("loss_paths"))
    scaled = _loss_scaled(trace.meta, thresholds, summed)
    nonfinite_op = losspath.nonfinite_op(nonfinite, trace.meta.get("loss_paths"), thresholds.rounding_rank)
    ctx = Context(events=events, links=links, layers={l.name: l for l in trace.layers}, rank=rank, first_step=first,
                  last_step=last, nonfinite=nonfinite, overflow=trace.overflow, lr=lr, lr_first=lr_first,
                  lr_peak=lr_peak, lr_rising=_lr_rising(trace, thresholds), th=thresholds,
                  lr_base=float(trace.meta.get("lr_base", math.nan)),
                  lr_base_key=str(trace.meta.get("lr_base_key", "initial_lr")),
                  dropout={str(k): [(int(r[0]), float(r[1])) for r in v] for k, v in
                           (trace.meta.get("dropout") or {}).items()},
                  dropout_inside=tuple(trace.meta.get("dropout_inside") or ()),
                  loss_floor=least, loss_uniform=classes_uniform,
                  target_count=tuple(tuple(r) for r in trace.meta.get("target_count") or [] if len(r) >= 3),
                  target_loss=str(trace.meta.get("target_loss") or ""),
                  lr_rows=tuple(zip(trace.globals.steps.tolist(), trace.global_column("lr").tolist()))
                  if trace.globals.n else (), has_loss=trace.loss.n > 0, ranks=ranks,
                  sampled=tuple(int(s) for s in table.steps),
                  unstepped=int(trace.meta.get("unstepped_passes", 0)) if steps <= 0 and not len(table.steps) else 0,
                  carried=_carried(trace.meta.get("gradients_carried")),
                  unreached=int(trace.meta.get("steps_unreached", 0)), unupdated=_unupdated(trace, thresholds),
                  left_out=_left_out(trace), unheld=_unheld(trace),
                  foreign_steps=_foreign_steps(trace), unregistered=_unregistered(trace, thresholds),
                  linear_maps=int(trace.meta.get("linear_maps", 0)), remade=_remade(trace, thresholds, steps),
                  eval_mode=_eval_mode(trace, thresholds),
                  cleared=_cleared(trace.meta.get("steps_cleared"), trace.meta.get("grad_clip")),
                  loss_misuse=losspath.misuse(trace.meta.get("loss_paths")),
                  loss_nonfinite_op=nonfinite_op,
                  loss_op_rescaled=losspath.transformed(trace.meta.get("loss_paths"),
                                                        nonfinite_op.partition(" of ")[2]) if nonfinite_op else "",
                  loss_unbounded=losspath.unbounded_form(trace.meta.get("loss_paths")),
                  loss_hand_written=losspath.hand_written(trace.meta.get("loss_paths")),
                  loss_no_gradient=losspath.no_gradient(trace.meta.get("loss_paths")),
                  loss_non_negative=losspath.non_negative(trace.meta.get("loss_paths")),
                  bounded_output=losspath.bounded_output(trace.meta.get("loss_paths"),
                                                         str(trace.meta.get("output_op") or "")),
                  loss_min=_loss_min(trace),
                  # (a moving objective's level says how the game stands: its fall is no learning)
                  loss_learned_at=None if trace.meta.get("loss_moving") else _loss_learned_at(trace, curve,
                                                                                               thresholds),
                  loss_stopped=None if trace.meta.get("loss_moving") else _loss_stopped(trace, curve, ahead,
                                                                                         thresholds),
                  loss_rows=_loss_rows(trace, ahead),
                  nonfinite_loss_gradient=_nonfinite_loss_gradient(trace),
                  output_blocked=_output_blocked(trace, curve.start if curve is not None else math.nan),
                  param_dtype=str(trace.meta.get("param_dtype") or ""),
                  moving_objective=bool(trace.meta.get("loss_moving")),
                  through_time=dict(trace.meta.get("through_time") or {}), loops=_loops(trace),
                  outputs_read=_outputs_read(trace, thresholds),
                  loss_at_start=_loss_at_start(trace, chance, uniform, classes_uniform),
                  positions_read=dict(trace.meta.get("positions_read") or {}),
                  order_blind=dict(trace.meta.get("order_blind") or {}),
                  optimizer_eps=float(trace.meta.get("optimizer_eps", math.nan)),
                  optimizer_momentum=float(trace.meta.get("optimizer_momentum", math.nan)),
                  optimizer_betas=tuple(float(b) for b in trace.meta.get("optimizer_betas") or ()),
                  optimizer_weight_decay=float(trace.meta.get("optimizer_weight_decay", math.nan)),
                  optimizer=str(trace.meta.get("optimizer") or ""), grad_rms=_grad_rms(trace),
                  optimizer_kind=str(trace.meta.get("optimizer_kind") or ""),
                  layers_moved=_layers_moved(trace), lr_groups=_lr_groups(trace.meta),
                  loss_terms={str(t[0]): list(t[1:]) for t in trace.meta.get("loss_terms") or [] if t},
                  grad_clip=_clip_rows(trace.meta),
                  updates_unchanged=[list(r) for r in trace.meta.get("updates_unchanged") or []],
                  loss_summed=summed, loss_scaled=scaled, loss_factor=_step_factor(trace.meta, summed),
                  passes_per_step=max(float(trace.meta.get("passes_per_step", 1.0)), 1.0),
                  scaled_steps=_scaled_steps(trace.meta, scaled),
                  scaler_scale=_scaler_scale(trace),
                  batch_mixing=dict(trace.meta.get("batch_mixing") or {}),
                  norm_values={str(k): float(np.median(v)) for k, v in (trace.meta.get("norm_values") or {}).items()
                               if v},
                  next_token=dict(trace.meta.get("next_token") or {}),
                  padding_counted=_padding_counted(trace.meta.get("padding_counted")))
    hypotheses = infer(ctx)
    return Analysis(health=table.latest, events=events, links=links, hypotheses=hypotheses, steps=steps)
