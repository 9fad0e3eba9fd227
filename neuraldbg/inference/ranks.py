"""Causes only a multi-process run has: one rank's data out of scale, the same data on every rank or in
every epoch, replicas that diverge, BatchNorm statistics that differ across ranks, gradients summed
instead of averaged. They read the rank events of ``Context.ranks`` (a ``rankevents.RankEvidence``;
None for one process, where they find nothing), name the rank where the cause starts (None when every
rank shares it), and explain what the all-reduce spreads from them (see ``causality``): a shard out of
scale, or a gradient summed over the ranks, makes every replica's updates too large.
"""
from __future__ import annotations

from ..causes import Cause
from ..rankevents import BatchState, RankSignal
from . import losses
from .context import Context
from .evidence import Candidate, past_ratio, persistence


def _ranks_of(events) -> list[int]:
    return sorted({e.rank for e in events if e.rank is not None})


def candidates(ctx: Context) -> list[Candidate]:
    ev = ctx.ranks
    if ev is None:
        return []
    th, out = ctx.th, []
    data = ev.of(RankSignal.RANK_INPUT)
    if data:
        e = data[0]
        out.append(Candidate(Cause.RANK_DATA, "input", e.step, "rank_data", data,
                             severity=past_ratio(e.values.get("ratio", 0.0), th.rank_input_scale),
                             persistence=persistence(e, ctx), loss_kinds=losses.ANY,
                             facts={"rank": e.rank, "ranks": _ranks_of(data), "world": ev.world,
                                    "values": dict(e.values), "bn": ev.of(RankSignal.BN_RANKS)}))
    batches = ev.of(RankSignal.BATCH)
    shared = [e for e in batches if e.after == BatchState.SHARED]
    repeated = [e for e in batches if e.after == BatchState.REPEATED]
    if shared or repeated:
        e = (shared or repeated)[0]
        rep_ranks = _ranks_of(repeated)
        # every rank training on the same batches is waste by itself; the same order every epoch, a weaker
        # finding (it may be a choice: shuffle=False)
        out.append(Candidate(Cause.DUPLICATE_DATA, "input", e.step, "shared" if shared else "repeated",
                             shared + repeated, severity=past_ratio(e.values.get("share", 1.0) or 1.0,
                                                                    th.duplicate_batches, decades=0.3),
                             persistence=persistence(e, ctx), certain=bool(shared),
                             facts={"rank": None if shared or len(rep_ranks) != 1 else rep_ranks[0],
                                    "world": ev.world, "groups": ev.shared, "shared": shared, "repeated": repeated,
                                    "rep_ranks": rep_ranks}))
    replicas = ev.of(RankSignal.REPLICA)
    if replicas:
        step = replicas[0].step
        onset = [e for e in replicas if e.step == step]
        ranks = _ranks_of(onset)
        names = list(dict.fromkeys(e.layer for e in onset))
        weight_layers = [n for n, info in ctx.layers.items() if info.n_params > 0]
        layer = "" if len(names) >= max(2, len(weight_layers) / 2) else names[0]
        # replicas of a data-parallel run are bit-identical: any difference is a failure by itself
        out.append(Candidate(Cause.REPLICA_DIVERGENCE, layer, step, "replicas", replicas, severity=1.0,
                             persistence=persistence(onset[0], ctx), certain=True,
                             facts={"rank": ranks[0] if len(ranks) == 1 else None, "ranks": ranks, "world": ev.world,
                                    "names": names, "onset": onset,
                                    "reference": int(onset[0].values.get("reference_rank", 0))}))
    bn = ev.of(RankSignal.BN_RANKS)
    if bn:
        e = bn[0]
        lasting = persistence(e, ctx)
        # the buffers are part of the replica: statistics that stay apart leave each rank a different model,
        # a fault by itself as for diverged weights (a passing difference is sampling noise)
        out.append(Candidate(Cause.BATCHNORM_RANK_MISMATCH, e.layer, e.step, "batchnorm", bn,
                             severity=past_ratio(max(x.values.get("spread", 0.0) for x in bn), th.bn_rank_spread,
                                                 decades=0.3),
                             persistence=lasting, certain=lasting >= 0.5,
                             facts={"rank": e.rank, "names": list(dict.fromkeys(x.layer for x in bn))}))
    scale = ev.of(RankSignal.GRAD_SCALE)
    if scale:
        e = scale[0]
        out.append(Candidate(Cause.WORLD_SIZE_SCALING, "", e.step, "summed", scale,
                             severity=past_ratio(e.values.get("ratio", 0.0), th.grad_world_ratio),
                             persistence=persistence(e, ctx), loss_kinds=losses.ANY,
                             facts={"rank": None, "world": int(e.values.get("world", ev.world) or ev.world),
                                    "ratio": e.values.get("ratio", float("nan"))}))
    return out
