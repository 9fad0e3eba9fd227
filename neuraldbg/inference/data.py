"""Data: NaN/Inf in the input or in the targets, an input out of scale, targets out of the outputs' reach or
outside the loss's range, batches whose classes are grouped (data read in order, not shuffled), a batch whose
samples a module mixes (fed another layout than it expects), a batch normalisation over a handful of values per
channel, a cross-entropy given several classes in a row."""
from __future__ import annotations

import math

from .. import mixing
from ..causes import Cause
from ..layers import Kind
from ..losspath import LossMisuse
from ..states import GradState, InputState, LossState, Signal, TargetState
from . import losses
from .context import Context
from .evidence import RATIO_CAP, Candidate, past_ratio, persistence

def candidates(ctx: Context) -> list[Candidate]:
    out = []
    nf = ctx.nonfinite
    bad_input = ctx.all(Signal.INPUT, InputState.NONFINITE)
    if (nf is not None and nf.phase == "input") or bad_input:
        step = nf.step if nf is not None and nf.phase == "input" else bad_input[0].step
        out.append(Candidate(Cause.DATA, "input", step, "input_nonfinite", bad_input, severity=1.0, persistence=1.0,
                             certain=True, loss_kinds=losses.ANY | losses.NONFINITE))
    elif nf is not None and nf.phase == "loss" and not ctx.loss_nonfinite_op:  # (else the loss's own op)
        out.append(Candidate(Cause.DATA, "input", nf.step, "loss_nonfinite", [], severity=1.0, persistence=1.0,
                             certain=True, loss_kinds=losses.ANY | losses.NONFINITE))
    elif nf is None and ctx.overflow is None:
        # the loss is NaN while no gradient of the step is (they are checked every step), and the updates stop
        # with it: a mean over no element, 0/0 with a gradient of 0 (every target ignored). (A loss that
        # overflows to Inf keeps large, finite gradients: no update stops.)
        for ev in ctx.all(Signal.LOSS, LossState.NONFINITE)[:1]:
            if not ctx.gives_no_gradient_at(ev.step):
                continue
            out.append(Candidate(Cause.DATA, "input", ev.step, "loss_empty", [ev], severity=1.0,
                                 persistence=persistence(ev, ctx), certain=True,
                                 loss_kinds=losses.ANY | losses.NONFINITE))
    unscaled = ctx.all(Signal.INPUT, InputState.UNSCALED)
    if unscaled:
        ev = unscaled[0]
        v = ev.values
        scale = max(abs(v.get("input_mean", 0.0)), v.get("input_std", 0.0))
        # too large, or too small by as many decades below input_tiny
        sev = past_ratio(scale, ctx.th.input_scale) if scale >= ctx.th.input_tiny else past_ratio(
            ctx.th.input_tiny, scale) if scale > 0 else RATIO_CAP
        first = ctx.input_reach()
        symptoms = [e for e in ctx.events if e.bad and e.layer in first and e.step >= ev.step
                    and e.signal in (Signal.ACTIVATION, Signal.GRADIENT, Signal.FINITE)
                    and e.after not in (GradState.DIMINISHING,)]
        # in scale before and after: some batches out of scale (a corrupt file, a unit mix-up), not the pipeline
        outlier = not ctx.from_start(ev) and ev.end is not None
        out.append(Candidate(Cause.DATA, "input", ev.step, "unscaled", [ev],
                             severity=sev, persistence=persistence(ev, ctx),
                             symptoms=symptoms, loss_kinds=losses.ANY,
                             facts={**v, "outlier": outlier, "until": ev.end}))
    small = [e for e in ctx.all(Signal.GAIN)
             if e.values.get("reads_input") and ctx.input_too_small(e) and ctx.from_start(e)]
    if small and not unscaled:
        # the first layer's output is its biases: its weights must grow by its gain before the input counts
        ev = small[0]
        rms = ev.values["input_rms"]
        out.append(Candidate(Cause.DATA, "input", ev.step, "input_small", [ev],
                             severity=past_ratio(1 / rms, ctx.th.layer_gain), persistence=persistence(ev, ctx),
                             needs_harm=True, lasting=True, loss_kinds=losses.ANY | {LossState.SLOW},
                             facts={"input_rms": rms, "gain": ev.values.get("gain", math.nan), "layer": ev.layer}))
    constant = ctx.all(Signal.INPUT, InputState.CONSTANT)
    if constant:
        # every sample's input the same: the outputs cannot depend on the sample, whatever the model or its
        # learning rate; a failure only where the loss shows it (another input may carry what the model needs)
        ev = constant[0]
        out.append(Candidate(Cause.DATA, "input", ev.step, "constant", [ev], severity=1.0,
                             persistence=persistence(ev, ctx), needs_harm=True, lasting=True,
                             loss_kinds=losses.FLAT | {LossState.SLOW}, facts=dict(ev.values)))
    if ctx.loss_misuse == LossMisuse.BROADCAST:  # the targets' shape is not the outputs': a fact of the code
        out.append(Candidate(Cause.DATA, "input", ctx.first_step, "targets_broadcast", [], severity=1.0,
                             persistence=1.0, certain=True, lasting=True, loss_kinds=losses.ANY | {LossState.SLOW}))
    for ev in ctx.all(Signal.TARGET, TargetState.OUT_OF_REACH)[:1]:
        out.append(Candidate(Cause.DATA, "input", ev.step, "targets_out_of_reach", [ev],
                             severity=past_ratio(ev.values.get("reach", 0.0), ctx.th.input_scale ** 2),
                             # the targets keep their scale: what the outputs must travel lasts beyond the first step
                             persistence=persistence(ev, ctx), lasting=True, loss_kinds=losses.ANY,
                             facts=dict(ev.values)))
    if not ctx.loss_unbounded:  # (the loss's own code unbounded below, -F.cross_entropy, is the loss's)
        out += unbounded_fall(ctx, Cause.DATA, "input", "targets_unbounded")
    mix = ctx.batch_mixing
    spread = float(mix.get("spread", 0.0))
    at = ctx.layers.get(str(mix.get("layer") or ""))
    # a module made to mix along a sequence (attention, a recurrence) found mixing the batch's samples, or an
    # output that changes with the batch's order; a batch statistic (a batch normalisation without running
    # statistics, or one written in functions, however many) is neither
    sequence_module = at is not None and at.kind in (Kind.ATTENTION, Kind.RECURRENT)
    if spread > mixing.TINY and (sequence_module or mix.get("equivariant") is False):
        # the layout a module reads the batch in is a fact of the code, from the first step: no loss says more
        out.append(Candidate(Cause.DATA, str(mix.get("layer") or ""), ctx.first_step, "mixed", [], severity=1.0,
                             persistence=1.0, certain=True, lasting=True, loss_kinds=losses.ANY | {LossState.SLOW},
                             facts=dict(mix)))
    # a batch normalisation whose statistics are taken over a handful of values per channel (a batch of 2 rows
    # of features): its output keeps little of its input (at 2 values, which of the two is larger) and each
    # sample's depends on the others'; the batch's size is a fact of the code, its harm needs a loss that fails
    few = sorted((n for n, v in ctx.norm_values.items() if v <= ctx.th.norm_values),
                 key=lambda n: ctx.rank.get(n, 1 << 30))
    if few:
        out.append(Candidate(Cause.DATA, few[0], ctx.first_step, "norm_batch", [], severity=1.0, persistence=1.0,
                             needs_harm=True, lasting=True, loss_kinds=losses.ANY | {LossState.SLOW},
                             facts={"values": ctx.norm_values[few[0]], "layers": few}))
    several = [r for r in ctx.target_count if r[2] > 0]
    if len(several) >= ctx.th.persist:
        # a cross-entropy given several classes in a row (multi-hot labels), or a binary cross-entropy of a
        # softmax's outputs: a softmax spreads one unit of probability over a row's classes, so they cannot all be
        # predicted; a fact of the targets and the loss
        out.append(Candidate(Cause.DATA, "input", int(several[0][0]), "targets_several", [], severity=1.0,
                             persistence=1.0, certain=True, lasting=True, acting_from=ctx.first_step,
                             loss_kinds=losses.ANY | {LossState.SLOW},
                             facts={"loss": ctx.target_loss,
                                    "per_row": sorted(r[1] for r in several)[len(several) // 2],
                                    "share": sorted(r[2] for r in several)[len(several) // 2]}))
    step, share, read = ctx.padding_counted
    if share >= ctx.th.padding_counted:
        # most of what the loss reads is the padding (targets that keep the pad token where attention_mask is
        # 0): the model is trained mostly to predict padding, a fact of the targets from their first batch
        out.append(Candidate(Cause.DATA, "input", step, "padding_counted", [], severity=1.0, persistence=1.0,
                             certain=True, lasting=True, acting_from=ctx.first_step,
                             loss_kinds=losses.ANY | {LossState.SLOW}, facts={"share": share, "positions": read}))
    ahead = ctx.next_token  # (read at a share of next-token targets of at least next_token_share when watching)
    if ahead and ahead.get("share", 1.0) < ctx.th.next_token_share:
        ahead = {}  # a share raised since: no longer a model trained on next tokens
    if ahead.get("ahead_by") in (0, 2):
        # the targets are the token after the next: labels shifted by hand, and again by the model; or the
        # position's own token under a causal model: labels never shifted (it learns to copy its input)
        out.append(Candidate(Cause.DATA, "input", ctx.first_step,
                             "shifted_twice" if ahead["ahead_by"] == 2 else "unshifted", [], severity=1.0,
                             persistence=1.0, certain=True, lasting=True, loss_kinds=losses.ANY | {LossState.SLOW},
                             facts=dict(ahead)))
    if ahead.get("sees_ahead"):
        # the targets are the next tokens and each position's output reads them: a fact of the model's code from
        # the first step, whatever the loss does (it falls the faster for it)
        place = str(ahead.get("layer") or "")
        out.append(Candidate(Cause.DATA, place if place in ctx.layers else "", ctx.first_step, "sees_ahead", [],
                             severity=1.0, persistence=1.0, certain=True, lasting=True,
                             loss_kinds=losses.ANY | {LossState.SLOW}, facts=dict(ahead)))
    for ev in ctx.all(Signal.TARGET, TargetState.ONE_CLASS)[:1]:
        # nothing to tell apart: the loss falls to ~0 with a constant output, and the model learns nothing else
        out.append(Candidate(Cause.DATA, "input", ev.step, "one_class", [ev], severity=1.0,
                             persistence=persistence(ev, ctx), certain=True, lasting=True,
                             acting_from=ctx.first_step, loss_kinds=losses.ANY, facts=dict(ev.values)))
    for ev in ctx.all(Signal.TARGET, TargetState.ORDERED)[:1]:
        # the order is the data loader's, from the first batch on; each batch pulls the model toward its classes
        out.append(Candidate(Cause.DATA, "input", ev.step, "ordered", [ev],
                             severity=past_ratio(ev.values.get("ratio", 0.0), ctx.th.batch_order),
                             persistence=persistence(ev, ctx), lasting=True, acting_from=ctx.first_step,
                             loss_kinds=losses.ANY | {LossState.SLOW}, facts=dict(ev.values)))
    return out


def unbounded_fall(ctx: Context, cause: Cause, layer: str, kind: str) -> list[Candidate]:
    """A loss that cannot be negative falling below zero without end (``TargetState.UNBOUNDED``), as ``cause``:
    its severity is its depth in units of the loss's early scale (linear, past the threshold). Below zero, a
    library loss that cannot be negative for targets in its range (the loss's graph says so) has targets out of
    that range: a fact, whatever the depth (a likelihood written by hand may rightly go negative)."""
    return [Candidate(cause, layer, ev.step, kind, [ev],
                      severity=min(max(ev.values.get("depth", 0.0) / ctx.th.loss_below_zero - 1.0, 0.0), RATIO_CAP),
                      # a failure by itself, not one more loss failure it explains: its own event is the loss
                      persistence=persistence(ev, ctx), certain=kind == "targets_unbounded" and ctx.loss_non_negative,
                      facts={**ev.values, "form": ctx.loss_unbounded})
            for ev in ctx.all(Signal.TARGET, TargetState.UNBOUNDED)[:1]]
