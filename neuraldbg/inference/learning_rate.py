"""The learning rate: updates too large for the weights (a loss that diverges, oscillates or spikes, weights
made NaN by an update, a weight layer that overflows during training, a layer's updates that spike far
above their size the sample before; updates as large as the weights are a failure by themselves), or
updates negligible next to the weights while the loss does not move. A flat loss is no evidence of a
learning rate too high: updates large only next to weights that stay small (a task the model cannot
fit, a weight decay holding them near zero) leave it flat. A jump of the learning rate shortly before the
failure is named
with it, and so is the layer whose updates spiked first."""
from __future__ import annotations

import math

from ..causes import Cause
from ..events import SemanticEvent
from ..states import LossState, LrState, Signal, SpikeState, UpdateState
from . import losses
from .context import Context
from .evidence import Candidate, below_ratio, past_fraction, past_ratio, persistence


def _clusters(events: list[SemanticEvent], window: int) -> list[list[SemanticEvent]]:
    """Evidence grouped by time: an event joins the group it starts within reach of (before the group ends,
    or within as long again, and at least ``window`` steps after)."""
    groups: list[list[SemanticEvent]] = []
    for e in sorted(events, key=lambda e: e.step):
        if groups:
            g = groups[-1]
            first = g[0].step
            end = max(math.inf if x.end is None else x.end for x in g)
            if e.step <= end + max(window, end - first):
                g.append(e)
                continue
        groups.append([e])
    return groups


def candidates(ctx: Context, found: list[Candidate]) -> list[Candidate]:
    out: list[Candidate] = []
    large = ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE)
    unstable = ctx.all(Signal.LOSS, LossState.DIVERGING, LossState.OSCILLATING)
    # a layer's updates far above their size at the sample before (the spiking step is sampled)
    spikes = [e for e in ctx.all(Signal.SPIKE, SpikeState.SPIKE) if e.layer]
    # NaN in the weights after an update, or an overflow of a weight layer during training: the updates grew them
    nan = [c for c in found if c.cause == Cause.NON_FINITE and c.kind in ("weights", "overflow")]
    # one candidate per burst of evidence: updates too large at the start and a loss that oscillates hundreds
    # of steps later are two stories
    for group in _clusters(large + unstable + spikes, ctx.th.lr_jump_window) or [[]]:
        g_large = [e for e in group if e.signal == Signal.UPDATE]
        g_unstable = [e for e in group if e.signal == Signal.LOSS]
        g_spikes = sorted((e for e in group if e.signal == Signal.SPIKE),
                          key=lambda e: (e.step, -(e.values.get("spike", 0.0) or 0.0), ctx.rank.get(e.layer, 0)))
        end = max((math.inf if e.end is None else e.end for e in group), default=math.inf)
        g_nan = [c for c in nan if (not group or group[0].step <= c.step <= end + ctx.th.lr_jump_window)
                 and all(c not in x.facts.get("nan", []) for x in out)]
        if not group and not g_nan:
            continue
        out.append(_too_large(ctx, g_large, g_unstable, g_spikes, g_nan))
    small = ctx.all(Signal.UPDATE, UpdateState.NEGLIGIBLE)
    nf_step = ctx.nonfinite_step()
    if nf_step is not None:  # weights that stop moving once NaN/Inf appeared say nothing of the learning rate
        small = [e for e in small if e.step < nf_step]
    decayed = _decayed(ctx, small)
    named = decayed + _clipped(ctx, small) + _rounded(ctx, small, nf_step) + _damped(ctx, small)
    out += named
    if decayed:  # updates made negligible by the decay are its consequence, in its chain
        small = [e for e in small if not any(e in c.events for c in decayed)]
    # under SGD a loss divided before backward divides every step alike (Adam's steps do not depend on its scale)
    shrunk = ctx.optimizer_kind == "SGD" and 0 < ctx.loss_factor <= ctx.th.loss_shrunk
    divided = 1 / ctx.loss_factor if shrunk else math.nan
    # a schedule that held the rate far below its base all along: the updates it left negligible are its own
    # (however long they stayed so: a warm-up still raising them), in its chain
    held = _held(ctx, small) if small and not named else []
    out += held
    if small and not held:
        ev = small[0]
        typical = ev.values.get("update_typical", math.nan)
        out.append(Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ev.step, "negligible", [ev],
                             severity=below_ratio(typical, ctx.th.update_negligible), persistence=persistence(ev, ctx),
                             needs_harm=True, loss_kinds=losses.FLAT,
                             facts={"update_typical": typical, "divided": divided}))
    if (not named and not held and not (small and small[0].end is None) and ctx.all(Signal.LOSS, LossState.PLATEAU)
            and (ctx.lr_rising != ctx.lr_rising or ctx.schedule_hold() == ctx.schedule_hold())):
        # updates above negligible (from some step on) that add up to little: a loss flat over a window, not
        # the first steps' stall; a rate a schedule is still raising, a warm-up under way, has moved the weights
        # little so far by design, unless it stayed far below the rate the schedule raises it to for the whole
        # run (a warm-up longer than the run)
        out += _still(ctx, divided) + _group_still(ctx)
    if not named and not small and not any(c.kind == "still" for c in out):
        out += _held(ctx)
    return out


def _held(ctx: Context, small: list[SemanticEvent] | None = None) -> list[Candidate]:
    """A schedule that held the rate ``lr_held`` times below the one it scales or heads to for the whole run,
    its peak included (a warm-up longer than the run, a one-cycle sized for many more steps than were run):
    the run never trained at the rate it was set up for. Its updates need not be negligible (``small``: those
    that were, in its chain); it needs a loss that does not come down, or barely, and the schedule is what to
    mend, not the base rate."""
    hold = ctx.schedule_hold()
    if hold != hold:
        return []
    return [Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ctx.first_step, "held", [], symptoms=list(small or []),
                      severity=past_ratio(hold, ctx.th.lr_held), persistence=1.0, needs_harm=True, lasting=True,
                      loss_kinds=losses.FLAT | {LossState.SLOW}, facts={"held": hold})]


def _group_still(ctx: Context) -> list[Candidate]:
    """A parameter group given a learning rate below another's (``{"params": ..., "lr": 1e-8}``, a default
    meant for another group) whose layers all moved, over the whole run, less than ``weights_still`` of their
    norm while a layer of another group moved more: those layers do not train. Only with a loss that does not
    come down (a backbone fine-tuned slowly on purpose, under a loss that falls, is no fault)."""
    th, moved = ctx.th, ctx.layers_moved
    if len(ctx.lr_groups) < 2:
        return []
    out = []
    for lr, names in ctx.lr_groups:
        own = [moved[n] for n in names if n in moved]
        others = [(g_lr, moved[n]) for g_lr, g_names in ctx.lr_groups if g_names != names
                  for n in g_names if n in moved]
        learns = [g_lr for g_lr, m in others if m >= th.weights_still and g_lr > lr]
        if not own or max(own) >= th.weights_still or not learns:
            continue
        layers = sorted((n for n in names if n in moved), key=lambda n: ctx.rank.get(n, 1 << 30))
        out.append(Candidate(Cause.LEARNING_RATE_TOO_LOW, layers[0], ctx.first_step, "group", [],
                             severity=below_ratio(max(own), th.weights_still), persistence=1.0, needs_harm=True,
                             lasting=True, loss_kinds=losses.FLAT,
                             facts={"moved": max(own), "lr_group": lr, "lr_other": max(learns), "layers": layers,
                                    "others_moved": max(m for _, m in others)}))
    return out


def _still(ctx: Context, divided: float) -> list[Candidate]:
    """Updates each above negligible that add up, over the whole run, to less than ``weights_still`` of the
    weights' norm in every layer: too few steps this small to train (a learning rate a few decades low; under
    SGD, a loss divided by a large count before backward, which divides each step alike). Read from the run's
    start, as a fact of its length: only with a loss that does not come down (a short run, or one whose loss
    is not recorded, moves its weights little by its nature). The rate to raise is the one of the layer that
    moved most (its parameter group's)."""
    if not ctx.layers_moved:
        return []
    most = max(ctx.layers_moved, key=ctx.layers_moved.__getitem__)
    moved = ctx.layers_moved[most]
    if not moved < ctx.th.weights_still:
        return []
    lr = ctx.lr_now()  # (with groups at different rates, the group of the layer that moved most)
    return [Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ctx.first_step, "still", [],
                      severity=below_ratio(moved, ctx.th.weights_still), persistence=1.0, needs_harm=True,
                      lasting=True, loss_kinds=losses.FLAT,
                      facts={"moved": moved, "layer": most, "lr": lr, "divided": divided})]


def _too_large(ctx: Context, large: list, unstable: list, spikes: list, nan: list) -> Candidate:
    step = min([e.step for e in large + unstable + spikes[:1]] + [c.step for c in nan])
    # the run's largest update-to-weight ratio: a figure that does not move with the thresholds
    top = max((e.values.get("update_peak", 0.0) or 0.0 for e in large), default=0.0)
    jump = None
    for e in ctx.all(Signal.LR, LrState.RAISED):
        if step - ctx.th.lr_jump_window <= e.step <= step:
            jump = e
    if jump is not None:
        step = jump.step
    # how far past their thresholds: the largest update, the rise of a diverging loss over its best, the
    # swing of an oscillating one, a spike; NaN weights or an overflow prove the updates outgrew the weights
    sev = past_ratio(top, ctx.th.update_too_large) if large else 0.0
    for e in unstable:
        v = e.values
        scale = max(abs(v.get("start", 0.0)), 1e-12)
        rise = (v.get("loss", 0.0) - v.get("best", 0.0)) / scale
        sev = max(sev, past_ratio(rise, ctx.th.loss_rise) if e.after == LossState.DIVERGING else
                  past_ratio(v.get("oscillation", 0.0), ctx.th.loss_oscillation))
    if nan:
        sev = max(sev, 1.0)
    if spikes:  # as far as the jump is past its factor, and the update it jumped to past too large
        s = spikes[0].values
        sev = max(sev, min(past_ratio(s.get("spike", 0.0), ctx.th.spike_factor),
                           past_ratio(s.get("update_ratio", 0.0), ctx.th.update_too_large)))
    first = large[0] if large else (unstable[0] if unstable else None)
    return Candidate(Cause.LEARNING_RATE_TOO_HIGH, "", step, "too_large", large + unstable + spikes[:1],
                     severity=sev, persistence=persistence(first, ctx) if first is not None else 0.0,
                     loss_kinds=losses.UNSTABLE | losses.SPIKES,
                     facts={"update_max": top, "large": large, "jump": jump, "nan": nan, "spikes": spikes})


def _rounded(ctx: Context, small: list[SemanticEvent], nf_step: int | None) -> list[Candidate]:
    """Weights stored in 16 bits (``model.bfloat16()``, ``model.half()``) that most updates leave exactly as
    they were: an update below half a unit in the last place of a weight (2^-9 of it in bfloat16) rounds away,
    whatever the gradient says. Read on sampled steps as the share of entries an update leaves unchanged, past
    ``updates_rounded``; it needs a loss that does not come down, or barely."""
    rows = [r for r in ctx.updates_unchanged if len(r) >= 2 and (nf_step is None or r[0] < nf_step)]
    if ctx.param_dtype not in ("bfloat16", "float16") or len(rows) < ctx.th.persist:
        return []
    shares = sorted(float(r[1]) for r in rows)
    typical = shares[len(shares) // 2]
    above = [r for r in rows if float(r[1]) >= ctx.th.updates_rounded]
    if typical < ctx.th.updates_rounded or not above:
        return []
    return [Candidate(Cause.LEARNING_RATE_TOO_LOW, "", int(above[0][0]), "rounded", [],
                      severity=past_fraction(typical, ctx.th.updates_rounded), persistence=len(above) / len(rows),
                      needs_harm=True, lasting=True, symptoms=list(small), loss_kinds=losses.FLAT | {LossState.SLOW},
                      facts={"unchanged": typical, "dtype": ctx.param_dtype, "samples": len(rows)})]


def _clipped(ctx: Context, small: list[SemanticEvent]) -> list[Candidate]:
    """Gradients clipped to a small share of their norm before every step (``clip_grad_norm_`` with a
    ``max_norm`` far below their norm, ``clip_grad_value_`` with a tiny value): the clip, not the learning
    rate, sets the updates' size. Seen by comparing their norm at backward end with the one the optimizer
    steps on, on sampled steps. No failure by itself (Adam's updates barely depend on the gradients' scale):
    it needs a loss that does not come down, or barely. A step with no gradient left at all (cleared or zeroed
    between ``backward()`` and ``step()``) is no clip, which leaves a share of the norm: it is not counted."""
    rows = [r for r in ctx.grad_clip if len(r) >= 2 and r[0] > 0 and r[1] > 0]
    if len(rows) < ctx.th.persist:
        return []
    ratios = sorted(r[1] / r[0] for r in rows)
    typical = ratios[len(ratios) // 2]
    if typical > ctx.th.clip_ratio:
        return []
    norms = sorted(r[0] for r in rows)
    stepped = sorted(r[1] for r in rows if r[1] <= ctx.th.clip_ratio * r[0])
    share = sum(q <= ctx.th.clip_ratio for q in ratios) / len(ratios)
    return [Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ctx.first_step, "clipped", [],
                      severity=below_ratio(typical, ctx.th.clip_ratio), persistence=share, needs_harm=True,
                      lasting=True, symptoms=list(small), loss_kinds=losses.FLAT | {LossState.SLOW},
                      facts={"kept": typical, "norm": norms[len(norms) // 2], "clipped": share,
                             "stepped": stepped[len(stepped) // 2], "samples": len(rows)})]


def _decayed(ctx: Context, small: list[SemanticEvent]) -> list[Candidate]:
    """A schedule that takes the learning rate ``lr_decayed`` times below its peak, with the loss stalling
    (flat, or it came down but hardly) once the decline is under way: named from there, with the negligible
    updates it leads to. Or a loss still coming down as the decline begins (by ``loss_progress`` of its start
    over ``plateau_steps``) that then stops, for good, within the decline, short of ``loss_learned`` of its way
    down, where the decline makes the updates negligible: the schedule ended its fall (a StepLR stepped every
    batch, sized in epochs). A decline at the end of a run that learned (a cosine to zero) is no fault, nor one
    that began after the loss had stalled or stopped: no candidate."""
    out = []
    stalled = ctx.all(Signal.LOSS, *losses.FLAT, LossState.SLOW)
    stop = ctx.loss_stopped
    for ev in ctx.all(Signal.LR, LrState.DECAYED):
        # the loss stalls once the decline is under way (a stall before it is not the schedule's)
        end, since = math.inf if ev.end is None else ev.end, ctx.sample_before(ev.step)
        follows = [e for e in small if ev.step <= e.step <= end]
        stalls = any((e.end is None or e.end > ev.step) and since <= e.step <= end for e in stalled)
        # (still coming down as the decline began, over ``plateau_steps`` before it: a cut made because the loss
        # had stopped, a ReduceLROnPlateau's, stops nothing)
        halts = False
        if stop is not None and not stalls and follows:
            at, level, start = stop
            falling = (ctx.loss_at(since - ctx.th.plateau_steps) - ctx.loss_at(since)
                       > ctx.th.loss_progress * abs(start))
            # (and it stops short of ``loss_learned`` of its way down: a loss cut a little early near where it
            # was going has learned)
            short = start - level < ctx.th.loss_learned * abs(start)
            halts = falling and short and since <= at <= end
        if not (stalls or halts):
            continue
        peak, low = ev.values.get("lr_peak", math.nan), ev.values.get("lr_low", math.nan)
        factor = peak / low if low > 0 else math.inf
        out.append(Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ev.step, "decayed", [ev] + follows,
                             severity=past_ratio(factor, ctx.th.lr_decayed), persistence=persistence(ev, ctx),
                             needs_harm=True, loss_kinds=losses.FLAT | {LossState.SLOW}, halts=halts,
                             facts={"lr_peak": peak, "lr_low": low, "factor": factor,
                                    "negligible_from": follows[0].step if follows else None,
                                    "stopped": stop if halts else None}))
    return out


def _damped(ctx: Context, small: list[SemanticEvent]) -> list[Candidate]:
    """An adaptive optimizer (Adam, RMSprop ...) whose ``eps`` is ``eps_damps`` times the gradients' typical RMS
    per entry or more: each update is lr x gradient / eps instead of ~lr, as small as the gradient is next to
    eps (``Adam(..., eps=1.0)``, a TensorFlow setting). No failure by itself: it needs a loss that does not
    come down, or barely."""
    eps, rms = ctx.optimizer_eps, ctx.grad_rms
    if (not ctx.adaptive() or not (eps == eps and rms == rms and rms > 0)
            or eps < ctx.th.eps_damps * rms):
        return []
    return [Candidate(Cause.LEARNING_RATE_TOO_LOW, "", ctx.first_step, "eps", [],
                      severity=past_ratio(eps / rms, ctx.th.eps_damps), persistence=1.0, needs_harm=True,
                      lasting=True, symptoms=list(small), loss_kinds=losses.FLAT | {LossState.SLOW},
                      facts={"eps": eps, "grad_rms": rms})]
