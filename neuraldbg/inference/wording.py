"""Every sentence inference writes: a hypothesis's chain (cause to effect) and its fix, per mechanism.

A root's chain is its own account, then one line per candidate it explains (in step order), then the loss.
Fixes never point the other way of the run's evidence: no larger learning rate next to updates that were too
large or a loss that rose.
"""
from __future__ import annotations

import math

from ..causes import Cause
from ..events import SemanticEvent
from ..formatting import number, percent
from ..layers import Kind
from ..losspath import LossMisuse
from ..states import LossState, LrState, Signal, TargetState
from .activations import ALL_DEAD
from .context import Context
from .evidence import Candidate


fmt = number



def _term(ops) -> str:
    """The ops of a loss's term on a layer's output, from the layer on (``abs -> mean -> mul``); the op that
    joins it to the rest of the loss is left out."""
    ops = [str(o).split("@")[0] for o in (ops or [])]
    if ops and ops[0] in ("Add", "Sub"):
        ops = ops[1:]
    return " -> ".join(o.lower() for o in reversed(ops)) or "a term of its own"

def _set_by_hand(x: float) -> bool:
    """Whether ``x`` is a number of at most three significant digits (1.0, 0.5, 0.125, 25, 1e-3), to 1e-5
    relative: a ``max_norm`` someone wrote. A norm clipped by ``clip_grad_norm_`` is its ``max_norm`` to
    ~1e-6 (``max_norm * norm / (norm + 1e-6)``); a power of two times a scale of 2**16 (8192) is not one."""
    if not (x > 0 and math.isfinite(x)):
        return False
    unit = 10.0 ** (math.floor(math.log10(x)) - 2)
    return abs(x / (round(x / unit) * unit) - 1) < 1e-5


def clipped_scaled(c, ctx) -> float:
    """The factor a loss scaler multiplied the loss by when a clip acted on the gradients before they were
    divided back (``clip_grad_norm_`` before ``scaler.unscale_``): the scale found in the gradients (a scaler
    the session was not given); or the given scaler's scale where the norm the clip left is a number written
    by hand (its ``max_norm``) only once multiplied back by that scale. NaN when neither."""
    if ctx.loss_scaled == ctx.loss_scaled:
        return ctx.loss_scaled
    scale, stepped = ctx.scaler_scale, c.facts.get("stepped", math.nan)
    if scale == scale and _set_by_hand(stepped * scale) and not _set_by_hand(stepped):
        return scale
    return math.nan


def _betas_line(ctx: Context) -> str:
    b1, b2 = ctx.optimizer_betas
    return (f"the optimizer's betas are ({fmt(b1)}, {fmt(b2)}): with beta1 at or above sqrt(beta2) "
            f"({fmt(math.sqrt(b2))}), the first moment averages the gradients over more steps than the second "
            "moment that divides it, and the step is no longer bounded by the learning rate")


def _betas_fix(ctx: Context) -> str:
    b1, b2 = ctx.optimizer_betas
    swapped = " (they look swapped)" if b2 < b1 else ""
    return (f"give the optimizer betas with beta1 below sqrt(beta2): the default (0.9, 0.999), not ({fmt(b1)}, "
            f"{fmt(b2)}){swapped}; clipping the gradients does not bound its step")


def _bidirectional(ctx: Context, layer: str) -> bool:
    info = ctx.layers.get(layer)
    return info is not None and bool(info.extra.get("bidirectional"))


def layer_list(names: list[str], limit: int = 4) -> str:
    unique = list(dict.fromkeys(n for n in names if n))
    shown = ", ".join(f"`{n}`" for n in unique[:limit])
    return shown + (f" and {len(unique) - limit} more" if len(unique) > limit else "")


def names(events: list[SemanticEvent], limit: int = 4) -> str:
    return layer_list([e.layer for e in events], limit)


# float16's largest finite value, and its smallest (subnormal) one
FP16_MAX = 65504.0
FP16_TINY = 5.96e-8


def name_sites(ctx: Context, text: str) -> str:
    """A functional operation's row named as the user wrote it: "`conv2:relu`" -> "F.relu after `conv2`"."""
    if "`" not in text:
        return text
    for info in sorted((l for l in ctx.layers.values() if l.is_site), key=lambda l: -len(l.name)):
        text = text.replace(f"`{info.name}`", info.where())
    return text


def loss_text(ev: SemanticEvent) -> str:
    v = ev.values
    if ev.signal == Signal.SPIKE:
        return (f"the loss spikes at step {ev.step}: {fmt(v.get('loss', math.nan))}, "
                f"from {fmt(v.get('before', math.nan))}")
    if ev.signal == Signal.TARGET:
        return (f"the loss falls below zero and on, down to {fmt(v.get('lowest', math.nan))}"
                if ev.after == TargetState.UNBOUNDED else "the loss starts far above what the outputs can reach")
    chance = v.get("chance", math.nan)
    if v.get("term"):
        what = ("the loss's classification term (read off the output's gradient; the loss adds other terms to it, "
                f"and as a whole starts at {fmt(v.get('whole_start', math.nan))})")
        span = f"{fmt(v.get('start', math.nan))} at the start, {fmt(v.get('latest', math.nan))} at the end"
        if chance == chance:
            return f"{what} does not come clearly below chance, {fmt(chance)}: {span}"
        return f"{what} stays flat: {span}"
    if ev.after in (LossState.PLATEAU, LossState.SLOW) and v.get("from_chance"):  # progress counted from chance
        how = "does not come clearly" if ev.after == LossState.PLATEAU else "hardly comes"
        return (f"the loss {how} below chance, {fmt(chance)} (what predicting the classes' frequencies gives): "
                f"{fmt(v.get('start', math.nan))} at the start, {fmt(v.get('latest', math.nan))} at the end")
    if ev.after == LossState.PLATEAU:
        return (f"the loss stays flat ({fmt(v.get('start', math.nan))} at the start, "
                f"best {fmt(v.get('best', math.nan))})")
    if ev.after == LossState.DIVERGING:
        return (f"the loss diverges from step {ev.step} (best {fmt(v.get('best', math.nan))}, "
                f"then {fmt(v.get('loss', math.nan))})")
    if ev.after == LossState.OSCILLATING:
        return f"the loss oscillates from step {ev.step} without progress"
    if ev.after == LossState.SLOW:
        if ev.end is not None:  # a slow stretch the loss then left (for a plateau, or to learn)
            return f"the loss hardly comes down from step {ev.step} to step {ev.end}"
        done = v.get("progress_end", v.get("progress", math.nan))
        return f"the loss hardly comes down: {max(done, 0.0):.0%} of its start over the run"
    if ev.after == LossState.STALLED:
        return (f"the loss has not come down in {ev.values.get('n', 'these')} steps: it moves only by its batch noise"
                if v.get("progress", 0.0) >= 0 else "the loss has not come down: its latest values are above the first")
    return f"the loss becomes NaN/Inf at step {ev.step}"


def _more_loops(n: int) -> str:
    """The other loops of the same forward whose gradient fades too."""
    return f"; {n} more loop{'s' if n > 1 else ''} of the same forward fade{'' if n > 1 else 's'} as well"


def _update_line(ev: SemanticEvent, ctx: Context, why: str = "") -> str:
    lr, _ = ctx.lr_text()
    text = (f"updates of up to {fmt(ev.values.get('update_peak', math.nan))} x the weights per step (lr {lr}) "
            f"from step {ev.step}")
    return text + (f": {why}" if why else "")


# -- one account per mechanism -----------------------------------------------------------------------------------

def _own(c: Candidate, ctx: Context) -> list[str]:
    f, k = c.facts, c.kind
    if c.cause.multi_rank:
        return _rank_lines(c, ctx)
    if c.cause == Cause.DATA:
        if k == "input_nonfinite":
            return [f"the input batch at step {c.step} contains NaN/Inf",
                    "every layer downstream computes NaN/Inf (non_finite)", "the loss and all gradients become NaN"]
        if k == "loss_empty":
            return [f"the loss is NaN from step {c.step}, while the gradients it sends back are finite: the NaN "
                    "never reaches the model",
                    "a loss averaged over no element is 0/0 with a gradient of 0 (every target equal to "
                    "ignore_index, an empty mask or batch): the weights get no update"]
        if k == "loss_nonfinite":
            return [f"the model output is finite at step {c.step}",
                    "the loss (or its gradient) is NaN/Inf: NaN in the targets, or a loss undefined for them",
                    "all gradients become NaN (non_finite)"]
        if k == "constant" and f.get("input_spread", 0.0) > 0:
            return [f"the samples of the input batch differ by at most {fmt(f['input_spread'])} on any feature from "
                    f"step {c.step}, against values up to {fmt(f.get('input_absmax', math.nan))} (mean "
                    f"{fmt(f.get('input_mean', math.nan))}): an offset they all share drowns what tells them apart",
                    "the model can hardly tell them apart: it learns one output for all of them (the targets' "
                    "average, or their most frequent class) before it can scale their differences up"]
        if k == "constant" and f.get("input_std", 0.0) > 0:
            return [f"every sample of the input batch is the same one from step {c.step} (its features vary, its "
                    "samples do not): the samples cannot be told apart",
                    "the model can only learn one output for all of them (the targets' average, or their most "
                    "frequent class)"]
        if k == "constant":
            return [f"every value of the input batch is {fmt(f.get('input_mean', math.nan))} from step {c.step} "
                    "(no spread at all): the samples cannot be told apart",
                    "the model can only learn one output for all of them (the targets' average, or their most "
                    "frequent class)"]
        if k == "targets_broadcast":
            return ["the loss compares outputs and targets of different shapes (e.g. (N, 1) against (N,)): it "
                    "broadcasts them, so every output is fit to every target of the batch, and the model can only "
                    "learn their mean"]
        if k == "unscaled" and f.get("outlier"):
            return [f"the input batch at step {c.step} is out of scale (mean {fmt(f.get('input_mean', math.nan))}, "
                    f"std {fmt(f.get('input_std', math.nan))}, values up to {fmt(f.get('input_absmax', math.nan))}); "
                    f"the batches sampled before it are not, and by step {f['until']} the input is back in scale"]
        if k == "input_small":
            return [f"the input is far below unit scale (RMS {fmt(f['input_rms'])}): `{f['layer']}` reads it with "
                    f"weights at their default spread, and its output, {fmt(f['gain'])}x the input's scale, is "
                    "made by its biases, not by the input",
                    f"the weights must grow ~{fmt(f['gain'])}x before the input counts: the model learns slowly, "
                    "if at all"]
        if k == "unscaled":
            return [f"the input is not normalised: mean {fmt(f.get('input_mean', math.nan))}, std "
                    f"{fmt(f.get('input_std', math.nan))}, values up to {fmt(f.get('input_absmax', math.nan))}"]
        if k == "padding_counted":
            return [f"{percent(f['share'])} of the positions the loss reads are padding (attention_mask 0; of "
                    f"{f['positions']} read at step {c.step}, their gradient not zero): the targets there keep the "
                    "pad token instead of the index the loss ignores",
                    "the loss is mostly about predicting the padding, which is easy: it falls while the real "
                    "tokens get a small share of each update"]
        if k == "targets_several":
            read = (f"{fmt(f['per_row'])} per row on average, {fmt(100 * f['share'])}% of the rows with more than one "
                    "(read off the gradient at the output)")
            if f.get("loss") == "bce_softmax":
                return [f"the binary cross-entropy is taken of a softmax over each row's outputs, and its targets "
                        f"mark several labels in a row: {read}",
                        "a softmax gives each row one unit of probability to spread: the labels marked together cannot "
                        "all be predicted near 1, and the loss cannot come down to 0"]
            return [f"the cross-entropy's targets mark several classes in a row: {read}, where it takes one class per "
                    "row or a distribution over them",
                    "a softmax gives each row one unit of probability to spread: the classes marked together cannot "
                    "all be predicted, and the loss cannot come down to 0"]
        if k == "norm_batch":
            n = f["values"]
            keeps = ("+-1 in every channel, whichever of the two values is larger" if n <= 2 else
                     f"statistics of {n:g} values, which carry as much noise as signal")
            return [f"`{c.layer}` normalises each channel by the batch's own mean and variance, taken over only "
                    f"{n:g} values (batch rows x positions) in training: its output is {keeps}, and each "
                    "sample's depends on the other samples of the batch"
                    + (f" (so do {layer_list(f['layers'][1:])})" if len(f["layers"]) > 1 else "")]
        if k == "mixed":
            where = f"`{c.layer}`" if c.layer else "the model"
            order = "; the outputs also change with the batch's order" if f.get("equivariant") is False else ""
            spread = f.get("spread", math.nan)
            much = ("while its own input does not reach it at all" if math.isinf(spread) else
                    f"{fmt(spread)}x as much as its own in all")
            return [f"one sample's output depends on the other samples of the batch: its gradient reaches their "
                    f"inputs, {much} (a replay of the pass at step {f.get('step', c.step)}, in eval mode){order}",
                    f"{where} mixes them: it reads the batch in another layout than it is fed (a recurrence or "
                    "attention run across the batch's samples, not along each sample's sequence)"]
        if k == "sees_ahead":
            where = (f"`{f['layer']}` is the first module whose output there changes" if f.get("layer") else
                     "the change arises in the model's own forward (attention written as functions)")
            which = "next input tokens" if f.get("ahead_by", 1) == 1 else "input tokens two positions ahead"
            return [f"the loss's targets are the {which} ({fmt(100 * f.get('share', math.nan))}% of the "
                    f"{f.get('positions', 0)} positions read at step {f.get('step', c.step)})",
                    "a position's output changes when a later token does (a replay of one sample with its last token "
                    f"replaced, in eval mode): {where}",
                    "each position reads the token it is asked to predict: the loss falls by copying it, and the "
                    "model cannot generate text"]
        if k == "shifted_twice":
            return [f"the loss's targets are the input tokens two positions ahead ({fmt(100 * f.get('share', 0))}% "
                    f"of the {f.get('positions', 0)} positions read at step {f.get('step', c.step)}): each position "
                    "is asked for the token after the next",
                    "labels shifted by hand, and again by a model that shifts them itself (a Hugging Face causal LM "
                    "compares logits[:, :-1] with labels[:, 1:]): every target is one token further than meant"]
        if k == "unshifted":
            return [f"the loss's targets are the input tokens at their own positions ({fmt(100 * f.get('share', 0))}% "
                    f"of the {f.get('positions', 0)} positions read at step {f.get('step', c.step)}), under a model "
                    "whose outputs read no later token (a replay of one sample with its last token replaced)",
                    "the labels were never shifted: each position is asked for the token it already reads, the loss "
                    "falls to ~0 by copying it, and the model learns nothing of the next token"]
        if k == "one_class":
            n = f.get("targets", math.nan)
            return [f"every one of the {n:.0f} targets read in {f.get('batches', math.nan):.0f} sampled batches is "
                    f"class {f.get('class', math.nan):.0f} (classes read off the output's gradient): any other class "
                    f"makes up less than {fmt(100 * 3 / n)}% of the data",
                    f"the loss falls from {fmt(f.get('loss_first', math.nan))} to {fmt(f.get('loss_min', math.nan))}: "
                    "the model fits a constant output and learns nothing of its input"]
        if k == "ordered":
            return [f"the sampled batches hold {f.get('batch_classes', math.nan):.1f} of the run's "
                    f"{f.get('classes', math.nan):.0f} classes on average, where batches of "
                    f"{f.get('batch', math.nan):.0f} drawn at random would hold "
                    f"{f.get('random_classes', math.nan):.1f} (their mix of classes "
                    f"{fmt(f.get('ratio', math.nan))}x further from the run's than chance; classes read off the "
                    "output's gradient)",
                    "the data is read in an order that groups classes: each batch pulls the outputs toward its own "
                    "classes and the next undoes it, so the loss jumps as the classes change and the model ends "
                    "fitted to the last ones"]
        if k == "targets_out_of_reach":
            target = f.get("reach", math.nan) * f.get("output_rms", math.nan)  # (the errors' scale)
            return [f"the loss starts at {fmt(f.get('loss', math.nan))}, while the outputs' RMS is "
                    f"{fmt(f.get('output_rms', math.nan))}: the targets are ~{fmt(target)}, "
                    f"{fmt(f.get('reach', math.nan))}x out of the outputs' reach"]
        if ctx.loss_hand_written:  # it may be a likelihood that rightly goes negative
            return [_falls(f), "no cross-entropy or squared error is in the loss's graph, and it falls below zero "
                    "at an unchanged pace: a likelihood that may go negative (a density's NLL) slows as it converges; "
                    "one whose targets are outside its range, or whose terms have no floor, is unbounded below"]
        if not ctx.loss_non_negative:  # a library loss reached through other ops, or a graph not read
            return [_falls(f), "a loss falling below zero at an unchanged pace: targets outside a loss's range make "
                    "it unbounded below, and the model learns to push its outputs without limit"]
        return [_falls(f), "a cross-entropy, a binary cross-entropy or a squared error cannot be negative: targets "
                "outside the loss's range make it unbounded below, and the model learns to push its outputs without "
                "limit"]
    if c.cause == Cause.DEAD_UNITS and k == "dropped":
        where = _dropout_where(ctx, c.layer)
        lines = [f"the dropout {where} drops {f['rate']:.0%} of its input in training from step {f['full_step']}: "
                 "what follows it reads 0 for every input, and no gradient goes back through it"]
        start, first = f["rise_from"]
        if first < f["rate"]:
            lines.append(f"the share it drops rose from {first:.0%} at step {start} to {f['rate']:.0%}, past "
                         f"{ctx.th.dropout_high:.0%} from step {c.step}: what it keeps is scaled by 1 / (1 - p)")
        return lines + symptom_lines(c.symptoms, 2)
    if c.cause == Cause.DEAD_UNITS:
        lines = [f"{f['fraction']:.0%} of the units of `{c.layer}` are dead: they output 0 for every input from step "
                 f"{c.step}"]
        if k == "penalised":
            lines.append(f"the loss reads `{c.layer}`'s output directly ({_term(f.get('term'))}): a penalty on its "
                         "activations pushes its units toward zero from the first step, and below it")
        elif ctx.from_start(c.step) and f.get("read") == "zero_weights":
            lines.append(f"present from step {c.step}: the weights of `{f['source']}` are all 0, so it outputs 0 for "
                         "every input")
        elif ctx.from_start(c.step) and f.get("read") == "zero":
            lines.append(f"present from step {c.step}: `{f['source']}` outputs 0 for every input, though its weights "
                         "are not 0")
        elif ctx.from_start(c.step) and f.get("read") == "between":
            lines.append(f"present from step {c.step}: `{f['source']}`'s output has values above 0, and what "
                         f"`{f['reader']}` reads of it, through operations between them, has none")
        elif ctx.from_start(c.step) and f.get("previous"):
            lines.append(f"present from step {c.step}: `{f['previous']}` feeds `{c.layer}` only non-positive values "
                         "(its bias or weight scale)")
        if f["blocked"]:
            lines.append(f"no gradient flows back through `{c.layer}`: it vanishes in {names(f['blocked'])}")
        if f["downstream"]:
            lines.append(f"the layers after it receive a constant signal: {symptom_lines(f['downstream'], 1)[0]}")
        return lines
    if c.cause == Cause.SATURATED_ACTIVATIONS:
        kind = ctx.layers[c.layer].type_name if c.layer in ctx.layers else "activation"
        lines = [f"{f['fraction']:.0%} of the outputs of `{c.layer}` ({kind}) are pinned at its bounds "
                 f"from step {c.step}"]
        if ctx.from_start(c.step) and f.get("previous"):
            lines.append(f"present from step {c.step}: the pre-activations from `{f['previous']}` are too large")
        if f["blocked"]:
            lines.append(f"its derivative is ~0, so the gradient vanishes in {names(f['blocked'])}")
        return lines
    if c.cause == Cause.BAD_INITIALIZATION:
        return _init_lines(c, ctx)
    if c.cause == Cause.NON_FINITE:
        if k in ("fp16_overflow", "skipping", "near_limit"):
            return _precision_lines(c, ctx)
        where = f"`{c.layer}`" if c.layer else "the model"
        kind = f" ({f['type']})" if f.get("type") else ""
        origin = f.get("origin")
        if k == "loss_op":
            return _loss_op_lines(c)
        if k == "loss_value":
            until = f" to step {f['end']}" if f.get("end") is not None else " on"
            more = f" (and in {f['count'] - 1} stretches later)" if f.get("count", 1) > 1 else ""
            return [f"the loss is NaN/Inf from step {c.step}{until}{more} while every gradient stays finite and "
                    "the weights go on moving: an operation of the loss leaves its domain "
                    "on some samples (a log or a square root of a negative output, a division by 0) where its "
                    "gradient does not",
                    "the training follows a gradient whose loss cannot be read: what it minimises is not the loss"]
        if k == "forward" and origin is not None and origin.op:
            rel = kind if origin.relation != "after" else ""
            return [f"at step {c.step}, {origin.where()}{rel} is the first operation to turn finite values into "
                    "NaN/Inf",
                    "every layer after it, the loss and all gradients become NaN"]
        if k == "forward":
            return [f"at step {c.step}, the forward pass of {where}{kind} is the first to output NaN/Inf "
                    "from finite inputs and weights", "every layer after it, the loss and all gradients become NaN"]
        if k == "backward":
            return [f"at step {c.step}, the backward pass of {where}{kind} turns a finite gradient into NaN/Inf",
                    "the parameter gradients of every layer before it become NaN"]
        if k == "weights":
            return [f"the parameters of {where} become NaN/Inf after the update before step {c.step}"]
        if k == "narrow_update":
            eps = ctx.optimizer_eps
            lines = [f"the parameters of {where} are stored in {ctx.param_dtype} and become NaN/Inf in the update "
                     f"before step {c.step}, from finite gradients, with no update too large before it"]
            if eps == eps and eps < FP16_TINY:
                lines.append(f"the optimizer's eps ({fmt(eps)}) rounds to 0 in float16, and squared gradients "
                             "below ~1e-4 underflow to 0: the update divides by zero")
            return lines
        if k == "overflow":
            return [f"weights and activations grow during training until {where}{kind} overflows",
                    f"non_finite: NaN/Inf first produced in {where} (forward) at step {c.step}"]
        return [f"NaN/Inf appears at step {c.step}; {f.get('detail', '')}".strip()]
    if c.cause == Cause.EXPLODING_GRADIENTS:
        amp = f["amplification"]
        size = (f"is {fmt(amp)}x that of the layers after it or of its start" if math.isfinite(amp) else
                "grows past any finite multiple of that of the layers after it or of its start (to NaN/Inf)")
        lines = [f"the relative gradient of `{f['origin']}` {size}, from step {c.step}"]
        if c.layer != f["origin"]:
            lines.insert(0, f"the backward pass of `{c.layer}` ({ctx.layers[c.layer].type_name}) multiplies the "
                            "gradient that flows through it")
        if ctx.betas_unbounded():
            lines.insert(0, _betas_line(ctx))
        if f["others"]:
            lines.append(f"the growth reaches {names(f['others'])}")
        return lines
    if c.cause == Cause.VANISHING_GRADIENTS and k == "through_time" and f.get("loop"):
        reach = ("no gradient at all reaches the first" if f["ratio"] <= 0 else
                 f"the gradient reaching the first is {fmt(f['ratio'])}x the most any gets")
        return [f"`{c.layer}` is called {f['steps_in_time']} times in a loop, each call reading what "
                f"the one before made (a recurrence, or layers stacked in a loop, written by hand): {reach} (typical "
                f"of {f['samples']} sampled steps), so it vanishes along the loop"
                + (_more_loops(f["loops"] - 1) if f.get("loops", 1) > 1 else ""),
                "what the loss needs from the loop's first calls (early in the sequence, or the first layers) is "
                "not learned"]
    if c.cause == Cause.VANISHING_GRADIENTS and k == "through_time":
        reach = ("no gradient at all reaches the first step of its input" if f["ratio"] <= 0 else
                 f"the gradient reaching the first step of its input is {fmt(f['ratio'])}x the most any step gets")
        lines = [f"through the {f['steps_in_time']} time steps of `{c.layer}`, {reach} (typical of {f['samples']} "
                 "sampled steps): it vanishes through time inside the recurrent module",
                 "what the loss needs from early in the sequence is not learned"]
        if _bidirectional(ctx, c.layer):
            lines.insert(1, f"`{c.layer}` is bidirectional, and its backward direction, which ends at the first "
                            "step, would bring the gradient there in one step: its output is not read where that "
                            "direction ends (out[:, -1] holds a backward direction that has seen one step)")
        return lines
    if c.cause == Cause.VANISHING_GRADIENTS and k == "unreached":
        others = f" (nor {layer_list(f['before'], 3)} before it)" if f["before"] else ""
        return [f"no gradient reaches `{c.layer}`{others} from step {c.step}, though its weights are trainable and "
                "it runs: the backward pass stops after it, so it never learns",
                "the graph is cut between it and the loss"]
    if c.cause == Cause.VANISHING_GRADIENTS:
        word = "is typically" if k == "diminishing" else "is"
        origin = f.get("origin", c.layer)
        lines = [f"the relative gradient of `{origin}` {word} {fmt(f['attenuation'])}x that of the layers after it "
                 f"from step {c.step}"]
        if f.get("applications", 1) > 1:
            lines.insert(0, f"`{c.layer}` is applied {f['applications']} times in a chain in a forward pass, each "
                            "application reading what the one before made: the gradient passes back through all of "
                            f"them before it reaches `{origin}`, and shrinks at each")
        if f.get("gap") and f.get("zero"):
            lines.insert(1, f"it is exactly 0 while `{f['gap']}`, the next weight layer, has one: an operation in the "
                            "forward between them (no module hook sees it) has a zero derivative")
        elif f.get("gap"):
            lines.insert(1, f"no module that could shrink a gradient runs between `{c.layer}` and `{f['gap']}`, the "
                            "next weight layer: the forward's own code between them (no module hook sees it) "
                            "erases the signal")
        if f["others"]:
            lines.append(f"it fades further toward the input: {names(f['others'])}")
        lines.append("the layers near the input barely learn")
        return lines
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH:
        lines = []
        if ctx.grads_never_zeroed():
            lines.append(f"the gradients are never zeroed: after {percent(ctx.carried)} of the optimizer steps the "
                         "next backward pass adds to the gradients already there, so each update holds every "
                         "earlier gradient")
        if ctx.accumulated():
            passes = ctx.accumulated()
            lines.append(f"the gradients of {passes} backward passes add up before each optimizer step and the loss is "
                         f"not divided by {passes}: each step's gradient is {passes} times a mean's")
        if ctx.loss_summed:
            lines.append("the loss sums over the batch (reduction='sum', or a .sum() of per-sample losses): its "
                         "gradient is the batch size times a mean's")
        if ctx.scaled_steps == ctx.scaled_steps:
            lines.append(f"the loss is multiplied by {int(ctx.scaled_steps)} (2^{round(math.log2(ctx.scaled_steps))}) "
                         "before backward (a GradScaler's scale(loss)) and the optimizer steps on those gradients as "
                         "they are: nothing divides them back")
        if ctx.betas_unbounded():
            lines.append(_betas_line(ctx))
        if ctx.optimizer_momentum >= ctx.th.momentum_high:
            lines.append(f"the optimizer's momentum is {fmt(ctx.optimizer_momentum)}: a step carries the gradients of "
                         "the steps before it, and at a steady gradient moves "
                         + (f"~{fmt(1 / (1 - ctx.optimizer_momentum))}x" if ctx.optimizer_momentum < 1 else
                            "ever more than") + " the learning rate times the gradient")
        if ctx.lr_rising == ctx.lr_rising:
            lines.append(f"the schedule keeps raising the learning rate: from {fmt(ctx.lr_first)} at the start to "
                         f"{fmt(ctx.lr)} ({fmt(ctx.lr_rising)}x), still rising at the end of the run")
        jump = f.get("jump")
        if jump is not None:
            lines.append(f"the learning rate rises from {fmt(jump.values.get('lr_before', math.nan))} to "
                         f"{fmt(jump.values.get('lr', math.nan))} at step {jump.step}")
        spikes = f.get("spikes") or []
        spike_lines = []
        if spikes:
            s = spikes[0]
            spike_lines.append(f"the updates of `{s.layer}` spike first, at step {s.step}: "
                               f"{fmt(s.values.get('spike', math.nan))}x their size at the sample before "
                               f"({fmt(s.values.get('update_ratio', math.nan))} x its weights)")
            later = [e.layer for e in spikes[1:] if e.layer != s.layer]
            if later:
                spike_lines.append(f"then those of {layer_list(later)}")
        large_lines = ([_update_line(f["large"][0], ctx) + ("" if ctx.warmed_up() else ", with no warm-up")]
                       if f["large"] else [])
        first_spike = spikes and (not f["large"] or spikes[0].step <= f["large"][0].step)
        return lines + (spike_lines + large_lines if first_spike else large_lines + spike_lines)
    if c.cause == Cause.ATTENTION_COLLAPSE:
        return _attention_lines(c, ctx)
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "eps":
        return [f"the optimizer's eps is {fmt(f['eps'])}, {fmt(f['eps'] / f['grad_rms'])}x the gradients' typical size "
                f"per weight ({fmt(f['grad_rms'])})",
                "an adaptive optimizer divides each update by the gradient's running RMS plus eps: with eps far "
                "above it, the update is the learning rate times gradient / eps, not ~the learning rate"]
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "rounded":
        ulp = "2^-8" if f["dtype"] == "bfloat16" else "2^-11"  # half of finfo(dtype).eps
        return [f"the weights are stored in {f['dtype']}: {percent(f['unchanged'])} of their entries come out of an "
                f"update exactly as they went in (typical of {f['samples']} sampled steps)",
                f"an update below half a unit in the last place of a weight (~{ulp} of it in {f['dtype']}) rounds "
                "away: the gradient says where to go, the weights do not move"]
    if c.cause == Cause.LOSS_PLATEAU and k == "input_unused":
        return [f"the model's output does not depend on its input: in a replay of the pass at step {f['replayed']}, "
                "the input is not in the computation of the output at all",
                "the model can only learn one output for every sample"]
    if c.cause == Cause.LOSS_PLATEAU and k == "order_blind":
        n = f["positions"]
        return [f"in a replay of one sample with its tokens 2 to {n - 1} (of {n}) in reverse order, the model's output "
                "is the same to rounding: its attention reads the tokens as a set (no positional encoding is added "
                "to their embeddings, and no causal mask orders them)",
                "where the label depends on the order, the loss can come down only as far as the bag of tokens "
                "predicts"]
    if c.cause == Cause.LOSS_PLATEAU and k == "read_early" and f.get("tokens"):
        read, steps = f["read"], f["steps_in_time"]
        return [f"the loss reads the model's output before its sequence ends: no gradient reaches `{c.layer}`'s "
                f"output (the tokens' embeddings) after position {read} of {steps}",
                f"the prediction depends on the first {read} of the {steps} tokens only (under a causal mask, "
                "position t sees the tokens up to t): what comes later cannot change it"]
    if c.cause == Cause.LOSS_PLATEAU and k == "read_early":
        info = ctx.layers.get(c.layer)
        kind = f" ({info.type_name})" if info is not None else ""
        read, steps = f["read"], f["steps_in_time"]
        return [f"the loss reads `{c.layer}`{kind} before its sequence ends: no gradient reaches its input after "
                f"time step {read} of {steps}",
                f"its output there has seen {read} of the {steps} steps: what comes later cannot change the "
                "prediction"]
    if c.cause == Cause.LOSS_PLATEAU and k == "plateau" and ctx.linear_maps >= 2:
        return [f"the model's {ctx.linear_maps} weight layers run one after another with no activation between "
                "them: together they compute one linear map of the input, no more than a single layer can"]
    if c.cause == Cause.LOSS_PLATEAU and k == "plateau" and (frozen := _frozen(ctx)) is not None:
        held, share = frozen
        return [f"{layer_list(held)} ({fmt(100 * share)}% of the weights) are frozen (requires_grad=False): only the "
                "rest of the model learns"]
    if c.cause == Cause.LOSS_PLATEAU and k == "eval_mode":
        return [f"the model trains in eval mode (model.training is False) at {f['passes']} of {f['sampled']} sampled "
                f"training passes, from step {f['step']}: model.eval() is left on (after a validation pass)",
                f"its batch normalisations ({layer_list(f['norms'], 3)}) normalise with their running statistics, "
                "which eval mode does not update, in place of the batch's: what reaches the layers after them is not "
                "normalised (and dropout is off)"]
    if c.cause == Cause.LOSS_PLATEAU and k == "remade":
        return [f"a new optimizer ({f['optimizer']}) was made {f['made']} times in {f['steps']} steps, and it keeps a "
                "state from step to step: its momentum buffers or moment estimates start from zero at every step",
                "momentum never builds: SGD's momentum acts as none" if f["optimizer"] == "SGD" else
                "every step is the optimizer's first (Adam's moves every weight by about lr, whatever its gradient)"]
    if c.cause == Cause.LOSS_PLATEAU and k == "unregistered":
        n = int(f["tensors"])
        shapes = ", ".join("x".join(str(d) for d in shape) for shape in f["shapes"])
        if f.get("renewed"):
            return [f"the forward makes new weights at every pass: the {n} weight tensor{'s' if n != 1 else ''} "
                    f"({shapes}{', ...' if n > 3 else ''}) of the first pass were freed by the next sampled step, "
                    "and no optimizer holds them (a layer created inside forward, not in __init__)",
                    "that part of the model starts again from random at every step, so it never learns"]
        return [f"the forward uses {n} weight tensor{'s' if n != 1 else ''} ({shapes}{', ...' if n > 3 else ''}; "
                f"{int(f['numel']):,} weights) that are not the model's parameters, and they stayed the same at "
                f"{f['still']} sampled steps while the model's own weights moved: model.parameters() does not list "
                "them, so no optimizer steps them",
                "only the registered layers learn; the rest stay as initialised"]
    if c.cause == Cause.LOSS_PLATEAU and k == "unoptimized" and f.get("tensors"):
        return [f"{layer_list(f['tensors'])} require a gradient, their layers hold one at every sampled step, "
                "and no group of the optimizer holds them: they never change, while the rest of the model's "
                "weights do",
                "only the parameters the optimizer holds learn; the rest stay as initialised"]
    if c.cause == Cause.LOSS_PLATEAU and k == "unoptimized":
        unheld = "no group of the optimizer holds them" if f.get("unheld") else "while the other layers' do"
        return [f"the weights of {layer_list(f['layers'])} hold a gradient at every sampled step and never change, "
                f"{unheld}: no optimizer steps them",
                "only the rest of the model learns"]
    if c.cause == Cause.LOSS_PLATEAU and k == "out_of_range" and "share" in f:
        act, beyond = f["activation"].lower(), _beyond(f)
        at = fmt(f["low"]) if not math.isfinite(f["high"]) else "a bound"
        return [f"over the second half of the run, {percent(f['share'])} of the squared gradient at the output "
                f"sits on outputs the final {act} holds at {at} while the loss pushes them {beyond}",
                f"the loss there is {percent(f['floor'])} of the loss at the start: targets {beyond}, out of the "
                "outputs' range, which no weights bring the outputs to"]
    if c.cause == Cause.LOSS_PLATEAU and k == "out_of_range":
        rng = f"[{fmt(f['low'])}, {fmt(f['high'])}]"
        return [f"the loss is a regression loss of outputs a {f['activation'].lower()} holds in {rng}, and it never "
                f"comes below {fmt(f['loss_min'])}, where targets in {rng} allow at most {fmt(f['bound'])}",
                "the targets lie outside the outputs' range: no weights bring the outputs to them"]
    if c.cause == Cause.LOSS_PLATEAU and k == "foreign":
        return [f"the weights never changed: an optimizer stepped {f['steps']} times, on weights none of which are "
                "this model's"]
    if c.cause == Cause.LOSS_PLATEAU and k == "not_stepped":
        return [f"the weights never changed: {f['passes']} backward passes ran and the optimizer did not step once"]
    if c.cause == Cause.LOSS_PLATEAU and k == "no_gradient":
        if f["op"] == "single":
            return ["the loss takes a softmax over a dimension of size 1 (a cross-entropy of one output per sample): "
                    "that probability is always 1 and the loss always 0, so no gradient reaches the weights"]
        if f["op"] == "single_softmax":
            return ["the model's output goes through a softmax over a dimension of size 1 (one output per sample): "
                    "it is 1 whatever its input, so the loss is the same at every step and no gradient reaches the "
                    "weights"]
        return [f"every path from the loss to the model's output goes through torch.{f['op'].lower()}, whose "
                "gradient is zero: no gradient reaches the weights, whatever the learning rate"]
    if c.cause == Cause.LOSS_PLATEAU and k == "on_probabilities":
        return [_ON_PROBABILITIES[f["misuse"]]]
    if c.cause == Cause.LOSS_PLATEAU and k == "unbounded":
        return [_falls(f), _UNBOUNDED[f["form"]]]
    if c.cause == Cause.LOSS_PLATEAU and k == "unreached":
        return [f"the weights never learned: the optimizer stepped {f['steps']} times, and no backward pass from the "
                "loss reached the model before those steps (the loss does not depend on the model's weights)"]
    if c.cause == Cause.LOSS_PLATEAU and k == "cleared":
        return [f"the weights never learned: at {f['steps']} of the {f['checked']} optimizer steps checked, the "
                "model's weights held no gradient, though a backward pass had reached them before the step: the "
                "gradients were cleared in between"]
    if c.cause == Cause.LOSS_PLATEAU and k == "weights_collapse":
        return [f"the weights shrink toward zero: by step {c.step} they are {fmt(f['weight_scale'])}x their size at "
                "the start (a weight decay, or an L2 penalty, strong enough to hold them there)"]
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "decayed":
        lines = [f"the learning rate falls from {fmt(f['lr_peak'])} from step {c.step} on, to {fmt(f['lr_low'])} "
                 f"({fmt(f['factor'])}x lower): the schedule ends learning before the loss has come down"]
        if f.get("stopped"):
            at, level, start = f["stopped"]
            lines.append(f"the loss stops coming down at step {at}, at {fmt(level)} (from {fmt(start)}), and stays "
                         "there to the end")
        if f["negligible_from"] is not None:
            lines.append(f"updates are negligible next to the weights from step {f['negligible_from']}")
        return lines
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "clipped":
        lines = [f"the gradients are clipped to {fmt(100 * f['kept'])}% of their norm before the optimizer steps "
                 f"(median of {f['samples']} sampled steps; their norm is ~{fmt(f['norm'])} before the clip): the "
                 f"updates are that much smaller than the learning rate ({fmt(ctx.lr)}) would make them"]
        scaled = clipped_scaled(c, ctx)
        if scaled == scaled:
            lines.insert(0, f"the loss is multiplied by {int(scaled)} before backward (a GradScaler's "
                            "scale(loss)): the clip acts on gradients that large, and the scaler divides what is "
                            "left by as much again")
        return lines
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "group":
        return [f"the parameter group holding {layer_list(f['layers'])} steps with lr {fmt(f['lr_group'])}, another "
                f"with {fmt(f['lr_other'])}: over the {ctx.last_step + 1} steps of the run its layers moved at most "
                f"{fmt(100 * f['moved'])}% of their norm, the other group's up to {fmt(100 * f['others_moved'])}%"]
    if c.cause == Cause.LEARNING_RATE_TOO_LOW:
        lines = ([f"over the {ctx.last_step + 1} steps of the run the weights moved at most {fmt(100 * f['moved'])}% "
                  f"of their norm (`{f['layer']}`, the layer that moved most, lr {fmt(f['lr'])})"] if k == "still" else
                 [] if k == "held" else
                 [f"updates are negligible from step {c.step}: the largest is typically {fmt(f['update_typical'])} x "
                  f"the weights per step (lr {fmt(ctx.lr)})"])
        if (hold := ctx.schedule_hold()) == hold:
            lines.insert(0, f"a schedule holds the learning rate at {_held_where(ctx, hold)}"
                            + (f", still raising it (x{fmt(ctx.lr_rising)} so far)" if ctx.lr_rising == ctx.lr_rising
                               else "") + ", and it never came nearer")
        if f.get("divided", math.nan) == f.get("divided"):
            lines.insert(0, f"the loss's gradient at the output is ~{fmt(1 / f['divided'])}x a mean's: the loss is "
                            f"divided by ~{f['divided']:.0f} before backward, and under {ctx.optimizer} every step "
                            "shrinks as much")
        return lines
    return []


def _ranks_text(ranks: list[int], world: int) -> str:
    if len(ranks) == world:
        return "every rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def _verb(who: str, verb: str) -> str:
    """``who`` and ``verb`` agreeing: "every rank sees", "ranks 0 and 2 see"."""
    return f"{who} {verb}" if who.startswith("ranks ") else f"{who} {verb}s"


def _rank_lines(c: Candidate, ctx: Context) -> list[str]:
    f = c.facts
    if c.cause == Cause.RANK_DATA:
        v = f["values"]
        lines = [f"the batches of {_ranks_text(f['ranks'], f['world'])} are {fmt(v.get('ratio', math.nan))}x the "
                 f"scale of the other ranks' (input RMS {fmt(v.get('input_rms', math.nan))} against "
                 f"{fmt(v.get('others_rms', math.nan))}) from step {c.step}"]
        if f["bn"]:
            lines.append(f"the BatchNorm statistics of {names(f['bn'])} differ across ranks")
        return lines
    if c.cause == Cause.DUPLICATE_DATA:
        lines = []
        rep = f["repeated"]
        rep_text = (f"{_verb(_ranks_text(f['rep_ranks'], f['world']), 'see')} the same batches in the same "
                    f"order every {int(rep[0].values.get('period', 0))} steps from step {rep[0].step}: each epoch "
                    "repeats the one before") if rep else ""
        if f["shared"]:
            e = f["shared"][0]
            world = f["world"]
            groups = f["groups"] or [tuple(range(world))]
            who = "; ".join(_ranks_text(list(g), world) for g in groups)
            copies = max(len(g) for g in groups)
            lines += [f"{_verb(who, 'train')} on the same batches ({e.values.get('share', math.nan):.0%} of the steps "
                      f"compared) from step {e.step}",
                      f"the all-reduce averages {copies} copies of the same gradient: {world} processes do the work of "
                      f"{world - sum(len(g) - 1 for g in groups)}, each epoch covers only part of the data"]
            if rep_text:
                lines.append(rep_text)
            return lines
        return [rep_text, "the model meets the data in one fixed order, epoch after epoch: the batches are no "
                          "longer a fresh random sample"]
    if c.cause == Cause.REPLICA_DIVERGENCE:
        onset = f["onset"]
        where = f"all {len(f['names'])} weight layers" if c.layer == "" else layer_list(f["names"])
        rel = max(e.values.get("divergence", 0.0) for e in onset)
        lines = [f"the weights of {where} on {_ranks_text(f['ranks'], f['world'])} differ from rank "
                 f"{f['reference']}'s (relative {fmt(rel)}) from step {c.step}"]
        if _replicas_synced(c, ctx):
            lines.append("their gradients after the all-reduce are the same on every rank: the weights are changed "
                         "outside the synchronised update")
        else:
            lines.append("their gradients after the all-reduce differ across ranks: these parameters are not "
                         "synchronised")
        lines.append("the replicas compute different functions: each rank's loss and gradients drift away from the "
                     "others'")
        return lines
    if c.cause == Cause.BATCHNORM_RANK_MISMATCH:
        return [f"the running statistics of {layer_list(f['names'])} differ across ranks by "
                f"{fmt(max(x.values.get('spread', 0.0) for x in c.events))} running standard deviations from step "
                f"{c.step}",
                "each rank normalises with the statistics of its own batches and keeps its own running estimates "
                "(BatchNorm is not synchronised across ranks)",
                "the model behaves differently in evaluation depending on the rank whose weights are saved"]
    world = f["world"]
    return [f"the gradient after the all-reduce is {fmt(f['ratio'])}x the mean of the ranks' own gradients from "
            f"step {c.step} (world size {world}): it is summed over the ranks, not averaged",
            f"every update is up to {world}x larger than one process would take, and changes with the number of "
            "processes"]


def _replicas_synced(c: Candidate, ctx: Context) -> bool:
    return all(e.values.get("grad_divergence", 0.0) <= ctx.th.replica_divergence for e in c.facts["onset"])


def _rank_fix(c: Candidate, ctx: Context) -> str:
    f = c.facts
    if c.cause == Cause.RANK_DATA:
        return (f"check the data pipeline of rank {f['rank']}: the shard it reads is scaled differently "
                "(unnormalised pixels, another preprocessing, a corrupt file); normalise every shard the same way "
                "(the same mean and std) and check a batch's scale where it is loaded")
    if c.cause == Cause.DUPLICATE_DATA:
        if c.kind == "shared":
            return ("give each rank its own part of the data: DataLoader(dataset, batch_size=..., "
                    "sampler=torch.utils.data.distributed.DistributedSampler(dataset)) (the sampler shuffles; no "
                    "shuffle=True on the loader), and call sampler.set_epoch(epoch) at the start of every epoch")
        return ("call sampler.set_epoch(epoch) at the start of every epoch (a DistributedSampler draws the same order "
                "again until told the epoch), or shuffle at all (DistributedSampler(dataset, shuffle=True))")
    if c.cause == Cause.REPLICA_DIVERGENCE:
        if _replicas_synced(c, ctx):
            return (f"find what changes the weights of rank {f['rank'] if f['rank'] is not None else f['ranks'][0]} "
                    "outside optimizer.step(): a rank-dependent in-place edit (if rank == ...: p.data ...), a per-rank "
                    "optimizer setting (learning rate, weight decay), or a checkpoint loaded on one rank only; to "
                    "resynchronise, broadcast rank 0's weights (dist.broadcast(p.data, src=0) for every parameter)")
        return ("wrap the model in DistributedDataParallel after every parameter exists and sits on its device (DDP "
                "synchronises only the parameters it saw when it was built), and keep them out of "
                "_ddp_params_and_buffers_to_ignore")
    if c.cause == Cause.BATCHNORM_RANK_MISMATCH:
        return ("synchronise BatchNorm across ranks: model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before "
                "DistributedDataParallel(model) (keeping broadcast_buffers=True, the default); if ranks read different "
                "kinds of data, shuffle it across them (DistributedSampler)")
    return ("DistributedDataParallel already averages the gradients: remove the extra dist.all_reduce of the "
            "gradients (or divide its result by dist.get_world_size()), and do not scale the loss by the world size")


def _attention_lines(c: Candidate, ctx: Context) -> list[str]:
    f = c.facts
    lines = []
    if not ctx.warmed_up() and ctx.lr_first == ctx.lr_first:
        lines.append(f"the learning rate is {fmt(ctx.lr_first)} from the first step, with no warm-up")
    growth = f["logit_growth"]
    if growth == growth and growth > 1:
        lines.append(f"the largest attention logit of `{c.layer}` grows from {fmt(f['first_logit'])} to "
                     f"{fmt(f['max_logit'])} ({fmt(growth)}x) by step {c.events[0].step}")
    others = [n for n in f["layers"] if n != c.layer]
    if c.kind == "collapsed":
        lines.append(f"the attention of `{c.layer}` collapses from step {c.events[0].step}: its entropy falls to "
                     f"{f['entropy']:.0%} of log(keys), each query attends to one or two keys"
                     + (f"; so does {layer_list(others)}" if others else ""))
    else:
        also = f" (so do those of {layer_list(others)})" if others else ""
        lines.append(f"the logits grow without bound{also}; "
                     f"the entropy is down to {f['entropy']:.0%} of log(keys)")
    return lines


def _precision_lines(c: Candidate, ctx: Context) -> list[str]:
    f = c.facts
    lines = []
    first, origin, skipping, overflow = f["first"], f["origin"], f["skipping"], f["overflow"]
    if first is not None:
        v = first.values
        lines.append(f"the output of `{first.layer}` reaches {fmt(v.get('act_absmax', math.nan))} at step "
                     f"{first.step}, {v.get('range_used', math.nan):.0%} of the largest value its dtype holds")
    if origin is not None:
        lines.append(f"fp16 overflow: under float16 autocast, {origin.where()} exceeds {fmt(FP16_MAX)} at step "
                     f"{origin.step} and becomes Inf")
    if skipping is not None:
        v = skipping.values
        low = v.get("lowest_scale", math.nan)
        scale = f" (its loss scale falls to {fmt(low)})" if low == low else ""
        if origin is None and overflow is not None:
            lines.append(f"NaN/Inf first in {overflow.where()} ({overflow.phase}) at step {overflow.step}")
        lines.append(f"the loss scaler skips {int(v.get('run_length', 0))} optimizer steps in a row from step "
                     f"{int(v.get('run_start', c.step))}{scale}: no scale fixes it, the model does not train")
    return lines


def _init_lines(c: Candidate, ctx: Context) -> list[str]:
    f, k = c.facts, c.kind
    if k == "outputs":
        return [f"the loss at step {c.step}, before any update, is {fmt(f['loss'])}: {fmt(f['ratio'])}x what a uniform "
                f"guess over the classes gives ({fmt(f['uniform'])}), so the model's outputs start far out of scale",
                *symptom_lines(c.symptoms, 2)]
    if k == "symmetric":
        held = " and ".join(fmt(v) for v in f["values"])
        lines = [f"at step {c.step}, {layer_list(f['layers'])} start with all their weights equal ({held}), one "
                 "feeding the next: every unit of a layer computes the same output and gets the same gradient, so "
                 "the units stay identical (each layer learns as if it had one unit)"]
        if 0.0 in f["values"]:
            lines.append("zero weights pass no gradient back: the layers before them do not learn at all")
        pruned = _pruned(c, ctx)
        if pruned:
            lines.append(f"a pruning mask (torch.nn.utils.prune) holds {layer_list(list(pruned))} at 0: it removes "
                         + ", ".join(f"{share:.0%} of `{n}`'s weights" for n, share in pruned.items()))
        return lines
    if k == "recurrent" and f.get("time_growth", math.nan) >= ctx.th.layer_gain and not (
            f["recurrent_scale"] > ctx.th.layer_gain or f["recurrent_scale"] < 1 / ctx.th.layer_gain):
        return [f"at step {c.step}, the gradient reaching `{c.layer}`'s input grows {fmt(f['time_growth'])}x back "
                f"through its {f.get('steps_in_time', 0)} time steps: its recurrent (hidden-to-hidden) weights, as "
                f"initialised ({fmt(f['recurrent_scale'])}x the spread of the default init), grow the state at every "
                "step (a spectral radius above 1)",
                "the state and its gradient explode with the sequence's length, and the first updates with them"]
    if k == "recurrent":
        r = f["recurrent_scale"]
        return [f"at step {c.step}, `{c.layer}` starts with recurrent (hidden-to-hidden) weights {fmt(r)}x the spread "
                "of the default init",
                "applied once per time step, they grow the hidden state until its units saturate or overflow"
                if r > 1 else "applied once per time step, they erase the hidden state: only the last steps reach "
                "the output, and the gradient through time vanishes"]
    if k == "saturating":
        kinds = sorted({ctx.layers[n].type_name for n in f["saturated"] if n in ctx.layers})
        fr = f["fractions"]
        return [f"at step {c.step}, {_weights_of(f['layers'])} start with weights too large for the "
                f"{'/'.join(kinds)} after them" + (", applied once per step of a loop in the forward (a recurrence)"
                                                   if _in_loop(f["saturated"], ctx) else ""),
                f"{min(fr):.0%}-{max(fr):.0%} of the outputs of {layer_list(f['saturated'])} are pinned at their "
                "bounds "
                f"from step {c.step}"]
    group = c.events
    ws = f.get("weight_scale", math.nan)
    if k == "shrinks" and ws == ws and ws < 1 / ctx.th.layer_gain:
        who = f"`{c.layer}` starts" if c.layer else f"{len(group)} layers ({names(group)}) start"
        return [f"at step {c.step}, {who} with weights {fmt(ws)}x the spread of PyTorch's default init: the "
                "signal rides on the biases, and the gradient through the weights all but vanishes"]
    if c.layer:
        what = ("its bias: its outputs sit at an offset larger than their spread" if f["biased"] else
                "its weight scale")
        line = f"at step {c.step}, `{c.layer}` {k} its input's scale (RMS) {fmt(f['gain'])}x ({what})"
    else:
        gs = [e.values.get("gain", math.nan) for e in group]
        finite = [g for g in gs if g == g]
        plural = "shrink" if k == "shrinks" else "amplify"
        line = (f"at step {c.step}, {len(group)} layers ({names(group)}) each {plural} the signal "
                f"{fmt(min(finite, default=math.nan))}-{fmt(max(finite, default=math.nan))}x "
                + (f"(the biases of {layer_list(f['biased_layers'])}: their outputs sit at an offset larger than "
                   "their spread)" if f["biased"] else "(their weight scale)"))
    deep = f["compounded"]
    if deep == deep and (deep > ctx.th.layer_gain or deep < 1 / ctx.th.layer_gain):
        since = "the last normalisation layer before it" if f["after_norm"] else "the input"
        line += f"; compounded, the scale reaching `{group[-1].layer}` is {fmt(deep)}x that of {since}"
    return [line]


def symptom_lines(events: list[SemanticEvent], limit: int = 4) -> list[str]:
    """One line per kind of symptom (signal and state), naming the layers and the first step."""
    groups: dict[tuple, list[SemanticEvent]] = {}
    for e in events:
        groups.setdefault((e.signal, e.after), []).append(e)
    lines = []
    for (signal, state), evs in list(groups.items())[:limit]:
        if signal in (Signal.LOSS, Signal.TARGET):
            lines.append(loss_text(evs[0]))
        elif signal == Signal.FINITE:
            lines.append(f"NaN/Inf in {names(evs)} from step {min(e.step for e in evs)}")
        else:
            where = f" in {names(evs)}" if any(e.layer for e in evs) else ""  # (the model as a whole: the updates)
            lines.append(f"{signal} {state}{where} from step {min(e.step for e in evs)}")
    return lines


def _scales_gradients(root: Candidate) -> bool:
    """A root whose effect is a gradient out of scale (an input, targets, weights or a module's gain)."""
    return (root.cause in (Cause.BAD_INITIALIZATION, Cause.EXPLODING_GRADIENTS)
            or root.cause == Cause.DATA and root.kind in ("unscaled", "targets_out_of_reach"))


def _summary(c: Candidate, ctx: Context, root: Candidate) -> str:
    """The one line an explained candidate contributes to its root's chain."""
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and c.facts.get("large"):
        return _update_line(c.facts["large"][0], ctx, "the gradients, and so the updates, are as out of scale"
                            if _scales_gradients(root) else "")
    if c.cause == Cause.NON_FINITE and c.kind not in ("fp16_overflow", "skipping", "near_limit"):
        origin = c.facts.get("origin")
        where = origin.where() if origin is not None and origin.op else (f"`{c.layer}`" if c.layer else "the model")
        if c.kind == "loss_op":
            return f"non_finite: NaN/Inf first produced by the loss's {f_op(c.facts['op'])} at step {c.step}"
        return f"non_finite: NaN/Inf first produced in {where} ({c.facts.get('phase', 'forward')}) at step {c.step}"
    if c.cause == Cause.ATTENTION_COLLAPSE:
        return _attention_lines(c, ctx)[-1] + " (a symptom: the updates are still too large)"
    if c.cause == Cause.LOSS_PLATEAU and c.events and c.events[0].signal in (Signal.LOSS, Signal.TARGET):
        return loss_text(c.events[0])
    own = _own(c, ctx)
    return own[0] if own else symptom_lines(c.events, 1)[0]


# optimizers that add the weight decay to the gradient and then normalise the step: the decay's pull does not
# scale with lr x weight_decay there (a weight with no gradient from the loss moves ~lr a step toward zero)
_COUPLED = frozenset({"Adam", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop", "Adadelta"})


def _decay_per_step(kind: str, decay: float, momentum: float) -> float:
    """What a weight decay takes off the weights per unit of learning rate, where it does not depend on the
    gradient: ``decay`` (AdamW's, decoupled), over 1 - momentum for SGD (the decay joins the gradient, and its
    momentum sums ~1 / (1 - momentum) of them); NaN for a normalising optimizer's."""
    if kind in _COUPLED or not decay > 0:
        return math.nan
    if kind == "SGD" and 0 <= momentum < 1:
        return decay / (1.0 - momentum)
    return decay


def _decay_accounts(c: Candidate, ctx: Context, decay: float) -> bool:
    """The optimizer's weight decay can account for the weights' collapse: a normalising optimizer's, or one
    (SGD's, AdamW's: ``_decay_per_step``) that alone shrinks the weights by weight_shrinking or more,
    between the start of the shrink and the collapse (a default AdamW decay of 0.01 cannot: another pull
    holds them down)."""
    if ctx.optimizer_kind in _COUPLED:
        return True
    lr = ctx.lr_peak if ctx.lr_peak == ctx.lr_peak else ctx.lr
    steps = max(c.step - c.since, 1)
    per = _decay_per_step(ctx.optimizer_kind, decay, ctx.optimizer_momentum)
    return lr == lr and per == per and lr * per * steps >= math.log(ctx.th.weight_shrinking)


def _beyond(f: dict) -> str:
    """Where a bounded output's blocked entries are pushed: below its low bound, or past one of its bounds."""
    if not math.isfinite(f["high"]):
        return f"below {fmt(f['low'])}"
    return f"below {fmt(f['low'])} or above {fmt(f['high'])}"


def _frozen(ctx: Context) -> tuple[list[str], float] | None:
    """The frozen weight layers (no parameter requires a gradient), in forward order, when they hold most of the
    model's weights, with their share of them; None otherwise."""
    weights = [info for name, info in ctx.layers.items() if info.n_params > 0 and name in ctx.rank]
    total = sum(info.n_params for info in weights)
    frozen = [info for info in weights if info.frozen]
    share = sum(info.n_params for info in frozen) / total if total else 0.0
    if share <= 0.5:
        return None
    return sorted((info.name for info in frozen), key=ctx.rank.__getitem__), share


def f_op(op: str) -> str:
    """An operation of the loss as the code writes it: "Log of Sigmoid" -> "log of a sigmoid"."""
    name, _, of = op.partition(" of ")
    return f"{name.lower()} of a {of.lower()}" if of else name.lower() if name[:1].isupper() else name


def _loss_op_lines(c: Candidate) -> list[str]:
    origin = c.facts["origin"]
    name, _, of = c.facts["op"].partition(" of ")
    lines = []
    if of and c.facts.get("rescaled"):  # the outputs' own range says nothing of what the probability sees
        how = ("fills some of the model's outputs (a mask set to -1e9 or -inf)" if c.facts["rescaled"] == "filled"
               else "scales the model's outputs (a temperature, a factor)")
        lines.append(f"at step {c.step} the loss {how} before their "
                     f"{of.lower()}, which rounds to exactly {'0 or 1' if of == 'Sigmoid' else '0 for some classes'} "
                     f"in {origin.dtype or 'float32'}")
        lines.append(f"the loss takes the {name.lower()} of it: {name.lower()}(0) is -inf, and 0 x -inf is NaN")
    elif of and len(origin.reach) == 2:
        absmax, spread = origin.reach
        size = (f"outputs up to {fmt(absmax)} in magnitude" if of == "Sigmoid" else
                f"outputs {fmt(spread)} apart within a row")
        lines.append(f"at step {c.step} the model's {size}: their {of.lower()} rounds to exactly "
                     f"{'0 or 1' if of == 'Sigmoid' else '0 for some classes'} in {origin.dtype or 'float32'}")
        lines.append(f"the loss takes the {name.lower()} of it: {name.lower()}(0) is -inf, and 0 x -inf is NaN")
    elif name in _OVERFLOWING:
        import torch
        dtype = origin.dtype or "float32"
        top = torch.finfo(getattr(torch, dtype, torch.float32)).max
        lines.append(f"at step {c.step} the model's output is finite; the loss's {f_op(c.facts['op'])} overflows "
                     f"to Inf (in {dtype}, exp(x) does for x above {math.log(top):.1f}), and Inf / Inf or "
                     "Inf - Inf is NaN")
    else:
        lines.append(f"at step {c.step} the model's output is finite; the loss's {f_op(c.facts['op'])} turns it "
                     "into NaN/Inf (outside its domain: a log of 0 or less, a division by 0, a square root at 0)")
    lines.append("the loss and all gradients become NaN")
    return lines


_OVERFLOWING = frozenset({"Exp"})

_LOSS_OP_FIX = {
    "Log of Sigmoid": "compute the loss from the logits: F.binary_cross_entropy_with_logits(logits, y) (or "
                      "F.logsigmoid(x) and F.logsigmoid(-x) for log p and log(1 - p)), which never round to 0; or "
                      "clamp p to [1e-7, 1 - 1e-7] before the log",
    "Log of Softmax": "compute the loss from the logits: F.cross_entropy(logits, y), or F.log_softmax(logits, dim=1) "
                      "instead of torch.log(F.softmax(...)), which never rounds to 0; or clamp p with "
                      "p.clamp_min(1e-7) before the log",
    "Log": "keep what the log is taken of above 0: torch.log(x.clamp_min(1e-8)), or make it positive by "
           "construction (F.softplus, the exp of a log-parameter)",
    "Div": "keep the denominator off 0: x / (d + 1e-8) (or d.clamp_min(1e-8))",
    "Reciprocal": "keep the denominator off 0: 1 / (d + 1e-8) (or d.clamp_min(1e-8))",
    "Sqrt": "keep the square root's argument above 0: torch.sqrt(x.clamp_min(1e-12)) (NaN below 0, an infinite "
            "gradient at 0)",
    "Rsqrt": "add an eps inside (torch.rsqrt(x + 1e-12)): it is infinite at 0",
    "Pow": "keep the base off 0 (a fractional power's gradient is infinite there) and its result in range: "
           "(x + 1e-12) ** p",
    "Exp": "exp overflows: compute in log space (torch.logsumexp, F.softplus, or F.cross_entropy of the scores "
           "for a softmax written by hand), or clamp its argument; a temperature that divides the scores first "
           "may be too small",
}


# operations whose NaN, made of finite or -Inf scores, is a row of scores masked everywhere
_MASKED_OPS = frozenset({"F.softmax", "F.scaled_dot_product_attention", "F.multi_head_attention_forward"})


def _loss_op_fix(op: str) -> str:
    if op in _LOSS_OP_FIX:
        return _LOSS_OP_FIX[op]
    name = op.partition(" of ")[0].rpartition(".")[2]  # "torch.sqrt", as a replayed step names it: "Sqrt"
    name = name[:1].upper() + name[1:]
    if name in _LOSS_OP_FIX:
        return _LOSS_OP_FIX[name]
    return (f"guard the loss's {f_op(op)}: clamp its input into its domain (x.clamp_min(1e-8) before a log or "
            "sqrt, an eps in a denominator), or use the library's stable loss on the logits (F.cross_entropy, "
            "F.binary_cross_entropy_with_logits)")


def _falls(f: dict) -> str:
    return (f"the loss starts at {fmt(f.get('start', math.nan))} and falls below zero, down to "
            f"{fmt(f.get('lowest', math.nan))}" + (", still falling as fast" if f.get("still_falling") else ""))


_UNBOUNDED = {
    "negated": "a minus sign stands before a loss that cannot be negative (-F.cross_entropy, -F.mse_loss ...): "
               "minimising it maximises the error, and the model pushes its outputs away from the targets without "
               "limit",
    "swapped": "the model's output is given to the loss as its target and the targets as its input (the arguments "
               "swapped): the loss is linear in the output, with no floor, and the model pushes it without limit",
    "nll_not_log": "nll_loss is given outputs that are not log-probabilities (no log_softmax before it): it reads "
                   "-output[target], which has no floor, and the model pushes the targets' outputs up without limit",
    "log_likelihood": "the loss is the log-probability of the targets, minimised as it is (its minus sign missing): "
                      "log p falls without limit as the model makes the targets ever less likely",
    "scaled": "the loss is a cross-entropy or an error that no target takes below zero, multiplied by a factor (a "
              "weight of -1, an advantage or a reward): the factor makes it negative, and nothing bounds it below",
    "hand_term": "the loss adds to a squared or absolute error, which no target takes below zero, a term written by "
                 "hand on the outputs (a KL divergence, a penalty): that term falls without floor, and the model "
                 "pushes its outputs without limit",
}
_UNBOUNDED_FIX = {
    "negated": "remove the minus sign before the loss: minimise the loss itself (to maximise a score, negate the "
               "score, not a loss)",
    "swapped": "give the loss the model's output first and the targets second: "
               "F.binary_cross_entropy_with_logits(logits, targets) (nn.BCEWithLogitsLoss()(logits, targets))",
    "nll_not_log": "give nll_loss log-probabilities: F.nll_loss(F.log_softmax(logits, dim=1), y), or "
                   "F.cross_entropy(logits, y) on the raw outputs",
    "log_likelihood": "negate the log-likelihood: loss = -log_probs.gather(1, y[:, None]).mean() (or "
                      "F.nll_loss(log_probs, y), or F.cross_entropy(logits, y) on the raw outputs)",
    "scaled": "check the sign of the factor that multiplies the loss: a loss to minimise needs a non-negative "
              "weight (for a policy gradient weighted by advantages, a value that falls without end is no sign "
              "of progress: normalise the advantages and watch the return)",
    "hand_term": "check the term added by hand to the error: its sign (a VAE's KL divergence, -0.5 * sum(1 + "
                 "logvar - mu^2 - logvar.exp()), is added to the reconstruction, not subtracted), and what it takes "
                 "a log of (a variance bounded below: F.softplus(v) + 1e-6)",
}


_ON_PROBABILITIES = {
    LossMisuse.SOFTMAX_TWICE: "the loss applies a log-softmax to the output of a softmax (cross_entropy on "
                              "probabilities: a softmax applied twice): it cannot reach its minimum, and its "
                              "gradient fades as the outputs sharpen",
    LossMisuse.NLL_OF_PROBABILITIES: "the loss is an NLL of probabilities (nll_loss on a softmax or sigmoid output, "
                                     "without the log): bounded between -1 and 0, its gradient fades as the "
                                     "outputs sharpen",
    LossMisuse.LOGITS_LOSS_ON_PROBABILITIES: "a loss that takes logits is given probabilities (a with-logits loss, or "
                                             "cross_entropy, on a sigmoid output): it cannot reach its minimum, "
                                             "and its gradient fades as the outputs sharpen",
    LossMisuse.LOGITS_BOUNDED: "the logits pass through an activation before the loss (a ReLU, ReLU6, tanh, "
                               "hardtanh or softplus after the last layer): cut at 0 or held in [-1, 1], "
                               "they cannot take the values the loss needs (a ReLU gives a logit below 0 no "
                               "gradient at all)",
    LossMisuse.NORMALISED_OVER_BATCH: "the loss is an NLL of a log-softmax taken over another dimension than the "
                                      "classes (dim=0: over the batch): it compares samples with each other, not "
                                      "classes, and cannot reach its minimum",
}
_ADD_POSITIONS = ("h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device)), with self.pos = "
                  "nn.Embedding(max_len, d_model)")
_ON_PROBABILITIES_FIX = {
    LossMisuse.SOFTMAX_TWICE: "give cross_entropy the logits: remove the final nn.Softmax / F.softmax (apply it only "
                              "to read probabilities), or use F.nll_loss(torch.log_softmax(...))",
    LossMisuse.NLL_OF_PROBABILITIES: "give nll_loss log-probabilities: F.log_softmax instead of F.softmax (or "
                                     "F.cross_entropy on the logits)",
    LossMisuse.LOGITS_LOSS_ON_PROBABILITIES: "remove the sigmoid or softmax before the loss: cross_entropy and "
                                             "binary_cross_entropy_with_logits take logits and apply their own "
                                             "(or, for a binary target, F.binary_cross_entropy on a sigmoid's "
                                             "probabilities)",
    LossMisuse.LOGITS_BOUNDED: "remove the activation after the last layer: give the loss the last layer's raw "
                               "output (cross_entropy and binary_cross_entropy_with_logits apply their own "
                               "softmax or sigmoid)",
    LossMisuse.NORMALISED_OVER_BATCH: "take the log-softmax over the classes: F.log_softmax(logits, dim=1) (dim=-1 "
                                      "for (batch, classes) outputs), or F.cross_entropy on the logits",
}


def chain(root: Candidate, ctx: Context) -> list[str]:
    lines = _own(root, ctx)
    named = root.events + root.symptoms
    # what follows, in the order it happened: the candidates it explains and its first two loss failures
    after = [(c.step, 0, c.family, _summary(c, ctx, root)) for c in root.explained()
             if not (c.events and all(any(e is n for n in named) for e in c.events))]  # (else its own lines say it)
    after += [(e.step, 1, 0, loss_text(e)) for e in sorted(root.loss, key=lambda e: e.step)[:2]]
    for *_, line in sorted(after, key=lambda t: t[:3]):
        if line not in lines:
            lines.append(line)
    return lines


# -- fixes -------------------------------------------------------------------------------------------------------

def fix(c: Candidate, ctx: Context, *, lr_way: str = "") -> str:
    """The change to try first. ``lr_way``: "lower" when the run says the updates were too large (never raise
    the lr), "raise" when a learning rate too low is the confident verdict (never lower it), else ""."""
    f, k = c.facts, c.kind
    lr, lr10 = ctx.lr_text()
    may_lower = lr_way != "raise"
    # the rate a fix that lowers it starts from: the peak, where a schedule brought the rate down from it (a
    # one-cycle, a decay, to 0 too), not what the run ends at
    # with parameter groups at different rates, the group whose layers moved most (its rate is the one quoted)
    group = ctx.lr_group()
    where = f"`{group[1]}`'s parameter group" if group is not None else ""
    high, high10 = (f"{lr} ({where})" if where else lr), lr10
    peak = ctx.lr_peak
    # (the peak is the first group's, whose rate is the one recorded: quoted for it alone)
    if (peak == peak and ctx.lr == ctx.lr and peak > 0 and peak >= ctx.th.lr_jump * ctx.lr
            and (group is None or group[0] == ctx.lr)):
        high, high10 = (f"{number(peak)} (its peak, {number(ctx.lr)} at the end{'; ' + where if where else ''})",
                        number(peak / 10))
    if c.cause.multi_rank:
        return _rank_fix(c, ctx)
    if c.cause == Cause.DATA:
        if k == "input_nonfinite":
            return (f"the batch at step {c.step} carries NaN/Inf in the input: find it in the data pipeline "
                    "(assert torch.isfinite(x).all()), then drop or impute those samples")
        if k == "loss_empty":
            return ("check that the batches hold targets the loss counts: with ignore_index (-100 by default), "
                    "padding or masking must leave some real targets in every batch (a label shift or a "
                    "tokeniser that maps every label to -100 leaves none); skip an empty batch or mask before "
                    "taking the mean")
        if k == "loss_nonfinite":
            return (f"check the targets of the batch at step {c.step} (assert torch.isfinite(y).all()) and that they "
                    "are in the loss's domain (class indices in range, probabilities in [0, 1]); mask or drop samples "
                    "with NaN targets")
        if k == "constant" and f.get("input_spread", 0.0) > 0:
            return ("normalise each feature with statistics measured on the input as it is fed, x = (x - mean) / std "
                    "over the training set (not the statistics of another scale: ImageNet's mean and std are for "
                    "pixels in [0, 1], not 0-255, and the reverse), so that the samples differ by about 1: check "
                    "that x.std(0).mean() on a batch is near 1")
        if k == "constant" and f.get("input_std", 0.0) > 0:
            return ("check that the dataset's __getitem__ uses its index (return self.x[idx], not self.x[0] or a "
                    "sample kept from an earlier call) and that the batch is not one sample repeated (x[0].expand, "
                    "x.repeat, a broadcast): assert not (x == x[:1]).all() on a batch before the model")
        if k == "constant":
            return ("find where the data pipeline replaces the input by a constant (a scale or mask that multiplies "
                    "it by 0, a normalisation by a statistic of the wrong axis, features read from an empty column, "
                    "an augmentation that blanks the image): assert x.std() > 0 on a batch before the model")
        if k == "unscaled" and f.get("outlier"):
            return (f"find the batch of step {c.step} in the data pipeline and fix or drop its samples (a corrupt "
                    "file, values in other units); guard the loop (skip a batch whose x.abs().max() is far above the "
                    "others') and clip gradients (max_norm=1.0) so one bad batch cannot undo training")
        if k == "input_small":
            return (f"normalise the input per feature with the training set's mean and std, x = (x - mean) / std "
                    f"(its RMS is now {fmt(f['input_rms'])}): check its units, and that images are divided by 255 "
                    "only once; not a smaller weight init: the weights are at their default scale")
        if k == "unscaled":
            m, s, a = f.get("input_mean", math.nan), f.get("input_std", math.nan), f.get("input_absmax", math.nan)
            shift = f"x + {fmt(-m)}" if m < 0 else f"x - {fmt(m)}"
            # per feature: one column in other units inflates the whole batch's spread, and dividing every
            # feature by it would squash the others
            # targets out of the outputs' reach as well (raw values predicted from raw values): an input
            # normalised alone leaves the loss as far from its targets
            far = ctx.all(Signal.TARGET, TargetState.OUT_OF_REACH)[:1]
            targets = "".join(f"; the targets too (~{fmt(ev.values['reach'] * ev.values['output_rms'])}, out of the "
                              "outputs' reach): standardise them the same way, y = (y - mean) / std, and invert it on "
                              "the predictions" for ev in far)
            return (f"normalise the input per feature (per channel for images) with the training set's mean and "
                    f"std, x = (x - mean) / std (this batch overall: ({shift}) / {fmt(s)})" +
                    ("; for 0-255 images, divide by 255 first, then subtract the per-channel mean and divide by the std"
                     if a == a and 200 <= a <= 256 else
                     "; images divided by 255 twice land at values up to 1/255: divide once"
                     if a == a and 0 < a <= 1.01 / 255 else "") + targets)
        if k == "targets_broadcast":
            return ("give the outputs and the targets the same shape before the loss: out.squeeze(-1) or "
                    "y.view_as(out) (torch warns: 'Using a target size ... different to the input size')")
        if k == "padding_counted":
            return ("leave the padding out of the loss: labels = input_ids.masked_fill(attention_mask == 0, -100) "
                    "(-100 is what the loss ignores; a DataCollatorForLanguageModeling(tokenizer, mlm=False) does "
                    "it), or ignore_index=pad_token_id in a loss of your own")
        if k == "targets_several" and f.get("loss") == "bce_softmax":
            return ("give each label its own probability: remove the softmax and train with "
                    "F.binary_cross_entropy_with_logits (nn.BCEWithLogitsLoss) on the raw outputs (a sigmoid per "
                    "label), and predict each label with out > 0")
        if k == "targets_several":
            return ("for several labels per sample, train with F.binary_cross_entropy_with_logits "
                    "(nn.BCEWithLogitsLoss) on the raw outputs and predict each label with out > 0; for one label per "
                    "sample, pass class indices (or targets that sum to 1 per row)")
        if k == "norm_batch":
            return (f"give `{c.layer}` more values per channel: train with larger batches (16 rows or more; "
                    "drop_last=True in the DataLoader if only a last batch is that small), or normalise each "
                    "sample alone with nn.LayerNorm / nn.GroupNorm in its place")
        if k == "mixed":
            where = f"`{c.layer}`" if c.layer else "the module that mixes them"
            return (f"give {where} the batch in the layout it expects: nn.LSTM / nn.GRU / nn.RNN / "
                    "nn.MultiheadAttention / nn.Transformer* take (time, batch, features) unless built with "
                    "batch_first=True, so pass batch_first=True (or x.transpose(0, 1) in and out); a reshape between "
                    "layouts needs a transpose or permute, not a view")
        if k == "sees_ahead":
            return ("mask the attention to later positions: a causal mask, mask=nn.Transformer."
                    "generate_square_subsequent_mask(T) with is_causal=True for nn.TransformerEncoder / "
                    "nn.TransformerDecoderLayer, F.scaled_dot_product_attention(q, k, v, is_causal=True), or, written "
                    "by hand, scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf')) "
                    "before the softmax; a mask already given may have the other convention: a bool attn_mask is True "
                    "where attention is blocked (triu, not tril), a float one is added to the scores (-inf where "
                    "blocked, not 0/1), and a softmax written by hand must run over the keys (dim=-1): over the "
                    "queries (dim=-2) it mixes later positions in under any mask; a bidirectional model is trained on "
                    "masked tokens, not the next ones")
        if k == "shifted_twice":
            return ("shift the labels once: give a model that shifts them itself (GPT2LMHeadModel, the *ForCausalLM "
                    "models) labels=input_ids as they are (padding set to -100), or compare logits[:, :-1] with "
                    "input_ids[:, 1:] yourself, not both")
        if k == "unshifted":
            return ("shift the labels by one: compare logits[:, :-1] with input_ids[:, 1:] (or, for a model that "
                    "shifts them itself, GPT2LMHeadModel and the *ForCausalLM models, pass labels=input_ids and use "
                    "the loss it returns)")
        if k == "one_class":
            return ("check the labels the loader yields (torch.bincount(y) over a few batches): a label column read as "
                    "one value, a mapping that sends every label to 0, or a filter that kept one class; if the other "
                    "classes are real but rare, weight them (cross_entropy's weight=, BCEWithLogits' pos_weight=) or "
                    "oversample them (WeightedRandomSampler)")
        if k == "ordered":
            return ("shuffle the training data: DataLoader(dataset, shuffle=True) (or a sampler that draws at "
                    "random), or shuffle the arrays once per epoch (idx = torch.randperm(len(x))); a data set "
                    "stored grouped by class must not be read in its stored order")
        if k == "targets_out_of_reach":
            return ("standardise the targets (y = (y - y.mean()) / y.std(), computed on the training set; invert it on "
                    f"the predictions), or scale the loss down by ~{fmt(abs(f.get('loss', math.nan)))}")
        return ("check the targets' range: binary_cross_entropy(_with_logits) needs targets in [0, 1] (divide 0/255 "
                "masks by 255), cross_entropy class indices in [0, classes) or probabilities summing to 1; if the loss "
                "is meant to go negative (a Gaussian NLL, a flow's NLL), check that its variance is bounded below "
                "and the sign of each term (a log-determinant adds to the log-likelihood)")
    if c.cause == Cause.DEAD_UNITS and k == "dropped":
        where, first = _dropout_where(ctx, c.layer), f["rise_from"][1]
        if first < f["rate"]:
            return (f"keep the dropout {where} at p=0.5 or below: its p rose from {first:.2g} to {f['rate']:.2g} (a "
                    "schedule of it run past its end); p is the share dropped, and at 1 nothing passes")
        return (f"give the dropout {where} the share to drop, not to keep: p = 1 - keep_prob (p={f['rate']:g} drops "
                "every input in training, so nothing reaches the layers after it); 0.1-0.5 is usual, 0 for none")
    if c.cause == Cause.DEAD_UNITS and k == "penalised":
        return (f"lower the weight of the penalty on `{c.layer}`'s output ({_term(f.get('term'))} in the loss), or "
                "stop it growing (cap it, or warm it up to a fixed value); the units it has already killed stay dead: "
                "retrain from before they died, or penalise through a nn.LeakyReLU(0.01)")
    if c.cause == Cause.DEAD_UNITS:
        prev, read = f.get("previous"), f.get("read", "")
        if read:
            prev = f.get("source") or prev
        if prev and read == "zero_weights":
            text = (f"initialise `{prev}`'s weights as its kind is (a normalisation's scale to 1, a linear or "
                    f"convolution layer's with nn.init.kaiming_normal_): they are all 0, so it outputs 0 for every "
                    f"input, and `{c.layer}` passes no gradient back at 0 to move them (a zero-init is for the last "
                    "layer of a residual branch only)")
        elif prev and read == "zero":
            text = (f"find what multiplies `{prev}`'s output by 0: it is 0 for every input though its weights are "
                    "not (a mask or gate made with torch.zeros where torch.ones was meant, a forward hook on it)")
        elif prev and read == "between":
            reader = f.get("reader") or c.layer
            gets = "reads none" if reader == c.layer else "outputs 0 for every input"
            text = (f"check what is done to `{prev}`'s output before `{reader}` reads it (a mask, a shift, a forward "
                    f"hook on `{prev}`): it has values above 0, and `{reader}` {gets}")
        else:
            text = (f"re-initialise `{prev}` (bias to 0, nn.init.kaiming_normal_ on its weight) or replace "
                    f"`{c.layer}` by nn.LeakyReLU(0.01)" if prev else f"replace `{c.layer}` by nn.LeakyReLU(0.01)")
        if not ctx.from_start(c.step) and may_lower:
            text += f"; if the units died during training, lower the learning rate from {high} to ~{high10}"
            if ctx.lr_rising == ctx.lr_rising:
                text += f" (the schedule keeps raising it: x{fmt(ctx.lr_rising)} so far; cap it)"
        return text
    if c.cause == Cause.SATURATED_ACTIVATIONS:
        prev = f.get("previous")
        kind = ctx.layers[c.layer].type_name if c.layer in ctx.layers else "it"
        return (f"scale down the pre-activations of `{c.layer}`: re-initialise `{prev}` with nn.init.xavier_uniform_ "
                f"(gain 1), or add nn.LayerNorm/BatchNorm before `{c.layer}`; or use ReLU/GELU instead of {kind}"
                if prev else f"normalise what enters `{c.layer}` or use ReLU/GELU instead of {kind}")
    if c.cause == Cause.BAD_INITIALIZATION:
        return _init_fix(c, ctx)
    if c.cause == Cause.ATTENTION_COLLAPSE:
        if not may_lower:
            text = "add a learning-rate warm-up (linear from ~0 over the first 5-10% of the steps)"
        elif not ctx.warmed_up():
            text = ("add a learning-rate warm-up (linear from ~0 over the first 5-10% of the steps) or lower the "
                    f"learning rate from {high} to ~{high10}")
        else:
            text = f"lower the learning rate from {high} to ~{high10} or lengthen its warm-up"
        text += ("; to keep the attention stable at the rate you want, normalise queries and keys (QK-norm: a "
                 "LayerNorm on q and on k per head) or soft-cap the logits (cap * tanh(logits / cap), cap ~ 30-50)")
        if f["hand_written"]:
            text += "; check that q @ k^T is scaled by 1/sqrt(head_dim) before the softmax"
        return text
    if c.cause == Cause.NON_FINITE and k in ("fp16_overflow", "near_limit") or (k == "skipping" and f["first"]):
        where = f"`{c.layer}`" if c.layer else "the layer that overflows"
        return ("run autocast in bfloat16 instead (torch.autocast(device, dtype=torch.bfloat16): float32's range, no "
                f"GradScaler needed), or add a normalisation (nn.LayerNorm) before or in {where}, or scale its input "
                f"or weights down; or keep {where} in float32 (with torch.autocast(device, enabled=False): ... on "
                "float inputs)")
    if c.cause == Cause.NON_FINITE and k == "skipping":
        where = f["overflow"].where() if f["overflow"] is not None else "the model"
        return (f"find why the gradients hold NaN/Inf at any scale ({where}): run one step in float32 with "
                "torch.autograd.detect_anomaly(); if they are finite there, use bfloat16 autocast")
    if c.cause == Cause.NON_FINITE:
        origin = f.get("origin")
        op = origin.op if origin is not None else ""
        if k == "loss_op":
            return _loss_op_fix(f["op"])
        if k == "loss_value":
            return ("keep what the loss takes a log, a square root or a reciprocal of inside its domain: give an "
                    "output that must be positive (a variance, a scale, a rate) an F.softplus or an exp of its log "
                    "(F.gaussian_nll_loss clamps var at eps, not below 0), or clamp it: torch.log(x.clamp_min(1e-12))")
        where = f"`{c.layer}`" if c.layer else "the model's own forward"
        info = ctx.layers.get(c.layer)
        if k == "forward" and (op in _MASKED_OPS or not op and info is not None and info.kind == Kind.ATTENTION):
            # a softmax cannot make NaN of finite scores: a row of scores all -Inf can (every key masked)
            return (f"check the attention mask in {where}: a query whose keys are all masked gets a softmax of only "
                    "-inf, which is NaN. key_padding_mask and a bool attn_mask mark with True what is ignored (a "
                    "mask made as tokens != pad must be inverted: tokens == pad), and no row may be masked "
                    "everywhere (a sequence that is all padding); fill with torch.finfo(scores.dtype).min instead "
                    "of -inf to keep such rows finite")
        if k == "forward":
            text = (f"guard {'the ' + op if op else 'the operation'} in {where} that leaves its domain: add an eps "
                    "to a denominator "
                    "(x / (d + 1e-8)), clamp before sqrt/log (torch.sqrt(x.clamp_min(1e-12)), "
                    "torch.log(x.clamp_min(1e-12))), or use a stable form (torch.logsumexp, F.softmax / F.log_softmax "
                    "instead of exp/sum)")
            if f.get("weight_layer"):
                text += ("; if it divides by a parameter of its own (a temperature, a scale), keep that off 0: leave "
                         "it out of weight decay, or learn its log (t = self.log_t.exp())")
            return text
        if k == "backward":
            return (f"the derivative of an operation in `{c.layer}` is infinite at the values it sees (sqrt or pow at "
                    "0, log of 0, division by ~0): add an eps (torch.sqrt(x + 1e-12)) or clamp its input")
        if k == "narrow_update":
            has_eps = ctx.optimizer_eps == ctx.optimizer_eps  # (SGD has none)
            return ("keep the parameters in float32 (no model.half()) and run the forward pass under "
                    "torch.autocast(device_type, dtype=torch.float16) with a torch.amp.GradScaler"
                    + ("; if they must stay float16, give the optimizer eps=1e-4" if has_eps else ""))
        if k in ("weights", "overflow"):
            return ((f"lower the learning rate from {high} to ~{high10} and clip gradients " if may_lower else
                     "clip gradients ") + "(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0))")
        return "run the failing step under torch.autograd.detect_anomaly() to find the operation"
    if c.cause in (Cause.EXPLODING_GRADIENTS, Cause.LEARNING_RATE_TOO_HIGH) and ctx.betas_unbounded():
        return _betas_fix(ctx)
    if c.cause == Cause.EXPLODING_GRADIENTS:
        text = "clip gradients with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)"
        info = ctx.layers.get(f["origin"])
        if info is not None and info.kind == Kind.RECURRENT:
            text += (f" and initialise the recurrent weights of `{f['origin']}` orthogonally with gain <= 1 "
                     "(nn.init.orthogonal_)")
        if may_lower:
            text += f"; if it persists, lower the learning rate from {high} to ~{high10}"
        if c.layer != f["origin"]:
            text = f"check the backward of `{c.layer}` (a gradient scale or reversal coefficient far above 1?); " + text
        return text
    if c.cause == Cause.VANISHING_GRADIENTS and k == "through_time" and f.get("loop"):
        return ("keep the gradient's scale along the loop: for a recurrence, initialise the state-to-state weights "
                "orthogonally (nn.init.orthogonal_) or use a gated cell (nn.GRU, nn.LSTM or their cells); for layers "
                "stacked in a loop, add a residual connection and a normalisation around each; if the loss needs the "
                "start of long sequences, shorten them (chunks, truncated backpropagation)")
    if c.cause == Cause.VANISHING_GRADIENTS and k == "through_time":
        cell = ctx.layers[c.layer].type_name if c.layer in ctx.layers else ""
        gates = {"RNN": f"replace `{c.layer}` (nn.RNN) by a gated nn.LSTM or nn.GRU; ",
                 "LSTM": f"initialise the forget-gate bias of `{c.layer}` to 1 or more (bias_ih/bias_hh entries "
                         "[hidden:2*hidden]) so its state is kept; ",
                 "GRU": f"bias the update gate of `{c.layer}` toward keeping its state (bias_ih/bias_hh entries "
                        "[hidden:2*hidden] at +1 or more); "}.get(cell, "")
        if _bidirectional(ctx, c.layer):
            return (f"read each direction of `{c.layer}` where it ends: torch.cat([h_n[-2], h_n[-1]], dim=1) (the "
                    "last layer's forward and backward final states), or out[:, -1, :hidden] with out[:, 0, hidden:] "
                    "(batch_first), not out[:, -1] alone")
        return (gates + "if the loss needs the start of long sequences, shorten them (chunks, truncated "
                "backpropagation) or give the model a path over time (attention, skip connections across steps)")
    if c.cause == Cause.VANISHING_GRADIENTS and k == "unreached":
        return (f"find what cuts the graph after `{c.layer}` in the forward pass: a .detach(), .data, a round trip "
                "through .item(), .numpy() or torch.tensor(...), a torch.no_grad() block, or torch.utils.checkpoint "
                "with use_reentrant=True on inputs that need no gradient (pass use_reentrant=False); if it is meant "
                "to stay fixed, freeze it (requires_grad_(False) on its parameters)")
    if c.cause == Cause.VANISHING_GRADIENTS and f.get("gap") and f.get("zero"):
        return (f"find the operation in the forward between `{c.layer}` and `{f['gap']}` whose derivative is 0: "
                "torch.round, floor, sign, argmax or a comparison (a quantiser or a hard threshold: pass the gradient "
                "straight through, z + (z.round() - z).detach()), or a multiplication by a mask of zeros")
    if c.cause == Cause.VANISHING_GRADIENTS and f.get("gap"):
        return (f"find the operation in the forward between `{c.layer}` and `{f['gap']}` that erases the signal: a "
                "normalisation over the wrong axis (dim=1 of (batch, length, features) normalises over the "
                "positions, where the features, dim=-1, were meant), a mean of what was just centred, a "
                f"multiplication by a mask of zeros; the input of `{f['gap']}` is then the same for every sample")
    if c.cause == Cause.VANISHING_GRADIENTS and f.get("applications", 1) > 1:
        return (f"keep the signal's scale through the {f['applications']} applications of `{c.layer}`: a residual "
                "connection and a normalisation around each (h = norm(h + f(layer(h)))), an initialisation that keeps "
                "its gain near 1 (orthogonal weights for a recurrent step), or fewer applications")
    if c.cause == Cause.VANISHING_GRADIENTS:
        bounded = sorted({n for n, l in ctx.layers.items() if l.kind == Kind.BOUNDED and n in ctx.rank},
                         key=ctx.rank.__getitem__)
        if bounded:
            kinds = sorted({ctx.layers[n].type_name for n in bounded})
            return (f"replace the {'/'.join(kinds)} activations ({layer_list(bounded, 3)}) by ReLU or GELU, "
                    "or add BatchNorm/LayerNorm after each weight layer or residual connections")
        return ("add normalisation (BatchNorm/LayerNorm) or residual connections, and initialise with "
                "nn.init.kaiming_normal_")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.grads_never_zeroed():
        return ("call optimizer.zero_grad() in every step, before loss.backward() (with gradient accumulation, after "
                "each optimizer.step()); then check the learning rate")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.scaled_steps == ctx.scaled_steps:
        return ("step through the scaler: scaler.step(optimizer) then scaler.update(), not optimizer.step() (it "
                "divides the gradients by the scale, and skips a step whose gradients overflowed); to clip, call "
                "scaler.unscale_(optimizer) before clip_grad_norm_; the learning rate need not change")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.accumulated() and not ctx.loss_summed:
        passes = ctx.accumulated()
        return (f"divide the loss by the number of passes accumulated before backward ((loss / {passes}).backward()): "
                f"undivided, each step's gradient is {passes} times a mean's; or lower the learning rate from {high} "
                f"by {passes} times; clip gradients at max_norm=1.0")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.loss_summed:
        return ("average the loss over the batch (reduction='mean', or divide the summed loss by the batch size): "
                "summed, its gradient and so every step grow with the batch size; or lower the learning rate from "
                f"{high} by as many times as the batch has samples")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.lr_rising == ctx.lr_rising:
        at = ctx.lr_at(c.step)
        below = f"; keep its peak below ~{fmt(at / 3)} (it was {fmt(at)} when the failure began)" if at == at else ""
        return (f"stop the schedule raising the learning rate (x{fmt(ctx.lr_rising)} so far, {lr} now): a warm-up "
                "ends at its peak (LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup_steps))), an ExponentialLR "
                f"needs gamma < 1{below}; clip gradients at max_norm=1.0")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH and ctx.optimizer_momentum >= ctx.th.momentum_high:
        # a step sums ~1 / (1 - momentum) gradients: the momentum multiplies the learning rate by as much
        mu = ctx.optimizer_momentum
        times = f"~{fmt(1 / (1 - mu))}x" if mu < 1 else "without bound"
        return (f"lower the momentum from {fmt(mu)} to 0.9: each step adds up the gradients of the steps before, "
                f"{times} the learning rate ({lr}) at a steady gradient; or lower the learning rate by as much; clip "
                "gradients at max_norm=1.0")
    if c.cause == Cause.LEARNING_RATE_TOO_HIGH:
        jump = f.get("jump")
        before = jump.values.get("lr_before", math.nan) if jump is not None else math.nan
        if jump is not None and before == before and before > 0:
            # the failure began with a rise of the rate: the rate before it is the one to come back to (a tenth of
            # the raised one may still be far above it)
            text = (f"bring the learning rate back toward {fmt(before)}, its value before step {jump.step}: a "
                    f"schedule raised it to {fmt(jump.values.get('lr', math.nan))} there, and the failure began with "
                    "it; check what raised it, and clip gradients at max_norm=1.0")
        else:
            text = (f"lower the learning rate from {high} to ~{high10} (or add a warm-up), and clip gradients at "
                    "max_norm=1.0")
        if f.get("spikes"):
            text += f" (a clip caps a spike like the one in `{f['spikes'][0].layer}`)"
        return text
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "decayed":
        return (f"keep the learning rate near {fmt(f['lr_peak'])} until the loss settles: a scheduler stepped every "
                "batch with a step size meant in epochs (StepLR, ExponentialLR, MultiStepLR) decays it that fast; call "
                "scheduler.step() once per epoch, or give the step size in batches (a ReduceLROnPlateau cuts it as "
                "fast when its mode does not match its metric, mode='max' for an accuracy, or its patience is meant "
                "in epochs)")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "eps":
        return (f"lower the optimizer's eps from {fmt(f['eps'])} to its default (1e-8 for Adam): it must stay far "
                "below the gradients' size for the update to be ~lr per step; leave the learning rate as it is")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "rounded":
        return (f"keep the weights in float32 (no model.to({f['dtype']})) and run the forward pass under "
                f"torch.autocast(device_type, dtype=torch.{f['dtype']}): the optimizer then updates float32 "
                "weights and the matrix products still run in 16 bits; a larger learning rate would only move "
                "them in coarse steps")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "clipped" and not math.isnan(clipped_scaled(c, ctx)):
        return ("unscale before clipping: scaler.unscale_(optimizer), then clip_grad_norm_, then "
                "scaler.step(optimizer) (it does not unscale twice); leave max_norm and the learning rate as they are")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "clipped":
        return (f"raise the clipping threshold: the gradients' norm is typically ~{fmt(f['norm'])}, so "
                f"clip_grad_norm_(params, max_norm=~{fmt(3 * f['norm'])}) clips only the spikes above it (a "
                "clip_grad_value_ clamps every entry: prefer clip_grad_norm_), or remove the clip; leave the "
                "learning rate as it is")
    cut = _cut_by_schedule(ctx)
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and cut is not None:
        peak = ctx.lr_peak
        if c.step >= cut:  # negligible once the schedule had cut the rate: the schedule's doing
            return (f"keep the learning rate near {number(peak)} while the loss still falls: "
                    + _SCHEDULE_CUT.format(peak=number(peak), lr=number(ctx.lr)))
        # negligible already at the peak: the peak is what to raise, not the remnant the schedule left
        return (f"raise the learning rate from {number(peak)} (its peak, before a schedule cut it to "
                f"{number(ctx.lr)}) to ~{number(peak * 1e3)} (updates of ~1e-3 x the weights per step are typical)")
    hold = ctx.schedule_hold()
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and hold == hold and k in ("negligible", "still", "held"):
        return _schedule_held(ctx, hold)
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and k == "group":
        # a rate that moves its layers by about their norm over a run this long, up to the other group's
        target = min(f["lr_group"] / f["moved"] if f["moved"] > 0 else math.inf, f["lr_other"])
        return (f"raise the learning rate of the parameter group holding {layer_list(f['layers'])} from "
                f"{fmt(f['lr_group'])} to ~{fmt(target)} (the other group's is {fmt(f['lr_other'])}); a group's own "
                "\"lr\" key overrides the optimizer's default")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW and f.get("divided", math.nan) == f.get("divided"):
        return (f"stop dividing the loss before backward (by ~{f['divided']:.0f}: a count of batches or samples, "
                f"len(loader)): under {ctx.optimizer} the step is the learning rate times the gradient, and that "
                "division shrinks every step as much; divide only the value you log, or raise the learning rate "
                f"from {fmt(f.get('lr', ctx.lr))} by as many times")
    if c.cause == Cause.LEARNING_RATE_TOO_LOW:
        lrv = f.get("lr", ctx.lr_now())
        # moved too little over the run: a rate that moves the weights by about their norm over a run this long
        gain = 1 / f["moved"] if k == "still" and f["moved"] > 0 else 1e3
        target = lrv * gain if lrv == lrv and lrv > 0 else math.nan
        why = ("over a run this long the weights then move by about their norm; or train for longer" if k == "still"
               else "updates of ~1e-3 x the weights per step are typical; "
               + ("1e-2 to 1e-1 is a usual start for SGD" if ctx.optimizer_kind == "SGD" else
                  "1e-3 is a usual start for Adam"))
        text = (f"raise the learning rate from {fmt(lrv)}{f' ({where})' if where else ''} to ~{fmt(target)} ({why})"
                if target == target else
                "set a learning rate above 0 (1e-3 is a usual start for Adam, 1e-2 to 1e-1 for SGD): the optimizer "
                "steps with lr=0" if lrv == 0 else
                "raise the learning rate until updates are ~1e-3 x the weights per step")
        if lrv == lrv and lrv >= ctx.th.usual_lr:
            text = (f"the learning rate ({fmt(lrv)}) is not small, the gradient reaching the optimizer is: check for a "
                    "gradient clipped to ~0 (clip_grad_norm_'s max_norm) or a loss multiplied by a tiny factor; else "
                    + text)
        return text
    if k == "input_unused":
        return ("make the forward compute from its argument: it is replaced on the way (torch.zeros_like(x), "
                "torch.randn_like(x), a batch stored from an earlier call) or another variable is read (self.x, a "
                "global, a name reused in the forward); check that model(x) changes when x does")
    if k == "order_blind":
        return (f"add the positions to the token embeddings before the first attention layer: {_ADD_POSITIONS} (or "
                "sinusoidal encodings); leave them out only for a model meant to read a set")
    if k == "read_early" and f.get("tokens"):
        return ("read the output at the last position, out[:, -1] (out[-1] where the positions come first; with "
                "padded sequences, at each sequence's length), or pool over the positions: under a causal mask, "
                "position 0 has seen the first token only (a summary token read at position 0 needs attention "
                "without the mask)")
    if k == "read_early":
        return (f"read `{c.layer}` after the last time step: out[:, -1] with batch_first=True (out[-1] without), "
                "or its final hidden state h_n[-1] (with padded sequences, the output at each sequence's length); "
                "out[:, 0] is its state after the first step only")
    if k == "eval_mode":
        return ("call model.train() before the training steps (and again after every validation pass that calls "
                "model.eval()): batch normalisation then normalises with the batch's statistics and updates its "
                "running ones")
    if k == "remade":
        return ("make the optimizer once, before the training loop (torch.optim.SGD(model.parameters(), ...) outside "
                "the for loop, and the same one across epochs), and keep stepping that one; a function that trains "
                "one epoch takes the optimizer as an argument")
    if k == "unregistered" and f.get("renewed"):
        return ("create every layer once, in __init__ (self.head = nn.Linear(...)), and make the optimizer from "
                "model.parameters() after the model is complete; forward only applies the layers")
    if k == "unregistered":
        return ("register them: hold sub-modules in nn.ModuleList or nn.ModuleDict (not a Python list or dict) and "
                "weight tensors as nn.Parameter (not torch.randn(..., requires_grad=True)), then make the optimizer "
                "again from model.parameters(); they then also move with model.to(device) and are saved in its "
                "state_dict (weights meant to stay fixed, a teacher: requires_grad_(False) or torch.no_grad())")
    if k == "unoptimized" and f.get("tensors"):
        return ("give the optimizer every parameter that should learn: its groups (one with weight decay, one "
                f"without) must together hold all of model.parameters(), and {layer_list(f['tensors'])} are in "
                "none (a filter on the names that keeps one kind only); if they are meant to stay fixed, freeze "
                "them (requires_grad_(False))")
    if k == "unoptimized":
        return ("give the optimizer every parameter that should learn: torch.optim.Adam(model.parameters(), ...) made "
                "after the model is complete (one made from model.fc.parameters(), or before a module was added, "
                f"leaves {layer_list(f['layers'])} out), or optimizer.add_param_group(...); check that no group has "
                "lr=0; if they are meant to stay fixed, freeze them (requires_grad_(False))")
    if k == "out_of_range" and not math.isfinite(f["high"]):
        return (f"remove the final {f['activation'].lower()} (a linear output for a regression), or shift the "
                f"targets to {fmt(f['low'])} and above (y - y.min() from the training set, added back to the "
                "predictions)")
    if k == "out_of_range":
        rng = f"[{fmt(f['low'])}, {fmt(f['high'])}]"
        return (f"remove the final {f['activation'].lower()} (a linear output for a regression), or scale the "
                f"targets into {rng} (y = (y - y.min()) / (y.max() - y.min()) from the training set, inverted on "
                "the predictions)")
    if k == "foreign":
        return ("make the optimizer again from this model's parameters (optimizer = "
                "torch.optim.Adam(model.parameters(), ...)) after the model is built: the one stepping holds another "
                "model's weights (a cell that "
                "re-creates the model leaves an optimizer made before it stepping the old weights)")
    if k == "not_stepped":
        return ("call optimizer.step() after loss.backward() in every step (with gradient accumulation, every few "
                "steps), on the optimizer that holds these parameters (made after the model, from "
                "model.parameters())")
    if k == "no_gradient":
        if f["op"] == "single":
            return ("give the last layer one output per class (nn.Linear(..., num_classes)) for cross_entropy; for "
                    "two classes either 2 outputs, or 1 output with F.binary_cross_entropy_with_logits(out.squeeze(1), "
                    "y.float())")
        if f["op"] == "single_softmax":
            return ("remove the softmax over the single output: for a regression give the loss the raw output; for "
                    "one probability use torch.sigmoid (better: F.binary_cross_entropy_with_logits on the raw "
                    "output); a softmax needs one output per class (nn.Linear(..., num_classes)) and dim=-1 over them")
        return (f"compute the loss from the raw outputs, not from torch.{f['op'].lower()} of them (apply it only to "
                "read predictions); for a rounded or thresholded target, use a loss of the outputs that is smooth in "
                "them (cross_entropy, binary_cross_entropy_with_logits, mse_loss)")
    if k == "on_probabilities":
        return _ON_PROBABILITIES_FIX[f["misuse"]]
    if k == "unbounded":
        return _UNBOUNDED_FIX[f["form"]]
    if k == "unreached":
        return ("compute the loss from the model's output as a tensor, without .detach(), .item(), torch.no_grad() "
                "or a round trip through numpy / torch.tensor(...), and call loss.backward() before optimizer.step()")
    if k == "cleared":
        return ("in each step call optimizer.zero_grad(), then loss.backward(), then optimizer.step(): a "
                "zero_grad() between loss.backward() and optimizer.step() (or a step() before backward()) leaves the "
                "step no gradient")
    if k == "weights_collapse":
        decay = ctx.optimizer_weight_decay
        if decay > 0 and _decay_accounts(c, ctx, decay):
            name = ctx.optimizer or "the optimizer"
            return (f"lower {name}'s weight_decay from {fmt(decay)} to ~{fmt(decay / 30)} (10-100x less): it pulls "
                    "the weights toward zero at every step harder than the loss's gradient moves them; then check "
                    "the learning rate")
        return ("lower the weight penalty added to the loss (an L2 term: lam times the sum of p.pow(2).sum() over the "
                "parameters) by 10-100x, or the weight decay of whatever steps the weights: it pulls them toward zero "
                "harder than the loss's gradient moves them; then check the learning rate")
    text = ("check that the model can learn at all: overfit a single batch, check that targets match the outputs "
            "(loss, label range)")
    term = next((e for e in c.events if e.values.get("term")), None)
    if term is not None and term.values.get("whole_start", 0.0) >= 2.0 * term.values["start"]:
        # what the loss adds to its classification held most of it at the start, and came down alone
        text = ("lower the weight of the terms the loss adds to its classification (a weight penalty, an auxiliary "
                "loss) by 10-100x: they held most of the loss at the start, and what came down is theirs; else "
                + text)
    room = ctx.loss_uniform - ctx.loss_floor
    if room < ctx.th.loss_progress * ctx.loss_uniform:
        # targets all but uniform: no prediction can take the loss much below a uniform one's
        left = (f"leaves the loss only {fmt(room)} of room below" if room > 1e-6 * ctx.loss_uniform else
                "equals")
        text = (f"make the targets less uniform: their entropy ({ctx.loss_floor:.4g}) {left} the loss of a uniform "
                f"prediction ({ctx.loss_uniform:.4g}), so the loss cannot show what the model learns; a "
                "label_smoothing near 1 does this (it is the share moved off the true class: 0.1 is usual); else "
                + text)
    if ctx.order_blind:
        text = (f"if the order of the tokens matters, add the positions to the token embeddings ({_ADD_POSITIONS}): "
                "the model reads them as a set (reordered in a replay, they gave the same output); else " + text)
    if (strong := _strong_dropout(ctx)) is not None:
        rate, place = strong
        text = (f"lower the dropout {_dropout_where(ctx, place)} from p={rate:g} if it is not meant that strong: it "
                "drops that share of its input in training (p is the share dropped, 1 - keep_prob; 0.1-0.5 is "
                "usual); else " + text)
    if (frozen := _frozen(ctx)) is not None:
        held, _ = frozen
        text = (f"if {layer_list(held)} should learn, unfreeze them (requires_grad_(True) on their parameters) and "
                "give them to the optimizer: most of the model's weights are frozen; else " + text)
    if ctx.linear_maps >= 2:
        text = ("add a nonlinearity between the linear layers (nn.ReLU() after each but the last, or F.relu in the "
                "forward): without one they make a single linear map of the input; then " + text)
    undone = _undone(c, ctx) if lr_way != "lower" else None
    if undone is not None:
        # it could learn at this rate: what undid it came later, and a larger rate is no way back
        best, now = undone
        text += (f"; the loss came down to {fmt(best)}, then rose back to {fmt(now)}: look at what changed after "
                 "it was at its best (a schedule, a loss term whose weight grows, the data) before the learning rate")
    elif lr_way != "lower" and _cut_by_schedule(ctx) is not None:
        # the rate at the end is a schedule's remnant: the one to raise is the one the run had at its peak
        text += (f"; the loss stayed flat and {_SCHEDULE_CUT.format(peak=number(ctx.lr_peak), lr=number(ctx.lr))}, "
                 f"then try a larger learning rate than {number(ctx.lr_peak)} (x3)")
    elif lr_way != "lower" and (hold := ctx.schedule_hold()) == hold:
        text += "; then " + _schedule_held(ctx, hold)
    elif lr_way != "lower":
        text += f"; then try a larger learning rate than {lr} (x3) or a schedule"
    else:
        text += f"; the updates were large: try a smaller learning rate than {high} or a warm-up"
    return text


def _undone(c: Candidate, ctx: Context) -> tuple[float, float] | None:
    """(the best loss, the loss at the latest flat stretch) when that loss lies above its best by more than
    ``loss_given_back`` of what it had come down from its start: it learned, then lost it."""
    flat = [e for e in c.loss + c.events if {"loss", "start", "best"} <= e.values.keys()]
    if not flat:
        return None
    e = max(flat, key=lambda e: e.step)
    start, best, now = (float(e.values[k]) for k in ("start", "best", "loss"))
    if not (start > best and now - best > ctx.th.loss_given_back * (start - best)):
        return None
    return best, now


def _dropout_where(ctx: Context, place: str) -> str:
    """A dropout's place in words: a dropout module, a module whose own forward calls one, or the module whose
    output a functional one drops."""
    info = ctx.layers.get(place)
    if info is not None and info.kind == Kind.DROPOUT:
        return f"`{place}`"
    if not place:
        return "in the model's forward"
    return f"in `{place}`" if place in ctx.dropout_inside else f"after `{place}`"


def _strong_dropout(ctx: Context) -> tuple[float, str] | None:
    """The dropout that drops the largest share of its input in training, ``dropout_high`` of it or more but
    short of all of it (that is dead units), as (share, place); None when there is none."""
    found = [(p, place) for place, rows in ctx.dropout.items() for _, p in rows
             if ctx.th.dropout_high <= p < ALL_DEAD]
    return max(found, key=lambda r: r[0]) if found else None


def _held_where(ctx: Context, held: float) -> str:
    at = int(ctx.lr_rows[-1][0]) if ctx.lr_rows else ctx.last_step
    times = f"{held:,.0f}" if held >= 100 else fmt(held)
    if ctx.lr_base_key == "max_lr":
        return f"{number(ctx.lr)} at step {at}, {times}x below the {number(ctx.lr_base)} it heads to (its max_lr)"
    return f"{number(ctx.lr)} at step {at}, {times}x below the optimizer's {number(ctx.lr_base)}"


def _schedule_held(ctx: Context, held: float) -> str:
    """The fix of a rate a schedule held far below the optimizer's base rate all run: the schedule's, not the
    base rate (raising it would only scale the schedule's rates alike)."""
    where = _held_where(ctx, held)
    if ctx.lr_base_key == "max_lr":  # (a one-cycle's warm-up starts at max_lr / div_factor, not at ~0)
        return (f"size the one-cycle schedule to the run: it holds the learning rate at {where}, still in its "
                "warm-up; its total_steps (or epochs x steps_per_epoch) must count the scheduler.step() calls the "
                "run makes (once per batch, not per epoch)")
    if ctx.lr_rising == ctx.lr_rising and _rarely_stepped(ctx):
        return (f"step the schedule every batch if its warm-up counts batches: it holds the learning rate at "
                f"{where}, and the rate stayed the same over {_rarely_stepped(ctx)} consecutive steps, as under a "
                "scheduler stepped once per epoch (Lightning's default interval is 'epoch': return "
                "{'scheduler': ..., 'interval': 'step'}; in a plain loop, call scheduler.step() after each "
                "optimizer.step()); if it counts epochs, it is longer than the run: shorten it to ~5-10% of it")
    if ctx.lr_rising == ctx.lr_rising:
        # a linear warm-up from ~0 at this pace reaches its base near the step read times the factor left
        at = int(ctx.lr_rows[-1][0]) if ctx.lr_rows else ctx.last_step
        return (f"shorten the schedule's warm-up: it had raised the learning rate only to {where}, and at this "
                f"pace reaches it near step ~{float(f'{max(at, 1) * held:.2g}'):,.0f}; unless the run is meant to "
                "last many times "
                "that, warm up over ~5-10% of its steps (LinearLR's total_iters, the warm-up steps of a LambdaLR or "
                "of num_warmup_steps) and leave the base rate as it is")
    return (f"check the schedule: it holds the learning rate at {where} (a LambdaLR multiplies the base rate by "
            "what its lambda returns; a warm-up's length counts the scheduler's steps, not epochs)")


def _rarely_stepped(ctx: Context) -> int:
    """A schedule that changes the rate only every so often (stepped once per epoch): the most consecutive
    sampled steps (a step apart) over which the rate stayed the same, when that is twice ``persist`` or more
    and the rate did change over the run; 0 otherwise."""
    rows = [(int(r[0]), float(r[1])) for r in ctx.lr_rows if len(r) >= 2]
    longest = run = 0
    for (s0, l0), (s1, l1) in zip(rows, rows[1:]):
        run = run + 1 if s1 == s0 + 1 and l1 == l0 else 0
        longest = max(longest, run)
    moved = len({lr for _, lr in rows}) > 1
    return longest + 1 if moved and longest + 1 >= 2 * ctx.th.persist else 0


_SCHEDULE_CUT = ("a schedule took the learning rate from {peak} down to {lr}: check what drives it (a "
                 "ReduceLROnPlateau's mode must match its metric, mode='max' for an accuracy; a scheduler stepped "
                 "every batch with a step size meant in epochs)")


def _cut_by_schedule(ctx: Context) -> int | None:
    """The step from which a schedule's decline took the learning rate ``lr_decayed`` times below its peak
    (the rate's state, as its events have it), when the rate is still that low at the end: a schedule's
    remnant. None otherwise."""
    peak, lr = ctx.lr_peak, ctx.lr
    if not (peak == peak and lr == lr and peak > 0 and lr * ctx.th.lr_decayed <= peak):
        return None
    decline = ctx.all(Signal.LR, LrState.DECAYED)
    return decline[-1].step if decline else None


def _weights_of(layers: list[str]) -> str:
    """Weight layers by name; ``""``, the model's own weights, as such."""
    named = layer_list(layers)
    if "" not in layers:
        return named
    own = "the model's own weights (the parameters its forward applies)"
    return f"{named} and {own}" if named else own


def _in_loop(layers: list[str], ctx: Context) -> bool:
    """Some of ``layers`` are calls of one operation in a loop of the forward, each reading the one before."""
    return any(ctx.layers[n].extra.get("follows") for n in layers if n in ctx.layers)


def _pruned(c: Candidate, ctx: Context) -> dict[str, float]:
    """The layers of a symmetric start whose equal weights are zeros a pruning mask holds: layer -> the share
    it removes."""
    if 0.0 not in c.facts.get("values", ()):
        return {}
    layers = [ctx.layers[n] for n in c.facts.get("layers", ()) if n in ctx.layers]
    return {info.name: float(info.extra["pruned"]) for info in layers
            if info.extra.get("equal_weights") == 0.0 and info.extra.get("pruned")}


def _init_fix(c: Candidate, ctx: Context) -> str:
    f, k = c.facts, c.kind
    if k == "symmetric" and _pruned(c, ctx):
        return (f"prune a smaller share of {layer_list(list(_pruned(c, ctx)))}: prune's amount is the share it "
                "removes (amount=0.99 removes 99%, and a global one may take whole layers), so a mask that holds "
                "a layer at 0 leaves it nothing to learn; prune after training, or by steps")
    if k == "symmetric":
        return (f"initialise {layer_list(f['layers'])} with random weights (PyTorch's default init, or "
                "nn.init.kaiming_normal_ for ReLU, xavier_normal_ for tanh) instead of nn.init.zeros_ / constant_: "
                "only a last layer, or a residual branch's last layer, may start at zero")
    if k == "recurrent":
        return (f"re-initialise the recurrent weights of `{c.layer}` (weight_hh_l*) with nn.init.orthogonal_, or keep "
                "PyTorch's default init (uniform in +-1/sqrt(hidden_size)); clip gradients at max_norm=1.0 (a "
                "recurrent net's usual guard against a gradient that grows through time)")
    if k == "outputs":
        return ("initialise the weights at the scale of their inputs: a spread of ~1/sqrt(fan_in) "
                "(nn.init.kaiming_normal_ before a ReLU, xavier_normal_ otherwise; torch.randn(fan_in, fan_out) "
                "/ fan_in ** 0.5 by hand), not torch.randn's 1; or find what multiplies the outputs (a scale or a "
                "temperature far from 1)")
    if k == "saturating":
        kinds = sorted({ctx.layers[n].type_name for n in f["saturated"] if n in ctx.layers})
        gain = "5/3, nn.init.calculate_gain('tanh')" if any("tanh" in t.lower() for t in kinds) else "1"
        text = (f"re-initialise {_weights_of(f['layers'])} with nn.init.xavier_uniform_ (gain {gain}) instead of "
                f"their current scale, or add nn.LayerNorm before each {'/'.join(kinds)}")
        if _in_loop(f["saturated"], ctx):
            text += ("; the weights applied to the state at every step of the loop want a spread of ~1/sqrt(hidden "
                     "size) or nn.init.orthogonal_, not torch.randn's 1")
        return text
    target = f"`{c.layer}` starts" if c.layer else "the weight layers start"
    g = f["gain"]
    if f["biased"] and c.layer:
        return (f"`{c.layer}` starts with a bias far off zero: reset it (nn.init.zeros_(...bias)) and check what set "
                "it; clip gradients at max_norm=1.0 meanwhile")
    if f["biased"]:
        return (f"{layer_list(f.get('biased_layers') or f['layers'])} start with biases far off zero: reset them "
                "(nn.init.zeros_(...bias)) and check what set them; clip gradients at max_norm=1.0 meanwhile")
    if k == "amplifies":
        return (f"{target} with weights ~{fmt(g)}x too large: re-initialise with nn.init.xavier_uniform_ "
                f"(or kaiming_uniform_ for ReLU), or scale them down by {fmt(g)}; clip gradients at max_norm=1.0 "
                "meanwhile")
    return (f"{target} with weights too small (each scales the signal by ~{fmt(g)}): use a variance-preserving init, "
            "nn.init.xavier_normal_ for tanh/sigmoid or nn.init.kaiming_normal_ for ReLU")
