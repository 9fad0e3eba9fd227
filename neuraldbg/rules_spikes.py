"""Inference: spikes. A layer's updates that jump far above their size at the sample before, and the loss
that spikes after them.

The recorder samples the steps after a spike of the gradient or the loss it sees every step (and the
spiking step's updates), so the layer whose updates spiked first is measured. Updates that spike
while the loss spikes or fails after them are updates too large for the weights: the learning rate's
fault (its fix is a gradient clip, which caps a spike, and a lower rate); the layer where it starts
is in the chain. A spike the loss recovers from is a weak signal.
"""
from __future__ import annotations

import math

from .causes import Cause
from .formatting import number as _fmt
from .hypothesis import CausalHypothesis
from .rules import Context, _hyp, _layer_list, _loss_symptoms, _loss_text
from .states import LossState, Signal, SpikeState, UpdateState


def rule_spikes(ctx: Context) -> list[CausalHypothesis]:
    spikes = ctx.free(Signal.SPIKE, SpikeState.SPIKE)
    updates = sorted((e for e in spikes if e.layer), key=lambda e: (e.step, -(e.values.get("spike", 0.0) or 0.0),
                                                                    ctx.rank.get(e.layer, 0)))
    if not updates:
        return []
    first = updates[0]
    active = [e for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE)
              if e.step <= first.step and (e.end is None or e.end > first.step)]
    if any(id(e) in ctx.claimed for e in active):
        return []  # the updates were already too large for a reason found before (an input out of scale...)
    loss_spikes = [e for e in spikes if not e.layer and e.step >= first.step]
    failing = [e for e in _loss_symptoms(ctx, first.step) if e.after != LossState.PLATEAU and e.step >= first.step]
    if not loss_spikes and not failing:
        return []  # updates that jump while the loss goes on: small updates' noise
    v = first.values
    chain = [f"the updates of `{first.layer}` spike first, at step {first.step}: "
             f"{_fmt(v.get('spike', math.nan))}x their size at the sample before "
             f"({_fmt(v.get('update_ratio', math.nan))} x its weights)"]
    later = [e.layer for e in updates[1:] if e.layer != first.layer]
    if later:
        chain.append(f"then those of {_layer_list(later)}")
    if loss_spikes:
        ls = loss_spikes[0]
        chain.append(f"the loss spikes at step {ls.step}: {_fmt(ls.values.get('loss', math.nan))}, from "
                     f"{_fmt(ls.values.get('before', math.nan))}")
    chain += [_loss_text(e) for e in failing[:1]]
    large = [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step >= first.step]
    lr, lr10 = ctx.lr_text()
    conf = 0.85 if failing else 0.4
    fix = (f"clip gradients (torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)): a clip caps a spike "
           f"like the one in `{first.layer}`; if spikes come back, lower the learning rate from {lr} to ~{lr10}")
    return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", first.step, conf, chain,
                 updates + loss_spikes + failing + large,
                 fix)]
