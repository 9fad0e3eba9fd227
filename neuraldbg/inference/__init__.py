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
    that it is too high, the way: "lower", "raise" or ""). The top hypothesis sets it when it is about the
    learning rate, whatever its confidence; else the most confident hypothesis about it that is confident;
    else updates too large or a loss diverging or oscillating (``unstable``) say "lower". No hypothesis
    left pointing the other way is kept."""
    lr = (Cause.LEARNING_RATE_TOO_HIGH, Cause.LEARNING_RATE_TOO_LOW)
    top = max(roots, key=lambda r: r.confidence, default=None)
    decides = top if top is not None and top.cause in lr else max(
        (r for r in roots if r.cause in lr and r.confidence >= CONFIDENT), key=lambda r: r.confidence, default=None)
    if decides is not None and decides.cause == Cause.LEARNING_RATE_TOO_HIGH:
        return True, False, "lower"
    if decides is not None:
        return False, True, "raise"
    return False, False, "lower" if unstable else ""


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
