"""Inference across ranks: rules for the causes only a multi-process run has.

They run first in ``rules.RULES`` and read the rank events of ``Context.ranks`` (a
``rankevents.RankEvidence``; None for one process, where they find nothing). Each names the rank
where its cause starts (None when every rank shares it) and claims the events of the rank being
analysed that follow from it (a shard out of scale makes every replica's updates too large through
the all-reduce), so that the single-process rules do not name a symptom as a cause of its own.
"""
from __future__ import annotations

import math

from .causes import Cause
from .events import SemanticEvent
from .formatting import number as _fmt
from .hypothesis import CausalHypothesis
from .rankevents import BatchState, RankEvidence, RankSignal
from .rules import Context, _hyp, _layer_list, _loss_symptoms, _loss_text
from .states import InputState, Signal, UpdateState


def _ranks_text(ranks: list[int], world: int) -> str:
    if len(ranks) == world:
        return "every rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def _verb(who: str, verb: str) -> str:
    """``who`` and ``verb`` agreeing: "every rank sees", "ranks 0 and 2 see"."""
    return f"{who} {verb}" if who.startswith("ranks ") else f"{who} {verb}s"


def _with_rank(h: CausalHypothesis, rank: int | None) -> CausalHypothesis:
    h.rank = None if rank is None else int(rank)
    return h


def _large_updates(ctx: Context, step: int) -> list[SemanticEvent]:
    """Updates too large from about ``step`` on, on the rank being analysed."""
    return [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step >= step - ctx.th.persist]


def _free(ev: RankEvidence, ctx: Context, signal: RankSignal) -> list[SemanticEvent]:
    return [e for e in ev.of(signal) if id(e) not in ctx.claimed]


def _ranks_of(events: list[SemanticEvent]) -> list[int]:
    return sorted({e.rank for e in events if e.rank is not None})


# -- one rank's data -------------------------------------------------------------------------------

def rule_rank_data(ctx: Context) -> list[CausalHypothesis]:
    ev = ctx.ranks
    if ev is None:
        return []
    evs = _free(ev, ctx, RankSignal.RANK_INPUT)
    if not evs:
        return []
    e = evs[0]
    r, v = e.rank, e.values
    ranks = _ranks_of(evs)
    own = ctx.free(Signal.INPUT, InputState.UNSCALED) if ev.rank in ranks else []
    updates = _large_updates(ctx, e.step)
    bn = _free(ev, ctx, RankSignal.BN_RANKS)
    chain = [f"the batches of {_ranks_text(ranks, ev.world)} are {_fmt(v['ratio'])}x the scale of the other "
             f"ranks' (input RMS {_fmt(v['input_rms'])} against {_fmt(v['others_rms'])}) from step {e.step}"]
    if updates:
        chain.append(f"its gradients dominate the all-reduce: every replica takes updates of up to "
                     f"{_fmt(updates[0].values.get('update_max', math.nan))} x the weights per step")
    if bn:
        chain.append(f"the BatchNorm statistics of {_layer_list([b.layer for b in bn])} differ across ranks")
    chain += [_loss_text(x) for x in _loss_symptoms(ctx, e.step)[:1]]
    fix = (f"check the data pipeline of rank {r}: the shard it reads is scaled differently (unnormalised pixels, "
           "another preprocessing, a corrupt file); normalise every shard the same way (the same mean and std) "
           "and check a batch's scale where it is loaded")
    return [_with_rank(_hyp(ctx, Cause.RANK_DATA, "input", e.step, 0.85, chain,
                            evs + own + updates + bn + _loss_symptoms(ctx, e.step), fix), r)]


# -- the same data twice ---------------------------------------------------------------------------

_SAMPLER = ("give each rank its own part of the data: DataLoader(dataset, batch_size=..., "
            "sampler=torch.utils.data.distributed.DistributedSampler(dataset)) (the sampler shuffles; no shuffle=True "
            "on the loader), and call sampler.set_epoch(epoch) at the start of every epoch")
_SET_EPOCH = ("call sampler.set_epoch(epoch) at the start of every epoch (a DistributedSampler draws the same order "
              "again until told the epoch), or shuffle at all (DistributedSampler(dataset, shuffle=True))")


def rule_duplicate_data(ctx: Context) -> list[CausalHypothesis]:
    ev = ctx.ranks
    if ev is None:
        return []
    evs = _free(ev, ctx, RankSignal.BATCH)
    shared = [e for e in evs if e.after == BatchState.SHARED]
    repeated = [e for e in evs if e.after == BatchState.REPEATED]
    world = ev.world
    rep_ranks = _ranks_of(repeated)
    rep_text = (f"{_verb(_ranks_text(rep_ranks, world), 'see')} the same batches in the same "
                f"order every {int(repeated[0].values['period'])} steps from step {repeated[0].step}: each epoch "
                "repeats the one before") if repeated else ""
    if shared:
        e = shared[0]
        groups = ev.shared or [tuple(range(world))]
        who = "; ".join(_ranks_text(list(g), world) for g in groups)
        copies = max(len(g) for g in groups)
        chain = [f"{_verb(who, 'train')} on the same batches ({e.values['share']:.0%} of the steps compared) "
                 f"from step {e.step}",
                 f"the all-reduce averages {copies} copies of the same gradient: {world} processes do the work of "
                 f"{world - sum(len(g) - 1 for g in groups)}, each epoch covers only part of the data"]
        if repeated:
            chain.append(rep_text)
        return [_hyp(ctx, Cause.DUPLICATE_DATA, "input", e.step, 0.9, chain, shared + repeated, _SAMPLER)]
    if repeated:
        e = repeated[0]
        chain = [rep_text, "the model meets the data in one fixed order, epoch after epoch: "
                           "the batches are no longer a fresh random sample"]
        h = _hyp(ctx, Cause.DUPLICATE_DATA, "input", e.step, 0.6, chain, repeated, _SET_EPOCH)
        return [_with_rank(h, rep_ranks[0] if len(rep_ranks) == 1 else None)]
    return []


# -- replicas --------------------------------------------------------------------------------------

def rule_replica_divergence(ctx: Context) -> list[CausalHypothesis]:
    ev = ctx.ranks
    if ev is None:
        return []
    evs = _free(ev, ctx, RankSignal.REPLICA)
    if not evs:
        return []
    step = evs[0].step
    onset = [e for e in evs if e.step == step]
    rank = onset[0].rank
    ranks = _ranks_of(onset)
    ref = int(onset[0].values.get("reference_rank", 0))
    names = list(dict.fromkeys(e.layer for e in onset))
    weight_layers = [n for n, l in ctx.layers.items() if l.n_params > 0]
    layer = "" if len(names) >= max(2, len(weight_layers) / 2) else names[0]
    where = f"all {len(names)} weight layers" if layer == "" else _layer_list(names)
    rel = max(e.values["divergence"] for e in onset)
    synced = all(e.values.get("grad_divergence", 0.0) <= ctx.th.replica_divergence for e in onset)
    chain = [f"the weights of {where} on {_ranks_text(ranks, ev.world)} differ from rank {ref}'s "
             f"(relative {_fmt(rel)}) from step {step}"]
    if synced:
        chain.append("their gradients after the all-reduce are the same on every rank: the weights are changed "
                     "outside the synchronised update")
        fix = (f"find what changes the weights of rank {rank} outside optimizer.step(): a rank-dependent in-place edit "
               "(if rank == ...: p.data ...), a per-rank optimizer setting (learning rate, weight decay), or a "
               "checkpoint loaded on one rank only; to resynchronise, broadcast rank 0's weights "
               "(dist.broadcast(p.data, src=0) for every parameter)")
    else:
        chain.append("their gradients after the all-reduce differ across ranks: these parameters are not synchronised")
        fix = ("wrap the model in DistributedDataParallel after every parameter exists and sits on its device (DDP "
               "synchronises only the parameters it saw when it was built), and keep them out of "
               "_ddp_params_and_buffers_to_ignore")
    chain.append("the replicas compute different functions: each rank's loss and gradients drift away from the others'")
    later = [e for e in evs if e.step > step]
    return [_with_rank(_hyp(ctx, Cause.REPLICA_DIVERGENCE, layer, step, 0.9, chain, onset + later, fix),
                       rank if len(ranks) == 1 else None)]


# -- BatchNorm -------------------------------------------------------------------------------------

def rule_batchnorm_ranks(ctx: Context) -> list[CausalHypothesis]:
    ev = ctx.ranks
    if ev is None:
        return []
    evs = _free(ev, ctx, RankSignal.BN_RANKS)
    if not evs:
        return []
    e = evs[0]
    names = list(dict.fromkeys(x.layer for x in evs))
    chain = [f"the running statistics of {_layer_list(names)} differ across ranks by "
             f"{_fmt(max(x.values['spread'] for x in evs))} running standard deviations from step {e.step}",
             "each rank normalises with the statistics of its own batches and keeps its own running estimates "
             "(BatchNorm is not synchronised across ranks)",
             "the model behaves differently in evaluation depending on the rank whose weights are saved"]
    fix = ("synchronise BatchNorm across ranks: model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
           "DistributedDataParallel(model) (keeping broadcast_buffers=True, the default); if ranks read different "
           "kinds of data, shuffle it across them (DistributedSampler)")
    return [_with_rank(_hyp(ctx, Cause.BATCHNORM_RANK_MISMATCH, e.layer, e.step, 0.75, chain, evs, fix), e.rank)]


# -- gradients and the world size ------------------------------------------------------------------

def rule_world_size_scaling(ctx: Context) -> list[CausalHypothesis]:
    ev = ctx.ranks
    if ev is None:
        return []
    evs = _free(ev, ctx, RankSignal.GRAD_SCALE)
    if not evs:
        return []
    e = evs[0]
    world = int(e.values.get("world", ev.world) or ev.world)
    updates = _large_updates(ctx, e.step)
    chain = [f"the gradient after the all-reduce is {_fmt(e.values['ratio'])}x the mean of the ranks' own gradients "
             f"from step {e.step} (world size {world}): it is summed over the ranks, not averaged",
             f"every update is up to {world}x larger than one process would take, and changes with the number of "
             "processes"]
    if updates:
        chain.append(f"updates of up to {_fmt(updates[0].values.get('update_max', math.nan))} x the weights per step")
    chain += [_loss_text(x) for x in _loss_symptoms(ctx, e.step)[:1]]
    fix = ("DistributedDataParallel already averages the gradients: remove the extra dist.all_reduce of the gradients "
           "(or divide its result by dist.get_world_size()), and do not scale the loss by the world size")
    return [_hyp(ctx, Cause.WORLD_SIZE_SCALING, "", e.step, 0.85, chain, evs + updates + _loss_symptoms(ctx, e.step),
                 fix)]


RULES = [
    ("rank data", rule_rank_data),
    ("duplicate data", rule_duplicate_data),
    ("replica divergence", rule_replica_divergence),
    ("batchnorm across ranks", rule_batchnorm_ranks),
    ("world size scaling", rule_world_size_scaling),
]
