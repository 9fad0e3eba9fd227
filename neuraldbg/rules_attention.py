"""Inference: attention that collapses onto a few keys, or whose logits grow without bound.

Sharp attention is often the solution (a model that copies the previous token attends to one key),
so a collapsed entropy is a fault only when the loss fails with it: it stays flat, near its start,
diverges or oscillates. Most often it follows updates too large for the weights: a learning rate
with no warm-up (AdamW at 3e-2 on a post-LN Transformer) pushes the logits up in the first steps, and
they keep growing after the updates are back to a usual size. The root is then named at the
attention that collapsed first; the learning rate and the updates open its chain. While the updates
are still too large when the attention collapses, the learning rate is the root, the collapse one of
its symptoms.
"""
from __future__ import annotations

import math

from .causes import Cause
from .events import SemanticEvent
from .formatting import number as _fmt
from .hypothesis import CausalHypothesis
from .rules import Context, _hyp, _layer_list, _loss_symptoms, _loss_text
from .states import AttnState, Signal, UpdateState


def _warm_up(ctx: Context, upto: int) -> tuple[float, float]:
    """The learning rate at the first sample and the largest one up to ``upto`` (NaN, NaN when unknown)."""
    steps, lr = ctx.lr_series
    known = [(int(s), float(v)) for s, v in zip(steps, lr) if v == v]
    if not known:
        return math.nan, math.nan
    first = known[0][1]
    top = max((v for s, v in known if s <= max(upto, known[0][0])), default=first)
    return first, top


def rule_attention_collapse(ctx: Context) -> list[CausalHypothesis]:
    collapsed = ctx.free(Signal.ATTENTION, AttnState.COLLAPSED)
    growing = ctx.free(Signal.ATTENTION, AttnState.GROWING)
    # logits that grew without the entropy collapsing (yet) are the same fault when the loss fails with them
    only_growth = not collapsed
    collapsed = sorted(collapsed or growing, key=lambda e: (e.step, ctx.rank.get(e.layer, 0)))
    if not collapsed:
        return []
    first = collapsed[0]
    names = list(dict.fromkeys(e.layer for e in collapsed))
    growing = [e for e in growing if e.layer in names and e not in collapsed]
    onset = min([e.step for e in growing if e.layer == first.layer and e.step <= first.step] + [first.step])
    large = [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step <= first.step]
    loss = [e for e in _loss_symptoms(ctx, onset) if e.step >= onset or e.end is None]
    progress = ctx.loss_progress
    flat = (ctx.has_loss and not loss and not only_growth and progress == progress
            and progress < ctx.th.collapse_progress)
    fails = bool(loss) or flat

    lr_first, lr_top = _warm_up(ctx, onset)
    no_warmup = lr_first == lr_first and lr_top > 0 and lr_first >= 0.5 * lr_top
    lr, lr10 = ctx.lr_text()
    chain = []
    if large:
        top = max((e.values.get("update_max", 0.0) or 0.0) for e in large)
        chain.append(f"updates of up to {_fmt(top)} x the weights per step from step {large[0].step} "
                     f"(lr {_fmt(lr_top) if lr_top == lr_top else lr}{', no warm-up' if no_warmup else ''})")
    elif no_warmup and lr_first == lr_first:
        chain.append(f"the learning rate is {_fmt(lr_first)} from the first step, with no warm-up")
    v = first.values
    growth = v.get("logit_growth", math.nan)
    if growth == growth and growth > 1:
        chain.append(f"the largest attention logit of `{first.layer}` grows from "
                     f"{_fmt(v.get('first_logit', math.nan))} "
                     f"to {_fmt(v.get('max_logit', math.nan))} ({_fmt(growth)}x) by step {first.step}")
    if only_growth:
        chain[-1] += (f", without bound{' (so do those of ' + _layer_list(names[1:]) + ')' if len(names) > 1 else ''}; "
                      f"its entropy is down to {v.get('entropy', math.nan):.0%} of log(keys)")
    else:
        chain.append(f"the attention of `{first.layer}` collapses from step {first.step}: its entropy falls to "
                     f"{v.get('entropy', math.nan):.0%} of log(keys), each query attends to one or two keys"
                     + (f"; so does {_layer_list(names[1:])}" if len(names) > 1 else ""))
    if loss:
        chain += [_loss_text(e) for e in loss[:1]]
    elif flat:
        chain.append(f"the loss hardly comes down: {progress:.0%} of its start over the run")
    if large and any(e.end is None or e.end >= onset for e in large):
        chain[-1 if not (loss or flat) else -2] += " (a symptom: the updates are still too large)"
        return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", large[0].step, 0.85 + 0.05 * fails, chain,
                     collapsed + growing + large + loss,
                     f"lower the learning rate from {lr} to ~{lr10} (with a warm-up) and clip gradients at "
                     "max_norm=1.0")]
    if fails:  # the collapse came with a failing loss: the failure
        conf = 0.85 + 0.05 * bool(large or no_warmup) - 0.1 * only_growth
    else:  # sharp attention while the loss learns (or no loss recorded): a weak signal
        conf = 0.45 if not ctx.has_loss else 0.3
    hand_written = any(ctx.layers[n].type_name == "F.softmax" for n in names if n in ctx.layers)
    fix = ("add a learning-rate warm-up (linear from ~0 over the first 5-10% of the steps) or lower the learning "
           f"rate from {lr} to ~{lr10}" if no_warmup else
           f"lower the learning rate from {lr} to ~{lr10} or lengthen its warm-up")
    fix += ("; to keep the attention stable at the rate you want, normalise queries and keys (QK-norm: a LayerNorm "
            "on q and on k per head) or soft-cap the logits (cap * tanh(logits / cap), cap ~ 30-50)")
    if hand_written:
        fix += "; check that q @ k^T is scaled by 1/sqrt(head_dim) before the softmax"
    evidence: list[SemanticEvent] = collapsed + growing + large + loss
    return [_hyp(ctx, Cause.ATTENTION_COLLAPSE, first.layer, onset, conf, chain, evidence, fix)]
