"""Attention that collapses onto a few keys, or whose logits grow without bound.

Sharp attention is often the solution (a model that copies the previous token attends to one key), so
a collapsed entropy is a failure only when the loss fails with it: it stays flat, hardly comes down,
diverges or oscillates. Most often it follows updates too large for the weights: a learning rate with
no warm-up pushes the logits up in the first steps, and they keep growing after the updates are back
to a usual size. The candidate is named at the attention that collapsed first; while the updates are
still too large when it collapses, the learning rate explains it (see ``causality``).
"""
from __future__ import annotations

from ..causes import Cause
from ..health import LOGIT_NAT
from ..states import AttnState, LossState, Signal
from . import losses
from .context import Context
from .evidence import Candidate, below_ratio, past_ratio, persistence


def candidates(ctx: Context) -> list[Candidate]:
    collapsed = ctx.all(Signal.ATTENTION, AttnState.COLLAPSED)
    growing = ctx.all(Signal.ATTENTION, AttnState.GROWING)
    events = sorted(collapsed or growing, key=lambda e: (e.step, ctx.rank.get(e.layer, 0)))
    if not events:
        return []
    first = events[0]
    layers = list(dict.fromkeys(e.layer for e in events))
    onset = min([e.step for e in growing if e.layer == first.layer and e.step <= first.step] + [first.step])
    v = first.values
    # how far past its thresholds: the entropy below its own, the logit's growth past its own
    # (the growth counted as the state counts it: from one nat at least)
    first_logit = v.get("first_logit", float("nan"))
    grown = (v.get("max_logit", float("nan")) / max(first_logit, LOGIT_NAT) if first_logit == first_logit
             else first_logit)
    severity = max(below_ratio(v.get("entropy", float("nan")), ctx.th.attention_entropy),
                   past_ratio(grown, ctx.th.attention_logit_growth))
    return [Candidate(Cause.ATTENTION_COLLAPSE, first.layer, onset, "collapsed" if collapsed else "growing",
                      [first], severity=severity, persistence=persistence(first, ctx), needs_harm=True,
                      symptoms=[e for e in events + growing if e is not first and e.layer != first.layer],
                      loss_kinds=losses.ANY | {LossState.SLOW},
                      facts={"layers": layers, "entropy": v.get("entropy", float("nan")),
                             "first_logit": v.get("first_logit", float("nan")),
                             "max_logit": v.get("max_logit", float("nan")),
                             "logit_growth": v.get("logit_growth", float("nan")),
                             "hand_written": any(ctx.layers[n].type_name == "F.softmax"
                                                 for n in layers if n in ctx.layers)})]
