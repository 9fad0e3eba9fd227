"""A loss that stops improving when nothing more specific explains it; weights that collapse toward zero
(a weight decay holding them there), or an optimizer that never stepped them, as the reason it does.

The flat stretch is the loss's plateau and "hardly comes down" states that follow each other to the end
(a loss hovering at the plateau threshold flickers between the two); its severity is how little it came
down, against the threshold of hardly coming down.
"""
from __future__ import annotations

from ..causes import Cause
from ..events import SemanticEvent
from ..layers import Kind
from ..losspath import LossMisuse
from ..states import LossState, Signal, UpdateState, WeightState
from .context import Context
from .data import unbounded_fall
from .evidence import Candidate, below_ratio, clip01, past_fraction, past_ratio, persistence

_FLAT = (LossState.PLATEAU, LossState.SLOW)


def _flat_stretch(ctx: Context) -> list[SemanticEvent]:
    """The plateau/slow events that follow each other up to the end of the run, when they end on a plateau (a
    loss that was flat for a while and then learned, or left its plateau and goes on coming down slowly, had a
    slow start, not a plateau); else the plateau of the classification term of a loss that adds other terms to
    it, when it holds to the end."""
    flat = ctx.all(Signal.LOSS, *_FLAT)
    run: list[SemanticEvent] = []
    for e in flat:
        if e.values.get("term"):
            continue
        if run and run[-1].end == e.step:
            run.append(e)
        else:
            run = [e]
    if run and run[-1].end is None and not run[-1].values.get("left_plateau") and any(
            e.after == LossState.PLATEAU for e in run):
        return run
    # the loss as a whole comes down, with what it adds to a classification: that term's own plateau
    return [e for e in flat if e.values.get("term") and e.end is None][-1:]


def candidates(ctx: Context) -> list[Candidate]:
    out = (_not_stepped(ctx) + _no_gradient(ctx) + _on_probabilities(ctx) + _read_early(ctx) + _order_blind(ctx)
           + _input_unused(ctx) + _unoptimized(ctx) + _out_of_range(ctx))
    if ctx.loss_unbounded:
        # a loss whose code has no floor (negated, an NLL of raw outputs, a log-likelihood left positive) falls
        # below zero without end: the model is trained away from its targets, whatever the data
        out += unbounded_fall(ctx, Cause.LOSS_PLATEAU, "", "unbounded")
    # a loss that depends on weights another optimizer moves (a discriminator, a critic) is a game's, not an
    # objective the model minimises alone: its flat stretch is no plateau
    run = [] if ctx.moving_objective else _flat_stretch(ctx)
    if not run:
        return out
    last = run[-1]
    whole = ctx.last_step - run[0].step
    held = (ctx.last_step if last.end is None else last.end) - run[0].step
    progress = last.values.get("progress", 0.0)
    severity = clip01(1.0 - progress / ctx.th.slow_progress) if progress == progress else 1.0
    out += [Candidate(Cause.LOSS_PLATEAU, "", run[0].step, "plateau", run, severity=severity,
                     persistence=clip01(held / whole) if whole > 0 else 1.0,
                     loss_kinds=frozenset(_FLAT))]
    collapsing = ctx.all(Signal.WEIGHTS, WeightState.COLLAPSING)
    if collapsing:
        # every stretch of it: weights held near the threshold flicker across it, and the collapse lasts as long
        # as they stay down
        ev = collapsing[0]
        scale = ev.values.get("weight_scale", float("nan"))
        since = ev.values.get("shrinking_since", float("nan"))
        out.append(Candidate(Cause.LOSS_PLATEAU, "", ev.step, "weights_collapse", collapsing,
                             severity=past_ratio(1.0 / scale if scale == scale and scale > 0 else float("inf"),
                                                 ctx.th.weight_collapse),
                             persistence=persistence(ev, ctx),
                             # what pulls them there acts from where they began to shrink without a break
                             acting_from=int(since) if since == since else None,
                             needs_harm=True, loss_kinds=frozenset(_FLAT) | {LossState.STALLED},
                             facts={"weight_scale": scale}))
    return out


_ON_PROBABILITIES = (LossMisuse.SOFTMAX_TWICE, LossMisuse.NLL_OF_PROBABILITIES, LossMisuse.LOGITS_LOSS_ON_PROBABILITIES,
                     LossMisuse.NORMALISED_OVER_BATCH, LossMisuse.LOGITS_BOUNDED)


def _on_probabilities(ctx: Context) -> list[Candidate]:
    """The loss is computed from probabilities where it takes logits or log-probabilities (a softmax applied
    twice, NLL without the log, a with-logits loss after a sigmoid), from logits cut at 0 or held in a range
    (a ReLU or tanh after the last layer), or from log-probabilities normalised over the batch instead of the
    classes: a fact of the code, at every step. The loss cannot reach its minimum
    (its gradient fades as the outputs sharpen, or it ranks samples instead of classes): a floor, a plateau."""
    if ctx.loss_misuse not in _ON_PROBABILITIES:
        return []
    return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "on_probabilities", [], severity=1.0, persistence=1.0,
                      certain=True, lasting=True, loss_kinds=frozenset(_FLAT) | {LossState.STALLED, LossState.SLOW},
                      facts={"misuse": ctx.loss_misuse})]


def _no_gradient(ctx: Context) -> list[Candidate]:
    """The loss's code gives the model's outputs no gradient on any path (a cross-entropy of one output column:
    its softmax is 1 and the loss 0 whatever the weights; a ``torch.round`` of the outputs): a fact of the code,
    from the first step. No learning rate moves weights that get no gradient; the loss stays where it is."""
    if not ctx.loss_no_gradient:
        return []
    return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "no_gradient", [], severity=1.0, persistence=1.0,
                      certain=True, lasting=True, loss_kinds=frozenset(_FLAT) | {LossState.STALLED},
                      facts={"op": ctx.loss_no_gradient})]


def _not_stepped(ctx: Context) -> list[Candidate]:
    """The weights cannot learn, whatever the learning rate: backward passes ran and the watched optimizer never
    stepped (``optimizer.step()`` not called, or called on another optimizer), or, none given, the only optimizer
    that stepped holds none of the model's weights (made for a model since re-created), or the optimizer stepped on the
    model's weights and most of its steps had no gradient from the loss on those weights: no backward pass
    through the model before them (a loss computed from a detached output: ``.detach()``, ``.item()``,
    ``torch.no_grad()``, a tensor rebuilt from numpy), or one whose gradients were cleared before the step."""
    kinds = frozenset(_FLAT) | {LossState.STALLED}
    if ctx.unstepped >= ctx.th.persist:
        return [Candidate(Cause.LOSS_PLATEAU, "", 0, "not_stepped", [], severity=1.0, persistence=1.0, lasting=True,
                          loss_kinds=kinds, facts={"passes": ctx.unstepped})]
    if ctx.foreign_steps >= ctx.th.persist:  # an optimizer stepped, on other weights: the model's never changed
        # (a failure only with a loss that fails: a loss that improves is not this model's to improve)
        return [Candidate(Cause.LOSS_PLATEAU, "", 0, "foreign", [], severity=1.0, persistence=1.0, lasting=True,
                          needs_harm=True, loss_kinds=kinds, facts={"steps": ctx.foreign_steps})]
    checked, cleared = ctx.cleared
    for kind, count, steps in (("unreached", ctx.unreached, ctx.last_step + 1), ("cleared", cleared, checked)):
        if count >= ctx.th.persist and 2 * count >= steps:
            return [Candidate(Cause.LOSS_PLATEAU, "", 0, kind, [], severity=1.0, persistence=1.0, lasting=True,
                              loss_kinds=kinds, facts={"steps": count, "checked": steps})]
    return []


def _read_early(ctx: Context) -> list[Candidate]:
    """A sequence whose first positions alone (up to ``time_read`` of them) get a gradient at most sampled
    passes: a recurrent layer's input (``ctx.through_time``), or else the tokens an embedding reads
    (``ctx.positions_read``, along the dimension that is cut while the other is reached whole). The loss
    reads the output before the sequence's end (``out[:, 0]``: a recurrent layer's state after the first
    step, a causal Transformer's output at the first token, where ``out[:, -1]`` was meant), and what comes
    later cannot change the prediction. The reading alone is no failure (a task decided by its first steps
    trains): it needs a loss that does not improve, or hardly, and no negligible updates (then the learning
    rate's)."""
    cut = ctx.nonfinite_step() or 1 << 62
    recurrent = {layer: [(r[0], r[3], r[2]) for r in rows if len(r) >= 4 and r[2] >= 2 and r[0] < cut]
                 for layer, rows in ctx.through_time.items()}
    out = _read_before_end(ctx, recurrent, {})
    if out or any(recurrent.values()):
        return out
    tokens = {}
    for layer, rows in ctx.positions_read.items():
        rows = [r for r in rows if len(r) >= 5 and r[0] < cut]
        # (step, reached, length) along the dimension that is cut, where the other is reached whole
        tokens[layer] = [(r[0], r[2 + 2 * d], r[1 + 2 * d]) for r in rows for d in (1, 0)
                         if r[1 + 2 * d] >= 2 and r[4 - 2 * d] >= r[3 - 2 * d] and r[2 + 2 * d] < r[1 + 2 * d]]
        if len(tokens[layer]) * 2 < len(rows):
            tokens[layer] = []
    return _read_before_end(ctx, tokens, {"tokens": True})[:1]


def _order_blind(ctx: Context) -> list[Candidate]:
    """An attention model over tokens whose output stayed the same, to rounding, when a sample's tokens were
    reordered (``order.sees_order``): it reads them as a set, with no positional information. A fact of the
    model, and a failure only where the task needs the order, which nothing in the run says (a loss that does
    not come down has other reasons too; on a task of counting tokens the model learns): a lead, which claims
    no loss failure. A plateau's fix names it first."""
    if not ctx.order_blind:
        return []
    return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "order_blind", [], severity=1.0, persistence=1.0,
                      needs_harm=True, lasting=True, loss_kinds=frozenset(),
                      facts={"positions": int(ctx.order_blind.get("positions", 0))})]


def _read_before_end(ctx: Context, readings: dict, facts: dict) -> list[Candidate]:
    """``_read_early`` over readings layer -> [(step, positions reached, positions), ...], the first layers
    in the model's order first."""
    still = bool(ctx.all(Signal.UPDATE, UpdateState.NEGLIGIBLE))
    out = []
    for layer in sorted(readings, key=lambda n: ctx.rank.get(n, 1 << 30)):
        rows = readings[layer]
        if layer not in ctx.layers or len(rows) < ctx.th.persist:
            continue
        shares = sorted(r[1] / r[2] for r in rows)
        typical = shares[len(shares) // 2]
        early = [r for r in rows if r[1] / r[2] <= ctx.th.time_read]
        if typical > ctx.th.time_read or not early:
            continue
        out.append(Candidate(Cause.LOSS_PLATEAU, layer, int(early[0][0]), "read_early", [],
                             severity=below_ratio(typical, ctx.th.time_read), persistence=len(early) / len(rows),
                             needs_harm=True, lasting=True,
                             loss_kinds=frozenset() if still else frozenset(_FLAT) | {LossState.STALLED,
                                                                                      LossState.SLOW},
                             facts={"read": int(early[-1][1]), "steps_in_time": int(early[-1][2]), **facts}))
    return out


def _input_unused(ctx: Context) -> list[Candidate]:
    """The replay of a pass (see ``mixing``) found the model's output computed without its input at all: the
    forward replaces it (``torch.zeros_like(x)``, a batch it stored, fresh noise) or reads another variable.
    No output can depend on its sample, whatever the weights: a fact of the code from the first step, a failure
    with a loss that does not improve."""
    mix = ctx.batch_mixing
    if not mix.get("unused") or ctx.moving_objective:  # (a generator may be handed a batch for its size alone)
        return []
    return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "input_unused", [], severity=1.0, persistence=1.0,
                      needs_harm=True, lasting=True, loss_kinds=frozenset(_FLAT) | {LossState.STALLED, LossState.SLOW},
                      facts={"replayed": int(mix.get("step", 0))})]


def _unoptimized(ctx: Context) -> list[Candidate]:
    """Layers whose weights hold a gradient at every sampled step and never move while the others' do: no
    optimizer steps them (built from part of the model, ``Adam(model.fc.parameters())``, or before a module was
    added; a group with lr=0). A fact of the run from the first step; a failure with a loss that does not
    improve (a probe trained on purpose over a frozen backbone learns). Named at the first of them. Weights the
    forward uses outside the model's parameters that never move are the same fact, named in the model; so is
    an optimizer made again at every step, whose state (momentum) never builds."""
    kinds = frozenset(_FLAT) | {LossState.STALLED, LossState.SLOW}
    out = []
    if ctx.unregistered is not None:  # weights the forward uses that model.parameters() does not list
        out.append(Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "unregistered", [], severity=1.0,
                             persistence=1.0, needs_harm=True, lasting=True, loss_kinds=kinds,
                             facts=dict(ctx.unregistered)))
    if ctx.remade is not None:  # its state starts from zero at every step: momentum never builds
        out.append(Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "remade", [], severity=1.0, persistence=1.0,
                             needs_harm=True, lasting=True, loss_kinds=kinds, facts=dict(ctx.remade)))
    if ctx.eval_mode is not None:  # batch normalisations on running statistics that never move: no normalisation
        mode = ctx.eval_mode
        # (a loss that stays flat, or one that diverges: an unnormalised network may at a rate it trains at
        # normalised; not one that is merely slow for a while)
        out.append(Candidate(Cause.LOSS_PLATEAU, "", max(mode["step"], ctx.first_step), "eval_mode", [],
                             severity=1.0, persistence=mode["passes"] / max(mode["sampled"], 1), needs_harm=True,
                             lasting=True,
                             loss_kinds=frozenset({LossState.PLATEAU, LossState.STALLED, LossState.DIVERGING,
                                                   LossState.NONFINITE}),
                             facts=dict(mode)))
    layers = [name for name in ctx.unupdated if name in ctx.layers]
    if not layers or ctx.param_dtype in ("bfloat16", "float16"):  # (16-bit updates may all round away)
        return out
    # the parameters named where a layer's are left out in part (its weight, while its bias is stepped)
    tensors = [f"{name}.{p}" if name else p for name in layers for p in ctx.left_out.get(name, ())]
    return out + [Candidate(Cause.LOSS_PLATEAU, layers[0], ctx.first_step, "unoptimized", [], severity=1.0,
                            persistence=1.0, needs_harm=True, lasting=True, loss_kinds=kinds,
                            facts={"layers": layers, "tensors": tensors,
                                   "unheld": all(name in ctx.unheld for name in layers)})]


def _out_of_range(ctx: Context) -> list[Candidate]:
    """A regression loss of outputs a sigmoid or tanh holds in [lo, hi] that never comes below what any target
    in that range allows: one element's squared error is at most (hi - lo)^2, its absolute error hi - lo (a
    Huber loss lies below both). So the targets lie outside the outputs' range (a sigmoid output for targets
    of 0-100), and the loss cannot come down to them: a floor from the first step."""
    kinds = frozenset(_FLAT) | {LossState.STALLED, LossState.SLOW}
    found = ctx.bounded_output
    if found is not None and ctx.loss_min == ctx.loss_min:
        span = found[2] - found[1]
        bound = max(span, span * span)
        if ctx.loss_min > bound:
            return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "out_of_range", [],
                              severity=past_ratio(ctx.loss_min, bound), persistence=1.0, needs_harm=True,
                              lasting=True, loss_kinds=kinds,
                              facts={"activation": found[0], "low": found[1], "high": found[2],
                                     "loss_min": ctx.loss_min, "bound": bound})]
    return _blocked(ctx, kinds)


def _blocked(ctx: Context, kinds: frozenset) -> list[Candidate]:
    """The same fact read off the gradient, for any bound (a ReLU's 0 too, which bounds no error): most of the
    loss's gradient at the output sits on entries held at its bound while the loss pushes them past it, and the
    loss they hold is more than what counts as progress. That loss is on targets out of the outputs' range: no
    step removes it, so it is a floor, whatever the rest of the loss does."""
    blocked = ctx.output_blocked
    if blocked.get("share", 0.0) < ctx.th.output_blocked or blocked.get("floor", 0.0) < ctx.th.loss_progress:
        return []
    # the output held at its bound reads as units dead or saturated in the last activation to run: what the
    # targets do to it
    acts = [n for n, info in ctx.layers.items() if info.kind in (Kind.RELU, Kind.BOUNDED, Kind.SMOOTH)
            and n in ctx.rank]
    last = max(acts, key=ctx.rank.__getitem__, default=None)
    held = [e for e in ctx.events if e.signal == Signal.ACTIVATION and e.bad and e.layer == last]
    return [Candidate(Cause.LOSS_PLATEAU, "", ctx.first_step, "out_of_range", [],
                      severity=past_fraction(blocked["share"], ctx.th.output_blocked), persistence=1.0,
                      certain=True, lasting=True, symptoms=held, loss_kinds=kinds, facts=dict(blocked))]
