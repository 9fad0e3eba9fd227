"""Inference: run the rules in order, let each root cause explain its events, rank the hypotheses."""
from __future__ import annotations

from .hypothesis import CONFIDENT, CausalHypothesis
from .rules import RULES, Context


def infer(ctx: Context) -> list[CausalHypothesis]:
    """Ranked hypotheses, best first. An event explained by an earlier (more fundamental) rule is
    not used again as the primary evidence of a later one: symptoms land in their root's chain."""
    for _, rule in RULES:
        for hyp in rule(ctx):
            ctx.found.append(hyp)
            if hyp.confidence >= CONFIDENT:  # a weak hypothesis explains nothing away
                ctx.claimed.update(id(e) for e in hyp.evidence)
    merged: dict[tuple, CausalHypothesis] = {}
    for i, hyp in enumerate(ctx.found):
        key = (hyp.cause, hyp.layer)
        if key not in merged or hyp.confidence > merged[key].confidence:
            merged[key] = hyp
    rank = {id(h): i for i, h in enumerate(ctx.found)}
    return sorted(merged.values(), key=lambda h: (-h.confidence, rank[id(h)]))
