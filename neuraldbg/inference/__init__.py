"""Inference: abductive reasoning from semantic events and links to ranked causal hypotheses.

Each cause family (one module each: ``ranks``, ``data``, ``initialization``, ``activations``, ``attention``,
``nonfinite``, ``precision``, ``gradients``, ``learning_rate``, ``loss``) turns the events matching its
signature into candidates with their evidence; ``evidence.confidence`` scores every candidate the same way;
``causality`` lets each candidate be absorbed by the one that explains it, root first; ``wording`` writes the
chains and fixes.
"""
from __future__ import annotations

from ..causes import Cause
from ..hypothesis import CONFIDENT, CausalHypothesis
from ..states import LossState, Signal, UpdateState
from . import (activations, attention, causality, data, gradients, initialization, learning_rate, loss, nonfinite,
               precision, ranks, wording)
from .context import Context
from .evidence import Candidate

FAMILIES = (ranks, data, initialization, activations, attention, nonfinite, precision, gradients, loss)

__all__ = ["Context", "infer", "candidates"]


def candidates(ctx: Context) -> list[Candidate]:
    found: list[Candidate] = []
    for family in FAMILIES:
        found += family.candidates(ctx)
    return found + learning_rate.candidates(ctx, found)


def _merge_repeats(roots: list[Candidate]) -> list[Candidate]:
    """The same cause at the same place found again later (a learning rate too high in two bursts) is one
    hypothesis: dated from its first confident burst, as confident as its strongest, the later ones in it."""
    out: list[Candidate] = []
    for r in roots:
        same = next((o for o in out if (o.cause, o.layer) == (r.cause, r.layer)), None)
        if same is None:
            out.append(r)
            continue
        if r.step < same.step and r.confidence >= CONFIDENT:  # an earlier burst, confident too: it comes first
            r.absorbed.append(same)
            r.confidence = max(r.confidence, same.confidence)
            out[out.index(same)] = r
        else:
            same.absorbed.append(r)
    return out


def learning_rate_way(roots, unstable: bool) -> tuple[bool, bool, str]:
    """Which way the fixes may move the learning rate: (drop the hypotheses that it is too low, drop those
    that it is too high, the way: "lower", "raise" or ""). The top hypothesis, whatever its confidence, or a
    confident one, sets it: no fix below it may point the other way. ``unstable``: the run shows updates too
    large or a loss diverging or oscillating."""
    top = max(roots, key=lambda r: r.confidence, default=None)
    confident_high = any(r.cause == Cause.LEARNING_RATE_TOO_HIGH and r.confidence >= CONFIDENT for r in roots)
    too_high = confident_high or (top is not None and top.cause == Cause.LEARNING_RATE_TOO_HIGH)
    # a learning rate too low on top (a schedule that decayed it away after large first updates) is the way:
    # the updates that were large before it say nothing against it
    low_on_top = (top is not None and top.cause == Cause.LEARNING_RATE_TOO_LOW
                  and (top.confidence >= CONFIDENT or not confident_high))
    lower = too_high or not low_on_top and unstable
    # a confident learning rate too low, with nothing saying the updates were too large, sets the way too
    too_low = not lower and (low_on_top or any(r.cause == Cause.LEARNING_RATE_TOO_LOW and r.confidence >= CONFIDENT
                                               for r in roots))
    return too_high, too_low, "lower" if lower else "raise" if too_low else ""


def infer(ctx: Context) -> list[CausalHypothesis]:
    """Ranked hypotheses, best first: the roots, each with what it explains in its chain."""
    roots = causality.resolve(candidates(ctx), ctx)
    unstable = bool(ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE)
                    or ctx.all(Signal.LOSS, LossState.DIVERGING, LossState.OSCILLATING))
    too_high, too_low, lr_way = learning_rate_way(roots, unstable)
    roots = _merge_repeats(roots)
    out = []
    for r in roots:
        if (r.cause == Cause.LEARNING_RATE_TOO_LOW and too_high) or (r.cause == Cause.LEARNING_RATE_TOO_HIGH
                                                                     and too_low):
            continue  # a fix may not point the other way of a confident one
        evidence = {id(e): e for c in r.tree() for e in c.events + c.symptoms}
        evidence.update({id(e): e for e in r.loss})
        # a functional operation's row is named by its module; the text names the operation
        info = ctx.layers.get(r.layer)
        layer = (info.owner or "") if info is not None and info.is_site else r.layer
        out.append(CausalHypothesis(cause=r.cause, layer=layer, step=int(r.step), confidence=r.confidence,
                                    chain=[wording.name_sites(ctx, line) for line in wording.chain(r, ctx)],
                                    evidence=sorted(evidence.values(), key=lambda e: e.step),
                                    suggestion=wording.name_sites(ctx, wording.fix(r, ctx, lr_way=lr_way)),
                                    rank=r.facts.get("rank") if r.cause.multi_rank else None))
    return out
