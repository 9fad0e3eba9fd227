"""Gradients: one that grows without bound (named where it is amplified), one that collapses on its way back
toward the input (named where the collapse starts, closest to the output), and one that persistently
diminishes to within ten times of vanishing. None is a failure by itself: attention keys and deep
normalised stacks train well with gradients far below the layers after them, and a gradient that grows for
a while can settle; each is one when the loss fails with it or it produces what fails."""
from __future__ import annotations

import math

from ..causes import Cause
from ..events import SemanticEvent
from ..layers import GRADIENT_KINDS, Kind
from ..patterns import LinkKind
from ..states import ActState, GradState, LossState, Signal, UpdateState
from . import losses
from .context import Context
from .evidence import Candidate, below_ratio, past_ratio, persistence


def _amplifier(ctx: Context, origin: str) -> str:
    """Where a gradient amplified at weight layer ``origin`` was amplified: the weight layer itself, or a
    custom module between it and the next layer whose gradient is compared with it (whose backward
    multiplies what passes)."""
    pos = ctx.rank.get(origin)
    if pos is None:
        return origin
    for name in sorted((n for n, r in ctx.rank.items() if r > pos), key=ctx.rank.__getitem__):
        info = ctx.layers[name]
        if info.n_trainable > 0 and info.kind in GRADIENT_KINDS:
            break
        if info.kind == Kind.OTHER:
            return name
    return origin


def _origin(ctx: Context, events: list[SemanticEvent]) -> SemanticEvent:
    linked = [link.cause for link in ctx.links if link.kind == LinkKind.PROPAGATES and link.cause in events]
    if linked:
        return linked[0]
    first = min(e.step for e in events)
    return max((e for e in events if e.step == first), key=lambda e: ctx.rank.get(e.layer, -1))


def _attenuation_spans(ctx: Context) -> list[list[SemanticEvent]]:
    """Per layer, runs of vanishing/diminishing events that follow each other without a healthy gap, or with
    one shorter than the run before it (a gradient flickering across its threshold is one attenuation)."""
    by_layer: dict[str, list[SemanticEvent]] = {}
    for e in ctx.all(Signal.GRADIENT, GradState.VANISHING, GradState.DIMINISHING):
        by_layer.setdefault(e.layer, []).append(e)
    spans = []
    for evs in by_layer.values():
        evs.sort(key=lambda e: e.step)
        run = [evs[0]]
        for e in evs[1:]:
            end = run[-1].end
            if end is not None and e.step - end <= end - run[0].step:
                run.append(e)
            else:
                spans.append(run)
                run = [e]
        spans.append(run)
    return spans


def _span_persistence(span: list[SemanticEvent], ctx: Context) -> float:
    """The share of the run from the span's onset on during which its events held."""
    whole = ctx.last_step - span[0].step
    if span[-1].end is None and len(span) == 1 or whole <= 0:
        return 1.0
    held = sum((ctx.last_step if e.end is None else e.end) - e.step for e in span)
    return min(max(held / whole, 0.0), 1.0)


def _through_time(ctx: Context) -> list[Candidate]:
    """Inside a recurrent module (hooks see only its output), the gradient that reaches the first time step
    of its input against the most any step gets: below ``vanishing_ratio`` at most sampled steps, what the
    loss needs from early in the sequence is not learned (it vanishes through time). Its measurement alone
    is no failure (a task that needs only the last steps trains): it needs a loss that does not improve."""
    out = []
    # a loss that does not improve while no weight moves is the updates' (they are negligible), not what the
    # gradient through time leaves out: then it explains no loss failure
    still = bool(ctx.all(Signal.UPDATE, UpdateState.NEGLIGIBLE))
    # (and a loop of one operation written in the forward, a recurrence by hand: the same along its calls)
    sources = [(layer, rows, False) for layer, rows in ctx.through_time.items()]
    sources += [(layer, rows, True) for layer, rows in ctx.loops.items()]
    for layer, rows, loop in sources:
        rows = [r for r in rows if len(r) >= 3 and r[0] < (ctx.nonfinite_step() or 1 << 62)]
        if layer not in ctx.layers or len(rows) < ctx.th.persist:
            continue
        ratios = sorted(float(r[1]) for r in rows)
        typical = ratios[len(ratios) // 2]
        below = [r for r in rows if float(r[1]) < ctx.th.vanishing_ratio]
        if typical >= ctx.th.vanishing_ratio or not below:
            continue
        out.append(Candidate(Cause.VANISHING_GRADIENTS, layer, int(below[0][0]), "through_time", [],
                             severity=below_ratio(max(typical, 1e-30), ctx.th.vanishing_ratio),
                             persistence=len(below) / len(rows), needs_harm=True, lasting=True,
                             loss_kinds=frozenset() if still else losses.FLAT,
                             facts={"ratio": typical, "steps_in_time": int(rows[-1][2]), "samples": len(rows),
                                    "loop": loop, "loops": 1}))
    return _one_loop_per_place(ctx, out)


def _one_loop_per_place(ctx: Context, found: list[Candidate]) -> list[Candidate]:
    """Loops of one module's forward (two layers of a recurrence stacked in each step: one loop each) are one
    hypothesis at that module: the one whose gradient fades most, counting the others."""
    out: list[Candidate] = []
    best: dict[str, int] = {}
    for c in found:
        if not c.facts["loop"]:
            out.append(c)
            continue
        place = str(ctx.layers[c.layer].extra.get("owner", c.layer))
        if place not in best:
            best[place] = len(out)
            out.append(c)
            continue
        kept = out[best[place]]
        loops = kept.facts["loops"] + 1
        if c.facts["ratio"] < kept.facts["ratio"]:
            out[best[place]] = kept = c
        kept.facts["loops"] = loops
    return out


def _unreached(ctx: Context) -> list[Candidate]:
    """Trainable weight layers that run and never get a gradient while the layers after them do: the graph is
    cut between them and the loss (a ``.detach()``, ``.data``, a round trip through ``.item()``/``.numpy()``,
    a ``torch.no_grad()`` block in the forward). Named at the last of them before the cut, from its first
    sample so. Not a failure by itself (a part frozen on purpose trains the rest): it needs a loss that does
    not get down, or barely."""
    events = ctx.all(Signal.GRADIENT, GradState.UNREACHED)
    if not events:
        return []
    origin = max(events, key=lambda e: (ctx.rank.get(e.layer, -1), -e.step))
    before = sorted({e.layer for e in events if ctx.upstream(e.layer, origin.layer)}, key=lambda n: ctx.rank.get(n, 0))
    return [Candidate(Cause.VANISHING_GRADIENTS, origin.layer, min(e.step for e in events), "unreached", [origin],
                      severity=1.0, persistence=persistence(origin, ctx), needs_harm=True,
                      symptoms=[e for e in events if e is not origin], loss_kinds=losses.FLAT | {LossState.SLOW},
                      facts={"before": before})]


def candidates(ctx: Context) -> list[Candidate]:
    out = _through_time(ctx) + _unreached(ctx)
    exploding = ctx.all(Signal.GRADIENT, GradState.EXPLODING)
    if exploding:
        origin = _origin(ctx, exploding)
        v = origin.values
        amp = max(v.get("attenuation", 0.0) or 0.0, v.get("grad_growth", 0.0) or 0.0)
        where = _amplifier(ctx, origin.layer)
        # at the first sample, before any update, the amplification is the model's as built: it lasts for as
        # long as the model does, whatever the first updates then do to it
        built = origin.step <= ctx.first_step
        out.append(Candidate(Cause.EXPLODING_GRADIENTS, where, origin.step, "exploding", [origin],
                             severity=past_ratio(amp, ctx.th.exploding_ratio),
                             persistence=1.0 if built else persistence(origin, ctx), needs_harm=True, lasting=built,
                             symptoms=[e for e in exploding if e is not origin], loss_kinds=losses.ANY,
                             facts={"amplification": amp, "origin": origin.layer, "others": [e for e in exploding
                                                                                            if e is not origin]}))
    # a gradient that collapses toward the input, named where the collapse starts, closest to the output. A
    # layer's vanishing and diminishing events that follow each other are one attenuation; one that still
    # holds when the loss stops improving (or at the end, if it never does) says more than one that passes
    # (a layer vanishing for a moment at the start). A gradient that only diminishes is a cause when the
    # loss does not improve.
    spans = _attenuation_spans(ctx)
    # a projection of an attention beside one whose gradient is not attenuated (a query or key beside its
    # value): the softmax over small logits keeps its gradient low by design, and the signal flows back to
    # their shared input through the other; no collapse
    attenuated = {run[0].layer for run in spans}
    spans = [run for run in spans if not _beside_signal(ctx, run[0].layer, attenuated)]
    flat = [e.step for e in ctx.all(Signal.LOSS, *losses.FLAT)]
    held = min(flat) if flat else ctx.last_step
    lasting = [run for run in spans if run[-1].end is None or run[-1].end > held]
    lasting_v = [run for run in lasting if run[-1].after == GradState.VANISHING]
    if lasting_v:
        pool, kind = lasting_v, "vanishing"
    elif lasting:
        pool, kind = lasting, "diminishing"
    else:
        pool, kind = [run for run in spans if any(e.after == GradState.VANISHING for e in run)], "vanishing"
    if pool:
        # when: its earliest onset; where: the layer closest to the output among those attenuated by the time the
        # loss stops improving (which of two borderline layers the sampling saw first says nothing of the place)
        first = min(run[0].step for run in pool)
        span = max((run for run in pool if run[0].step <= max(first, held)),
                   key=lambda run: ctx.rank.get(run[0].layer, -1))
        origin = span[0]
        att = min((e.values.get("attenuation", math.nan) for run in pool for e in run), default=math.nan)
        # a gradient exactly 0 at each event of the span (read at its onset), while the layers after it have
        # one: cut, not faded
        zero = all(e.values.get("attenuation", math.nan) == 0.0 for e in span)
        # the next weight layer applied in a chain, each application reading the one before (a block shared
        # across depth, a cell applied per time step): the gradient came back through every application of
        # it, and faded there; it is named there
        after = ctx.next_weight_layer(origin.layer)
        applied = ctx.layers[after].extra.get("applications", 1) if after is not None and not zero else 1
        gap = (_gap(ctx, origin.layer, zero) if span[-1].values.get("attenuation", 1.0) < ctx.th.vanishing_ratio
               and applied <= 1 else None)
        # an adaptive optimizer's steps do not shrink with the gradient: a loss that does not improve while no
        # weight moves is the updates' (negligible), not the attenuation's, as through time
        still = ctx.adaptive() and bool(ctx.all(Signal.UPDATE, UpdateState.NEGLIGIBLE))
        # a gradient that vanishes from the first sample and stays attenuated to the end is the model's as
        # built, and it stays so: the layers before it hardly train, and a loss that comes down only by what
        # the layers after them learn comes down, but hardly (the stack of sigmoids a loss learns its prior
        # through)
        built = (span[0].step <= ctx.first_step and span[-1].end is None
                 and any(e.after == GradState.VANISHING for e in span))
        out.append(Candidate(Cause.VANISHING_GRADIENTS, after if after is not None and applied > 1 else origin.layer,
                             first, kind, span,
                             # from the diminishing threshold: one decade below it is (by default) vanishing
                             severity=below_ratio(att, max(ctx.th.diminishing_ratio, ctx.th.vanishing_ratio)),
                             persistence=_span_persistence(span, ctx), needs_harm=True, lasting=built,
                             loss_kinds=frozenset() if still else losses.FLAT | {LossState.SLOW} if built
                             else losses.FLAT,
                             facts={"attenuation": span[-1].values.get("attenuation", math.nan),
                                    "origin": origin.layer, "applications": applied,
                                    "others": [run[0] for run in pool if ctx.upstream(run[0].layer, origin.layer)],
                                    "gap": gap, "zero": zero}))
    return out


# modules whose backward can shrink a gradient by itself: units that die or saturate, a state through time, a
# softmax over positions, a pooling, custom code
_SHRINKING = frozenset({Kind.RELU, Kind.BOUNDED, Kind.SMOOTH, Kind.RECURRENT, Kind.ATTENTION, Kind.POOL, Kind.OTHER})


def _parallel(ctx: Context, a: str, b: str) -> bool:
    """Two layers of one module that holds an attention: its query, key and value projections read the same
    input side by side (the order they run in is no data flow), and a softmax over small logits keeps the
    queries' and keys' gradients far below the rest by design."""
    parent = a.rpartition(".")[0]
    if b.rpartition(".")[0] != parent:
        return False
    inside = [n for n in ctx.layers if not parent or n == parent or n.startswith((parent + ".", parent + ":"))]
    return any(ctx.layers[n].kind == Kind.ATTENTION for n in inside)


def _beside_signal(ctx: Context, layer: str, attenuated: set) -> bool:
    """``layer`` is a projection of an attention with a weight layer beside it (see ``_parallel``) whose
    gradient is not attenuated."""
    parent = layer.rpartition(".")[0]
    if not parent:  # (the model's own layers are no projections of one attention)
        return False
    return any(n != layer and n.rpartition(".")[0] == parent and info.n_trainable > 0 and info.kind in GRADIENT_KINDS
               and n in ctx.rank and n not in attenuated and _parallel(ctx, layer, n)
               for n, info in ctx.layers.items())


def _gap(ctx: Context, layer: str, zero: bool = False) -> str | None:
    """The weight layer after ``layer`` (not a projection beside it in an attention) when nothing runs between
    them that could shrink a gradient (a dropout, a normalisation, a module that returns its input, are no
    such thing) and ``layer``'s gradient vanished against the layers after it all the same: the forward
    between them, in code no module hook sees, erases the signal (a normalisation over the wrong axis, a mean
    of what was just centred). A gradient that is exactly 0 (``zero``) is cut there even past modules that
    could shrink one, unless their units are dead or pinned: an operation whose derivative is 0 (a rounding,
    a sign, a comparison) or a mask of zeros."""
    after = ctx.next_weight_layer(layer)
    if after is None or ctx.layers[after].kind == Kind.NORM or _parallel(ctx, layer, after):
        return None
    lo, hi = ctx.rank.get(layer, 0), ctx.rank.get(after, 0)
    between = [n for n, r in ctx.rank.items() if lo < r < hi and not ctx.layers[n].extra.get("passthrough")]
    if zero:
        failing = {e.layer for e in ctx.all(Signal.ACTIVATION, ActState.DEAD, ActState.SATURATED)}
        return None if any(n in failing for n in between) else after
    return None if any(ctx.layers[n].kind in _SHRINKING for n in between) else after
