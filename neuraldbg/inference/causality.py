"""Root first, by structure and time: which candidate explains which.

``EXPLAINS[(a, b)]`` says when a candidate of cause ``a`` accounts for one of cause ``b`` (a mechanism by which
``a`` produces ``b``, checked against the places and the onsets). A cause cannot start after its effect. From
the first NaN/Inf, or from the onset of a divergence, on, what starts later is a symptom of whatever explains
that NaN or that divergence. Each candidate is absorbed by its best explainer, transitively; the roots that
remain are the hypotheses, each carrying what it explains.
"""
from __future__ import annotations

import math
from typing import Callable

from ..causes import Cause
from ..states import ActState, LossState, Signal
from .context import Context
from .evidence import Candidate, confidence

Predicate = Callable[[Candidate, Candidate, Context], bool]

C = Cause


def _early(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """``b`` starts with ``a``: within the persistence window of its onset."""
    return b.step <= a.step + ctx.th.persist


def _after(a: Candidate, b: Candidate) -> bool:
    return b.step >= a.step


def _holds_at(a: Candidate, step: int) -> bool:
    """One of ``a``'s own events still holds at ``step``."""
    return any(e.step <= step and (e.end is None or e.end >= step) for e in a.events)


def _large_before(a: Candidate, step: int, ctx: Context, strict: bool = False) -> list:
    """Large-update events of ``a`` that started before ``step`` and still held near it (too large, or back
    only in their warning band since)."""
    window = ctx.th.lr_jump_window
    return [e for e in a.facts.get("large", []) if (e.step < step if strict else e.step <= step)
            and (e.end is None or max(e.end, e.values.get("near_until", e.end)) >= step - window)]


def _unstable_before(a: Candidate, step: float) -> list:
    return [e for e in a.events if e.signal == Signal.LOSS and e.step <= step]


def _downstream_of(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """``b`` is at or after one of ``a``'s layers (a model-wide ``a`` covers every layer)."""
    layers = a.facts.get("layers") or ([a.layer] if a.layer else [])
    if not layers or not b.layer:
        return True
    return any(l == b.layer or ctx.upstream(l, b.layer) for l in layers)


# -- data ------------------------------------------------------------------------------------------------------

def _data(a: Candidate, b: Candidate, ctx: Context) -> bool:
    if b.cause == C.DATA:
        return False
    if a.kind in ("input_nonfinite", "loss_nonfinite"):
        return _after(a, b)
    if a.kind == "unscaled":
        if b.cause == C.LEARNING_RATE_TOO_HIGH:  # the first layer's gradient, and update, scale with its input
            return _early(a, b, ctx)
        if b.cause == C.BAD_INITIALIZATION and b.kind == "outputs":  # inputs out of scale make outputs so
            return _after(a, b)
        first = ctx.input_reach()
        return _after(a, b) and (b.layer in first or any(e.layer in first for e in b.events))
    if a.kind == "input_small":  # the first layer's weight gradient scales with its input, its output is its
        # biases (the units a negative bias holds are dead): it barely learns. Updates negligible everywhere
        # are the learning rate's, not this
        return b.cause in (C.LOSS_PLATEAU, C.VANISHING_GRADIENTS, C.BAD_INITIALIZATION, C.DEAD_UNITS) and _after(a, b)
    if a.kind == "constant":  # every unit computes one value for all samples: on or off for all, no signal
        return b.cause in (C.LEARNING_RATE_TOO_LOW, C.LOSS_PLATEAU, C.DEAD_UNITS, C.SATURATED_ACTIVATIONS,
                           C.VANISHING_GRADIENTS) and _after(a, b)
    if a.kind in ("norm_batch", "targets_several"):  # what follows a normalisation that keeps little of its
        # input, or targets a softmax cannot fit
        return b.cause in (C.LEARNING_RATE_TOO_HIGH, C.LEARNING_RATE_TOO_LOW, C.LOSS_PLATEAU, C.DEAD_UNITS,
                           C.SATURATED_ACTIVATIONS, C.VANISHING_GRADIENTS, C.EXPLODING_GRADIENTS,
                           C.BAD_INITIALIZATION) and _after(a, b)
    if a.kind == "mixed":  # what the model cannot learn when each output depends on other samples' inputs
        return b.cause in (C.LEARNING_RATE_TOO_HIGH, C.LEARNING_RATE_TOO_LOW, C.LOSS_PLATEAU, C.DEAD_UNITS,
                           C.SATURATED_ACTIVATIONS, C.VANISHING_GRADIENTS, C.EXPLODING_GRADIENTS)
    if a.kind == "ordered":  # each batch pulls the outputs toward its own classes, the next one away again
        return b.cause in (C.LEARNING_RATE_TOO_HIGH, C.LEARNING_RATE_TOO_LOW, C.LOSS_PLATEAU, C.DEAD_UNITS,
                           C.SATURATED_ACTIVATIONS, C.EXPLODING_GRADIENTS) and b.step >= a.since
    if a.kind == "targets_unbounded":
        return _unbounded(a, b, ctx)
    if a.kind == "targets_out_of_reach":  # the error, and so the gradient and the updates, scale with the targets
        return b.cause in (C.LEARNING_RATE_TOO_HIGH, C.EXPLODING_GRADIENTS) and _early(a, b, ctx) or (
            b.cause == C.NON_FINITE and _after(a, b))
    return False


# -- initialisation ---------------------------------------------------------------------------------------------

def _init(a: Candidate, b: Candidate, ctx: Context) -> bool:
    grows = a.kind in ("amplifies", "recurrent", "saturating", "outputs")
    if a.kind == "symmetric":  # units that stay identical: their scale, activations and gradients follow from it
        return (b.cause in (C.BAD_INITIALIZATION, C.DEAD_UNITS, C.SATURATED_ACTIVATIONS, C.VANISHING_GRADIENTS,
                            C.EXPLODING_GRADIENTS, C.LEARNING_RATE_TOO_LOW) and _early(a, b, ctx)
                and _downstream_of(a, b, ctx) or b.cause == C.LEARNING_RATE_TOO_LOW)
    if b.cause == C.BAD_INITIALIZATION:  # a recurrent layer's state scale shows as its own and later layers' gain
        return (a.kind == "recurrent" and b.kind in ("amplifies", "shrinks") and b.facts["layers"][0] == a.layer
                and _early(a, b, ctx))
    if b.cause == C.NON_FINITE:  # (the loss's own arithmetic is no overflow of the weights' scale)
        return grows and _after(a, b) and b.kind != "loss_op"
    if (b.cause in (C.SATURATED_ACTIVATIONS, C.DEAD_UNITS) and a.kind == "shrinks" and _holds_at(a, b.step)
            and a.layer != b.facts.get("previous") and _downstream_of(a, b, ctx)):
        # a signal shrunk to nothing leaves each unit its bias for every input: whichever side of the
        # activation's edge the updates then move that bias to, the unit is the same for all of them (dead, or
        # pinned), however long after the first step
        return True
    if not _early(a, b, ctx):
        return False
    if b.cause == C.LEARNING_RATE_TOO_HIGH:
        # outputs out of scale give gradients, and updates, out of scale. Weights k times too small make
        # updates k times larger next to them than usual (up to k times the threshold), but cannot make the
        # loss diverge or the weights overflow
        if grows:
            return True
        k = 1.0 / a.facts["gain"] if a.facts.get("gain", 0.0) > 0 else math.inf
        return (b.facts.get("update_max", 0.0) <= ctx.th.update_too_large * k
                and not (_unstable_before(b, math.inf) or b.facts.get("nan")))
    if b.cause == C.LEARNING_RATE_TOO_LOW:
        # a layer's weights k times too large make its updates k times smaller next to them: at their usual
        # scale the same updates would have counted in some layer (a rate decades too low, or small updates
        # in layers of a usual scale, are the rate's own)
        if a.kind == "saturating":  # weights that pin their units at the bounds are far above their scale, and
            # the updates small next to them (an adaptive optimizer's step does not grow with them)
            return b.kind in ("still", "negligible")
        if a.kind != "amplifies" or a.facts.get("biased"):
            return False
        gains = {e.layer: e.values.get("gain", math.nan) for e in a.events}
        if b.kind == "still":
            return any(ctx.layers_moved.get(n, 0.0) * k >= ctx.th.weights_still for n, k in gains.items() if k > 1)
        k = min(gains.values(), default=math.nan)
        return (b.kind == "negligible" and set(ctx.layers_moved) <= set(gains)
                and b.facts["update_typical"] * k >= ctx.th.update_negligible)
    if a.kind == "saturating":
        return b.cause == C.SATURATED_ACTIVATIONS and b.layer in a.facts["saturated"]
    if b.cause in (C.SATURATED_ACTIVATIONS, C.DEAD_UNITS):
        # the scale of the one layer feeding an activation is that activation's own account (its chain and fix
        # name the layer): the activation is the root, see _blocks
        return a.layer != b.facts.get("previous") and _downstream_of(a, b, ctx)
    if b.cause in (C.VANISHING_GRADIENTS, C.EXPLODING_GRADIENTS):
        return True
    return False


# -- the learning rate ---------------------------------------------------------------------------------------------

def _lr_high(a: Candidate, b: Candidate, ctx: Context) -> bool:
    if b.cause in (C.DEAD_UNITS, C.SATURATED_ACTIVATIONS):  # units pushed out of their range by an update
        # (seen too large, or the loss already unstable from them before the units went: the samples may have
        # missed the updates themselves)
        return not ctx.from_start(b.step) and bool(_large_before(a, b.step, ctx) or a.facts.get("jump")
                                                   or _unstable_before(a, b.step))
    if b.cause == C.EXPLODING_GRADIENTS:
        return bool(_large_before(a, b.step, ctx, strict=True))
    if b.cause == C.VANISHING_GRADIENTS:  # units killed by an update pass no gradient back
        return not ctx.from_start(b.step) and bool(_large_before(a, b.step, ctx) or _unstable_before(a, b.step))
    if b.cause == C.ATTENTION_COLLAPSE:  # the logits pushed up while the updates are too large
        return bool(_large_before(a, b.step, ctx)) and any(e.end is None or e.end >= b.step
                                                           for e in a.facts.get("large", []))
    if b.cause == C.NON_FINITE:
        if b.kind in ("weights", "overflow"):
            return True
        if b.kind in ("fp16_overflow", "near_limit", "skipping"):  # weights grown by the updates until they overflow
            return bool(_large_before(a, b.step, ctx, strict=True))
        large = _large_before(a, b.step, ctx, strict=True)
        # something grew out of scale before the NaN: a loss that rose, activations blown up
        grew = _unstable_before(a, b.step) or [e for nan in b.events for e in ctx.preceding(nan) if e.step < b.step
                                                and e.signal == Signal.ACTIVATION and e.after == ActState.ANOMALOUS]
        if b.kind == "loss_op":
            # the loss's own arithmetic (a log of a probability that rounds to 0): training toward confident
            # outputs reaches it at any learning rate; large updates account for it only through a loss they
            # made unstable first
            return bool(_unstable_before(a, b.step))
        if b.kind == "forward":
            # an operation that leaves its domain in a module that is no weight layer: updates alone, with
            # nothing growing out of scale before it, only moved a value to the edge of that domain -- unless
            # they replace the weights outright
            return bool(large and (grew or max((e.values.get("update_max", 0.0) or 0.0 for e in large),
                                               default=0.0) >= 1.0))
        return bool(large or grew)
    return False


def _attention(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """A collapsed attention passes (almost) no gradient to its queries and keys, and opens with the updates
    that pushed its logits up once those are back to a usual size."""
    if b.cause == C.VANISHING_GRADIENTS:
        return b.step >= a.step and any(b.layer.startswith(l.rsplit(".", 1)[0]) for l in a.facts["layers"])
    if b.cause == C.LEARNING_RATE_TOO_HIGH:
        large = b.facts.get("large", [])
        return (bool(large) and not (_unstable_before(b, math.inf) or b.facts.get("nan") or b.facts.get("spikes"))
                and all(e.end is not None and e.end < a.step for e in large))
    return False


def _precision(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """Values out of float16's range, or steps a scaler skips, are NaN/Inf from then on."""
    return a.kind != "near_limit" and b.cause != C.DATA and b.step > a.step


def _unbounded(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """A loss with no floor has the model push its outputs without limit: its gradient and its updates grow,
    the loss runs away to -Inf and NaN, units are driven out of their range."""
    return b.cause in (C.LEARNING_RATE_TOO_HIGH, C.EXPLODING_GRADIENTS, C.NON_FINITE, C.DEAD_UNITS,
                       C.SATURATED_ACTIVATIONS, C.VANISHING_GRADIENTS) and _after(a, b)


# what a network shows when nothing in it is normalised: signals out of scale, updates too large at a rate it
# trains at normalised, a NaN/Inf made in one of its layers, a plateau
_UNNORMALISED = frozenset({C.LOSS_PLATEAU, C.LEARNING_RATE_TOO_LOW, C.LEARNING_RATE_TOO_HIGH, C.EXPLODING_GRADIENTS,
                           C.VANISHING_GRADIENTS, C.DEAD_UNITS, C.SATURATED_ACTIVATIONS, C.BAD_INITIALIZATION,
                           C.NON_FINITE})


def _unnormalised(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """Training in eval mode: its batch normalisations normalise with running statistics that never move, so
    the network trains unnormalised from then on: what starts with it follows, and in a run whose loss stays
    flat or diverges, what starts later too (not a NaN/Inf of the input or of the loss's own code)."""
    if b.cause not in _UNNORMALISED or b.step < a.step or b is a:
        return False
    if not a.loss and not _early(a, b, ctx):  # (not a spike it recovered from, later in a run that learned)
        return False
    return b.cause != C.NON_FINITE or b.layer not in ("input", "loss")


def _loss_family(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """A loss with no floor, see ``_unbounded``. Weights that never change (no optimizer steps them, or steps
    on no gradient, or the loss gives them none) leave no learning rate or plateau more to say; weights the
    hooks do not see (not the model's parameters) make any scale read across them no reading of its own. Weights held
    near zero make every update large next to them (no divergence, no NaN: just a ratio), pass a vanishing
    signal and gradient, and leave units dead; the plain plateau is the same story."""
    if a.kind == "unbounded":
        return _unbounded(a, b, ctx)
    if a.kind == "unregistered" and b.cause == C.BAD_INITIALIZATION:
        return True  # a scale read across layers the hooks do not see (they sit between the watched ones)
    if a.kind == "eval_mode":
        return _unnormalised(a, b, ctx)
    if a.kind == "on_probabilities":  # a loss of probabilities passes back a gradient that fades as they sharpen:
        # the updates small next to the weights are its, no rate to raise
        return b.cause == C.LEARNING_RATE_TOO_LOW and b.step >= a.step
    if a.kind in ("not_stepped", "foreign", "unreached", "cleared", "unoptimized", "unregistered", "remade",
                  "no_gradient"):
        return b.cause in (C.LOSS_PLATEAU, C.LEARNING_RATE_TOO_LOW) and b is not a
    if a.kind != "weights_collapse":
        return False
    if b.cause == C.LEARNING_RATE_TOO_HIGH:  # (ratios that jump as the weights approach zero included)
        return not (_unstable_before(b, math.inf) or b.facts.get("nan"))
    return b.cause in (C.VANISHING_GRADIENTS, C.DEAD_UNITS, C.BAD_INITIALIZATION, C.LEARNING_RATE_TOO_LOW,
                       C.LOSS_PLATEAU) and b.step >= a.step - ctx.th.lr_jump_window


def _rank_spread(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """One rank's shard out of scale, or gradients summed over the ranks, make every replica's updates too
    large through the all-reduce (and the shard, this rank's own input out of scale and its BatchNorm
    statistics apart from the others')."""
    if b.cause == C.LEARNING_RATE_TOO_HIGH:
        return bool(b.facts.get("large")) and b.facts["large"][0].step >= a.step - ctx.th.persist
    if a.cause == C.RANK_DATA:
        return (b.cause == C.DATA and b.kind == "unscaled") or b.cause == C.BATCHNORM_RANK_MISMATCH
    return False


def _exploding(a: Candidate, b: Candidate, ctx: Context) -> bool:
    if b.cause == C.NON_FINITE:
        return b.step > a.step and b.kind != "loss_op"
    if b.cause == C.LEARNING_RATE_TOO_HIGH:  # updates large because the gradient is
        return b.step >= a.step
    return False


def _blocks(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """A dead or saturated layer stops the gradient to the layers before it (and so their updates); from the
    first step, it accounts for the scale of the one layer that feeds it."""
    if b.cause == C.LEARNING_RATE_TOO_LOW:
        return _no_gradient(a, b)
    if b.cause == C.LOSS_PLATEAU and b.kind == "weights_collapse":
        # behind a layer that passes no gradient the loss pulls on nothing, and any decay, however usual, walks
        # the weights down: the collapse (of the median layer) follows when most weight layers lie behind it
        weighted = [n for n, info in ctx.layers.items() if info.n_params and n in ctx.rank]
        behind = [n for n in weighted if ctx.upstream(n, a.layer)]
        return a.since <= b.since and 2 * len(behind) >= len(weighted) > 0
    if b.cause in (C.DEAD_UNITS, C.SATURATED_ACTIVATIONS):  # what a constant signal does downstream
        return any(e in a.facts.get("downstream", []) for e in b.events)
    if b.cause == C.BAD_INITIALIZATION:
        return (b.kind in ("amplifies", "shrinks") and bool(b.layer) and b.layer == a.facts.get("previous")
                and ctx.from_start(a.step) and _early(b, a, ctx))
    if b.cause != C.VANISHING_GRADIENTS:
        return False
    blocked = a.facts.get("blocked", [])
    return any(e in blocked for e in b.events) or (ctx.upstream(b.layer, a.layer) and b.step >= a.step)


def _no_gradient(a: Candidate, b: Candidate) -> bool:
    """Updates that become negligible once the gradient stopped flowing: not the step size, the gradient."""
    return b.step >= a.step and bool(a.symptoms or a.cause == C.VANISHING_GRADIENTS)


def _vanishing(a: Candidate, b: Candidate, ctx: Context) -> bool:
    """Updates that are small because the gradient is: negligible, or adding up to little, under an optimizer
    whose step shrinks with the gradient (an adaptive optimizer's do not: its small updates are its rate's),
    or an adaptive optimizer's eps that damps a gradient that vanished below it. A rate a schedule holds
    down, a clip or a rounding are settings no gradient makes."""
    return (b.cause == C.LEARNING_RATE_TOO_LOW and a.kind == "vanishing" and _no_gradient(a, b)
            and (b.kind in ("negligible", "still") and not ctx.adaptive() or b.kind == "eps"))


def _nonfinite(a: Candidate, b: Candidate, ctx: Context) -> bool:
    if a.kind in ("fp16_overflow", "near_limit", "skipping"):
        return _precision(a, b, ctx)
    return b.cause != C.DATA and b.step > a.step


EXPLAINS: dict[Cause, Predicate] = {
    C.DATA: _data,
    C.BAD_INITIALIZATION: _init,
    C.LEARNING_RATE_TOO_HIGH: _lr_high,
    C.EXPLODING_GRADIENTS: _exploding,
    C.DEAD_UNITS: _blocks,
    C.SATURATED_ACTIVATIONS: _blocks,
    C.NON_FINITE: _nonfinite,
    C.VANISHING_GRADIENTS: _vanishing,
    C.ATTENTION_COLLAPSE: _attention,
    C.LOSS_PLATEAU: _loss_family,
    C.RANK_DATA: _rank_spread,
    C.WORLD_SIZE_SCALING: _rank_spread,
}


def _span_end(c: Candidate) -> float:
    """The last step ``c``'s own evidence holds (infinite while any of it holds to the end, or when its
    effects outlast it: weights that start at the wrong scale)."""
    if c.lasting:
        return math.inf
    ends = [math.inf if e.end is None else e.end for e in c.events]
    return max(ends) if ends else math.inf


def explained_loss(c: Candidate, ctx: Context) -> list:
    """The loss failures ``c`` accounts for: of a kind it can produce, still there at its onset or later, and
    starting while it holds or soon after (within as long again, and at least ``lr_jump_window`` steps): a
    burst of large updates at the start does not explain a loss that oscillates hundreds of steps later; nor
    can it explain a failure that began before it could have (before the sample preceding its onset)."""
    end = _span_end(c)
    reach = end + max(ctx.th.lr_jump_window, end - c.step)
    since = ctx.sample_before(c.step) if c.acting_from is None else c.since
    out = [e for e in ctx.events if (e.signal in (Signal.LOSS, Signal.TARGET) or e.signal == Signal.SPIKE
                                     and not e.layer) and e.after in c.loss_kinds
           and (e.end is None or e.end > c.since) and since <= e.step <= reach]
    return out


def _explains(a: Candidate, b: Candidate, ctx: Context) -> bool:
    if a is b or b.kind in ("dropped", "eval_mode"):  # set in the code: nothing in the run makes a dropout drop
        return False                                 # all, or puts the model in eval mode
    if b.kind == "order_blind":  # a model that reads its tokens as a set: no positions in the code, or attention
        # that cannot see them (collapsed, dropped, or run over the batch instead of the positions), or an output
        # read where the other tokens cannot reach it
        return a.cause == C.ATTENTION_COLLAPSE or a.kind in ("mixed", "dropped", "read_early")
    divergence = [e for e in a.loss if e.after == LossState.DIVERGING]
    diverged = bool(divergence) and b.step > divergence[0].step
    if b.cause == C.LOSS_PLATEAU and b.kind == "plateau":  # a flat loss that a more specific cause accounts for
        # (or a loss that settles where a divergence left it)
        if a.cause == C.LOSS_PLATEAU and a.kind == "plateau":
            return False
        return any(e in a.loss for e in b.events) or diverged
    if (b.events and all(e.signal == Signal.LOSS for e in b.events) and all(e in a.loss for e in b.events)
            and not b.facts.get("nan") and b.step >= a.since):
        return True  # a candidate made of nothing but a loss failure that ``a`` accounts for
    if b.events and b.step >= a.step and all(any(e is s for s in a.symptoms) for e in b.events):
        return True  # a candidate whose evidence is all symptoms named by ``a``'s signature
    if diverged and b.cause not in (C.DATA, C.BAD_INITIALIZATION):
        return True  # from the onset of a divergence on, what starts later is its symptom
    rule = EXPLAINS.get(a.cause)
    return rule is not None and rule(a, b, ctx)


def resolve(cands: list[Candidate], ctx: Context) -> list[Candidate]:
    """The roots, each with what it explains, ranked by confidence (then causal order)."""
    for c in cands:
        c.loss = explained_loss(c, ctx)
        c.confidence = confidence(c, ctx)
    edges = {(i, j) for i, a in enumerate(cands) for j, b in enumerate(cands) if _explains(a, b, ctx)}
    for i, j in list(edges):  # both ways: the earlier (onset, then causal order) is the cause
        if (j, i) in edges and cands[j].order < cands[i].order:
            edges.discard((i, j))
    parent: dict[int, int] = {}
    for j in range(len(cands)):
        sources = [i for i, jj in edges if jj == j]
        if sources:
            # a source that came first (onset, then causal order) before one that did not: two candidates that
            # explain each other (the same state in two layers) never keep each other from an earlier root
            parent[j] = min(sources, key=lambda i: (cands[i].order >= cands[j].order, -cands[i].confidence,
                                                    cands[i].family, cands[i].step))

    def root(j: int) -> int:
        seen = {j}
        while j in parent and parent[j] not in seen:
            j = parent[j]
            seen.add(j)
        return j

    roots: dict[int, Candidate] = {}
    for j, c in enumerate(cands):
        top = root(j)
        roots.setdefault(top, cands[top])
        if top != j:
            cands[top].absorbed.append(c)
    out = list(roots.values())
    for r in out:
        seen = {id(e) for e in r.loss}
        for c in r.explained():
            for e in c.loss:
                if id(e) not in seen:
                    seen.add(id(e))
                    r.loss.append(e)
        r.confidence = confidence(r, ctx)
    out.sort(key=lambda c: (-c.confidence, c.family, c.step))
    return out

