"""What inference reads: the semantic events, the links between them, the layer table and the NaN origin.

Nothing here holds raw statistics: the earlier stages have turned them into states and events.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..events import SemanticEvent
from ..formatting import number
from ..layers import Kind, LayerInfo
from ..losspath import LossMisuse
from ..patterns import Link, LinkKind
from ..states import FiniteState, GainState, LossState, Signal, UpdateState
from ..thresholds import Thresholds
from ..trace import NonFiniteOrigin

if TYPE_CHECKING:
    from ..rankevents import RankEvidence


ADAPTIVE = frozenset({"Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop", "Adagrad", "SparseAdam"})


@dataclass
class Context:
    events: list[SemanticEvent]
    links: list[Link]
    layers: dict[str, LayerInfo]
    rank: dict[str, int]            # forward order of the layers that ran
    first_step: int                 # the first sampled step
    last_step: int                  # the last step seen (sampled or with a loss)
    nonfinite: NonFiniteOrigin | None
    overflow: NonFiniteOrigin | None  # where the NaN/Inf of the first step a loss scaler skipped came from
    lr: float                       # the latest learning rate (NaN: unknown)
    lr_first: float                 # ... at the first sample
    lr_peak: float                  # ... the largest
    th: Thresholds
    has_loss: bool
    ranks: RankEvidence | None = None  # the other ranks of a multi-process run, else None
    sampled: tuple[int, ...] = ()   # the steps whose layer statistics were sampled
    unstepped: int = 0              # backward passes while the watched optimizer never stepped (0: it did)
    carried: float = 0.0            # share of optimizer steps after which the gradients were not zeroed
    unreached: int = 0              # optimizer steps on the model's weights with no backward pass through it
    unupdated: tuple = ()           # layers whose weights hold a gradient and that no optimizer step moves
    left_out: dict = field(default_factory=dict)  # layer -> its parameters no group of the optimizer holds
    unheld: tuple = ()              # layers none of whose parameters a group of the optimizer holds
    foreign_steps: int = 0          # optimizer steps on other weights while the model's never changed
    # weights the forward uses that are not the model's parameters and never changed ({"tensors", "numel",
    # "shapes", "still"}; None: none such)
    unregistered: dict | None = None
    # weight layers of a forward pass that is one linear map of its input (no activation between them); 0: not
    linear_maps: int = 0
    # an optimizer with a state made again at about every step ({"made", "steps", "optimizer"}; None: not)
    remade: dict | None = None
    # training passes run in eval mode, their batch normalisations on running statistics ({"passes", "sampled",
    # "step", "norms"}; None: not)
    eval_mode: dict | None = None
    cleared: tuple[int, int] = (0, 0)  # optimizer steps after a backward pass: checked, and with no gradient left
    loss_misuse: LossMisuse | None = None  # how the loss is computed from the outputs, when that is wrong
    # the loss's own operation that turned the model's finite output into NaN/Inf ("": none, or its targets did)
    loss_nonfinite_op: str = ""
    # the loss's graph was read and holds no library loss: the model's own code (a likelihood written by hand)
    loss_hand_written: bool = False
    # the loss computes something of the outputs before the probability that op is taken of: "scaled" (a
    # temperature), "filled" (a mask set to -1e9), "" (neither)
    loss_op_rescaled: str = ""
    # how the loss's code makes it unbounded below, should it fall so (see ``losspath.unbounded_form``; "": its
    # targets would)
    loss_unbounded: str = ""
    # the largest weight-gradient norm on the sampled steps whose loss is NaN/Inf (0: the loss gave none; NaN: no
    # such step was sampled)
    nonfinite_loss_gradient: float = math.nan
    # every path from the loss reaches a library loss that cannot be negative for targets in its range
    loss_non_negative: bool = False
    # how the loss's code gives the model's outputs no gradient (see ``losspath.no_gradient``; "": it gives one)
    loss_no_gradient: str = ""
    # how many times over a schedule still raising the learning rate at the end of the run has raised it (NaN: not)
    lr_rising: float = math.nan
    # per place of a dropout (the module it follows or is, "" for the model's own forward): (step, share it
    # drops in training) where sampled passes saw that share first
    dropout: dict = field(default_factory=dict)
    dropout_inside: tuple = ()      # the places among those whose dropout runs inside their own forward
    # the least a cross-entropy can reach, its targets' entropy read off the output's gradient, and the loss of a
    # uniform prediction over its classes (NaNs: not read)
    loss_floor: float = math.nan
    loss_uniform: float = math.nan
    # a cross-entropy's targets that mark several classes in a row, read off the output's gradient on sampled
    # passes: (step, mean targets per row, share of rows with several)
    target_count: tuple = ()
    # the loss they were read under: "" (a cross-entropy), "bce_softmax" (a binary cross-entropy of a softmax)
    target_loss: str = ""
    # the rate the optimizer's schedule scales or heads to (its first group's ``initial_lr``, or a one-cycle's
    # ``max_lr``, the key in ``lr_base_key``; NaN: no schedule seen)
    lr_base: float = math.nan
    lr_base_key: str = "initial_lr"
    # a regression loss of outputs a sigmoid or tanh bounds: (the activation, low, high); None: not so
    bounded_output: tuple | None = None
    loss_min: float = math.nan      # the lowest finite loss recorded
    # the first step at which the smoothed loss had come ``loss_learned`` of its way down, in a run whose loss
    # came down by more than ``loss_progress`` (None: it did not)
    loss_learned_at: int | None = None
    # the first step from which the loss, after coming down by more than ``loss_progress``, comes down by no more
    # than that to the end, over ``plateau_steps`` or more: (step, its level there, its start); None: it comes down
    # to the end, or never came down
    loss_stopped: tuple | None = None
    loss_rows: tuple = ()           # (step, the loss's level: the median of the losses from there over a window)
    # a regression loss of a bounded output, over the second half of the run: the share of its gradient at the
    # output on entries its bound blocks ("share"), and the loss they hold over the loss's start ("floor")
    output_blocked: dict = field(default_factory=dict)
    lr_rows: tuple = ()             # (step, learning rate) at each sample
    param_dtype: str = ""           # the dtype most of the trainable weights are stored in ("": unknown)
    moving_objective: bool = False  # the loss depends on weights outside the model that another optimizer moves
    # per recurrent layer: [step, gradient reaching the first time step / the most any step gets, time steps]
    through_time: dict = field(default_factory=dict)
    # the loss at the first step, before any update, and a uniform guess's over the classes (NaNs: not known)
    loss_at_start: tuple = (math.nan, math.nan)
    # per layer with any: what its output held on each sampled step ("zero", "zero_weights", "positive", ""; see
    # ``analysis._outputs_read``)
    outputs_read: dict = field(default_factory=dict)
    # per loop of one operation in the forward (by its first call's site), rows as ``through_time``'s over its calls
    loops: dict = field(default_factory=dict)
    # an embedding of a 2-D batch of tokens: the positions its output's gradient reaches, per sampled pass,
    # [step, length along dimension 0, reached along it, the same along dimension 1] (medians over sequences)
    positions_read: dict = field(default_factory=dict)
    # an attention model over tokens whose output did not change with their order, in a replay: {"step",
    # "positions"}; empty when not seen so
    order_blind: dict = field(default_factory=dict)
    optimizer_eps: float = math.nan  # the optimizer's eps, when it has one
    optimizer_momentum: float = math.nan  # its momentum (SGD, RMSprop), when it has one
    optimizer_betas: tuple = ()      # its betas (Adam and its kin), when it has them
    optimizer_weight_decay: float = math.nan  # its groups' largest weight_decay, when it has one
    optimizer: str = ""             # the watched optimizer's class name ("": none)
    optimizer_kind: str = ""        # the torch.optim class it is or derives from ("": none known)
    grad_rms: float = math.nan      # the typical gradient RMS per weight entry (median over layers and samples)
    # per trainable layer: how far its weights moved over the run, as a share of their norm (the sum of its
    # update-to-weight ratios: an upper bound); empty: not measured
    layers_moved: dict = field(default_factory=dict)
    # (learning rate, layers) of each parameter group of an optimizer with several; () with one
    lr_groups: tuple = ()
    # layers whose output the loss reads directly, besides through the model's outputs (an activity penalty):
    # layer -> the ops from the loss to it, loss side first
    loss_terms: dict = field(default_factory=dict)
    # sampled steps' whole gradient norm at backward end and as the optimizer steps on it (after a clip; a loss
    # scaler's unscale, exactly a power of two, left out)
    grad_clip: list = field(default_factory=list)
    loss_summed: bool = False  # the loss sums over the batch (reduction="sum"): its gradient grows with the batch
    # sampled steps' share of a 16-bit model's weight entries the update left exactly as they were: [step, share]
    updates_unchanged: list = field(default_factory=list)
    # the factor a loss scaler the session was not given multiplied the loss by before backward (2**k)
    loss_scaled: float = math.nan
    # the loss's gradient at a classifier's output against a mean's, typically, as an optimizer step gets it
    # (the backward passes of an accumulated step added up; NaN: not read, summed or weighted)
    loss_factor: float = math.nan
    passes_per_step: float = 1.0    # backward passes per optimizer step (more than one: gradient accumulation)
    # the median scale of the GradScaler the session was given (NaN: none given, or never read)
    scaler_scale: float = math.nan
    # the optimizer steps on the gradients of a loss a scaler multiplied (2**k), never divided back: that factor
    scaled_steps: float = math.nan
    # one replay of a pass: how far one sample's output gradient reaches the other samples' inputs (see mixing)
    batch_mixing: dict = field(default_factory=dict)
    # per batch normalisation run on the batch's statistics: the median number of values per channel they took
    norm_values: dict = field(default_factory=dict)
    # a model trained on next tokens: whether a position's output reads the tokens after it (see ``leak``)
    next_token: dict = field(default_factory=dict)
    padding_counted: tuple = (0, math.nan, 0)  # (first step, share of the loss's positions on padding, read)

    def adaptive(self) -> bool:
        """The optimizer divides each update by the gradient's running size (Adam, RMSprop ...): its steps do not
        shrink with the gradient (until the gradient falls to its eps)."""
        return (self.optimizer_kind or self.optimizer) in ADAPTIVE

    def accumulated(self) -> int:
        """Under gradient accumulation, the backward passes whose gradients add up undivided in each step of an
        optimizer whose step grows with its gradient (SGD): the loss is not divided by their number, so a step's
        gradient is that many times a mean's. 0 otherwise (one pass a step, a loss divided, an adaptive
        optimizer, a loss whose gradient was not read)."""
        k = round(self.passes_per_step)
        if k < 2 or self.adaptive() or not self.loss_factor >= 0.75 * k:  # (divided: ~1)
            return 0
        return k

    def betas_unbounded(self) -> bool:
        """Adam's step is bounded (by ~the learning rate) only while beta1 < sqrt(beta2): past it the first
        moment averages the gradients over more steps than the second moment that divides it."""
        b = self.optimizer_betas
        return len(b) == 2 and 0 <= b[1] < 1 and b[0] >= math.sqrt(b[1])

    def grads_never_zeroed(self) -> bool:
        """The backward passes start on the gradients of the steps before: ``zero_grad`` is not called."""
        return self.carried >= self.th.gradients_carried

    def sample_before(self, step: int) -> int:
        """The sampled step before ``step`` (``step`` itself when none is): an event dated at ``step`` began
        somewhere after it."""
        earlier = [s for s in self.sampled if s < step]
        return earlier[-1] if earlier else step

    def all(self, signal: Signal, *states) -> list[SemanticEvent]:
        return [e for e in self.events if e.signal == signal and (not states or e.after in states)]

    def linked(self, kind: LinkKind, cause: SemanticEvent) -> list[SemanticEvent]:
        return [e for link in self.links if link.kind == kind and link.cause is cause for e in link.effects]

    def from_start(self, ev: SemanticEvent | int) -> bool:
        """An event linked as present from the first sample (or a step at or before it)."""
        if isinstance(ev, int):
            return ev <= self.first_step
        return any(link.kind == LinkKind.FROM_START and link.cause is ev for link in self.links)

    def input_too_small(self, ev: SemanticEvent) -> bool:
        """A weight layer that amplifies what it reads only because that lies far below unit scale (under
        1 / ``layer_gain``): its weights are at their default spread and its output is its biases' plus what
        those weights make of that input (at the default init, ~0.6x its scale: at most twice the weights'
        spread times it is allowed), not the input's amplified (the model's inputs divided by 255 twice,
        values in other units; a signal the forward's own code erased before the layer). An input the
        forward normalises before that layer, which no row shows, leaves more than the biases explain: no
        such case. Outputs that sit at an offset larger than their spread are biases far off zero: those
        are the fault, however small the input."""
        v = ev.values
        if ev.signal != Signal.GAIN or ev.after != GainState.AMPLIFIES or v.get("offset", 0.0) > 1.0:
            return False
        rms, gain, w, bias = (v.get(k, math.nan) for k in ("input_rms", "gain", "weight_scale", "bias_rms"))
        big, own = self.th.layer_gain, gain * rms
        if not (0 < rms < 1 / big and 1 / big <= w <= big and own > 0 and bias > 0):
            return False
        return own - bias <= 2 * w * rms  # (an RMS of a sum is at most the sum of the RMSs)

    def preceding(self, ev: SemanticEvent) -> list[SemanticEvent]:
        """The abnormal events the pattern stage linked as coming before ``ev`` (a critical event)."""
        return [link.cause for link in self.links if link.kind == LinkKind.PRECEDES and ev in link.effects]

    def previous(self, name: str) -> str | None:
        """The layer that ran just before ``name`` in the forward pass."""
        pos = self.rank.get(name)
        if pos is None:
            return None
        before = [n for n, r in self.rank.items() if r < pos]
        return max(before, key=self.rank.__getitem__) if before else None

    def output_read(self, name: str | None, step: int) -> str:
        """What ``name``'s output held on the sampled step at or before ``step`` (see ``outputs_read``)."""
        col = self.outputs_read.get(name) if name else None
        if not col or not self.sampled:
            return ""
        i = max(bisect.bisect_right(self.sampled, step) - 1, 0)
        return col[i] if i < len(col) else ""

    def source(self, name: str) -> tuple[str | None, bool]:
        """The layer whose output ``name`` was seen to read (the module a functional operation is attributed
        after, the one a module's input came from: ``extra["reads"]``), and whether through operations between
        (a mask, a shift, a forward hook); (None, False) where not seen."""
        info = self.layers.get(name)
        extra = info.extra if info is not None else {}
        known = extra.get("owner") if extra.get("relation") == "after" else extra.get("reads")
        if known in self.layers:
            return str(known), bool(extra.get("through"))
        return None, False

    def previous_weight_layer(self, name: str) -> str | None:
        pos = self.rank.get(name, -1)
        cands = [n for n, r in self.rank.items() if r < pos and self.layers[n].n_params > 0]
        return max(cands, key=self.rank.__getitem__) if cands else None

    def next_weight_layer(self, name: str) -> str | None:
        """The first layer with parameters that runs after ``name`` in the forward pass (the order they run in,
        not the data flow: in a model of two branches it may read the other branch's output)."""
        pos = self.rank.get(name, 1 << 30)
        cands = [n for n, r in self.rank.items() if r > pos and self.layers[n].n_params > 0]
        return min(cands, key=self.rank.__getitem__) if cands else None

    def upstream(self, name: str, of: str) -> bool:
        """``name`` runs before ``of`` in the forward pass."""
        return self.rank.get(name, 1 << 30) < self.rank.get(of, -1)

    def first_layers(self, k: int) -> list[str]:
        return sorted(self.rank, key=self.rank.__getitem__)[:k]

    def input_reach(self) -> set[str]:
        """The layers an input out of scale reaches directly: the first ``input_reach``, and every one before
        the first normalisation layer (up to it, each layer's output scales with the input)."""
        order = sorted(self.rank, key=self.rank.__getitem__)
        norm = next((i for i, n in enumerate(order) if self.layers[n].kind == Kind.NORM), len(order))
        return set(order[:max(self.th.input_reach, norm)])

    def gives_no_gradient_at(self, step: int) -> bool:
        """The loss gave the weights no gradient on the sampled steps where it was NaN/Inf, or, where none was
        sampled, the updates are negligible at ``step`` (or at the first sampled step from it on): an optimizer
        with momentum goes on moving the weights a while on no gradient."""
        g = self.nonfinite_loss_gradient
        if g == g:
            return g == 0.0
        later = [s for s in self.sampled if s >= step]
        return any(u.step <= (later[0] if later else step) and (u.end is None or u.end > step)
                   for u in self.all(Signal.UPDATE, UpdateState.NEGLIGIBLE))

    def nonfinite_step(self) -> int | None:
        """The first step with NaN/Inf anywhere: the replayed origin, a layer's statistics or the loss."""
        steps = [e.step for e in self.all(Signal.FINITE, FiniteState.NONFINITE)]
        steps += [e.step for e in self.all(Signal.LOSS, LossState.NONFINITE)]
        if self.nonfinite is not None:
            steps.append(self.nonfinite.step)
        return min(steps) if steps else None

    def loss_recovered_after(self, step: int) -> bool:
        """From ``step`` to the end of the run the loss is improving: its state from then on is one open
        improving state, with no other failure after it (a slow stretch of a loss that left its plateau and
        comes down steadily is on its way there)."""
        later = [e for e in self.all(Signal.LOSS) if e.step >= step]
        return (bool(later) and all(e.after == LossState.IMPROVING or e.values.get("left_plateau") for e in later)
                and later[-1].end is None)

    def warmed_up(self) -> bool:
        """The learning rate started at less than half of its largest value (a warm-up, or a schedule that
        raised it); unknown learning rates count as warmed up."""
        return not (self.lr_first == self.lr_first and self.lr_peak > 0 and self.lr_first >= 0.5 * self.lr_peak)

    def schedule_hold(self) -> float:
        """How many times below the optimizer's base learning rate (the one its schedule scales, or a one-cycle's
        max_lr, the one it heads to) the rate is at
        the end of the run, when a schedule held it ``lr_held`` times below that base or more all along, its
        peak included: a warm-up longer than the run, a schedule's factor far below 1. NaN otherwise (a
        schedule that reached its base and decayed from it is read from its peak)."""
        base, peak, lr = self.lr_base, self.lr_peak, self.lr
        if base == base and peak == peak and lr == lr and lr > 0 and peak * self.th.lr_held <= base:
            return base / lr
        return math.nan

    def loss_at(self, step: int) -> float:
        """The loss's level at the last row at or before ``step`` (its first row before any; NaN: none
        recorded)."""
        known = [v for s, v in self.loss_rows if s <= step]
        return known[-1] if known else (self.loss_rows[0][1] if self.loss_rows else math.nan)

    def lr_at(self, step: int) -> float:
        """The learning rate at the last sample at or before ``step`` (NaN: unknown)."""
        known = [lr for s, lr in self.lr_rows if s <= step and lr == lr]
        return known[-1] if known else math.nan

    def lr_group(self) -> tuple[float, str] | None:
        """With parameter groups at different learning rates: the rate of the group holding the layer that moved
        most against its weights over the run, and that layer. A fix on the rate is about that group: a rate too
        high shows there as the largest updates, and a rate too low is raised where the weights moved at all.
        None with one rate, or when no layer's movement is known."""
        if len({lr for lr, _ in self.lr_groups if lr == lr}) < 2 or not self.layers_moved:
            return None
        most = max(self.layers_moved, key=self.layers_moved.__getitem__)
        return next(((lr, most) for lr, names in self.lr_groups if most in names and lr == lr), None)

    def lr_now(self) -> float:
        """The current learning rate a fix quotes: its parameter group's (see ``lr_group``), else the recorded one."""
        group = self.lr_group()
        return group[0] if group is not None else self.lr

    def lr_text(self) -> tuple[str, str]:
        """The current learning rate a fix quotes and a tenth of it, as text."""
        lr = self.lr_now()
        if lr == lr and lr > 0:
            return number(lr), number(lr / 10)
        return "its current value", "a tenth of it"
