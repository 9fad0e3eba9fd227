"""The analysis of a multi-process run: each rank's trace analysed with the evidence of the others, then
one verdict.

Every rank's trace goes through the same stages as one process's, with ``Context.ranks`` set: the
multi-rank rules see the rank axis, and a NaN/Inf counts from where it was first produced on any rank
(it reaches the others through the all-reduce). The verdicts are then joined: a cause that several
ranks find is one hypothesis, named on the rank where it starts first (None when every rank has it
from the same step), and its chain says how it reached the others.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from . import rankevents
from .analysis import Analysis, analyze
from .causes import Cause
from .events import SemanticEvent
from .hypothesis import CausalHypothesis
from .merge import MergedRun
from .rankevents import RankEvidence
from .thresholds import Thresholds

# Causes whose rule names the rank itself (from the rank axis), not from the onsets of the ranks' verdicts.
RANK_CAUSES = frozenset({Cause.REPLICA_DIVERGENCE, Cause.DUPLICATE_DATA, Cause.RANK_DATA,
                         Cause.BATCHNORM_RANK_MISMATCH, Cause.WORLD_SIZE_SCALING})


@dataclass
class RunAnalysis:
    """``per_rank``: each rank's own analysis; ``hypotheses`` and ``events``: the run's, every one with its rank."""

    per_rank: dict[int, Analysis]
    hypotheses: list[CausalHypothesis] = field(default_factory=list)
    events: list[SemanticEvent] = field(default_factory=list)
    evidence: RankEvidence | None = None
    steps: int = 0

    def view(self, rank: int) -> Analysis:
        """The run's verdict with one rank's layer health (what a dashboard shows for that rank)."""
        own = self.per_rank[rank]
        return Analysis(health=own.health, events=self.events, links=own.links, hypotheses=self.hypotheses,
                        steps=self.steps)


def analyze_run(run: MergedRun, thresholds: Thresholds) -> RunAnalysis:
    layers = run.traces[run.present[0]].layers
    ev = rankevents.evidence(run.ranks, run.traces, layers, thresholds)
    per: dict[int, Analysis] = {}
    for r in run.present:
        a = analyze(run.traces[r], thresholds, steps=run.steps.get(r, 0), ranks=ev.for_rank(r))
        for e in a.events:
            e.rank = r
        per[r] = a
    events = sorted([e for a in per.values() for e in a.events] + ev.events,
                    key=lambda e: (e.step, -1 if e.rank is None else e.rank))
    return RunAnalysis(per_rank=per, hypotheses=join(per, ev, run.present), events=events, evidence=ev,
                       steps=run.step)


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(f"rank {r}" for r in ranks)


def join(per: dict[int, Analysis], ev: RankEvidence, present: list[int]) -> list[CausalHypothesis]:
    """One ranked list from the ranks' hypotheses (see the module docstring)."""
    groups: dict[tuple, list[tuple[int, int, CausalHypothesis]]] = {}
    for r, a in per.items():
        for pos, h in enumerate(a.hypotheses):
            key = (h.cause, h.layer, h.rank) if h.cause in RANK_CAUSES else (h.cause, h.layer)
            groups.setdefault(key, []).append((r, pos, h))
    first = ev.first
    out: list[tuple[float, int, CausalHypothesis]] = []
    for items in groups.values():
        best = max(items, key=lambda x: (x[2].confidence, -x[1]))
        h = best[2]
        if h.cause in RANK_CAUSES:
            out.append((-h.confidence, best[1], h))
            continue
        onsets = {r: x.step for r, _, x in items}
        s0 = min(onsets.values())
        at_first = [r for r in sorted(onsets) if onsets[r] == s0]
        from_nan = first is not None and (h.cause == Cause.NON_FINITE or (
            h.cause == Cause.DATA and first[1].phase in ("input", "loss") and h.step == first[1].step))
        rank: int | None
        if from_nan and first is not None:
            rank = first[0]
        elif len(present) > 1 and len(at_first) < len(present):
            rank = at_first[0]
        else:
            rank = None
        lead = next((x for r, _, x in items if r == rank), None) or max(
            (x for r, _, x in items if r in at_first), key=lambda x: x.confidence)
        h = copy.copy(lead)
        h.chain = list(lead.chain)
        h.confidence = max(x.confidence for _, _, x in items)
        h.rank = rank
        if from_nan and rank is not None:
            h.chain.append(_spread_of_nan(ev, rank))
        elif rank is not None:
            later = sorted(r for r in onsets if r != rank)
            h.chain.append(f"then {_ranks_text(later)} from step {min(onsets[r] for r in later)}" if later
                           else f"on rank {rank} only")
        elif first is not None and h.cause in (Cause.LEARNING_RATE_TOO_HIGH, Cause.EXPLODING_GRADIENTS):
            h.chain.append(f"NaN/Inf appears first on rank {first[0]} at step {first[1].step}")
        out.append((-h.confidence, best[1], h))
    out.sort(key=lambda x: (x[0], x[1]))
    return [h for _, _, h in out]


def _spread_of_nan(ev: RankEvidence, rank: int) -> str:
    others = sorted(r for r in range(ev.world) if r != rank)
    seen = {r: ev.origins[r] for r in others if r in ev.origins}
    if not others:
        return f"on rank {rank}"
    if not seen:
        return f"the other ranks had not seen NaN/Inf when their traces end ({_ranks_text(others)})"
    how = ", ".join(f"rank {r} at step {o.step} ({o.phase})" for r, o in sorted(seen.items()))
    who = "every rank" if len(seen) == len(others) else _ranks_text(sorted(seen))
    return f"then {who} through the all-reduce: {how}"
