"""The held-out part of the fault generator: whole model families and whole fault mechanisms that
the reasoner is measured on and never tuned on.

Every run of a held-out family, and every run of a held-out mechanism (on any family), is held out;
the development part shares neither a family nor a mechanism with it (split by group, as
scikit-learn's GroupKFold does, never by seed). These definitions were written and committed before
the reasoner was measured on them. Nobody looks at a held-out miss to decide a change to the
reasoner: a held-out case that drives a change moves to the development part (its family or
mechanism goes into ``families.py`` / ``faults.py``) and a new one, built the same way, takes its
place here.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import faults as K
from . import models as M
from . import tasks as T
from .families import (Build, Family, Opt, mlp_family, recurrent_family, recurrent_sites, transformer_family,
                       transformer_sites)
from .faults import V, Evidence, Expect, Mechanism

# -- families ----------------------------------------------------------------------------------------

FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("mlp_gelu", mlp_family("gelu"), lambda b, s: T.teacher_classes(10, 4, b, s),
           Opt("sgd", 0.05, (("momentum", 0.9),)), (32, 128), (2, 4),
           frozenset({"float_input", "classes", "sgd", "mlp_stack", "relu"})),
    Family("gru", recurrent_family("gru"), lambda b, s: T.sequence_sign(b, s), Opt("adam", 1e-2), (16, 32), (1, 2),
           frozenset({"float_input", "classes", "recurrent", "adam"}), recurrent_sites),
    Family("transformer_preln_custom", transformer_family(True, "custom"), lambda b, s: T.token_majority(b, s),
           Opt("adamw", 3e-3), (16, 32), (1, 2),
           frozenset({"tokens", "classes", "attention", "norm", "adam", "custom_attention"}), transformer_sites),
]}


# -- modules the held-out faults bring in ------------------------------------------------------------

class Standardize(nn.Module):
    """Per-feature standardisation over the batch, written without an epsilon."""

    def forward(self, x):
        return (x - x.mean(0, keepdim=True)) / x.std(0, keepdim=True)


# -- how the faults are put in -----------------------------------------------------------------------

def jump_step(b: Build) -> int:
    return b.steps // 3


def lr_jump(b: Build) -> None:
    at, factor = jump_step(b), K.LR_UP[0] if b.opt.kind == "sgd" else K.LR_UP[1]

    def jump(step, opt, at=at, factor=factor):
        if step == at:
            for g in opt.param_groups:
                g["lr"] *= factor
    b.schedule.append(jump)


def warmup_over(total: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        base = b.opt.lr

        def warmup(step, opt):
            for g in opt.param_groups:
                g["lr"] = base * (step + 1) / total
        b.schedule.append(warmup)
    return inject


def negative_weights(b: Build) -> None:
    site = b.sites().middle("relu", blocking=True, positive_input=True)
    with torch.no_grad():
        b.param(site.weight).abs_().neg_()
        b.param(site.weight.replace(".weight", ".bias")).abs_().neg_()


def sigmoid_head(b: Build) -> None:
    with torch.no_grad():
        b.core.linear.weight.mul_(100.0)
    b.wrap(M.back(b.core, "prob", nn.Sigmoid()), "net.")
    b.loss = lambda p, y: F.binary_cross_entropy(p.squeeze(-1), y)


def sigmoid_cnn(b: Build) -> None:
    K.deep("sigmoid", (6, 10))(b)
    b.arch["norm"] = False


def head_gradient_scale(b: Build) -> None:
    """A gradient scale of 1e6 in front of the first fully connected layer after the convolutions (a
    loss-weighting trick put on the features instead of the loss)."""
    name = next(n for n, m in b.core.named_children() if isinstance(m, nn.Linear))
    setattr(b.core, name, nn.Sequential(M.GradientScale(1e6), getattr(b.core, name)))
    b.arch["scaled"] = f"{name}.0"


def standardize_front(b: Build) -> None:
    b.wrap(M.front("norm", Standardize(), b.core), "net.")
    data = b.task.data

    def constant_feature(step, data=data):
        x, y = data(step)
        x = x.clone()
        x[..., 0] = 1.0
        return x, y
    b.task = b.task.with_data(constant_feature)


def targets_out_of_range(step, x, y, b):
    return x, (y * 255.0 if b.task.kind == "binary" else 500.0 + 300.0 * y)


def middle_weight(b: Build) -> str:
    w = b.sites().weights
    return w[len(w) // 2]


def scale_middle(factor: float) -> Callable[[Build], None]:
    def inject(b: Build) -> None:
        with torch.no_grad():
            b.param(f"{middle_weight(b)}.weight").mul_(factor)
    return inject


def one_layer_expect(b: Build) -> Expect:
    layer = middle_weight(b)
    accepted = [V("bad_initialization", layer)]
    after = [s for s in b.sites().squash if s.weight == f"{layer}.weight"]
    if after:
        accepted.append(V("saturated_activations", after[0].place))
    return Expect(tuple(accepted), (0, 2))


def mask_sign_flipped(b: Build) -> None:
    """A padding mask meant to push the last (padding) key to -1e4 is added with the wrong sign."""
    length = b.task.data(0)[0].shape[1]
    bias = torch.zeros(length)
    bias[-1] = 1e4
    for a in b.sites().attention:
        dict(b.model.named_modules())[a.place].key_bias = bias


def norm_scale_zero(b: Build) -> None:
    """The normalisation before the middle ReLU gets its scale (``weight``, gamma) initialised to 0, a
    zero-init meant for a residual branch's last norm applied to every norm: it outputs its bias (0) for
    every input, and a ReLU at 0 passes no gradient back to the scale."""
    site = b.sites().middle("relu", blocking=True)
    with torch.no_grad():
        b.param(f"{site.pre}.weight").zero_()


def pre_activation_offset(b: Build) -> None:
    """A shift meant for the raw data (subtract its mean, 30) applied to the middle ReLU-family activation's
    input instead, by a forward hook on the module that feeds it: every value it reads is far below 0."""
    site = b.sites().middle("relu", blocking=True)
    dict(b.model.named_modules())[site.pre].register_forward_hook(lambda m, i, out: out - 30.0)


# -- did it bite? ------------------------------------------------------------------------------------

def worse_after_jump(e: Evidence) -> str | None:
    """The loss after the jump ends having lost at least half of what it had gained over chance before it,
    and clearly worse than the run without the jump."""
    p, at = e.probe, jump_step(e.build)
    if p.nonfinite_step is not None and p.nonfinite_step >= at:
        return None
    before = p.median(at - 10, at)
    if p.last >= before + 0.5 * (p.baseline - before):
        return K.worse_than_twin(e)
    return f"loss {before:.3g} before the jump, {p.last:.3g} at the end"


def below_zero_or_far(e: Evidence) -> str | None:
    """A cross-entropy against targets outside [0, 1] falls below zero; squared errors against raw targets
    stay far above what the run reaches on the right ones."""
    p = e.probe
    if p.nonfinite_step is not None or min(p.losses) < -1.0:
        return None
    return K.worse_than_twin(e)


def class_groups_sorted(b: Build) -> None:
    """The data set sorted by pairs of classes (a superclass, the source a class was collected from) and
    read in that order every epoch: each batch holds two classes of the task's three or four, in turn."""
    x, y, batch = K.epoch_pool(b, 30_000)
    order = torch.sort(torch.div(y, 2, rounding_mode="floor"), stable=True).indices
    x, y = x[order], y[order]

    def data(step: int):
        i = (step % K.EPOCH_BATCHES) * batch
        return x[i:i + batch], y[i:i + batch]
    b.task = b.task.with_data(data)


class RunningSum(nn.Module):
    """A running sum meant along the sequence (dim=1) taken along dim=0, the batch."""

    def forward(self, x):
        return x.cumsum(dim=0) / torch.arange(1, len(x) + 1, dtype=x.dtype).view(-1, *[1] * (x.dim() - 1)).sqrt()


def running_sum_over_batch(b: Build) -> None:
    b.wrap(M.front("cumsum", RunningSum(), b.core), "net.")


# -- mechanisms --------------------------------------------------------------------------------------

MECHANISMS: dict[str, Mechanism] = {m.name: m for m in [
    Mechanism("lr_schedule_jump", "learning_rate_too_high",
              "a schedule multiplies the working learning rate by 300 (SGD) or 1000 (Adam) a third of the way in",
              K.only("logistic_regression", "mlp_tanh", "cnn_bn_functional", "residual_cnn", "gru", "lstm",
                     "transformer_preln_mha", "transformer_postln_custom", "embedding_bag", "autoencoder"),
              lr_jump, lambda b: Expect(K.lr_high_verdicts(b), (jump_step(b), jump_step(b) + 10)),
              worse_after_jump),
    Mechanism("warmup_too_long", "learning_rate_too_low",
              "a linear warm-up over a million steps (a unit slip): the learning rate stays ~1e-6 of its value",
              K.only("mlp_relu", "mlp_tanh", "cnn_bn", "lstm", "transformer_postln_mha", "transformer_preln_custom",
                     "embedding_bag", "autoencoder"), warmup_over(1e6),
              lambda b: Expect((V("learning_rate_too_low", ""),), (0, 10)), K.no_progress),
    Mechanism("negative_weights", "dead_units",
              "the weight layer before the middle ReLU reads non-negative inputs and its weights and bias are "
              "made non-positive: the ReLU outputs 0 for every input",
              K.only("mlp_relu", "cnn_bn_functional"), negative_weights,
              K.dead_expect("relu", positive_input=True),
              K.all_of(K.site_state("dead", lambda b: b.sites().middle("relu", blocking=True,
                                                                      positive_input=True).place, "end"),
                       K.worse_than_twin)),
    Mechanism("sigmoid_output_saturated", "saturated_activations",
              "a sigmoid output layer and a cross-entropy on its probabilities, the weights before it x100: "
              "the sigmoid returns exactly 0 or 1 and passes no gradient",
              lambda f: f.has("binary"), sigmoid_head,
              lambda b: Expect((V("saturated_activations", "prob"), V("bad_initialization", "net.linear")), (0, 2)),
              K.worse_than_twin),
    Mechanism("sigmoid_cnn_stack", "vanishing_gradients",
              "the conv stack made of 6 or 10 conv + sigmoid layers without BatchNorm",
              K.only("cnn_bn", "cnn_bn_functional"), lambda b: None, K.vanishing_expect,
              K.all_of(K.gradient_attenuates(1e-3), K.worse_than_twin), configure=sigmoid_cnn),
    Mechanism("head_gradient_scale", "exploding_gradients",
              "a module that multiplies the gradient by 1e6 between the convolutions and the fully connected "
              "layers of a CNN trained with SGD",
              K.only("residual_cnn", "cnn_bn_functional"), head_gradient_scale,
              lambda b: Expect((V("exploding_gradients", b.prefix + b.arch["scaled"]),), (0, 2)), K.worse_than_twin),
    Mechanism("standardize_without_eps", "non_finite",
              "an in-model standardisation over the batch without epsilon; one input feature is constant: 0/0",
              K.only("mlp_tanh", "cnn_bn_functional", "residual_cnn", "gru", "autoencoder", "logistic_regression"),
              standardize_front, lambda b: Expect((V("non_finite", "norm"),), (0, 2)), K.nonfinite_by(lambda b: 2)),
    Mechanism("targets_out_of_range", "data",
              "binary targets 0/255 (masks saved as bytes); regression targets in raw units (500 + 300 y)",
              lambda f: f.has("binary") or f.has("regression"), K.map_data(targets_out_of_range),
              lambda b: Expect((V("data", "input"),), (0, 20)), below_zero_or_far),
    Mechanism("class_groups_sorted", "data",
              "the data set sorted by pairs of classes and read in that order every epoch (no shuffling)",
              K.only("mlp_relu", "mlp_tanh", "mlp_gelu", "cnn_bn", "cnn_bn_functional", "residual_cnn"),
              class_groups_sorted,
              lambda b: Expect((V("data", "input"),), (0, 20)), K.worse_on_fresh_batches),
    Mechanism("running_sum_over_batch", "data",
              "a running sum of the input meant along the sequence (dim=1) taken along dim=0, the batch (scaled "
              "by the square root of the count)",
              lambda f: f.has("float_input") and f.has("recurrent"), running_sum_over_batch,
              lambda b: Expect((V("data", "cumsum", b.sites().weights[0], b.prefix + "rnn"),), (0, 10)),
              K.worse_than_twin),
    Mechanism("one_layer_scaled", "bad_initialization",
              "the middle weight layer x1000 at initialisation",
              K.only("mlp_relu", "mlp_gelu", "autoencoder"), scale_middle(1000.0), one_layer_expect, K.worse_than_twin),
    Mechanism("norm_scale_zero", "dead_units",
              "the normalisation before the middle ReLU has its scale initialised to 0 (a residual branch's "
              "zero-init applied to every norm): the ReLU reads 0 for every input and passes no gradient",
              lambda f: f.name in ("cnn_bn", "cnn_bn_functional"), norm_scale_zero,
              lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place,
                                  b.sites().middle("relu", blocking=True).pre),
                                V("bad_initialization", b.sites().middle("relu", blocking=True).pre)), (0, 2)),
              K.worse_than_twin),
    Mechanism("pre_activation_offset", "dead_units",
              "a shift meant for the raw data (minus 30) applied by a forward hook to the middle ReLU-family "
              "activation's input: it reads values far below 0 for every input",
              K.only("mlp_relu", "mlp_gelu", "cnn_bn", "cnn_bn_functional"), pre_activation_offset,
              lambda b: Expect((V("dead_units", b.sites().middle("relu", blocking=True).place,
                                  b.sites().middle("relu", blocking=True).pre),), (0, 2)),
              K.worse_than_twin),
    Mechanism("attention_mask_sign_flipped", "attention_collapse",
              "hand-written attention whose padding mask (+1e4 on the last key) is added with the wrong sign: "
              "every query attends to that one key",
              lambda f: f.has("custom_attention"), mask_sign_flipped,
              lambda b: Expect((V("attention_collapse", *K.attention_places(b)),), (0, 2)),
              K.all_of(K.attention_collapsed("start"), K.worse_than_twin)),
]}
