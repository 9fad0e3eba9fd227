"""Initialisation: a weight or bias scale that is wrong from step 0. Layers that amplify or shrink the signal
far from unit gain (alone, or compounded along several layers), recurrent weights far from their default
scale, and several bounded layers saturated from the first step behind their weight layers."""
from __future__ import annotations

import math

from ..causes import Cause
from ..layers import Kind
from ..states import ActState, GainState, Signal
from . import losses
from .context import Context
from .evidence import Candidate, below_ratio, past_fraction, past_ratio, persistence


def _recurrent_off(ctx: Context, e) -> bool:
    r = e.values.get("recurrent_scale", math.nan)
    return r == r and (r > ctx.th.layer_gain or r < 1 / ctx.th.layer_gain)


def _decades(x: float) -> float:
    return abs(math.log10(x)) if x == x and x > 0 else 0.0


def _off(ctx: Context, scale: float) -> bool:
    return scale == scale and (scale > ctx.th.layer_gain or scale < 1 / ctx.th.layer_gain)


def _symmetric(ctx: Context) -> list[Candidate]:
    """Trainable weight layers that start with all their weights equal (zero, or a constant), one feeding the
    next: every unit of the first computes the same output and, the next one weighing them all alike, gets
    the same gradient, so they stay identical (and with zeros and a ReLU or tanh, no gradient reaches them at
    all). A lone layer of equal weights is no such trap (a zero-initialised last layer or residual branch):
    the targets, or the next layer's random weights, tell its units apart."""
    equal = {n for n, l in ctx.layers.items() if "equal_weights" in l.extra and l.n_trainable > 0}
    # a normalisation layer between them keeps identical units identical: the previous layer is read past it
    order = [n for n in sorted(ctx.rank, key=ctx.rank.__getitem__)
             if ctx.layers[n].n_params > 0 and ctx.layers[n].kind != Kind.NORM]
    before = dict(zip(order[1:], order))
    trapped = {n for n in equal if before.get(n) in equal}
    layers = sorted(trapped | {before[n] for n in trapped}, key=lambda n: ctx.rank.get(n, 0))
    if not layers:
        return []
    values = sorted({ctx.layers[n].extra["equal_weights"] for n in layers})
    # the fault is shared by the layers listed: the model is its place
    return [Candidate(Cause.BAD_INITIALIZATION, "", ctx.first_step, "symmetric", [], severity=1.0,
                      persistence=1.0, needs_harm=True, lasting=True, loss_kinds=losses.SLOWED,
                      facts={"layers": layers, "values": values})]


def _grows_through_time(ctx: Context) -> dict[str, tuple[int, float, int]]:
    """Recurrent layers whose input's gradient, at the first pass (step 0: the weights as initialised, before
    any update), grows ``layer_gain`` times or more back through time, from the last time step the loss
    reaches to the first (meta ``through_time``): layer -> (step, growth, time steps). The state's scale
    through time is what explodes it, whatever the spread of its weights (an identity x1.2 has the spread
    of an orthogonal init)."""
    out = {}
    for layer, rows in ctx.through_time.items():
        if layer in ctx.layers and ctx.layers[layer].extra.get("bidirectional"):
            # its input's gradient at a step sums both directions: a backward direction that read every later
            # step, and a forward one that feeds every later output; their sum tells nothing of either's growth
            continue
        first = rows[0] if rows else []
        if layer in ctx.layers and len(first) >= 5 and first[0] == 0 and first[4] >= ctx.th.layer_gain:
            out[layer] = (0, float(first[4]), int(first[3]))
    return out


def _normalised_next(ctx: Context, e) -> bool:
    """A layer that shrinks the signal, with weights at a usual spread, whose output a normalisation layer
    reads next (a residual branch summed into a LayerNorm, a convolution into its BatchNorm): the norm takes
    its scale away, forward and backward (the gradient it passes back grows as its input shrinks), so the
    shrink costs nothing. Weights far below their default spread leave outputs made of the biases, which a
    norm does not give back the samples' differences."""
    after = ctx.next_weight_layer(e.layer)
    return (e.after == GainState.SHRINKS and after is not None and ctx.layers[after].kind == Kind.NORM
            and not _off(ctx, e.values.get("weight_scale", 1.0)))


def _output_shrinks(ctx: Context, e) -> bool:
    """The last weight layer, whose output is the model's, shrinking the signal with weights at a usual spread:
    outputs near zero at the start (near-uniform predictions, the aim of a head initialised small or at zero),
    which the loss's gradient at the output moves as it needs."""
    last = max((n for n, l in ctx.layers.items() if n in ctx.rank and l.n_params > 0 and l.kind != Kind.NORM),
               key=ctx.rank.__getitem__, default=None)
    return (e.after == GainState.SHRINKS and e.layer == last
            and not _off(ctx, e.values.get("weight_scale", 1.0)))


def _feeding_weights(ctx: Context, name: str) -> str | None:
    """The weights that feed a layer: the module with parameters of its own a functional operation runs in
    (weights the module applies in its forward, ``""`` for the model's own), else the weight layer before it."""
    info = ctx.layers.get(name)
    owner = info.extra.get("owner") if info is not None and info.extra.get("relation") == "in" else None
    if owner is not None and owner in ctx.layers and ctx.layers[owner].n_params > 0:
        return owner
    return ctx.previous_weight_layer(name)


def _outputs(ctx: Context) -> list[Candidate]:
    """A classifier whose loss at the first step, before any update, is ``outputs_out_of_scale`` times a
    uniform guess's or more: its outputs are far out of scale as initialised (weights drawn at a spread of 1
    where 1/sqrt(fan_in) was meant, a logit scale far above 1). Read where no layer's gain names the weights
    (the model's own parameters, applied in its forward, that no module hook sees)."""
    first, uniform = ctx.loss_at_start
    if not (first == first and uniform > 0) or first < ctx.th.outputs_out_of_scale * uniform:
        return []
    ratio = first / uniform
    return [Candidate(Cause.BAD_INITIALIZATION, "", ctx.first_step, "outputs", [],
                      severity=past_ratio(ratio, ctx.th.outputs_out_of_scale), persistence=1.0, needs_harm=True,
                      lasting=True, loss_kinds=losses.SLOWED,
                      facts={"ratio": ratio, "loss": first, "uniform": uniform})]


def candidates(ctx: Context) -> list[Candidate]:
    out = _symmetric(ctx)
    # (an input far below unit scale amplified by weights at their default spread is the data's)
    gains = [e for e in ctx.all(Signal.GAIN) if e.bad and ctx.from_start(e) and not ctx.input_too_small(e)
             and not _normalised_next(ctx, e) and not _output_shrinks(ctx, e)]
    recurrent = [e for e in gains if _recurrent_off(ctx, e)]
    through = _grows_through_time(ctx)
    for e in recurrent:
        r = e.values["recurrent_scale"]
        sev = past_ratio(r, ctx.th.layer_gain) if r > 1 else below_ratio(r, 1 / ctx.th.layer_gain)
        out.append(Candidate(Cause.BAD_INITIALIZATION, e.layer, e.step, "recurrent", [e], severity=sev,
                             persistence=1.0, needs_harm=True, lasting=True, loss_kinds=losses.SLOWED,
                             facts={"recurrent_scale": r, "time_growth": through.pop(e.layer, (0, math.nan, 0))[1]}))
    for layer, (step, growth, steps) in through.items():
        scale = ctx.layers[layer].extra.get("recurrent_scale", math.nan)
        out.append(Candidate(Cause.BAD_INITIALIZATION, layer, step, "recurrent", [],
                             severity=past_ratio(growth, ctx.th.layer_gain), persistence=1.0, needs_harm=True,
                             lasting=True, loss_kinds=losses.SLOWED,
                             facts={"recurrent_scale": scale, "time_growth": growth, "steps_in_time": steps}))
    gains = [e for e in gains if e not in recurrent]
    if gains:
        amplify = [e for e in gains if e.after == GainState.AMPLIFIES]
        shrink = [e for e in gains if e.after == GainState.SHRINKS]
        group = amplify if len(amplify) >= len(shrink) else shrink
        group.sort(key=lambda e: ctx.rank.get(e.layer, 0))
        verb = "amplifies" if group is amplify else "shrinks"
        finite = [g for g in (e.values.get("gain", math.nan) for e in group) if g == g]
        worst = (max(finite) if verb == "amplifies" else min(finite)) if finite else math.nan
        compounded = group[-1].values.get("compounded", math.nan)
        # weights that start far below the default init's spread (the signal may ride on the biases)
        wscales = [w for w in (e.values.get("weight_scale", math.nan) for e in group) if w == w]
        wscale = min(wscales) if wscales else math.nan
        # several layers each a little out of scale add up: the severity is the worse of the single gain and
        # the compounded scale, each against its own threshold
        if verb == "amplifies":
            sev = max(past_ratio(worst, ctx.th.layer_gain), past_ratio(compounded, ctx.th.layer_gain ** 2))
        else:
            sev = max(below_ratio(worst, 1 / ctx.th.layer_gain), below_ratio(compounded, ctx.th.layer_gain ** -2),
                      below_ratio(wscale, 1 / ctx.th.layer_gain))
        # named after the layer that makes more than half of the compounded scale (in decades), if one does;
        # else the fault is shared by all of them
        logs = [max(_decades(e.values.get("gain", 1.0)), _decades(e.values.get("weight_scale", 1.0))
                    if _off(ctx, e.values.get("weight_scale", 1.0)) else 0.0) for e in group]
        total = sum(logs)
        named = [e for e, lg in zip(group, logs) if total > 0 and lg > total / 2] or group
        layer = named[0].layer if len(named) == 1 else ""
        # outputs that sit at an offset larger than their spread, in every layer named: the biases, not the
        # weights, make the scale
        biased = verb == "amplifies" and all(e.values.get("offset", 0.0) > 1.0 for e in named)
        out.append(Candidate(Cause.BAD_INITIALIZATION, layer, group[0].step, verb, group, severity=sev,
                             persistence=max(persistence(e, ctx) for e in group), needs_harm=True, lasting=True,
                             loss_kinds=losses.SLOWED,
                             facts={"gain": worst, "compounded": compounded, "biased": biased, "weight_scale": wscale,
                                    "after_norm": group[-1].values.get("after_norm", 0.0) > 0,
                                    "biased_layers": [e.layer for e in named] if biased else [],
                                    "layers": [e.layer for e in group]}))
    if not any(c.kind in ("amplifies", "recurrent") for c in out):  # (a layer's scale named: the outputs follow)
        out += _outputs(ctx)
    # several bounded layers saturated from the first step, each behind a weight layer: one root, the initial
    # weight scale, rather than one saturation per layer
    sat = [e for e in ctx.all(Signal.ACTIVATION, ActState.SATURATED)
           if ctx.from_start(e) and _feeding_weights(ctx, e.layer) is not None]
    if len({e.layer for e in sat}) >= 2:
        sat.sort(key=lambda e: ctx.rank.get(e.layer, 0))
        weights = list(dict.fromkeys(w for w in (_feeding_weights(ctx, e.layer) for e in sat) if w is not None))
        fracs = [e.values.get("saturated_fraction", 1.0) for e in sat]
        out.append(Candidate(Cause.BAD_INITIALIZATION, weights[0] if len(weights) == 1 else "", sat[0].step,
                             "saturating", sat,
                             severity=max(past_fraction(f, ctx.th.saturated_fraction) for f in fracs),
                             persistence=max(persistence(e, ctx) for e in sat), needs_harm=True, lasting=True,
                             loss_kinds=losses.SLOWED,
                             facts={"layers": weights, "saturated": [e.layer for e in sat], "fractions": fracs}))
    return out
