"""Inference rules: abductive steps from events and links to causal hypotheses.

Each rule looks for the signature of one root cause among the events not yet explained by a
stronger rule (``Context.free``), and returns hypotheses whose evidence then counts as explained.
The rules run in ``RULES`` order: data before the model, activations that block the gradient
before the gradient they block, the initial weight scale before what it leads to, updates before
the NaN they produce, and a flat loss only when nothing more specific was found.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from .causes import Cause
from .events import SemanticEvent
from .formatting import number as _fmt
from .hypothesis import CausalHypothesis
from .layers import Kind, LayerInfo
from .patterns import Link, LinkKind
from .states import ActState, FiniteState, GainState, GradState, InputState, LossState, Signal, UpdateState
from .thresholds import Thresholds
from .trace import NonFiniteOrigin

if TYPE_CHECKING:
    from .rankevents import RankEvidence


@dataclass
class Context:
    """What the rules read: events, links, the layer table and the NaN origin, plus what is explained."""

    events: list[SemanticEvent]
    links: list[Link]
    layers: dict[str, LayerInfo]
    rank: dict[str, int]
    first_step: int
    nonfinite: NonFiniteOrigin | None
    lr: float
    th: Thresholds
    has_loss: bool
    # sampled steps, and per weight layer its gradient attenuation toward the input at each
    attenuation: tuple = (np.zeros(0, dtype=np.int64), {})
    lr_series: tuple = (np.zeros(0, dtype=np.int64), np.zeros(0))  # sampled steps and the learning rate at each
    loss_reach: tuple = (math.nan, math.nan, math.nan)  # first loss, output RMS, sqrt(loss) / RMS
    loss_fall: object = None  # analysis.LossFall: how far below zero a positive loss went, or None
    # the latest losses below the first ones on the loss's scale, and the z of their downward trend
    loss_trend: tuple = (math.nan, math.nan)
    loss_progress: float = math.nan  # how far the latest losses are below the first ones, on the loss's scale
    # optimizer steps skipped for NaN/Inf gradients (a loss scaler's), with the scale then, and where the
    # NaN/Inf of the latest run of them came from
    skipped: tuple = (np.zeros(0, dtype=np.int64), np.zeros(0))
    overflow: NonFiniteOrigin | None = None
    origin_claimed: bool = False  # the NaN/Inf origin is explained by an earlier rule
    ranks: RankEvidence | None = None  # the other ranks of a multi-process run, else None
    claimed: set[int] = field(default_factory=set)
    found: list[CausalHypothesis] = field(default_factory=list)

    @property
    def sites(self) -> list[LayerInfo]:
        """The functional operations among the layers, longest names first (so none is a prefix of another)."""
        return sorted((l for l in self.layers.values() if l.is_site), key=lambda l: -len(l.name))

    def free(self, signal: Signal, *states) -> list[SemanticEvent]:
        return [e for e in self.events if id(e) not in self.claimed and e.signal == signal
                and (not states or e.after in states)]

    def all(self, signal: Signal, *states) -> list[SemanticEvent]:
        return [e for e in self.events if e.signal == signal and (not states or e.after in states)]

    def linked(self, kind: LinkKind, cause: SemanticEvent) -> list[SemanticEvent]:
        return [e for l in self.links if l.kind == kind and l.cause is cause for e in l.effects]

    def previous(self, name: str) -> str | None:
        """The layer that ran just before ``name`` in the forward pass."""
        pos = self.rank.get(name)
        if pos is None:
            return None
        before = [n for n, r in self.rank.items() if r < pos]
        return max(before, key=self.rank.get) if before else None

    def previous_weight_layer(self, name: str) -> str | None:
        pos = self.rank.get(name, -1)
        cands = [n for n, r in self.rank.items() if r < pos and self.layers[n].n_params > 0]
        return max(cands, key=self.rank.get) if cands else None

    def from_start(self, ev: SemanticEvent) -> bool:
        return ev.step <= self.first_step

    def loss_state(self, *states) -> list[SemanticEvent]:
        return self.all(Signal.LOSS, *states)

    def lr_text(self) -> tuple[str, str]:
        """The current learning rate and a tenth of it, as text (``"lr"`` when unknown)."""
        if self.lr == self.lr and self.lr > 0:
            return _fmt(self.lr), _fmt(self.lr / 10)
        return "its current value", "a tenth of it"


def _layer_list(names: list[str], limit: int = 4) -> str:
    unique = list(dict.fromkeys(names))
    shown = ", ".join(f"`{n}`" for n in unique[:limit])
    return shown + (f" and {len(unique) - limit} more" if len(unique) > limit else "")


def _names(events: list[SemanticEvent], limit: int = 4) -> str:
    return _layer_list([e.layer for e in events], limit)


def _symptoms_text(events: list[SemanticEvent], limit: int = 4) -> list[str]:
    """One line per kind of symptom (signal and state), naming the layers and the first step."""
    groups: dict[tuple, list[SemanticEvent]] = {}
    for e in events:
        groups.setdefault((e.signal, e.after), []).append(e)
    lines = []
    for (signal, state), evs in list(groups.items())[:limit]:
        if signal == Signal.LOSS:
            lines.append(_loss_text(evs[0]))
        elif signal == Signal.FINITE:
            lines.append(f"NaN/Inf in {_names(evs)} from step {min(e.step for e in evs)}")
        else:
            lines.append(f"{signal} {state} in {_names(evs)} from step {min(e.step for e in evs)}")
    return lines


# A rise of the learning rate explains a failure that starts within this many steps of it.
LR_JUMP_WINDOW = 16


def _lr_jump(ctx: Context, upto: int) -> tuple[float, float, int] | None:
    """A rise of the learning rate (x2 or more between sampled steps) shortly before ``upto``, from a
    rate that held steady before it (a warm-up ramp is not a jump): (from, to, step)."""
    steps, lr = ctx.lr_series
    for i in range(len(steps) - 1, 1, -1):
        if steps[i] > upto:
            continue
        if steps[i] < upto - LR_JUMP_WINDOW:
            break
        before, prior = lr[i - 1], lr[i - 2]
        if before > 0 and lr[i] >= 2 * before and abs(prior - before) <= 0.1 * before:
            return float(before), float(lr[i]), int(steps[i])
    return None


def _hyp(ctx: Context, cause: Cause, layer: str, step: int, confidence: float, chain: list[str],
         evidence: list[SemanticEvent], suggestion: str) -> CausalHypothesis:
    if cause == Cause.LEARNING_RATE_TOO_HIGH:
        jump = _lr_jump(ctx, step)
        if jump is not None:  # the failure starts with a new learning rate: say so, from there
            before, after, at = jump
            chain = [f"the learning rate rises from {_fmt(before)} to {_fmt(after)} at step {at}"] + chain
            suggestion += f"; it was {_fmt(before)} before step {at}: check the schedule that raised it"
            step = at
    evidence = sorted({id(e): e for e in evidence}.values(), key=lambda e: e.step)
    confidence = round(min(max(confidence, 0.0), 0.99), 3)
    chain, suggestion = [_name_sites(ctx, c) for c in chain], _name_sites(ctx, suggestion)
    info = ctx.layers.get(layer)
    if info is not None and info.is_site:  # a functional operation: named by its module, the op in the chain
        layer = info.owner
    return CausalHypothesis(cause=cause, layer=layer, step=int(step), confidence=confidence,
                            chain=chain, evidence=evidence, suggestion=suggestion)


def _name_sites(ctx: Context, text: str) -> str:
    """A functional operation's row named as the user wrote it: "`conv2:relu`" -> "F.relu after `conv2`"."""
    if "`" not in text:
        return text
    for info in ctx.sites:
        text = text.replace(f"`{info.name}`", info.where())
    return text


def _loss_symptoms(ctx: Context, after: int = -1) -> list[SemanticEvent]:
    return [e for e in ctx.loss_state(LossState.PLATEAU, LossState.DIVERGING, LossState.OSCILLATING,
                                      LossState.NONFINITE) if e.step >= after or e.end is None]


def _loss_text(ev: SemanticEvent) -> str:
    v = ev.values
    if ev.after == LossState.PLATEAU:
        start, best = _fmt(v.get("start", math.nan)), _fmt(v.get("best", math.nan))
        return f"the loss stays flat ({start} at the start, best {best})"
    if ev.after == LossState.DIVERGING:
        best, then = _fmt(v.get("best", math.nan)), _fmt(v.get("loss", math.nan))
        return f"the loss diverges from step {ev.step} (best {best}, then {then})"
    if ev.after == LossState.OSCILLATING:
        return f"the loss oscillates from step {ev.step} without progress"
    return f"the loss becomes NaN/Inf at step {ev.step}"


# -- data ----------------------------------------------------------------------------------------------

def rule_data(ctx: Context) -> list[CausalHypothesis]:
    out = []
    nf = ctx.nonfinite
    bad_input = ctx.free(Signal.INPUT, InputState.NONFINITE)
    finite_ev = ctx.free(Signal.FINITE, FiniteState.NONFINITE)
    loss_nf = ctx.loss_state(LossState.NONFINITE)
    if (nf is not None and nf.phase == "input") or bad_input:
        step = nf.step if nf is not None and nf.phase == "input" else bad_input[0].step
        chain = [f"the input batch at step {step} contains NaN/Inf",
                 "every layer downstream computes NaN/Inf (non_finite)", "the loss and all gradients become NaN"]
        out.append(_hyp(ctx, Cause.DATA, "input", step, 0.95, chain, bad_input + finite_ev + loss_nf,
                        f"the batch at step {step} carries NaN/Inf in the input: find it in the data pipeline "
                        "(assert torch.isfinite(x).all()), then drop or impute those samples"))
    elif nf is not None and nf.phase == "loss":
        chain = [f"the model output is finite at step {nf.step}",
                 "the loss (or its gradient) is NaN/Inf: NaN in the targets, or a loss undefined for them",
                 "all gradients become NaN (non_finite)"]
        out.append(_hyp(ctx, Cause.DATA, "input", nf.step, 0.9, chain, finite_ev + loss_nf,
                        f"check the targets of the batch at step {nf.step} (assert torch.isfinite(y).all()) and that "
                        "they are in the loss's domain (class indices in range, probabilities in [0, 1]); "
                        "mask or drop samples with NaN targets"))
    if out:
        return out
    unscaled = ctx.free(Signal.INPUT, InputState.UNSCALED)
    if not unscaled:
        return _targets_out_of_reach(ctx) or _loss_unbounded_below(ctx)
    if unscaled:
        ev = unscaled[0]
        first = sorted(ctx.rank, key=ctx.rank.get)[:3]
        symptoms = [e for e in ctx.events if e.bad and id(e) not in ctx.claimed and e.layer in first
                    and e.signal in (Signal.ACTIVATION, Signal.GRADIENT, Signal.FINITE)]
        # an input out of scale gives the first layer gradients, and so updates, out of scale: what those
        # updates then break (units pushed dead, a diverging loss) follows from the input
        updates = [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step <= ev.step + ctx.th.persist]
        if updates:
            later = [e for e in ctx.events if e.bad and id(e) not in ctx.claimed and e.step >= updates[0].step
                     and e.signal in (Signal.ACTIVATION, Signal.GRADIENT, Signal.FINITE, Signal.UPDATE)]
            seen = {id(e) for e in symptoms}
            symptoms += [e for e in updates + later if id(e) not in seen and not seen.add(id(e))]
        symptoms += _loss_symptoms(ctx)
        v = ev.values
        m, s, a = v.get("input_mean", math.nan), v.get("input_std", math.nan), v.get("input_absmax", math.nan)
        chain = [f"the input is not normalised: mean {_fmt(m)}, std {_fmt(s)}, values up to {_fmt(a)}"]
        chain += [f"updates of up to {_fmt(e.values.get('update_peak', math.nan))} x the weights per step from step "
                  f"{e.step}: the first layer's gradient scales with its input" for e in updates[:1]]
        chain += _symptoms_text([e for e in symptoms if e.signal != Signal.UPDATE])
        fix = (f"normalise the input: x = (x - {_fmt(m)}) / {_fmt(s)}" +
               ("; for 0-255 images, divide by 255 first, then subtract the per-channel mean and divide by the std"
                if a == a and 200 <= a <= 256 else ""))
        conf = (0.85 + 0.05 * bool(updates)) if symptoms else 0.35
        out.append(_hyp(ctx, Cause.DATA, "input", ev.step, conf, chain, [ev] + symptoms, fix))
    return out


def _targets_out_of_reach(ctx: Context) -> list[CausalHypothesis]:
    """A first loss whose square root is beyond the input-scale threshold and hundreds of times the
    outputs' RMS: a squared error against targets on a scale the outputs do not have (the targets
    themselves are not seen). A classification loss starts near log(classes), whatever the outputs."""
    loss0, rms, reach = ctx.loss_reach
    if not (reach == reach and reach > ctx.th.input_scale ** 2 and math.sqrt(abs(loss0)) > ctx.th.input_scale):
        return []
    first = ctx.first_step
    updates = [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step <= first + ctx.th.persist]
    later = [e for e in ctx.events if e.bad and id(e) not in ctx.claimed and updates and e.step >= updates[0].step
             and e.signal in (Signal.ACTIVATION, Signal.GRADIENT, Signal.FINITE, Signal.UPDATE)]
    symptoms = list({id(e): e for e in updates + later}.values()) + _loss_symptoms(ctx)
    target = math.sqrt(abs(loss0))
    chain = [f"the loss starts at {_fmt(loss0)}, while the outputs' RMS is {_fmt(rms)}: "
             f"the targets are ~{_fmt(target)}, "
             f"{_fmt(reach)}x out of the outputs' reach"]
    chain += [f"updates of up to {_fmt(e.values.get('update_peak', math.nan))} x the weights per step from step "
              f"{e.step}: the gradient scales with the error" for e in updates[:1]]
    chain += _symptoms_text([e for e in symptoms if e.signal != Signal.UPDATE])
    fix = (f"standardise the targets (y = (y - y.mean()) / y.std(), computed on the training set; invert it on "
           f"the predictions), or scale the loss down by ~{_fmt(target ** 2)}")
    # alone (a loss summed over many values can start high too), a weak signal; with updates out of
    # scale or a loss that fails, the failure
    conf = (0.7 + 0.1 * bool(updates)) if symptoms else 0.35
    return [_hyp(ctx, Cause.DATA, "input", first, conf, chain, symptoms, fix)]


# How far below zero, in units of its own early scale, a loss must go before its
# sign is evidence: a Gaussian NLL goes a few units below zero as its variance shrinks; a cross-entropy
# against targets outside [0, 1] falls without bound.
LOSS_BELOW_ZERO = 10.0


def _loss_unbounded_below(ctx: Context) -> list[CausalHypothesis]:
    """A loss that falls an order of magnitude of its own scale below zero, still
    falling as fast: cross-entropies and squared errors cannot be negative; against targets outside
    the loss's range (0/255 masks in binary_cross_entropy) they fall without bound as the logits grow."""
    fall = ctx.loss_fall
    if fall is None or fall.depth < LOSS_BELOW_ZERO:
        return []
    chain = [f"the loss starts at {_fmt(fall.start)} and is below zero from step {fall.below_from}, down to "
             f"{_fmt(fall.lowest)}" + (", still falling as fast" if fall.still_falling else ""),
             "a cross-entropy, a binary cross-entropy or a squared error cannot be negative: targets outside the "
             "loss's range make it unbounded below, and the model learns to push its outputs without limit"]
    fix = ("check the targets' range: binary_cross_entropy(_with_logits) needs targets in [0, 1] (divide 0/255 masks "
           "by 255), cross_entropy class indices in [0, classes) or probabilities summing to 1; if the loss is "
           "meant to go negative (a Gaussian NLL), check that its variance is bounded below")
    # falling as fast as ever, it is unbounded; slowing down, it may be a likelihood that goes negative
    conf = 0.6 if fall.still_falling else 0.4
    return [_hyp(ctx, Cause.DATA, "input", fall.below_from, conf, chain, [], fix)]


# -- activations that block the gradient ----------------------------------------------------------------

def _update_before(ctx: Context, step: int) -> list[SemanticEvent]:
    return [e for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step <= step]


def _downstream_of_dead(ctx: Context, ev: SemanticEvent) -> list[SemanticEvent]:
    """Events after a fully dead layer (in forward order, from its onset on): with a constant signal
    reaching them, they are its consequences, not roots of their own."""
    pos = ctx.rank.get(ev.layer, 1 << 30)
    return [e for e in ctx.events if e.bad and id(e) not in ctx.claimed and e is not ev and e.step >= ev.step
            and ctx.rank.get(e.layer, -1) > pos and e.signal in (Signal.ACTIVATION, Signal.GAIN)]


def _amplified_at_start(ctx: Context) -> list[SemanticEvent]:
    return [e for e in ctx.free(Signal.GAIN, GainState.AMPLIFIES) if ctx.from_start(e)]


def rule_dead(ctx: Context) -> list[CausalHypothesis]:
    out = []
    for ev in sorted(ctx.free(Signal.ACTIVATION, ActState.DEAD), key=lambda e: (e.step, ctx.rank.get(e.layer, 0))):
        if id(ev) in ctx.claimed:
            continue
        frac = ev.values.get("dead_fraction", 1.0)
        frac = 1.0 if frac != frac else frac
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        downstream = _downstream_of_dead(ctx, ev) if frac >= 0.99 else []
        prev = ctx.previous(ev.layer)
        lr, lr10 = ctx.lr_text()
        chain = [f"{frac:.0%} of the units of `{ev.layer}` output 0 for every input from step {ev.step}"]
        large = _update_before(ctx, ev.step)
        if large and ctx.from_start(large[0]) and _amplified_at_start(ctx):
            continue  # the updates are large because the initial weights are: rule_initialization's case
        loss = _loss_symptoms(ctx, ev.step)
        # units that die during training while the gradient goes around them to the layers before (a residual
        # path, as in a Transformer's feed-forward block: only their own feeding layer loses its gradient) and the
        # loss keeps learning are lost capacity: a weak signal
        feeder = ctx.previous_weight_layer(ev.layer)
        pos = ctx.rank.get(ev.layer, -1)
        earlier = [n for n, r in ctx.rank.items() if r < pos and n != feeder and ctx.layers[n].n_trainable > 0]
        around = bool(earlier) and not [b for b in blocked if b.layer != feeder]
        failing = [e for e in loss if e.end is None or e.after != LossState.PLATEAU]
        cap = 0.45 if ctx.has_loss and not ctx.from_start(ev) and around and not (failing or downstream) else 1.0
        if not ctx.from_start(ev) and large:
            u = large[0].values.get("update_peak", math.nan)
            chain = [f"updates of up to {_fmt(u)} x the weights per step (lr {lr}) from step {large[0].step}"] + chain
            if blocked:
                chain.append(f"no gradient flows back through `{ev.layer}`: it vanishes in {_names(blocked)}")
            chain.append("the layers before it stop learning")
            chain += [_loss_text(e) for e in loss[:1]]
            out.append(_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", large[0].step, min(0.8 + 0.1 * bool(blocked), cap),
                            chain, [large[0], ev] + blocked,
                            f"lower the learning rate from {lr} to ~{lr10}: a too-large update pushed the units of "
                            f"`{ev.layer}` into the zero region; optionally use nn.LeakyReLU(0.01) there"))
            continue
        if ctx.from_start(ev) and prev:
            chain.append(f"present from step {ev.step}: `{prev}` feeds `{ev.layer}` only non-positive values "
                         "(its bias or weight scale)")
        if blocked:
            chain.append(f"no gradient flows back through `{ev.layer}`: it vanishes in {_names(blocked)}")
        if downstream:
            chain.append(f"the layers after it receive a constant signal: {_symptoms_text(downstream, 1)[0]}")
        chain += [_loss_text(e) for e in loss[:1]]
        # just above the threshold: a weak signal; all units dead: 0.9; more when the gradient or loss shows it
        th = min(ctx.th.dead_fraction, 0.999)
        conf = min(0.45 + 0.45 * max(frac - th, 0.0) / (1 - th) + 0.05 * bool(blocked or loss), cap)
        fix = (f"re-initialise `{prev}` (bias to 0, nn.init.kaiming_normal_ on its weight) or replace `{ev.layer}` by "
               f"nn.LeakyReLU(0.01)" if prev else f"replace `{ev.layer}` by nn.LeakyReLU(0.01)")
        if not ctx.from_start(ev):
            fix += f"; if the units died during training, lower the learning rate from {lr} to ~{lr10}"
        hyp = _hyp(ctx, Cause.DEAD_UNITS, ev.layer, ev.step, conf, chain, [ev] + blocked + downstream + loss, fix)
        if downstream:
            ctx.claimed.update(id(e) for e in downstream)
        out.append(hyp)
    return out


def _saturated_by_updates(ctx: Context, events: list[SemanticEvent]) -> list[CausalHypothesis]:
    """Units that saturate only after updates too large for the weights: the learning rate grew the
    weights (the gains that follow are the updates' doing, not the initial scale)."""
    large = _update_before(ctx, max(e.step for e in events))
    lr, lr10 = ctx.lr_text()
    names = [e.layer for e in events]
    gains = [e for e in ctx.free(Signal.GAIN, GainState.AMPLIFIES) if e.step > ctx.first_step]
    loss = _loss_symptoms(ctx)
    frac = max(e.values.get("saturated_fraction", 1.0) for e in events)
    chain = [f"updates of up to {_fmt(large[0].values.get('update_peak', math.nan))} x the weights per step "
             f"(lr {lr}) from step {large[0].step}",
             f"the weights grow until {frac:.0%} of the outputs of {_layer_list(names)} are pinned at their bounds "
             f"from step {min(e.step for e in events)}"]
    chain += [_loss_text(e) for e in loss[:1]]
    return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", large[0].step, 0.8 + 0.05 * bool(loss), chain,
                 large + events + gains + loss,
                 f"lower the learning rate from {lr} to ~{lr10} (or add a warm-up) and clip gradients at max_norm=1.0")]


def _saturated_by_init(ctx: Context, events: list[SemanticEvent]) -> list[CausalHypothesis]:
    """Several bounded layers saturated from the first step, each behind a weight layer: one root, the
    initial weight scale, rather than one saturation per layer."""
    events = sorted(events, key=lambda e: ctx.rank.get(e.layer, 0))
    sat = [e.layer for e in events]
    weights = list(dict.fromkeys(ctx.previous_weight_layer(n) for n in sat))
    gains = [e for e in ctx.all(Signal.GAIN, GainState.AMPLIFIES) if e.layer in weights and ctx.from_start(e)]
    blocked = [b for e in events for b in ctx.linked(LinkKind.BLOCKS, e)]
    loss = [e for e in _loss_symptoms(ctx) if e.after in (LossState.PLATEAU, LossState.OSCILLATING)]
    kinds = sorted({ctx.layers[n].type_name for n in sat})
    fracs = [e.values.get("saturated_fraction", math.nan) for e in events]
    first = min(e.step for e in events)
    chain = [f"at step {first}, {_layer_list(weights)} start with weights too large for the "
             f"{'/'.join(kinds)} after them"
             + (f" (up to {_fmt(max(e.values.get('gain', 0.0) for e in gains))}x the scale (RMS) of their input)"
                if gains else ""),
             f"{min(fracs):.0%}-{max(fracs):.0%} of the outputs of {_layer_list(sat)} are pinned at their bounds "
             f"from step {first}"]
    if blocked:
        chain.append(f"their derivative is ~0, so the gradient vanishes in {_names(blocked)}")
    chain += [_loss_text(e) for e in loss[:1]]
    conf = min(0.7 + 0.05 * len(sat) + 0.05 * bool(blocked or loss), 0.9)
    gain = "5/3, nn.init.calculate_gain('tanh')" if "Tanh" in kinds else "1"
    fix = (f"re-initialise {_layer_list(weights)} with nn.init.xavier_uniform_ (gain {gain}) instead of their current "
           f"scale, or add nn.LayerNorm before each {'/'.join(kinds)}")
    return [_hyp(ctx, Cause.BAD_INITIALIZATION, weights[0] if len(weights) == 1 else "", first, conf, chain,
                 events + gains + blocked + loss, fix)]


def rule_saturated(ctx: Context) -> list[CausalHypothesis]:
    out = []
    free = ctx.free(Signal.ACTIVATION, ActState.SATURATED)
    by_updates = [e for e in free if not ctx.from_start(e) and _update_before(ctx, e.step)]
    if by_updates:
        out += _saturated_by_updates(ctx, by_updates)
    explained = {id(e) for e in by_updates}
    at_start = [e for e in free if id(e) not in explained and ctx.from_start(e) and ctx.previous_weight_layer(e.layer)]
    if len({e.layer for e in at_start}) >= 2:
        out += _saturated_by_init(ctx, at_start)
        explained.update(id(e) for e in at_start)
    for ev in free:
        if id(ev) in explained:
            continue
        frac = ev.values.get("saturated_fraction", 1.0)
        blocked = ctx.linked(LinkKind.BLOCKS, ev)
        loss = [e for e in _loss_symptoms(ctx, ev.step) if e.after in (LossState.PLATEAU, LossState.OSCILLATING)]
        prev = ctx.previous_weight_layer(ev.layer)
        gains = [e for e in ctx.all(Signal.GAIN, GainState.AMPLIFIES) if e.layer == prev and e.step <= ev.step]
        kind = ctx.layers[ev.layer].type_name
        chain = [f"{frac:.0%} of the outputs of `{ev.layer}` ({kind}) are pinned at its bounds from step {ev.step}"]
        if gains:
            chain.insert(0, f"`{prev}` amplifies its input {_fmt(gains[0].values.get('gain', math.nan))}x "
                            "(its weight scale)")
        elif ctx.from_start(ev) and prev:
            chain.append(f"present from step {ev.step}: the pre-activations from `{prev}` are too large")
        if blocked:
            chain.append(f"its derivative is ~0, so the gradient vanishes in {_names(blocked)}")
        chain += [_loss_text(e) for e in loss[:1]]
        consequence = bool(blocked or loss)
        # pinned outputs pass (almost) no gradient: a nearly fully saturated layer stops learning by itself
        th = min(ctx.th.saturated_fraction, 0.999)
        conf = (0.6 + 0.3 * frac) if consequence else (0.35 + 0.55 * max(frac - th, 0.0) / (1 - th))
        fix = (f"scale down the pre-activations of `{ev.layer}`: re-initialise `{prev}` with nn.init.xavier_uniform_ "
               f"(gain 1), or add nn.LayerNorm/BatchNorm before `{ev.layer}`; or use ReLU/GELU instead of {kind}"
               if prev else f"normalise what enters `{ev.layer}` or use ReLU/GELU instead of {kind}")
        out.append(_hyp(ctx, Cause.SATURATED_ACTIVATIONS, ev.layer, ev.step, conf, chain, [ev] + blocked + gains + loss,
                        fix))
    return out


# -- initial weight scale -------------------------------------------------------------------------------

def rule_initialization(ctx: Context) -> list[CausalHypothesis]:
    gains = [e for e in ctx.free(Signal.GAIN) if e.bad and ctx.from_start(e)]
    if not gains:
        return []
    symptoms = [e for e in ctx.events if e.bad and id(e) not in ctx.claimed and e.signal in
                (Signal.GRADIENT, Signal.FINITE, Signal.ACTIVATION)]
    symptoms += _loss_symptoms(ctx)
    out = []
    recurrent = [e for e in gains if _recurrent_scale_off(ctx, e)]
    if recurrent:
        out.append(_recurrent_init(ctx, recurrent, symptoms))
        gains = [e for e in gains if e not in recurrent]
    if not symptoms or not gains:
        return out
    amplify = [e for e in gains if e.after == GainState.AMPLIFIES]
    shrink = [e for e in gains if e.after == GainState.SHRINKS]
    group = amplify if len(amplify) >= len(shrink) else shrink
    group.sort(key=lambda e: ctx.rank.get(e.layer, 0))
    layer = group[0].layer if len(group) == 1 else ""
    verb = "amplifies" if group is amplify else "shrinks"
    gs = [e.values.get("gain", math.nan) for e in group]
    finite = [x for x in gs if x == x]
    g = (max(finite) if verb == "amplifies" else min(finite)) if finite else math.nan  # the worst of them
    # a layer whose outputs sit at an offset larger than their spread is out of scale by its bias
    biased = bool(layer) and verb == "amplifies" and group[0].values.get("offset", 0.0) > 1.0
    if layer:
        what = "its bias: its outputs sit at an offset larger than their spread" if biased else "its weight scale"
        chain = [f"at step {group[0].step}, `{layer}` {verb} its input's scale (RMS) {_fmt(g)}x ({what})"]
    else:
        plural = "shrink" if verb == "shrinks" else "amplify"
        chain = [f"at step {group[0].step}, {len(group)} layers ({_names(group)}) each {plural}"
                 f" the signal {_fmt(min(finite, default=math.nan))}-{_fmt(max(finite, default=math.nan))}x "
                 "(their weight scale)"]
    deepest = group[-1].values.get("compounded", math.nan)
    if deepest == deepest and (deepest > ctx.th.layer_gain or deepest < 1 / ctx.th.layer_gain):
        since = ("the last normalisation layer before it" if group[-1].values.get("after_norm", 0.0) > 0
                 else "the input")
        chain[0] += f"; compounded, the scale reaching `{group[-1].layer}` is {_fmt(deepest)}x that of {since}"
    updates = []
    if verb == "amplifies":  # outputs out of scale give gradients, and so updates, out of scale
        updates = [e for e in ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE) if ctx.from_start(e)]
        chain += [f"updates of up to {_fmt(e.values.get('update_peak', math.nan))} x the weights per step "
                  f"from step {e.step}: the gradients are as out of scale as the outputs" for e in updates[:1]]
        symptoms += updates
    chain += _symptoms_text([e for e in symptoms if e.signal != Signal.UPDATE])
    if ctx.nonfinite is not None:
        chain.append(f"non_finite: NaN/Inf in `{ctx.nonfinite.layer or 'the model'}` at step {ctx.nonfinite.step}")
    conf = min(0.55 + 0.1 * len(symptoms) + 0.1 * (ctx.nonfinite is not None), 0.9)
    target = f"`{layer}` starts" if layer else "the weight layers start"
    if biased:
        fix = (f"`{layer}` starts with a bias far off zero: reset it (nn.init.zeros_(...bias)) and check what set "
               "it; clip gradients at max_norm=1.0 meanwhile")
    elif verb == "amplifies":
        fix = (f"{target} with weights ~{_fmt(g)}x too large: re-initialise with nn.init.xavier_uniform_ "
               f"(or kaiming_uniform_ for ReLU), or scale them down by {_fmt(g)}; "
               "clip gradients at max_norm=1.0 meanwhile")
    else:
        fix = (f"{target} with weights too small (each scales the signal by ~{_fmt(g)}): use a "
               "variance-preserving init, nn.init.xavier_normal_ for tanh/sigmoid or nn.init.kaiming_normal_ for ReLU")
    return out + [_hyp(ctx, Cause.BAD_INITIALIZATION, layer, group[0].step, conf, chain, group + symptoms, fix)]


def _recurrent_scale_off(ctx: Context, e: SemanticEvent) -> bool:
    r = e.values.get("recurrent_scale", math.nan)
    return r == r and (r > ctx.th.layer_gain or r < 1 / ctx.th.layer_gain)


def _recurrent_init(ctx: Context, events: list[SemanticEvent], symptoms: list[SemanticEvent]) -> CausalHypothesis:
    """Hidden-to-hidden weights far from their default scale: a fault by itself, since they act once per
    time step (what they do inside the cell does not show at its output)."""
    events = sorted(events, key=lambda e: ctx.rank.get(e.layer, 0))
    ev = events[0]
    r = ev.values.get("recurrent_scale", math.nan)
    chain = [f"at step {ev.step}, `{ev.layer}` starts with recurrent (hidden-to-hidden) weights {_fmt(r)}x the "
             "spread of the default init",
             "applied once per time step, they grow the hidden state until its units saturate or overflow"
             if r > 1 else
             "applied once per time step, they erase the hidden state: only the last steps reach the output, "
             "and the gradient through time vanishes"]
    chain += _symptoms_text(symptoms)
    # alone, a weak signal: the scale is measured when watching starts, and a trained model's may differ
    conf = min(0.55 + 0.1 * len(symptoms), 0.9) if symptoms else 0.45
    fix = (f"re-initialise the recurrent weights of `{ev.layer}` (weight_hh_l*) with nn.init.orthogonal_, or keep "
           "PyTorch's default init (uniform in +-1/sqrt(hidden_size))")
    return _hyp(ctx, Cause.BAD_INITIALIZATION, ev.layer if len(events) == 1 else "", ev.step, conf, chain,
                events + symptoms, fix)


# -- NaN/Inf in the model ---------------------------------------------------------------------------------

_OVERFLOW_KINDS = frozenset({Kind.LINEAR, Kind.CONV, Kind.RECURRENT, Kind.ATTENTION})


def rule_nonfinite(ctx: Context) -> list[CausalHypothesis]:
    nf = None if ctx.origin_claimed else ctx.nonfinite
    finite_ev = ctx.free(Signal.FINITE, FiniteState.NONFINITE)
    loss_nf = ctx.loss_state(LossState.NONFINITE)
    if (nf is None and not finite_ev) or (nf is not None and nf.phase in ("input", "loss")):
        return []  # NaN/Inf from the data or the loss: rule_data's case
    step = nf.step if nf is not None else finite_ev[0].step
    layer = nf.layer if nf is not None else finite_ev[0].layer
    phase = nf.phase if nf is not None else "forward"
    lr, lr10 = ctx.lr_text()
    evidence = finite_ev + loss_nf
    large = [e for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step < step]
    diverging = [e for e in ctx.loss_state(LossState.DIVERGING, LossState.OSCILLATING) if e.step < step]
    exploding = [e for e in ctx.all(Signal.GRADIENT, GradState.EXPLODING) if e.step < step]
    blown = [e for e in ctx.all(Signal.ACTIVATION, ActState.ANOMALOUS) if e.step < step]
    where = f"`{layer}`" if layer else "the model"
    # a weight layer cannot leave a domain: NaN/Inf from its finite inputs and weights is an overflow,
    # values grown too large; after the start of training, the updates grew them
    info = ctx.layers.get(layer)
    overflow = (phase == "forward" and info is not None and info.kind in _OVERFLOW_KINDS
                and step > ctx.first_step and not exploding)
    if phase == "forward" and not overflow:
        # an operation that leaves its domain (a division by 0, log of 0) in a module that is no weight
        # layer: large updates that had stopped long before the NaN did not cause it, and large updates
        # alone, with nothing growing out of scale before it (no diverging loss, no blown activation or
        # gradient), only moved a value to the edge of that domain
        large = [e for e in large if e.end is None or e.end >= step - ctx.th.persist]
        if large and not diverging and not blown and not exploding:
            # ... unless the updates replace the weights outright: then they are what left the domain
            large = [e for e in large if (e.values.get("update_max", 0.0) or 0.0) >= 1.0]
    if phase == "weights" or large or (diverging and not exploding) or overflow:
        chain = []
        if large:
            chain.append(f"updates of up to {_fmt(large[0].values.get('update_peak', math.nan))} x the weights "
                         f"per step (lr {lr}) from step {large[0].step}")
        chain += [_loss_text(e) for e in diverging[:1]]
        if blown:
            chain.append(f"activations blow up in {_names(blown)}")
        if overflow and not large and not diverging:
            chain.append(f"weights and activations grow during training until `{layer}` ({info.type_name}) overflows")
        chain.append(f"the parameters of {where} become NaN/Inf after the update before step {step}"
                     if phase == "weights" else
                     f"non_finite: NaN/Inf first produced in {where} ({phase}) at step {step}")
        conf = 0.9 if (phase == "weights" or large) else 0.7
        return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", large[0].step if large else step, conf, chain,
                     large + diverging + blown + exploding + evidence,
                     f"lower the learning rate from {lr} to ~{lr10} and clip gradients "
                     "(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0))")]
    if exploding:
        origin = [l.cause for l in ctx.links if l.kind == LinkKind.PROPAGATES and l.cause in exploding]
        src = (origin or exploding)[0]
        where_x = _amplifier(ctx, src.layer)
        chain = [f"the gradient explodes in `{src.layer}` from step {src.step} "
                 f"(x{_fmt(max(src.values.get('grad_growth', 0) or 0, src.values.get('attenuation', 0) or 0))})",
                 f"non_finite: NaN/Inf first produced in {where} ({phase}) at step {step}"]
        return [_hyp(ctx, Cause.EXPLODING_GRADIENTS, where_x, src.step, 0.85, chain, exploding + blown + evidence,
                     _explode_fix(ctx, src.layer))]
    if phase == "unknown":
        return [_hyp(ctx, Cause.NON_FINITE, "", step, 0.6, [f"NaN/Inf appears at step {step}; "
                                                             f"{nf.detail if nf else ''}".strip()], evidence,
                     "run the failing step under torch.autograd.detect_anomaly() to find the operation")]
    kind = f" ({ctx.layers[layer].type_name})" if layer in ctx.layers else ""
    if phase == "forward":
        op = nf.op if nf is not None else ""
        chain = [f"at step {step}, {nf.where()}{kind if nf.relation != 'after' else ''} is the first operation to "
                 "turn finite values into NaN/Inf" if op else
                 f"at step {step}, the forward pass of `{layer}`{kind} is the first to output NaN/Inf "
                 "from finite inputs and weights",
                 "every layer after it, the loss and all gradients become NaN"]
        fix = (f"guard {'the ' + op if op else 'the operation'} in `{layer}` that leaves its domain: add an eps to a "
               "denominator "
               "(x / (d + 1e-8)), clamp before sqrt/log (torch.sqrt(x.clamp_min(1e-12)), "
               "torch.log(x.clamp_min(1e-12))), "
               "or use a stable form (torch.logsumexp, F.softmax / F.log_softmax instead of exp/sum)")
        if info is not None and info.n_params > 0 and info.kind not in _OVERFLOW_KINDS:
            fix += ("; if it divides by a parameter of its own (a temperature, a scale), keep that off 0: leave it "
                    "out of weight decay, or learn its log (t = self.log_t.exp())")
    else:
        chain = [f"at step {step}, the backward pass of `{layer}`{kind} turns a finite gradient into NaN/Inf",
                 "the parameter gradients of every layer before it become NaN"]
        fix = (f"the derivative of an operation in `{layer}` is infinite at the values it sees (sqrt or pow at 0, "
               "log of 0, division by ~0): add an eps (torch.sqrt(x + 1e-12)) or clamp its input")
    return [_hyp(ctx, Cause.NON_FINITE, layer, step, 0.9, chain, evidence, fix)]


# -- gradients -------------------------------------------------------------------------------------------

def _explode_fix(ctx: Context, layer: str) -> str:
    lr, lr10 = ctx.lr_text()
    fix = "clip gradients with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)"
    info = ctx.layers.get(layer)
    if info is not None and info.kind == Kind.RECURRENT:
        fix += f" and initialise the recurrent weights of `{layer}` orthogonally with gain <= 1 (nn.init.orthogonal_)"
    return fix + f"; if it persists, lower the learning rate from {lr} to ~{lr10}"


def _amplifier(ctx: Context, origin: str) -> str:
    """Where a gradient amplified at weight layer ``origin`` was amplified: the weight layer itself, or a
    custom module between it and the next weight layer (whose backward multiplies what passes)."""
    pos = ctx.rank.get(origin)
    if pos is None:
        return origin
    after = sorted((n for n, r in ctx.rank.items() if r > pos), key=ctx.rank.get)
    for name in after:
        info = ctx.layers[name]
        if info.n_params > 0:
            break
        if info.kind == Kind.OTHER:
            return name
    return origin


def rule_exploding(ctx: Context) -> list[CausalHypothesis]:
    free = ctx.free(Signal.GRADIENT, GradState.EXPLODING)
    if not free:
        return []
    origin = next((l.cause for l in ctx.links if l.kind == LinkKind.PROPAGATES and l.cause in free), free[0])
    where = _amplifier(ctx, origin.layer)
    large = [e for e in ctx.all(Signal.UPDATE, UpdateState.TOO_LARGE) if e.step < origin.step]
    loss = [e for e in _loss_symptoms(ctx) if e.after != LossState.PLATEAU]
    v = origin.values
    amp = max(v.get("attenuation", 0) or 0, v.get("grad_growth", 0) or 0)
    lr, lr10 = ctx.lr_text()
    if large:
        top = _fmt(large[0].values.get("update_peak", math.nan))
        chain = [f"updates of up to {top} x the weights per step (lr {lr})",
                 f"the gradient grows {_fmt(amp)}x in {_names(free)} from step {origin.step}"]
        chain += [_loss_text(e) for e in loss[:1]]
        return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", large[0].step, 0.6 + 0.25 * bool(loss), chain,
                     large + free + loss,
                     f"lower the learning rate from {lr} to ~{lr10} and clip gradients at max_norm=1.0")]
    chain = [f"the relative gradient of `{origin.layer}` is {_fmt(amp)}x that of the layers after it or of its start, "
             f"from step {origin.step}"]
    if where != origin.layer:
        chain.insert(0, f"the backward pass of `{where}` ({ctx.layers[where].type_name}) multiplies the gradient "
                        "that flows through it")
    others = [e for e in free if e is not origin]
    if others:
        chain.append(f"the growth reaches {_names(others)}")
    chain += [_loss_text(e) for e in loss[:1]]
    conf = 0.55 + 0.1 * min(math.log10(max(amp / ctx.th.exploding_ratio, 1.0)) + 1, 2) + 0.1 * bool(loss)
    fix = _explode_fix(ctx, origin.layer)
    if where != origin.layer:
        fix = f"check the backward of `{where}` (a gradient scale or reversal coefficient far above 1?); " + fix
    return [_hyp(ctx, Cause.EXPLODING_GRADIENTS, where, origin.step, conf, chain, free + loss, fix)]


def rule_vanishing(ctx: Context) -> list[CausalHypothesis]:
    free = ctx.free(Signal.GRADIENT, GradState.VANISHING)
    if not free:
        return []
    origin = next((l.cause for l in ctx.links if l.kind == LinkKind.PROPAGATES and l.cause in free), None)
    if origin is None:
        first = min(e.step for e in free)
        origin = max((e for e in free if e.step == first), key=lambda e: ctx.rank.get(e.layer, -1))
    att = origin.values.get("attenuation", math.nan)
    loss = [e for e in _loss_symptoms(ctx) if e.after == LossState.PLATEAU]
    layers = sorted({e.layer for e in free}, key=lambda n: ctx.rank.get(n, 0))
    chain = [f"the relative gradient of `{origin.layer}` is {_fmt(att)}x that of the layers after it from step "
             f"{origin.step}"]
    if len(layers) > 1:
        chain.append(f"it fades further toward the input: {_names([e for e in free if e is not origin])}")
    chain.append("the layers near the input barely learn")
    chain += [_loss_text(e) for e in loss[:1]]
    depth = math.log10(max(ctx.th.vanishing_ratio / att, 1.0)) if att == att and att > 0 else 3.0
    conf = 0.55 + 0.08 * min(depth + 1, 4) + 0.05 * bool(loss)
    bounded = sorted({n for n, l in ctx.layers.items() if l.kind == Kind.BOUNDED and n in ctx.rank},
                     key=ctx.rank.get)
    if bounded:
        kinds = sorted({ctx.layers[n].type_name for n in bounded})
        fix = (f"replace the {'/'.join(kinds)} activations ({_layer_list(bounded, 3)}) by ReLU or GELU, "
               "or add BatchNorm/LayerNorm after each weight layer or residual connections")
    else:
        fix = ("add normalisation (BatchNorm/LayerNorm) or residual connections, and initialise with "
               "nn.init.kaiming_normal_")
    return [_hyp(ctx, Cause.VANISHING_GRADIENTS, origin.layer, origin.step, conf, chain, free + loss, fix)]


# -- learning rate and loss -----------------------------------------------------------------------------

def rule_lr_high(ctx: Context) -> list[CausalHypothesis]:
    large = ctx.free(Signal.UPDATE, UpdateState.TOO_LARGE)
    loss = [e for e in ctx.loss_state(LossState.DIVERGING, LossState.OSCILLATING) if id(e) not in ctx.claimed]
    if not large and not loss:
        return []
    lr, lr10 = ctx.lr_text()
    chain = []
    if large:
        chain.append(f"updates of up to {_fmt(large[0].values.get('update_peak', math.nan))} x the weights per step "
                     f"(lr {lr}) from step {large[0].step}")
    chain += [_loss_text(e) for e in loss[:1]]
    if large and loss:
        conf = 0.85
    elif loss:  # a diverging loss alone is most often the learning rate; an oscillating one may be noise
        conf = 0.6 if loss[0].after == LossState.DIVERGING else 0.45
    else:  # alone, the size of the updates speaks: weights replaced every step are a failure by themselves
        top = max((e.values.get("update_max", 0.0) or 0.0) for e in large)
        conf = 0.3 + 0.15 * math.log10(max(top / ctx.th.update_too_large, 1.0)) if top == top else 0.3
    step = min(e.step for e in large + loss)
    return [_hyp(ctx, Cause.LEARNING_RATE_TOO_HIGH, "", step, conf, chain, large + loss,
                 f"lower the learning rate from {lr} to ~{lr10} (or add a warm-up), "
                 "and clip gradients at max_norm=1.0")]


# A learning rate at least this large is not what makes updates negligible (a usual SGD rate is 1e-2 to 1e-1).
USUAL_LR = 1e-2
# A downward trend of the loss (Mann-Kendall z) this many standard deviations beyond batch noise is one.
TREND_Z = 2.0


def rule_lr_low(ctx: Context) -> list[CausalHypothesis]:
    small = ctx.free(Signal.UPDATE, UpdateState.NEGLIGIBLE)
    if ctx.nonfinite is not None:  # weights that stop moving once NaN/Inf appeared say nothing of the lr
        small = [e for e in small if e.step < ctx.nonfinite.step]
    if not small:
        return []
    ev = small[0]
    plateau = [e for e in ctx.loss_state(LossState.PLATEAU) if id(e) not in ctx.claimed]
    lr = ctx.lr
    chain = [f"updates are negligible from step {ev.step}: the largest is typically "
             f"{_fmt(ev.values.get('update_typical', math.nan))} x the weights per step (lr {_fmt(lr)})"]
    chain += [_loss_text(e) for e in plateau[:1]]
    # a run too short for a plateau whose loss has not come down, or only by its batch noise: weights
    # that barely move are why (an lr at the start of an endless warm-up, a gradient clipped to ~0)
    progress, z = ctx.loss_trend
    stalled = not plateau and (progress < ctx.th.loss_progress or z < TREND_Z)
    if stalled:
        chain.append(f"the loss has not come down: its latest values are {_fmt(abs(progress))} x its scale "
                     f"{'above' if progress < 0 else 'below'} the first ones ({_fmt(ctx.th.loss_progress)} counts "
                     "as progress)" if progress < ctx.th.loss_progress else
                     f"the loss moves only by its batch noise: no downward trend (z {z:.2f}, {TREND_Z:.0f} is one)")
    improving = ctx.has_loss and not plateau and not stalled
    conf = 0.85 if plateau else 0.7 if stalled else (0.3 if improving else 0.55)
    target = lr * 1e3 if lr == lr and lr > 0 else math.nan
    fix = (f"raise the learning rate from {_fmt(lr)} to ~{_fmt(target)} (updates of ~1e-3 x the weights per step are "
           "typical; 1e-3 is a usual start for Adam)" if target == target else
           "raise the learning rate until updates are ~1e-3 x the weights per step")
    if lr == lr and lr >= USUAL_LR:
        fix = (f"the learning rate ({_fmt(lr)}) is not small, the gradient reaching the optimizer is: check for a "
               "gradient clipped to ~0 (clip_grad_norm_'s max_norm) or a loss multiplied by a tiny "
               f"factor; else {fix}")
    return [_hyp(ctx, Cause.LEARNING_RATE_TOO_LOW, "", ev.step, conf, chain, small + plateau, fix)]


# A loss that makes no progress lowers the bar for a gradient that fades toward the input: a typical
# attenuation within this factor of the vanishing threshold explains the plateau.
PLATEAU_SLACK = 10.0


def _plateau_from_fading_gradient(ctx: Context, ev: SemanticEvent) -> list[CausalHypothesis]:
    steps, series = ctx.attenuation
    bar = ctx.th.vanishing_ratio * PLATEAU_SLACK
    with np.errstate(all="ignore"):
        typical = {n: float(np.nanmedian(a)) for n, a in series.items() if n in ctx.rank}
    weak = sorted((n for n, a in typical.items() if a < bar), key=ctx.rank.get)
    if not weak:
        return []
    origin = weak[-1]  # the fade is first that strong here; the layers before it get even less
    below = np.nonzero(series[origin] < bar)[0]
    onset = int(steps[below[0]]) if len(below) else ev.step
    chain = [f"the relative gradient of `{origin}` is typically {_fmt(typical[origin])}x that of the layers after it, "
             f"from step {onset}",
             (f"it fades further toward the input: {_layer_list(weak[:-1])}" if len(weak) > 1 else
              "the layers before it barely learn"), _loss_text(ev)]
    bounded = sorted({n for n, l in ctx.layers.items() if l.kind == Kind.BOUNDED and n in ctx.rank}, key=ctx.rank.get)
    kinds = sorted({ctx.layers[n].type_name for n in bounded})
    fix = (f"replace the {'/'.join(kinds)} activations ({_layer_list(bounded, 3)}) by ReLU or GELU, or add "
           "BatchNorm/LayerNorm after each weight layer" if bounded else
           "add normalisation (BatchNorm/LayerNorm) or residual connections, and initialise with "
           "nn.init.kaiming_normal_")
    return [_hyp(ctx, Cause.VANISHING_GRADIENTS, origin, onset, 0.6 + 0.1 * (len(weak) > 1), chain, [ev], fix)]


def rule_plateau(ctx: Context) -> list[CausalHypothesis]:
    plateau = [e for e in ctx.loss_state(LossState.PLATEAU) if id(e) not in ctx.claimed]
    if not plateau:
        return []
    ev = plateau[-1]
    strong = any(h.confidence >= 0.5 for h in ctx.found)
    if not strong and ev.end is None:
        fading = _plateau_from_fading_gradient(ctx, ev)
        if fading:
            return fading
    lr, _ = ctx.lr_text()
    conf = 0.3 if (strong or ev.end is not None) else 0.6
    return [_hyp(ctx, Cause.LOSS_PLATEAU, "", ev.step, conf, [_loss_text(ev)], plateau,
                 "check that the model can learn at all: overfit a single batch, check that targets match the outputs "
                 f"(loss, label range); then try a larger learning rate than {lr} (x3) or a schedule")]


from .rules_attention import rule_attention_collapse  # noqa: E402  (their rules use the helpers above)
from .rules_precision import rule_mixed_precision  # noqa: E402
from .rules_spikes import rule_spikes  # noqa: E402

Rule = Callable[[Context], list[CausalHypothesis]]
RULES: list[tuple[str, Rule]] = [
    ("data", rule_data),
    ("attention collapse", rule_attention_collapse),
    ("mixed precision", rule_mixed_precision),
    ("update spikes", rule_spikes),
    ("dead units", rule_dead),
    ("saturated activations", rule_saturated),
    ("initialization", rule_initialization),
    ("non-finite", rule_nonfinite),
    ("exploding gradients", rule_exploding),
    ("vanishing gradients", rule_vanishing),
    ("learning rate too high", rule_lr_high),
    ("learning rate too low", rule_lr_low),
    ("loss plateau", rule_plateau),
]

# Causes only a multi-process run has come first: one rank's data before the data rule, what the
# all-reduce spreads before the symptoms it spreads (rankrules uses the helpers above).
from .rankrules import RULES as _RANK_RULES  # noqa: E402

RULES[:0] = _RANK_RULES
