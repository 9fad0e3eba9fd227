"""Activations that stop learning: ReLU-family units that output zero for every input, bounded units pinned
at their bounds. Each blocks the gradient to the layers before it."""
from __future__ import annotations

from ..causes import Cause
from ..layers import Kind
from ..events import SemanticEvent
from ..patterns import LinkKind
from ..states import ActState, Signal
from . import losses
from .context import Context
from .evidence import Candidate, past_fraction, persistence

# a layer this dead passes a constant to the layers after it
ALL_DEAD = 0.99


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


def _dropped(ctx: Context) -> list[Candidate]:
    """A dropout that drops (nearly) all of its input in training (``p=1.0``: a keep probability passed as the
    share to drop, or a schedule of ``p`` run up to 1): what follows it reads 0, a constant, and no gradient
    goes back through it. A fact of the code, from the first sampled pass that saw it so; a failure where the
    loss shows one. A rate a schedule raised to it harms from where it passed ``dropout_high`` (what is kept
    is scaled by 1 / (1 - p): the activations, gradients and updates after it grow as they thin out) and acts
    from where it began to rise without a break. Named at the dropout's place (the module it follows, or is);
    the units dead after it, the gradients that vanish before it and the updates it inflates are in its
    chain."""
    out = []
    for place, rows in ctx.dropout.items():
        i = next((i for i, (_, p) in enumerate(rows) if p >= ALL_DEAD), None)
        if i is None:
            continue
        full_step, rate = rows[i]
        # (rows are where the rate changed: a rate held since the first row, then raised at once, is no rise)
        while i > 1 and 0 < rows[i - 1][1] < rows[i][1] and rows[i - 2][1] < rows[i - 1][1]:
            i -= 1
        rise = rows[i:]
        step = next(s for s, p in rise if p >= ctx.th.dropout_high)
        after = [e for e in ctx.events if e.bad and e.step >= step and e.signal in (
            Signal.ACTIVATION, Signal.GAIN, Signal.GRADIENT, Signal.UPDATE, Signal.SPIKE)]
        out.append(Candidate(Cause.DEAD_UNITS, place, step, "dropped", [], severity=1.0, persistence=1.0,
                             certain=True, needs_harm=True, lasting=True, symptoms=after,
                             acting_from=rise[0][0] if rise[0][0] < step else None, loss_kinds=losses.SLOWED,
                             facts={"rate": rate, "full_step": full_step, "rise_from": rise[0]}))
    return out


def _zero_from(ctx: Context, layer: str, step: int, depth: int = 4) -> tuple[str, str | None, str]:
    """Where a whole layer that reads nothing above 0 at ``step`` gets that from, as (how, the layer, the layer
    reading it), from what the layers it was seen to read output then: "zero_weights", it reads as it is the
    output of a layer whose weights are all 0; "zero", of a layer with weights that outputs 0 all the same;
    "between", what operations between (a mask, a shift, a forward hook) made of an output with values above 0.
    A layer with no weights of its own whose output is 0 (a normalisation of a constant has weights; a pooling,
    a reshape has none) is followed back to what it reads, ``depth`` layers at most; a layer of units that are
    dead themselves ends the search. ("", None, layer): none of these, or not known."""
    reader = layer
    for _ in range(depth):
        source, through = ctx.source(reader)
        if source is None:
            break
        read = ctx.output_read(source, step)
        if through:
            return ("between", source, reader) if read == "positive" else ("", None, layer)
        info = ctx.layers[source]
        if read == "zero_weights" and info.n_params > 0:
            return read, source, reader
        if read != "zero" or info.kind in (Kind.RELU, Kind.BOUNDED, Kind.SMOOTH):
            break
        if info.n_params > 0:
            # (a layer with weights that outputs 0: what it reads may be where the zeros come from)
            up, up_through = ctx.source(source)
            if up is not None and up_through and ctx.output_read(up, step) == "positive":
                return "between", up, source
            return "zero", source, reader
        reader = source
    return "", None, layer


def candidates(ctx: Context) -> list[Candidate]:
    out = _dropped(ctx)
    for ev in ctx.all(Signal.ACTIVATION, ActState.DEAD):
        frac = _share(ev, "dead_fraction")
        worst = max(frac, _share(ev, "dead_peak", frac))
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        downstream = _downstream(ctx, ev) if frac >= ALL_DEAD else []
        penalised = ev.layer in ctx.loss_terms
        # a whole layer that reads nothing above 0: what the layer it reads output then says where that comes
        # from (a source that outputs exactly 0, with its weights at 0 or not; or one with values above 0, which
        # something between them takes away)
        read, source, reader = _zero_from(ctx, ev.layer, ev.step) if frac >= ALL_DEAD else ("", None, ev.layer)
        out.append(Candidate(Cause.DEAD_UNITS, ev.layer, ev.step, "penalised" if penalised else "dead", [ev],
                             severity=past_fraction(worst, ctx.th.dead_fraction), persistence=persistence(ev, ctx),
                             partial=True,
                             symptoms=blocked + downstream, loss_kinds=_loss_kinds(ctx, ev),
                             acting_from=ctx.first_step if penalised else None,
                             facts={"fraction": frac, "blocked": blocked, "downstream": downstream,
                                    "previous": ctx.previous(ev.layer), "read": read, "source": source,
                                    "reader": reader,
                                    "term": ctx.loss_terms.get(ev.layer)}))
    for ev in ctx.all(Signal.ACTIVATION, ActState.SATURATED):
        frac = _share(ev, "saturated_fraction")
        worst = max(frac, _share(ev, "saturated_peak", frac))
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        # (pinned units are no failure by themselves: a confident classifier's squashing layer pins them too,
        # once it has learned; they are one where the loss shows they stop learning)
        out.append(Candidate(Cause.SATURATED_ACTIVATIONS, ev.layer, ev.step, "saturated", [ev],
                             severity=past_fraction(worst, ctx.th.saturated_fraction),
                             persistence=persistence(ev, ctx), symptoms=blocked, partial=True, needs_harm=True,
                             loss_kinds=_loss_kinds(ctx, ev),
                             facts={"fraction": frac, "blocked": blocked,
                                    "previous": ctx.previous_weight_layer(ev.layer)}))
    return out
