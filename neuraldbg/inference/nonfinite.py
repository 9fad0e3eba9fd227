"""NaN/Inf first produced inside the model: the module where it appears, forward or backward, and the step
(from the replay of the failing pass, or from the statistics when no replay was possible)."""
from __future__ import annotations

from ..causes import Cause
from ..layers import Kind
from ..states import FiniteState, LossState, Signal, UpdateState
from . import losses
from .context import Context
from .evidence import Candidate, persistence

# layers that compute only products and sums of their inputs and weights: they cannot leave a domain,
# only overflow when values have grown too large
OVERFLOW_KINDS = frozenset({Kind.LINEAR, Kind.CONV, Kind.RECURRENT, Kind.ATTENTION})


# dtypes whose range an optimizer's arithmetic leaves at usual settings: Adam's eps=1e-8 rounds to 0 in float16,
# and squared gradients below ~1e-4 underflow to 0, so an update can divide 0 by 0
NARROW = frozenset({"float16"})


def _grew_before(ctx: Context, step: int) -> bool:
    """Updates too large, or a loss diverging or oscillating, before ``step``: weights pushed out of range."""
    return any(e.step < step for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE)
               + ctx.all(Signal.LOSS, LossState.DIVERGING, LossState.OSCILLATING))


def candidates(ctx: Context) -> list[Candidate]:
    nf = ctx.nonfinite
    finite_ev = ctx.all(Signal.FINITE, FiniteState.NONFINITE)
    if nf is not None and nf.phase == "loss" and ctx.loss_nonfinite_op:
        # the loss's own arithmetic (a log of a probability that rounded to 0): a fact of the code, whatever
        # made the outputs large enough (training toward confident outputs does, at any learning rate)
        return [Candidate(Cause.NON_FINITE, "loss", nf.step, "loss_op", ctx.all(Signal.LOSS, LossState.NONFINITE),
                          severity=1.0, persistence=1.0, certain=True, loss_kinds=losses.NONFINITE,
                          facts={"phase": "loss", "op": ctx.loss_nonfinite_op, "origin": nf,
                                 "rescaled": ctx.loss_op_rescaled})]
    if nf is None and not finite_ev and ctx.overflow is None:
        # the loss is NaN/Inf while every gradient is finite and the weights go on moving (a NaN loss whose
        # updates stop is a mean over no element: the data family's): an operation of the loss leaves its domain
        # on some samples (a log of a negative output) where its gradient does not
        for ev in ctx.all(Signal.LOSS, LossState.NONFINITE)[:1]:
            if not ctx.gives_no_gradient_at(ev.step):
                return [Candidate(Cause.NON_FINITE, "loss", ev.step, "loss_value", [ev], severity=1.0,
                                  persistence=persistence(ev, ctx), certain=True, loss_kinds=losses.NONFINITE,
                                  facts={"phase": "loss", "count": len(ctx.all(Signal.LOSS, LossState.NONFINITE)),
                                         "end": ev.end})]
    if (nf is None and not finite_ev) or (nf is not None and nf.phase in ("input", "loss")):
        return []  # NaN/Inf from the data or the loss: the data family's
    if nf is not None and nf.phase == "forward" and nf.dtype == "float16":
        return []  # out of float16's range: the precision family's
    if nf is None and ctx.overflow is not None:
        return []  # NaN/Inf only in steps a loss scaler skipped: the precision family's
    step = nf.step if nf is not None else finite_ev[0].step
    layer = nf.layer if nf is not None else finite_ev[0].layer
    phase = nf.phase if nf is not None else "forward"
    info = ctx.layers.get(layer)
    # (an operation named inside the layer, "torch.log in `2`", is what left its domain, not the layer's product)
    overflow = (phase == "forward" and info is not None and info.kind in OVERFLOW_KINDS and not ctx.from_start(step)
                and not (nf is not None and nf.op))
    kind = "weights" if phase == "weights" else "overflow" if overflow else phase
    if kind == "weights" and ctx.param_dtype in NARROW and not _grew_before(ctx, step):
        kind = "narrow_update"  # the update's own arithmetic in a narrow dtype, not its scale
    return [Candidate(Cause.NON_FINITE, layer, step, kind, finite_ev + ctx.all(Signal.LOSS, LossState.NONFINITE),
                      severity=1.0, persistence=1.0, certain=True, loss_kinds=losses.NONFINITE,
                      facts={"phase": phase, "detail": nf.detail if nf is not None else "",
                             "type": info.type_name if info is not None else "", "origin": nf,
                             "weight_layer": info is not None and info.n_params > 0})]
