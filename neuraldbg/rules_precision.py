"""Inference: mixed precision. Values out of float16's range, and a loss scaler that keeps skipping.

Under ``torch.autocast(dtype=torch.float16)`` the largest finite value is 65504: a layer whose output
grows past it turns into Inf, and the loss with it. A ``GradScaler`` skips the optimizer steps whose
gradients hold NaN/Inf and halves its scale; a few such steps at the start are its calibration. It
keeps skipping when the overflow is not the scale's doing: an Inf in the forward pass, which no scale
can fix. The root is named at the first layer whose output comes within ``range_margin`` of the
limit (or the one that overflows), with "fp16 overflow" in its chain.
"""
from __future__ import annotations

import math

import numpy as np

from .causes import Cause
from .formatting import number as _fmt
from .hypothesis import CausalHypothesis
from .rules import Context, _hyp, _symptoms_text
from .states import FiniteState, LossState, RangeState, Signal, UpdateState

_FP16_MAX = 65504.0


def skip_run(steps: np.ndarray) -> tuple[int, int]:
    """The longest run of skipped optimizer steps with at most one applied step between two of them
    (skips share the step number of the next applied step): (its first step, its length)."""
    best, start, length = (0, 0), 0, 0
    for i, s in enumerate(steps):
        if i and s - steps[i - 1] <= 1:
            length += 1
        else:
            start, length = int(s), 1
        if length > best[1]:
            best = (start, length)
    return best


def _fp16_fix(layer: str) -> str:
    where = f"`{layer}`" if layer else "the layer that overflows"
    return ("run autocast in bfloat16 instead (torch.autocast(device, dtype=torch.bfloat16): float32's range, no "
            f"GradScaler needed), or add a normalisation (nn.LayerNorm) before or in {where}, or scale its input or "
            f"weights down; or keep {where} in float32 (with torch.autocast(device, enabled=False): ... on float "
            "inputs)")


def rule_mixed_precision(ctx: Context) -> list[CausalHypothesis]:
    steps, scales = ctx.skipped
    run_start, run_len = skip_run(steps)
    skipping = run_len >= ctx.th.skipped_steps
    origins = [o for o in (ctx.nonfinite, ctx.overflow if skipping else None)
               if o is not None and o.phase == "forward" and o.dtype == "float16"]
    origin = origins[0] if origins else None
    near = sorted(ctx.free(Signal.RANGE, RangeState.NEAR_LIMIT), key=lambda e: (e.step, ctx.rank.get(e.layer, 0)))
    if origin is None and not skipping and not near:
        return []
    onset = origin.step if origin is not None else (run_start if skipping else near[0].step)
    large = [e for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step < onset]
    if large and origin is ctx.nonfinite and origin is not None:
        return []  # weights grown by oversized updates until they overflow: the learning rate's (rule_nonfinite)
    finite = ctx.free(Signal.FINITE, FiniteState.NONFINITE)
    loss = ctx.loss_state(LossState.NONFINITE, LossState.DIVERGING)
    before = [e for e in near if e.step <= onset and (origin is None or ctx.rank.get(e.layer, 0)
                                                       <= ctx.rank.get(origin.layer, 1 << 30))]
    first = before[0] if before else (near[0] if near and origin is None else None)
    chain: list[str] = []
    if first is not None:
        v = first.values
        chain.append(f"the output of `{first.layer}` reaches {_fmt(v.get('act_absmax', math.nan))} "
                     f"at step {first.step}, "
                     f"{v.get('range_used', math.nan):.0%} of the largest value its dtype holds")
    if origin is not None:
        chain.append(f"fp16 overflow: under float16 autocast, {origin.where()} exceeds {_fmt(_FP16_MAX)} at step "
                     f"{origin.step} and becomes Inf")
    if skipping:
        lo = float(np.nanmin(scales)) if np.isfinite(scales).any() else math.nan
        scale = f" (its loss scale falls to {_fmt(lo)})" if lo == lo else ""
        if origin is None and ctx.overflow is not None:
            chain.append(f"NaN/Inf first in {ctx.overflow.where()} ({ctx.overflow.phase}) at step {ctx.overflow.step}")
        chain.append(f"the loss scaler skips {run_len} optimizer steps in a row from step {run_start}{scale}: no scale "
                     "fixes it, the model does not train")
    chain += _symptoms_text(finite + loss, 2)
    layer = first.layer if first is not None else (origin.layer if origin is not None else
                                                   (ctx.overflow.layer if ctx.overflow is not None else ""))
    if origin is not None or (skipping and first is not None):
        conf, fix = 0.9, _fp16_fix(layer)
    elif skipping:  # gradients overflow at every scale: not the range of the forward pass
        where = ctx.overflow.where() if ctx.overflow is not None else "the model"
        conf = 0.8
        fix = (f"find why the gradients hold NaN/Inf at any scale ({where}): run one step in float32 with "
               "torch.autograd.detect_anomaly(); if they are finite there, use bfloat16 autocast")
    else:  # near the limit, nothing overflowed yet: a warning
        conf, fix = 0.4, _fp16_fix(layer)
    ctx.origin_claimed = origin is not None
    return [_hyp(ctx, Cause.NON_FINITE, layer, onset if first is None else min(first.step, onset), conf, chain,
                 near + finite + loss, fix)]
