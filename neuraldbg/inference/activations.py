"""Activations that stop learning: ReLU-family units that output zero for every input, bounded units pinned
at their bounds. Each blocks the gradient to the layers before it."""
from __future__ import annotations

from ..causes import Cause
from ..events import SemanticEvent
from ..patterns import LinkKind
from ..states import ActState, Signal
from . import losses
from .context import Context
from .evidence import Candidate, past_fraction, persistence

# a layer this dead passes a constant to the layers after it
_ALL_DEAD = 0.99


def _downstream(ctx: Context, ev: SemanticEvent) -> list[SemanticEvent]:
    """Events after a fully dead layer (in forward order, from its onset on): with a constant signal reaching
    them, they are its consequences."""
    return [e for e in ctx.events if e.bad and e is not ev and e.step >= ev.step and ctx.upstream(ev.layer, e.layer)
            and e.signal in (Signal.ACTIVATION, Signal.GAIN)]


def candidates(ctx: Context) -> list[Candidate]:
    out = []
    for ev in ctx.all(Signal.ACTIVATION, ActState.DEAD):
        frac = ev.values.get("dead_fraction", 1.0)
        frac = 1.0 if frac != frac else frac
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        downstream = _downstream(ctx, ev) if frac >= _ALL_DEAD else []
        out.append(Candidate(Cause.DEAD_UNITS, ev.layer, ev.step, "dead", [ev],
                             severity=past_fraction(frac, ctx.th.dead_fraction), persistence=persistence(ev, ctx),
                             partial=True,
                             symptoms=blocked + downstream, loss_kinds=losses.FLAT | {losses.LossState.OSCILLATING},
                             facts={"fraction": frac, "blocked": blocked, "downstream": downstream,
                                    "previous": ctx.previous(ev.layer)}))
    for ev in ctx.all(Signal.ACTIVATION, ActState.SATURATED):
        frac = ev.values.get("saturated_fraction", 1.0)
        frac = 1.0 if frac != frac else frac
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        out.append(Candidate(Cause.SATURATED_ACTIVATIONS, ev.layer, ev.step, "saturated", [ev],
                             severity=past_fraction(frac, ctx.th.saturated_fraction),
                             persistence=persistence(ev, ctx), symptoms=blocked, partial=True,
                             loss_kinds=losses.FLAT | {losses.LossState.OSCILLATING},
                             facts={"fraction": frac, "blocked": blocked,
                                    "previous": ctx.previous_weight_layer(ev.layer)}))
    return out
