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


def _share(ev: SemanticEvent, key: str, default: float = 1.0) -> float:
    """A share the event carries (``default`` when absent; 1 when not measured)."""
    v = ev.values.get(key, default)
    return 1.0 if v != v else v


def _loss_kinds(ctx: Context, ev: SemanticEvent) -> frozenset:
    """A loss that stays flat or oscillates; and units that stop during training take away what the model had
    learned with them: a loss that rises back from then on (past its divergence threshold, or to where it
    has hardly come down from its start). (Units the loss itself penalises, through a term on
    their output, are pushed there by that term from the first step: see ``acting_from``.)"""
    kinds = losses.FLAT | {losses.LossState.OSCILLATING}
    return kinds if ctx.from_start(ev) else kinds | {losses.LossState.DIVERGING, losses.LossState.SLOW}


def candidates(ctx: Context) -> list[Candidate]:
    out = []
    for ev in ctx.all(Signal.ACTIVATION, ActState.DEAD):
        frac = _share(ev, "dead_fraction")
        worst = max(frac, _share(ev, "dead_peak", frac))
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        downstream = _downstream(ctx, ev) if frac >= _ALL_DEAD else []
        penalised = ev.layer in ctx.loss_terms
        out.append(Candidate(Cause.DEAD_UNITS, ev.layer, ev.step, "penalised" if penalised else "dead", [ev],
                             severity=past_fraction(worst, ctx.th.dead_fraction), persistence=persistence(ev, ctx),
                             partial=True,
                             symptoms=blocked + downstream, loss_kinds=_loss_kinds(ctx, ev),
                             acting_from=ctx.first_step if penalised else None,
                             facts={"fraction": frac, "blocked": blocked, "downstream": downstream,
                                    "previous": ctx.previous(ev.layer), "term": ctx.loss_terms.get(ev.layer)}))
    for ev in ctx.all(Signal.ACTIVATION, ActState.SATURATED):
        frac = _share(ev, "saturated_fraction")
        worst = max(frac, _share(ev, "saturated_peak", frac))
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        out.append(Candidate(Cause.SATURATED_ACTIVATIONS, ev.layer, ev.step, "saturated", [ev],
                             severity=past_fraction(worst, ctx.th.saturated_fraction),
                             persistence=persistence(ev, ctx), symptoms=blocked, partial=True,
                             loss_kinds=_loss_kinds(ctx, ev),
                             facts={"fraction": frac, "blocked": blocked,
                                    "previous": ctx.previous_weight_layer(ev.layer)}))
    return out
