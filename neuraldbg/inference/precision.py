"""Mixed precision: values out of float16's range, and a loss scaler that keeps skipping.

Under ``torch.autocast(dtype=torch.float16)`` the largest finite value is 65504: a layer whose output
grows past it turns into Inf, and the loss with it. A ``GradScaler`` skips the optimizer steps whose
gradients hold NaN/Inf and halves its scale; a few such steps at the start are its calibration. It
keeps skipping when the overflow is not the scale's doing: an Inf in the forward pass, which no scale
can fix. Both are ``non_finite``, named at the first layer whose output came within ``range_margin``
of the limit (or the one that overflowed), with "fp16 overflow" in the chain. An output near the limit
with nothing overflowing yet is a warning.
"""
from __future__ import annotations

from ..causes import Cause
from ..states import FiniteState, RangeState, ScalerState, Signal
from . import losses
from .context import Context
from .evidence import Candidate, persistence


def _fp16(origin) -> bool:
    return origin is not None and origin.phase == "forward" and origin.dtype == "float16"


def candidates(ctx: Context) -> list[Candidate]:
    skipping = ctx.all(Signal.SCALER, ScalerState.SKIPPING)
    near = sorted(ctx.all(Signal.RANGE, RangeState.NEAR_LIMIT), key=lambda e: (e.step, ctx.rank.get(e.layer, 0)))
    origin = next((o for o in (ctx.nonfinite, ctx.overflow if skipping else None) if _fp16(o)), None)
    if origin is None and not skipping and not near:
        return []
    onset = origin.step if origin is not None else (skipping[0].step if skipping else near[0].step)
    before = [e for e in near if e.step <= onset and (origin is None or ctx.rank.get(e.layer, 0)
                                                       <= ctx.rank.get(origin.layer, 1 << 30))]
    first = before[0] if before else (near[0] if near and origin is None else None)
    layer = (first.layer if first is not None else origin.layer if origin is not None
             else ctx.overflow.layer if ctx.overflow is not None else "")
    kind = "fp16_overflow" if origin is not None else "skipping" if skipping else "near_limit"
    events = near + skipping
    return [Candidate(Cause.NON_FINITE, layer, min(onset, first.step) if first is not None else onset, kind, events,
                      # an overflow, or steps that never train, are failures by themselves; nearing the limit is a
                      # warning (its severity: how close, on the margin's log scale)
                      symptoms=ctx.all(Signal.FINITE, FiniteState.NONFINITE) if kind != "near_limit" else [],
                      severity=1.0 if kind != "near_limit" else 0.0,
                      persistence=persistence(events[0], ctx) if events else 1.0,
                      certain=kind != "near_limit", needs_harm=kind == "near_limit",
                      loss_kinds=losses.NONFINITE | losses.UNSTABLE,
                      facts={"origin": origin, "first": first, "skipping": skipping[0] if skipping else None,
                             "overflow": ctx.overflow, "phase": "forward",
                             "type": ctx.layers[layer].type_name if layer in ctx.layers else ""})]
