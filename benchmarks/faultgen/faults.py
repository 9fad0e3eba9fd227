"""Fault mechanisms: how a fault is put into a run, which families it applies to, the verdict a
practitioner would give (cause, place, accepted alternatives, onset window), and the check that the
fault really does harm (a "faulty" run that trains fine would be a mislabelled case).

Verdict conventions (as the product names things): the place is a module name as in
``named_modules()``, ``""`` for the model as a whole, ``"input"`` for the data. A functional
activation (``F.relu(self.bn2(...))``) belongs to the module whose output it consumes (``bn2``);
attention statistics to the attention module. The root comes first: units killed by an update too
large are the learning rate's doing; a layer dead from step 0 that blocks every gradient is
``dead_units`` at that layer; a fault present at step 0 that traces back to a weight scale is the
initialisation's.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import models as M
from . import tasks as T
from .families import Build, Family, Opt
from .probe import Probe

# -- expected verdicts -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """One accepted verdict: a cause at one of ``places``; ``chain``: a pattern its chain must match."""

    cause: str
    places: tuple
    chain: str | None = None

    def matches(self, cause: str, layer: str, chain: list[str]) -> bool:
        if cause != self.cause or layer not in self.places:
            return False
        return self.chain is None or bool(re.search(self.chain, " ".join(chain), re.IGNORECASE))


@dataclass(frozen=True)
class Expect:
    accepted: tuple            # Verdicts, the first one primary
    onset: tuple               # (first, last) step the verdict may date the fault at

    @property
    def cause(self) -> str:
        return self.accepted[0].cause

    @property
    def place(self) -> str:
        return self.accepted[0].places[0]

    def match(self, cause: str, layer: str, chain: list[str]) -> Verdict | None:
        return next((v for v in self.accepted if v.matches(cause, layer, chain)), None)

    def describe(self) -> str:
        def one(v):
            places = "|".join(p if p else '""' for p in v.places)
            return f"{v.cause}@{places}" + (f" (chain ~ /{v.chain}/)" if v.chain else "")
        return " or ".join(one(v) for v in self.accepted) + f", onset {self.onset[0]}-{self.onset[1]}"


def V(cause: str, *places: str, chain: str | None = None) -> Verdict:
    return Verdict(cause, tuple(places), chain)


# -- did the fault bite? -----------------------------------------------------------------------------

@dataclass
class Evidence:
    """What a bite check sees: the faulty run's probe, and the same run without the fault (lazily)."""

    probe: Probe
    twin_of: Callable[[], Probe]
    build: Build
    _twin: Probe | None = None

    @property
    def twin(self) -> Probe:
        if self._twin is None:
            self._twin = self.twin_of()
        return self._twin


def worse_than_twin(e: Evidence) -> str | None:
    """The loss is not finite, or ends having lost at least half of what the same run without the fault
    gains over chance, or ends at three times its loss (and a fifth of chance above it)."""
    p, t = e.probe, e.twin
    if p.nonfinite_step is not None:
        return None
    if p.last >= t.last + 0.5 * (p.baseline - t.last):
        return None
    if p.last >= 3 * t.last and p.last - t.last >= 0.2 * p.baseline:
        return None
    return f"loss ends at {p.last:.3g}, the run without the fault at {t.last:.3g} (chance {p.baseline:.3g})"


def worse_on_fresh_batches(e: Evidence) -> str | None:
    """On batches the model never trained on (the task's data as drawn before the fault), the trained model
    loses at least half of what the same run without the fault gains over chance: a fault in what the model
    is shown can leave the training loss low."""
    p, t = e.probe, e.twin
    if p.nonfinite_step is not None or not p.fresh < t.fresh + 0.5 * (p.baseline - t.fresh):
        return None
    return f"loss on fresh batches {p.fresh:.3g}, the run without the fault {t.fresh:.3g} (chance {p.baseline:.3g})"


def no_progress(e: Evidence) -> str | None:
    """Under a quarter of the progress the same run makes without the fault, from the same start (means
    over the first and the last fifth of the run)."""
    p, t = e.probe, e.twin
    start = p.mean("head")
    gain, twin_gain = start - p.mean("tail"), start - t.mean("tail")
    if twin_gain > 0.1 * p.baseline and gain < 0.25 * twin_gain:
        return None
    return f"loss {start:.3g} -> {p.mean('tail'):.3g}; without the fault -> {t.mean('tail'):.3g} (means of fifths)"


def at_chance(e: Evidence) -> str | None:
    """The loss stays at the best input-blind guess (mean over the last fifth of the run)."""
    p = e.probe
    if p.nonfinite_step is None and p.mean("tail") >= 0.9 * p.baseline:
        return None
    return f"loss ends at {p.mean('tail'):.3g} (mean of the last fifth), chance is {p.baseline:.3g}"


def nonfinite_by(step: Callable[[Build], int]) -> Callable[[Evidence], str | None]:
    def check(e: Evidence) -> str | None:
        at = e.probe.nonfinite_step
        if at is not None and at <= step(e.build):
            return None
        return f"first non-finite loss at step {at}, expected by {step(e.build)}"
    return check


def all_of(*checks) -> Callable[[Evidence], str | None]:
    def check(e: Evidence) -> str | None:
        for c in checks:
            why = c(e)
            if why is not None:
                return why
        return None
    return check


def site_state(kind: str, where: Callable[[Build], str], at: str, least: float = 0.9):
    """At least ``least`` of the site's units dead / outputs saturated, at the start or the end."""
    def check(e: Evidence) -> str | None:
        snap = e.probe.start if at == "start" else e.probe.end
        value = getattr(snap, kind).get(where(e.build), 0.0)
        return None if value >= least else f"{kind} {value:.2f} at {where(e.build)} ({at})"
    return check


def killed_during_training(e: Evidence) -> str | None:
    """Some blocking ReLU site is >= 90% dead at the end, with at least 40% more of its units dead than at
    the start."""
    for s in e.build.sites().relu:
        end, start = e.probe.end.dead.get(s.place, 0), e.probe.start.dead.get(s.place, 1)
        if s.blocking and end >= 0.9 and end - start >= 0.4:
            return None
    return f"no site died: start {e.probe.start.dead}, end {e.probe.end.dead}"


def gradient_grows(factor: float) -> Callable[[Evidence], str | None]:
    def check(e: Evidence) -> str | None:
        g, tg = e.probe.start.grad_norm, e.twin.start.grad_norm
        return None if g >= factor * tg else f"gradient norm at step 0 {g:.3g}, without the fault {tg:.3g}"
    return check


def gradient_attenuates(ratio: float) -> Callable[[Evidence], str | None]:
    """The first weight layer's relative gradient is under ``ratio`` of the last one's at step 0."""
    def check(e: Evidence) -> str | None:
        rel = e.probe.start.grad_rel
        names = [n for n in e.build.sites().weights if n in rel]
        first, last = rel[names[0]], rel[names[-1]]
        return None if first <= ratio * last else f"relative gradient first/last = {first / last:.3g}"
    return check


def attention_collapsed(at: str, most: float = 0.25):
    def check(e: Evidence) -> str | None:
        ent = (e.probe.start if at == "start" else e.probe.end).entropy
        low = min(ent.values()) if ent else 1.0
        return None if low <= most else f"lowest attention entropy {low:.2f} ({at})"
    return check


# -- mechanisms --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mechanism:
    """A way to cause a failure. ``setup`` changes the run in ways that are part of the scenario (the run
    without the fault gets them too); ``configure`` and ``inject`` put the fault in, before and after the
    model is built; ``expect`` is the verdict; ``bites`` checks the fault did harm (None when it did); ``gradual``: the
    run starts healthy and fails slowly (what the early warnings' forecasts are measured on)."""

    name: str
    cause: str
    doc: str
    applies: Callable[[Family], bool]
    inject: Callable[[Build], None]
    expect: Callable[[Build], Expect]
    bites: Callable[[Evidence], str | None]
    configure: Callable[[Build], None] | None = None
    setup: Callable[[Build], None] | None = None
    gradual: bool = False      # a slowly failing run: healthy at first, the fault grows at a constant rate


def _set_lr(factor_sgd: float, factor_adam: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        b.opt = b.opt.scaled(factor_sgd if b.opt.kind == "sgd" else factor_adam)
    return inject


LR_UP = (300.0, 1000.0)     # SGD 0.05 -> 15, Adam 1e-3..1e-2 -> 1..10


def _adam(lr: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        b.opt = Opt("adam", lr)
    return inject


def _transformer_no_warmup(b: Build) -> None:
    b.opt = Opt("adamw", 1e-1)


def owner(param: str) -> str:
    return param.rsplit(".", 1)[0]


def _negative_bias(b: Build) -> None:
    site = b.sites().middle("relu", blocking=True)
    with torch.no_grad():
        b.param(site.bias).fill_(-20.0)


def dropout_as_keep_prob(b: Build) -> None:
    """``F.dropout(h, p=keep_prob)`` on the middle ReLU-family activation's input, with keep_prob 1.0 (a keep
    probability passed where PyTorch takes the probability of dropping, as in a port from TensorFlow 1):
    in training every element is dropped, so the activation reads 0 for every input."""
    site = b.sites().middle("relu", blocking=True)
    dict(b.model.named_modules())[site.pre].register_forward_hook(
        lambda m, i, out: F.dropout(out, p=1.0, training=m.training))


def dropout_schedule_to_one(b: Build) -> None:
    """A dropout schedule on the middle ReLU-family activation's input whose p rises linearly from 0 to
    1.0 at ``RAMP_CROSS`` of the run (a schedule of the keep probability's complement run past its end):
    ever fewer elements pass, then none, and the activation reads 0 for every input."""
    site = b.sites().middle("relu", blocking=True)
    p = {"now": 0.0}
    end = RAMP_CROSS * b.steps

    def rise(step, opt, end=end):
        p["now"] = min(1.0, step / end)
    b.schedule.append(rise)
    dict(b.model.named_modules())[site.pre].register_forward_hook(
        lambda m, i, out: F.dropout(out, p=p["now"], training=m.training))


def unit_mask_zeros(b: Build) -> None:
    """A unit mask (meant to prune a few units of the middle ReLU-family activation's input) made with
    ``torch.zeros`` where ``torch.ones`` was meant: every unit is multiplied by 0."""
    site = b.sites().middle("relu", blocking=True)

    def mask(m, i, out):
        shape = (out.shape[1],) + (1,) * (out.dim() - 2)
        return out * torch.zeros(shape, dtype=out.dtype, device=out.device)
    dict(b.model.named_modules())[site.pre].register_forward_hook(mask)


def dead_expect(kind: str, **need):
    def expect(b: Build) -> Expect:
        site = b.sites().middle(kind, blocking=True, **need)
        return Expect((V("dead_units", site.place), V("bad_initialization", owner(site.bias))), (0, 2))
    return expect


def _squash_bias(b: Build) -> None:
    site = b.sites().middle("squash")
    with torch.no_grad():
        b.param(site.bias).fill_(20.0)


def squash_expect(owner_of: Callable) -> Callable[[Build], Expect]:
    def expect(b: Build) -> Expect:
        site = b.sites().middle("squash")
        return Expect((V("saturated_activations", site.place), V("bad_initialization", owner_of(site))), (0, 2))
    return expect


def deep(act: str | None, depths: tuple[int, int]) -> Callable[[Build], None]:
    def configure(b: Build) -> None:
        if act is not None:
            b.arch["act_override"] = act
        b.arch["depth"] = depths[b.var.depth]
    return configure


def _stack_places(b: Build, with_model: bool = True) -> tuple:
    s = b.sites()
    return tuple(s.stack[:-1]) + (("",) if with_model else ())


def vanishing_expect(b: Build) -> Expect:
    return Expect((V("vanishing_gradients", *_stack_places(b)),), (0, 10))


def _gain_init(gain: float) -> Callable[[Build], None]:
    """Every weight layer drawn N(0, (gain * sqrt(2 / fan_in))^2): each one amplifies by ~gain."""
    def inject(b: Build) -> None:
        with torch.no_grad():
            for name in b.sites().weights:
                w = b.param(f"{name}.weight")
                w.normal_(0.0, gain * math.sqrt(2.0 / w[0].numel()))
    return inject


def _scale_weights(factor: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        with torch.no_grad():
            for name in b.sites().weights:
                b.param(f"{name}.weight").mul_(factor)
    return inject


def _std_three(b: Build) -> None:
    with torch.no_grad():
        for name in b.sites().weights:
            b.param(f"{name}.weight").normal_(0.0, 3.0)


def _zero_init(b: Build) -> None:
    """Every weight layer's weights and biases set to zero (``model.apply`` with ``nn.init.zeros_``)."""
    with torch.no_grad():
        for name in b.sites().weights:
            b.param(f"{name}.weight").zero_()
            bias = dict(b.model.named_parameters()).get(f"{name}.bias")
            if bias is not None:
                bias.zero_()


def _recurrent_scale(factor: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        rnn = dict(b.model.named_modules())[b.sites().recurrent]
        with torch.no_grad():
            for name, p in rnn.named_parameters():
                if name.startswith("weight_hh"):
                    p.mul_(factor)
    return inject


def _float_last_dim(b: Build) -> int:
    x, _ = b.task.data(0)
    return x.shape[-1]


def _log_front(b: Build) -> None:
    b.wrap(M.front("feat", M.LogFeatures(_float_last_dim(b)), b.core), "net.")


def _fp16_softmax(b: Build) -> None:
    b.wrap(M.back(b.core, "prob", M.HalfTemperedSoftmax(0.01)), "net.")
    b.loss = M.nll_of_probs


def map_data(fn: Callable) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        data = b.task.data
        b.task = b.task.with_data(lambda step, data=data, b=b: fn(step, *data(step), b))
    return inject


def _nan_row(step, x, y, b):
    if step == _nan_step(b):
        x = x.clone()
        x[0] = float("nan")
    return x, y


def _nan_step(b: Build) -> int:
    return b.steps // 3


def _raw_units(step, x, y, b):
    raw = 128.0 + 64.0 * x
    return raw, (raw if b.task.kind == "regression" else y)


def _shuffle_labels(step, x, y, b):
    g = torch.Generator().manual_seed(7_777 + step)
    return x, y[torch.randperm(len(y), generator=g)]


EPOCH_BATCHES = 60   # batches in one pass over a data set read in a fixed order


def epoch_pool(b: Build, offset: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A data set of ``EPOCH_BATCHES`` of the task's batches (drawn apart from the ones it trains on), and
    the batch size."""
    xs, ys = zip(*(b.task.data(offset + i) for i in range(EPOCH_BATCHES)))
    return torch.cat(xs), torch.cat(ys), len(ys[0])


def _label_sorted(b: Build) -> None:
    """The data set sorted by label and read in that order every epoch (a loader without shuffle=True over
    files grouped by class): every batch holds one class, the class changes every few batches."""
    x, y, batch = epoch_pool(b, 20_000)
    order = torch.sort(y, stable=True).indices
    x, y = x[order], y[order]

    def data(step: int):
        i = (step % EPOCH_BATCHES) * batch
        return x[i:i + batch], y[i:i + batch]
    b.task = b.task.with_data(data)


def _rnn_not_batch_first(b: Build) -> None:
    """The recurrent module built without batch_first=True and fed (batch, time, features): it runs along
    the batch, each time step a separate sequence, and the head reads the last time step of every sample."""
    b.core.rnn.batch_first = False


def _attention_not_batch_first(b: Build) -> None:
    """Every nn.MultiheadAttention left at batch_first=False and fed (batch, tokens, dim): each token attends
    over the samples of the batch at its position, not over its own sequence."""
    for m in b.core.modules():
        if isinstance(m, nn.MultiheadAttention):
            m.batch_first = False


class FoldedView(nn.Module):
    """Features stored (features, batch) and read back with a view where a transpose was meant:
    ``x.reshape(n, -1)`` laid out again as ``(features, n)`` and transposed, each row a mix of samples."""

    def forward(self, x):
        n = x.shape[0]
        return x.reshape(n, -1).reshape(-1, n).t().reshape(x.shape)


def _view_mixes_batch(b: Build) -> None:
    b.wrap(M.front("view", FoldedView(), b.core), "net.")


def _view_expect(b: Build) -> Expect:
    return Expect((V("data", "view", b.sites().weights[0]),), (0, 10))


# -- slowly failing: the fault grows at a constant rate from a healthy start ---------------------------

RAMP_CROSS = 0.6   # share of the run by which a gradual fault has grown by its factor


def per_step(factor: float, b: Build) -> float:
    """The constant rate that grows a quantity ``factor`` times over ``RAMP_CROSS`` of the run."""
    return factor ** (1.0 / (RAMP_CROSS * b.steps))


def _lr_ramp(b: Build) -> None:
    rate, start = LR_RAMP ** (1.0 / b.steps), b.opt.lr / 10

    def ramp(step, opt, rate=rate, start=start):
        for g in opt.param_groups:
            g["lr"] = start * rate ** step
    b.schedule.append(ramp)


LR_RAMP = 1e4   # from a tenth of the working learning rate, 10^4 x over the run (its working rate at a quarter)


def _lr_decay_per_batch(b: Build) -> None:
    start = b.opt.lr

    def decay(step, opt, start=start):  # StepLR(step_size=LR_DECAY_EVERY, gamma=LR_DECAY) stepped every batch
        for g in opt.param_groups:
            g["lr"] = start * LR_DECAY ** (step // LR_DECAY_EVERY)
    b.schedule.append(decay)


LR_DECAY, LR_DECAY_EVERY = 0.1, 3   # a thousandfold below the working rate by step 9


def _growing_inputs(step, x, y, b):
    k = per_step(INPUT_DRIFT, b) ** step
    return x * k, (y * k if b.task.kind == "regression" else y)


INPUT_DRIFT = 20.0   # the inputs grow 20x over 60% of the run, and on at the same rate


def gradual_onset(b: Build) -> tuple[int, int]:
    """Where a verdict may date a gradual fault: from a quarter of the run to its end."""
    return b.steps // 4, b.steps


def _unrepresentable(b: Build) -> None:
    if b.family.has("tokens"):
        b.task_maker = lambda batch, seed: T.token_order(batch, seed)
    else:
        b.task_maker = lambda batch, seed: T.xor_binary(16, batch, seed)


def _over_regularised(b: Build) -> None:
    if b.opt.kind == "sgd":
        b.opt = Opt("sgd", b.opt.lr, b.opt.kwargs + (("weight_decay", 2.0),))
    else:
        b.opt = Opt("adamw", b.opt.lr, (("weight_decay", 0.5 / b.opt.lr),))


def _scale_qk(factor: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        with torch.no_grad():
            for a in b.sites().attention:
                a.q(b.core).mul_(factor)
                a.k(b.core).mul_(factor)
    return inject


def attention_places(b: Build) -> tuple:
    return tuple(a.place for a in b.sites().attention)


def _qk_expect(b: Build) -> Expect:
    places = attention_places(b)
    children = tuple(f"{p}.{c}" for p in places for c in ("q", "k")) if b.family.has("custom_attention") else ()
    return Expect((V("attention_collapse", *places), V("bad_initialization", *places, *children)), (0, 2))


def lr_high_verdicts(b: Build, chain: str | None = None) -> tuple:
    """The learning rate, for the model; on a Transformer also the attention collapse it causes, with the
    learning rate in its chain."""
    out = (V("learning_rate_too_high", "", chain=chain),)
    if b.family.has("attention"):
        out += (V("attention_collapse", *attention_places(b), chain="learning rate"),)
    return out


def _lr_expect(onset: Callable[[Build], tuple]) -> Callable[[Build], Expect]:
    return lambda b: Expect(lr_high_verdicts(b), onset(b))


def init_sensitive(f: Family) -> bool:
    """Families whose loss an initial weight scale can ruin: no normalisation to absorb it, not convex
    (logistic regression), not a lone embedding under Adam (it moves each row by ~lr whatever its scale)."""
    return f.has("mlp_stack", "sgd") or f.name == "autoencoder"


def only(*names: str) -> Callable[[Family], bool]:
    """Applies to the families named (a fault that fits every family is spread over a diverse part of
    them, to keep the runs per cause comparable)."""
    return lambda f: f.name in names


def _gradient_amplifier(b: Build) -> None:
    """Insert a module that multiplies the gradient by 1e4 after the middle hidden activation."""
    layers = list(b.core)
    acts = [i for i, m in enumerate(layers) if isinstance(m, (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid))]
    at = acts[len(acts) // 2] + 1
    layers.insert(at, M.GradientScale(1e4))
    b.core = b.model = nn.Sequential(*layers)
    b.arch["amplifier"] = str(at)


def _gradient_reversal(b: Build) -> None:
    """Insert a gradient reversal layer with coefficient 1e4 (where 1e-4 was meant) after the middle
    conv block's activation."""
    layers = list(b.core)
    acts = [i for i, m in enumerate(layers) if isinstance(m, (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid))]
    at = acts[len(acts) // 2] + 1
    layers.insert(at, M.GradientScale(-1e4))
    b.core = b.model = nn.Sequential(*layers)
    b.arch["reversal"] = str(at)


SPARSITY = 1e4    # the penalty's weight grows this many times over 60% of the run
SPARSITY_START = 1e-3


def _sparsity_ramp(b: Build) -> None:
    """An L1 penalty on the middle ReLU's output (a sparsity regulariser) whose weight grows by the same
    factor every step: it pushes the units' inputs below zero, more of them every step."""
    site = b.sites().middle("relu", blocking=True)
    held: dict = {}
    dict(b.model.named_modules())[site.place].register_forward_hook(lambda m, i, out: held.__setitem__("h", out))
    weight = {"now": SPARSITY_START}
    rate = per_step(SPARSITY, b)

    def grow(step, opt, rate=rate):
        weight["now"] = SPARSITY_START * rate ** step
    b.schedule.append(grow)
    task_loss = b.loss
    b.loss = lambda out, y: task_loss(out, y) + weight["now"] * held["h"].abs().mean()


def _mechanism_list() -> list[Mechanism]:
    return [
        # -- learning rate too high ------------------------------------------------------------------
        Mechanism("lr_scaled_up", "learning_rate_too_high",
                  "the family's optimizer at 300x (SGD) or 1000x (Adam) its working learning rate",
                  lambda f: True, _set_lr(*LR_UP), _lr_expect(lambda b: (0, 10)), worse_than_twin),
        Mechanism("transformer_no_warmup", "learning_rate_too_high",
                  "AdamW at 1e-1 from the first step on a Transformer (no warm-up)",
                  lambda f: f.has("attention"), _transformer_no_warmup,
                  lambda b: Expect(lr_high_verdicts(b), (0, b.steps)), worse_than_twin),
        Mechanism("relu_killed_by_update", "learning_rate_too_high",
                  "Adam at 0.3: large first updates push ReLU units below zero for every input",
                  lambda f: f.name in ("mlp_relu", "autoencoder"), _adam(0.3),
                  lambda b: Expect((V("learning_rate_too_high", "", chain="dead"),
                                    V("dead_units", *[s.place for s in b.sites().relu])), (0, 60)),
                  all_of(killed_during_training, worse_than_twin)),
        Mechanism("lr_ramp", "learning_rate_too_high",
                  "a warm-up that never stops: from a tenth of the working learning rate, the same factor every "
                  "step, 10^4 x over the run (the working rate a quarter of the way in, 1000x it at the end)",
                  only("mlp_relu", "mlp_tanh", "mlp_gelu", "cnn_bn", "lstm", "gru", "autoencoder"), _lr_ramp,
                  lambda b: Expect(lr_high_verdicts(b), gradual_onset(b)), worse_than_twin, gradual=True),
        # -- learning rate too low -------------------------------------------------------------------
        Mechanism("lr_scaled_down", "learning_rate_too_low",
                  "the family's optimizer at 1e-5 of its working learning rate",
                  lambda f: True, _set_lr(1e-5, 1e-5),
                  lambda b: Expect((V("learning_rate_too_low", ""),), (0, 10)), no_progress),
        Mechanism("lr_decay_per_batch", "learning_rate_too_low",
                  "a step schedule meant in epochs stepped every batch: the working learning rate x0.1 every "
                  "3 steps, a thousandfold lower by step 9",
                  lambda f: True, _lr_decay_per_batch,
                  lambda b: Expect((V("learning_rate_too_low", ""),), (0, 2 * LR_DECAY_EVERY)), worse_than_twin),
        # -- dead units ------------------------------------------------------------------------------
        Mechanism("negative_bias", "dead_units",
                  "the bias feeding the middle ReLU-family activation set to -20: it outputs 0 for every input",
                  lambda f: f.has("relu"), _negative_bias, dead_expect("relu"),
                  all_of(site_state("dead", lambda b: b.sites().middle("relu", blocking=True).place, "start"),
                         site_state("dead", lambda b: b.sites().middle("relu", blocking=True).place, "end"),
                         worse_than_twin)),
        Mechanism("sparsity_penalty_ramp", "dead_units",
                  "an L1 penalty on the middle ReLU's output whose weight grows by the same factor every step "
                  "(1e-3, then 1e4 times that by 60% of the run): more of its units are pushed below zero every step",
                  only("mlp_relu", "cnn_bn", "residual_cnn", "autoencoder"), _sparsity_ramp,
                  lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place),),
                                   gradual_onset(b)), worse_than_twin, gradual=True),
        Mechanism("dropout_as_keep_prob", "dead_units",
                  "functional dropout on the middle ReLU-family activation's input called with a keep probability "
                  "of 1.0 as its p: in training every element is dropped, the activation outputs 0 for every input",
                  only("mlp_relu", "mlp_gelu", "cnn_bn", "cnn_bn_functional", "autoencoder"),
                  dropout_as_keep_prob,
                  lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place,
                                      b.sites().middle("relu", blocking=True).pre),), (0, 2)),
                  worse_than_twin),
        Mechanism("dropout_schedule_to_one", "dead_units",
                  "a dropout schedule on the middle ReLU-family activation's input whose p rises from 0 to 1.0 by 60% "
                  "of the run: ever fewer elements pass, then none",
                  only("mlp_relu", "cnn_bn", "cnn_bn_functional", "autoencoder"), dropout_schedule_to_one,
                  lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place,
                                      b.sites().middle("relu", blocking=True).pre),), gradual_onset(b)),
                  worse_than_twin, gradual=True),
        Mechanism("unit_mask_zeros", "dead_units",
                  "a unit mask on the middle ReLU-family activation's input made with torch.zeros where torch.ones "
                  "was meant: the activation reads 0 for every input",
                  only("mlp_relu", "mlp_gelu", "cnn_bn", "cnn_bn_functional"), unit_mask_zeros,
                  lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place,
                                      b.sites().middle("relu", blocking=True).pre),), (0, 2)),
                  worse_than_twin),
        # -- saturated activations -------------------------------------------------------------------
        Mechanism("squash_bias_shift", "saturated_activations",
                  "the bias before the middle tanh/sigmoid set to +20: it sits at its upper bound for every input",
                  lambda f: f.has("squash"), _squash_bias, squash_expect(lambda s: owner(s.bias)),
                  all_of(site_state("saturated", lambda b: b.sites().middle("squash").place, "start", 0.6),
                         worse_than_twin)),
        # -- vanishing gradients ---------------------------------------------------------------------
        Mechanism("deep_sigmoid_stack", "vanishing_gradients",
                  "the hidden stack made of 6 or 10 sigmoid layers at the default init",
                  lambda f: f.has("mlp_stack") and f.has("sgd"), lambda b: None, vanishing_expect,
                  all_of(gradient_attenuates(1e-3), worse_than_twin), configure=deep("sigmoid", (6, 10))),
        # -- exploding gradients ---------------------------------------------------------------------
        Mechanism("recurrent_weights_large", "exploding_gradients",
                  "the recurrent (hidden-to-hidden) weights x50 at initialisation",
                  lambda f: f.has("recurrent"), _recurrent_scale(50.0),
                  lambda b: Expect((V("exploding_gradients", b.sites().recurrent),
                                    V("bad_initialization", b.sites().recurrent)), (0, 2)),
                  all_of(gradient_grows(100.0), worse_than_twin)),
        Mechanism("deep_unnormalised_gain", "exploding_gradients",
                  "8 or 12 hidden layers without normalisation, each weight drawn at twice the He scale",
                  lambda f: f.has("mlp_stack") and f.has("relu"), _gain_init(2.0),
                  lambda b: Expect((V("exploding_gradients", *_stack_places(b)), V("bad_initialization", "")),
                                   (0, 2)),
                  all_of(gradient_grows(100.0), worse_than_twin), configure=deep(None, (8, 12))),
        Mechanism("gradient_amplifier", "exploding_gradients",
                  "a module that multiplies the gradient flowing back through it by 1e4, in the middle of an MLP",
                  only("mlp_relu", "mlp_tanh", "mlp_gelu"), _gradient_amplifier,
                  lambda b: Expect((V("exploding_gradients", b.arch["amplifier"]),), (0, 2)), worse_than_twin),
        Mechanism("gradient_reversal_large", "exploding_gradients",
                  "a gradient reversal layer (domain-adversarial training) after the middle conv block, its "
                  "coefficient 1e4 where 1e-4 was meant: the gradient into the blocks before it is reversed and x1e4",
                  only("cnn_bn"), _gradient_reversal,
                  lambda b: Expect((V("exploding_gradients", b.arch["reversal"]),), (0, 2)), worse_than_twin),
        # -- non-finite values -----------------------------------------------------------------------
        Mechanism("log_of_negative", "non_finite",
                  "a hand-written feature map takes the log of a projection of the input that can be negative",
                  only("mlp_relu", "mlp_gelu", "cnn_bn", "lstm", "autoencoder", "logistic_regression"), _log_front,
                  lambda b: Expect((V("non_finite", "feat"),), (0, 2)), nonfinite_by(lambda b: 2)),
        Mechanism("fp16_softmax_overflow", "non_finite",
                  "a hand-written softmax at temperature 0.01 computed in float16: exp overflows",
                  only("mlp_relu", "mlp_tanh", "cnn_bn_functional", "residual_cnn", "lstm", "gru",
                       "transformer_postln_mha", "transformer_preln_custom", "embedding_bag"), _fp16_softmax,
                  lambda b: Expect((V("non_finite", "prob"),), (0, 10)), nonfinite_by(lambda b: 10)),
        # -- data ------------------------------------------------------------------------------------
        Mechanism("nan_input_row", "data",
                  "one row of the batch at a third of the run is NaN",
                  only("mlp_tanh", "mlp_gelu", "cnn_bn", "cnn_bn_functional", "lstm", "gru", "autoencoder",
                       "logistic_regression"), map_data(_nan_row),
                  lambda b: Expect((V("data", "input"),), (_nan_step(b), _nan_step(b))),
                  nonfinite_by(_nan_step)),
        Mechanism("raw_input_scale", "data",
                  "inputs left in raw 0-255 units (mean 128, spread 64); an autoencoder reconstructs them raw",
                  lambda f: f.has("float_input") and not f.has("norm"), map_data(_raw_units),
                  lambda b: Expect((V("data", "input"),), (0, 2)), worse_than_twin),
        Mechanism("input_scale_drift", "data",
                  "the inputs grow by the same factor every step (a normalisation whose statistics drift): 20x "
                  "their scale by 60% of the run, and on at the same rate",
                  only("logistic_regression", "mlp_relu", "mlp_gelu"), map_data(_growing_inputs),
                  lambda b: Expect((V("data", "input"),), gradual_onset(b)), worse_than_twin, gradual=True),
        Mechanism("shuffled_labels", "data",
                  "the targets are shuffled within each batch, apart from their inputs",
                  lambda f: True, map_data(_shuffle_labels),
                  lambda b: Expect((V("data", "input"), V("loss_plateau", "")), (0, b.steps)), at_chance),
        Mechanism("label_sorted", "data",
                  "the data set sorted by label and read in that order every epoch of 60 batches (no shuffling)",
                  lambda f: f.has("classes"), _label_sorted,
                  lambda b: Expect((V("data", "input"),), (0, EPOCH_BATCHES)), worse_on_fresh_batches),
        Mechanism("rnn_not_batch_first", "data",
                  "nn.LSTM / nn.GRU left at batch_first=False and fed (batch, time, features): the recurrence runs "
                  "across the samples of the batch",
                  lambda f: f.has("recurrent"), _rnn_not_batch_first,
                  lambda b: Expect((V("data", b.prefix + "rnn"),), (0, 10)), worse_than_twin),
        Mechanism("attention_not_batch_first", "data",
                  "nn.MultiheadAttention left at batch_first=False and fed (batch, tokens, dim): attention runs "
                  "across the samples of the batch",
                  lambda f: f.has("attention") and not f.has("custom_attention"), _attention_not_batch_first,
                  lambda b: Expect((V("data", *attention_places(b)),), (0, 10)), worse_than_twin),
        Mechanism("view_mixes_batch", "data",
                  "the input read with a view where a transpose was meant (stored features x batch): every row a mix "
                  "of samples",
                  only("logistic_regression", "mlp_relu", "cnn_bn", "lstm", "autoencoder"), _view_mixes_batch,
                  _view_expect, worse_than_twin),
        # -- loss plateau ----------------------------------------------------------------------------
        Mechanism("unrepresentable_task", "loss_plateau",
                  "labels the model cannot express: XOR for a linear model, token order for a bag of tokens",
                  lambda f: f.name in ("logistic_regression", "embedding_bag"), lambda b: None,
                  lambda b: Expect((V("loss_plateau", ""),), (0, b.steps)), at_chance,
                  configure=_unrepresentable),
        Mechanism("weight_decay_too_strong", "loss_plateau",
                  "weight decay so strong (SGD 2.0; AdamW lr*wd = 0.5) that it holds the weights near zero",
                  only("logistic_regression", "mlp_relu", "mlp_gelu", "cnn_bn", "residual_cnn", "lstm",
                       "transformer_postln_mha", "transformer_preln_custom", "embedding_bag", "autoencoder"),
                  _over_regularised,
                  lambda b: Expect((V("loss_plateau", ""),), (0, b.steps)), all_of(at_chance, worse_than_twin)),
        # -- bad initialisation ----------------------------------------------------------------------
        Mechanism("tiny_init", "bad_initialization",
                  "every weight layer scaled x0.01 at initialisation",
                  init_sensitive, _scale_weights(0.01),
                  lambda b: Expect((V("bad_initialization", ""), V("vanishing_gradients", *_stack_places(b))),
                                   (0, 2)), worse_than_twin),
        Mechanism("large_normal_init", "bad_initialization",
                  "every weight layer drawn from N(0, 3^2) (a gain used as the standard deviation)",
                  init_sensitive, _std_three, lambda b: Expect((V("bad_initialization", ""),), (0, 2)),
                  worse_than_twin),
        Mechanism("zero_init", "bad_initialization",
                  "every weight layer's weights and biases zeroed at initialisation (nn.init.zeros_ over the model)",
                  only("mlp_relu", "mlp_tanh", "cnn_bn", "cnn_bn_functional", "autoencoder"),
                  _zero_init, lambda b: Expect((V("bad_initialization", ""),), (0, 2)), worse_than_twin),
        # -- attention collapse ----------------------------------------------------------------------
        Mechanism("qk_scale_large", "attention_collapse",
                  "the query and key projections x16 at initialisation: attention logits 256x, one key per query",
                  lambda f: f.has("attention"), _scale_qk(16.0), _qk_expect,
                  all_of(attention_collapsed("start"), worse_than_twin)),
    ]


MECHANISMS: dict[str, Mechanism] = {m.name: m for m in _mechanism_list()}
