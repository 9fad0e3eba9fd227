"""The failure zoo: real training loops with one injected fault each, and healthy runs that must stay quiet.

Every case uses the default thresholds and the default sampling. A faulty case asserts the top
hypothesis's cause, layer and an onset window; a healthy one, that nothing reaches confidence 0.5.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import Cause
from zoo import (EmbeddingBagModel, GradientReversal, LogFeatures, NaiveSoftmax, ResNet, Run, SeqClassifier,
                 TransformerBlock, mlp, nll_of_probs, pixels, sequences, teacher_classes, teacher_regression, tokens,
                 train)


@dataclass
class Expect:
    cause: Cause
    layer: str
    onset: tuple[int, int]


# -- faulty runs -----------------------------------------------------------------------------------------

def dead_middle_relu():
    """A ReLU in the middle of an MLP dies from step 0 (large negative bias before it): the root
    is that ReLU, not the vanishing gradient of the layers before it."""
    torch.manual_seed(0)
    model = mlp([8, 32, 32, 32, 3])
    with torch.no_grad():
        model[2].bias.fill_(-20.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3))


def tiny_init_deep_tanh():
    """Eight tanh layers initialised with std 0.01: the signal shrinks layer after layer."""
    torch.manual_seed(0)
    model = mlp([16] + [32] * 8 + [3], act=nn.Tanh)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1), teacher_classes(16, 3), steps=40)


def deep_sigmoid_cnn():
    """Ten conv layers with sigmoid activations: each halves-and-quarters the gradient on its way back."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.Sigmoid()]
    for _ in range(9):
        layers += [nn.Conv2d(8, 8, 3, padding=1), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1), pixels(size=6), steps=30)


def relu_mlp_lr10():
    """SGD at lr=10 on a ReLU MLP: the updates dwarf the weights."""
    torch.manual_seed(0)
    model = mlp([8, 64, 64, 3])
    return Run(model, torch.optim.SGD(model.parameters(), lr=10.0), teacher_classes(8, 3))


def rnn_large_recurrent_init():
    """A ReLU RNN whose recurrent weights start 8x too large: the state grows through time until it
    overflows; the root is the recurrent weights' initial scale."""
    torch.manual_seed(0)
    cell = nn.RNN(4, 32, batch_first=True, nonlinearity="relu")
    with torch.no_grad():
        cell.weight_hh_l0.mul_(8.0)
    model = SeqClassifier(cell, 32)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), sequences(), steps=30)


def gradient_reversal_too_strong():
    """A gradient-reversal layer with its coefficient set to 1e4 instead of ~1: the layers before it
    receive gradients 1e4x those after it, while the forward pass is untouched."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), GradientReversal(1e4),
                          nn.Linear(32, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(8, 3))


def linear_stack_one_layer_x100():
    """A stack of linear layers, one of them scaled x100 at initialisation."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 1))
    with torch.no_grad():
        model[2].weight.mul_(100.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), teacher_regression(16), loss=F.mse_loss)


def log_of_negative():
    """A custom module takes the log of a projection that is negative for some inputs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), LogFeatures(16, 16), nn.Linear(16, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(8, 3))


def naive_softmax_overflow():
    """A hand-written softmax with a sharp temperature: exp overflows to Inf, Inf/Inf is NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3), NaiveSoftmax(sharpness=200.0))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), teacher_classes(8, 3), loss=nll_of_probs)


def nan_targets():
    """A regression whose targets carry a NaN from step 6 on: the model output stays finite."""
    torch.manual_seed(0)
    model = mlp([16, 32, 32, 1])
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_regression(16, nan_target_at=6),
               loss=F.mse_loss, steps=12)


def nan_input_cnn():
    """A CNN whose batch at step 9 has a NaN pixel."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), pixels(nan_at=9), steps=14)


def adam_lr_1e9():
    """Adam at lr=1e-9: nothing moves."""
    torch.manual_seed(0)
    model = mlp([8, 32, 32, 3])
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-9), teacher_classes(8, 3), steps=70)


def unnormalised_pixels():
    """A tanh CNN fed raw 0-255 pixels."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), pixels(raw=True), steps=30)


def compiled_saturated_tanh():
    """A compiled MLP (aot_eager) whose second layer starts with weights x50: its tanh saturates."""
    torch.manual_seed(0)
    model = mlp([8, 32, 32, 32, 3], act=nn.Tanh)
    with torch.no_grad():
        model[2].weight.mul_(50.0)
    compiled = torch.compile(model, backend="aot_eager")
    return Run(compiled, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3), steps=30)


def lstm_dead_head():
    """An LSTM classifier whose head has a ReLU that dies from step 0."""
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        head[0].bias.fill_(-10.0)
    model = SeqClassifier(nn.LSTM(4, 16, batch_first=True), 16, head=head)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), sequences(), steps=20)


def lr_schedule_jump():
    """A schedule bug sets lr to 20 at step 150 of 300: by then the default sampling is sparse, and the
    NaN a few steps later first shows as an overflow in a Linear layer; the root is the learning rate."""
    torch.manual_seed(0)
    model = mlp([8, 64, 64, 3])

    def schedule(step, opt):
        if step == 150:
            for g in opt.param_groups:
                g["lr"] = 20.0
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3), steps=300,
               before_step=schedule)


def wide_layer_x50_before_tanh():
    """A wide tanh MLP whose middle layer starts with weights x50: the weight scale is the root, whether
    it shows as saturation or as a vanishing gradient."""
    torch.manual_seed(3)
    model = mlp([10] + [256] * 6 + [4], act=nn.Tanh)
    with torch.no_grad():
        model[6].weight.mul_(50.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(10, 4, batch=128), steps=30)


def adam_lr_too_high_bounces():
    """Adam at lr=0.3: the loss drops, then bounces between levels; every step rewrites the weights."""
    torch.manual_seed(0)
    model = mlp([8, 32, 3])
    return Run(model, torch.optim.Adam(model.parameters(), lr=0.3), teacher_classes(8, 3), steps=60)


def regression_sgd_diverges():
    """Linear regression with SGD above the stability limit: the loss climbs step after step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 1))
    return Run(model, torch.optim.SGD(model.parameters(), lr=1.5), teacher_regression(16), loss=F.mse_loss,
               steps=30)


def unlearnable_plateau():
    """Labels independent of the inputs: the loss cannot improve and nothing else is wrong (at SGD's lr 0.01 the
    weights would end less than a tenth of their norm from their start in these 70 steps: a rate too low to
    tell; at 0.1 they move)."""
    torch.manual_seed(0)
    model = mlp([8, 32, 3])

    def data(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1), data, steps=70)


def inputs_x1000_mlp():
    """Features left in raw units (x1000): the first layer's gradient, and so every update, is out of
    scale; the ReLU units it pushes dead and the diverging loss follow from the input, not the lr."""
    torch.manual_seed(1)
    model = mlp([20, 64, 64, 5])
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(20, 5, scale=1000.0), steps=120)


def std1_init_relu_mlp():
    """N(0, 1) weights in a width-64 ReLU MLP: no layer alone is 10x out of scale, but together they
    grow the logits ~400x (loss ~500 at step 0); the large first updates are the init's doing."""
    torch.manual_seed(1)
    model = mlp([20, 64, 64, 64, 5])
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=1.0)
            nn.init.zeros_(m.bias)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(20, 5), steps=120)


def tanh_mlp_sgd_lr20():
    """SGD at lr=20 on a tanh MLP: the weights grow until the tanh units saturate. The saturation is a
    symptom in the learning rate's chain, not a root of its own."""
    torch.manual_seed(1)
    model = mlp([20, 64, 64, 64, 5], act=nn.Tanh)
    return Run(model, torch.optim.SGD(model.parameters(), lr=20.0), teacher_classes(20, 5), steps=120)


def deep_sigmoid_mlp_plateau():
    """Four sigmoid layers, default init, SGD: the gradient reaching the first layers is ~1e-3 of the
    head's, never below the vanishing threshold at any one step, and the loss stays flat: the plateau
    is the fading gradient's."""
    torch.manual_seed(1)
    model = mlp([20] + [64] * 4 + [5], act=nn.Sigmoid)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1), teacher_classes(20, 5), steps=120)


def std2_init_tanh_mlp():
    """Every weight layer of a tanh MLP drawn with std 2: three tanh layers saturated from step 0 are
    one fault, the initial weight scale, not three saturations."""
    torch.manual_seed(1)
    model = mlp([20, 64, 64, 64, 5], act=nn.Tanh)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=2.0)
            nn.init.zeros_(m.bias)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(20, 5), steps=120)


def sgd_lr3_behind_a_warmup():
    """SGD at lr=3 reached through a 30-step linear warm-up: the ramp is not a jump; the verdict is the
    learning rate, dated where the updates grow too large, not at the ramp's first doubling."""
    torch.manual_seed(0)
    model = mlp([20, 64, 64, 5])
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    base = 3.0

    def warmup(step, opt):
        for g in opt.param_groups:
            g["lr"] = base * min((step + 1) / 30, 1.0)
    return Run(model, opt, teacher_classes(20, 5), steps=150, before_step=warmup)


FAULTY = {
    "sgd_lr3_behind_a_warmup": (sgd_lr3_behind_a_warmup, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (2, 30))),
    "std2_init_tanh_mlp": (std2_init_tanh_mlp, Expect(Cause.BAD_INITIALIZATION, "", (0, 0))),
    "deep_sigmoid_mlp_plateau": (deep_sigmoid_mlp_plateau, Expect(Cause.VANISHING_GRADIENTS, "2", (0, 0))),
    "inputs_x1000_mlp": (inputs_x1000_mlp, Expect(Cause.DATA, "input", (0, 0))),
    "std1_init_relu_mlp": (std1_init_relu_mlp, Expect(Cause.BAD_INITIALIZATION, "", (0, 0))),
    "tanh_mlp_sgd_lr20": (tanh_mlp_sgd_lr20, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (0, 2))),
    "dead_middle_relu": (dead_middle_relu, Expect(Cause.DEAD_UNITS, "3", (0, 0))),
    "tiny_init_deep_tanh": (tiny_init_deep_tanh, Expect(Cause.BAD_INITIALIZATION, "", (0, 0))),
    "deep_sigmoid_cnn": (deep_sigmoid_cnn, Expect(Cause.VANISHING_GRADIENTS, "10", (0, 2))),
    "relu_mlp_lr10": (relu_mlp_lr10, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (0, 3))),
    "rnn_large_recurrent_init": (rnn_large_recurrent_init, Expect(Cause.BAD_INITIALIZATION, "rnn", (0, 0))),
    "gradient_reversal_too_strong": (gradient_reversal_too_strong, Expect(Cause.EXPLODING_GRADIENTS, "4", (0, 0))),
    "linear_stack_one_layer_x100": (linear_stack_one_layer_x100, Expect(Cause.BAD_INITIALIZATION, "2", (0, 0))),
    "log_of_negative": (log_of_negative, Expect(Cause.NON_FINITE, "2", (0, 0))),
    "naive_softmax_overflow": (naive_softmax_overflow, Expect(Cause.NON_FINITE, "3", (0, 5))),
    "nan_targets": (nan_targets, Expect(Cause.DATA, "input", (6, 6))),
    "nan_input_cnn": (nan_input_cnn, Expect(Cause.DATA, "input", (9, 9))),
    "adam_lr_1e9": (adam_lr_1e9, Expect(Cause.LEARNING_RATE_TOO_LOW, "", (0, 2))),
    "unnormalised_pixels": (unnormalised_pixels, Expect(Cause.DATA, "input", (0, 0))),
    "compiled_saturated_tanh": (compiled_saturated_tanh, Expect(Cause.SATURATED_ACTIVATIONS, "3", (0, 1))),
    "lstm_dead_head": (lstm_dead_head, Expect(Cause.DEAD_UNITS, "head.1", (0, 0))),
    "regression_sgd_diverges": (regression_sgd_diverges, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (0, 10))),
    "adam_lr_too_high_bounces": (adam_lr_too_high_bounces, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (0, 2))),
    "lr_schedule_jump": (lr_schedule_jump, Expect(Cause.LEARNING_RATE_TOO_HIGH, "", (150, 160))),
    "wide_layer_x50_before_tanh": (wide_layer_x50_before_tanh, Expect(Cause.BAD_INITIALIZATION, "6", (0, 0))),
    "unlearnable_plateau": (unlearnable_plateau, Expect(Cause.LOSS_PLATEAU, "", (0, 60))),
}


# -- healthy runs ----------------------------------------------------------------------------------------

def healthy_transformer():
    torch.manual_seed(0)
    model = TransformerBlock()
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), tokens(), steps=30)


def healthy_resnet_bn():
    torch.manual_seed(0)
    model = ResNet()
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), pixels(), steps=25)


def healthy_logistic_regression():
    """A sigmoid output that becomes confident: saturation of the output is the goal, not a fault."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
    data = teacher_classes(8, 2)

    def binary(step):
        x, y = data(step)
        return x * 3, y.float()[:, None]
    return Run(model, torch.optim.Adam(model.parameters(), lr=0.3), binary, loss=F.binary_cross_entropy, steps=40)


def healthy_frozen_backbone():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    for p in list(model[0].parameters()) + list(model[2].parameters()):
        p.requires_grad_(False)
    return Run(model, torch.optim.Adam(model[4].parameters(), lr=1e-2), teacher_classes(8, 3), steps=30)


def healthy_sparse_embedding():
    torch.manual_seed(0)
    model = EmbeddingBagModel()
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.5), tokens(vocab=200), steps=30)


def healthy_dropout_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 64), nn.ReLU(),
                          nn.Dropout(0.5), nn.Linear(64, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), teacher_classes(8, 3), steps=30)


def healthy_lstm():
    torch.manual_seed(0)
    model = SeqClassifier(nn.LSTM(4, 16, batch_first=True), 16)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), sequences(), steps=30)


def healthy_compiled_mlp():
    torch.manual_seed(0)
    model = mlp([8, 32, 32, 3])
    return Run(torch.compile(model, backend="aot_eager"), torch.optim.Adam(model.parameters(), lr=1e-2),
               teacher_classes(8, 3), steps=30)


def healthy_deep_narrow_relu():
    """Six ReLU layers of 16 units at the default init: some units die along the way (up to ~70% of a layer
    from the first step), not a whole layer, and the net learns. (At Adam lr 1e-3 with batches of 8 the
    loss sits at chance for 80 steps: that run has not learned, and is no healthy run.)"""
    torch.manual_seed(3)
    model = mlp([10] + [16] * 6 + [4])
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), teacher_classes(10, 4, batch=32), steps=40)


def healthy_deep_gelu():
    """Six GELU layers of 256 units at the default init, trained with Adam: the gradient shrinks toward
    the input (~1e-3x) without vanishing."""
    torch.manual_seed(3)
    model = mlp([10] + [256] * 6 + [4], act=nn.GELU)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(10, 4, batch=8), steps=40)


def healthy_deep_residual_layernorm():
    """Twelve pre-norm residual blocks: deep, but normalised and residual, so gradients flow."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.fc = nn.Linear(d, d)
            self.act = nn.GELU()

        def forward(self, x):
            return x + self.act(self.fc(self.norm(x)))

    model = nn.Sequential(nn.Linear(8, 32), *[Block(32) for _ in range(12)], nn.LayerNorm(32), nn.Linear(32, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(8, 3), steps=30)


def healthy_zero_init_residual():
    """Residual blocks whose last layer starts at zero (a common init): zero is a choice, not a collapse."""
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc1 = nn.Linear(d, d)
            self.act = nn.ReLU()
            self.fc2 = nn.Linear(d, d)
            nn.init.zeros_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(x)))

    model = nn.Sequential(nn.Linear(8, 32), *[Block(32) for _ in range(4)], nn.Linear(32, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(8, 3), steps=30)


def healthy_regression_summed_loss():
    """MSE summed over a batch of 1024 (the loss starts near 1e3, far above the outputs): a loss scale,
    not targets out of reach; a learning rate scaled down to match."""
    torch.manual_seed(0)
    model = mlp([16, 32, 1])
    return Run(model, torch.optim.SGD(model.parameters(), lr=2e-5), teacher_regression(16, batch=1024),
               loss=lambda out, y: F.mse_loss(out, y, reduction="sum"), steps=60)


def healthy_autoencoder_summed_bce():
    """A 784-pixel autoencoder trained on BCE summed over the batch (VAE style): the loss starts near 7e4,
    far above the outputs, and that is its scale, not targets out of reach."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 784), nn.Sigmoid())
    protos = (torch.rand(10, 784) > 0.5).float()

    def data(step):
        x = protos[torch.randint(0, 10, (128,), generator=torch.Generator().manual_seed(step))]
        return x, x
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data,
               loss=lambda out, y: F.binary_cross_entropy(out, y, reduction="sum"), steps=100)


HEALTHY = {
    "autoencoder_summed_bce": healthy_autoencoder_summed_bce,
    "regression_summed_loss": healthy_regression_summed_loss,
    "transformer_layernorm": healthy_transformer,
    "resnet_batchnorm": healthy_resnet_bn,
    "logistic_regression_sigmoid": healthy_logistic_regression,
    "frozen_backbone": healthy_frozen_backbone,
    "sparse_embedding": healthy_sparse_embedding,
    "dropout_mlp": healthy_dropout_mlp,
    "lstm": healthy_lstm,
    "compiled_mlp": healthy_compiled_mlp,
    "deep_residual_layernorm": healthy_deep_residual_layernorm,
    "deep_narrow_relu": healthy_deep_narrow_relu,
    "deep_gelu_adam": healthy_deep_gelu,
    "zero_init_residual": healthy_zero_init_residual,
}


def _verdict(dbg) -> str:
    return "\n".join(f"  {h} {h.chain}" for h in dbg.explain()) or "  (none)"


@pytest.mark.parametrize("name", sorted(FAULTY))
def test_faulty_run_names_its_root_cause(name):
    build, expect = FAULTY[name]
    dbg = train(build())
    hyps = dbg.explain()
    assert hyps, f"{name}: no hypothesis"
    top = hyps[0]
    msg = f"{name}:\n{_verdict(dbg)}"
    assert top.confidence >= 0.5, msg
    assert (top.cause, top.layer) == (expect.cause, expect.layer), msg
    lo, hi = expect.onset
    assert lo <= top.step <= hi, msg
    assert top.chain and top.evidence and top.suggestion, msg


def test_symptoms_stay_in_their_roots_chain():
    # the saturation the learning rate or the init causes, and the dead units the raw input causes,
    # are not reported again as roots of their own
    for build, symptom in ((tanh_mlp_sgd_lr20, Cause.SATURATED_ACTIVATIONS), (inputs_x1000_mlp, Cause.DEAD_UNITS),
                           (inputs_x1000_mlp, Cause.LEARNING_RATE_TOO_HIGH),
                           (std2_init_tanh_mlp, Cause.SATURATED_ACTIVATIONS)):
        hyps = train(build()).explain()
        assert not [h for h in hyps[1:] if h.cause == symptom and h.confidence >= 0.5], _verdict_of(hyps)


def _verdict_of(hyps) -> str:
    return "\n".join(f"  {h} {h.chain}" for h in hyps) or "  (none)"


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_run_stays_quiet(name):
    dbg = train(HEALTHY[name]())
    loud = [h for h in dbg.explain() if h.confidence >= 0.5]
    assert not loud, f"{name}:\n{_verdict(dbg)}"
    assert "Verdict: healthy" in dbg.report()


# -- the same faults across sizes: defaults are ratios, so the verdict must not depend on width or batch ----

def _sized(fault: str, width: int, depth: int, batch: int) -> tuple[Run, tuple[Cause, str]]:
    torch.manual_seed(3)
    act = nn.Tanh if fault in ("tiny_init", "raw_scale") else nn.ReLU
    model = mlp([10] + [width] * depth + [4], act=act)
    mid = 2 * (depth // 2)
    lr, scale = 0.05, 1.0
    if fault == "dead":
        with torch.no_grad():
            model[mid].bias.fill_(-30.0)
        expect = (Cause.DEAD_UNITS, str(mid + 1))
    elif fault == "lr10":
        lr, expect = 10.0, (Cause.LEARNING_RATE_TOO_HIGH, "")
    elif fault == "tiny_init":
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.04 / width ** 0.5)  # each layer scales the signal by ~0.04
                nn.init.zeros_(m.bias)
        expect = (Cause.BAD_INITIALIZATION, "")
    else:
        scale, expect = 255.0, (Cause.DATA, "input")
    run = Run(model, torch.optim.SGD(model.parameters(), lr=lr), teacher_classes(10, 4, batch=batch, scale=scale),
              steps=30)
    return run, expect


@pytest.mark.parametrize("size", [(16, 3, 8), (256, 6, 128)], ids=["narrow-shallow-b8", "wide-deep-b128"])
@pytest.mark.parametrize("fault", ["dead", "lr10", "tiny_init", "raw_scale"])
def test_verdict_holds_across_sizes(fault, size):
    run, expect = _sized(fault, *size)
    dbg = train(run)
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == expect and top.confidence >= 0.5, f"{fault} {size}:\n{_verdict(dbg)}"


@pytest.mark.parametrize("every", [1, 2])
def test_a_fading_gradient_is_placed_where_it_begins_whatever_the_sampling(every):
    """The sigmoid MLP from another seed: the second weight layer's gradient sits at the diminishing threshold
    (flickering across it), the first one's is well below. Sampled every step or every other, the verdict
    names where the fading begins (the layer closest to the output), dated from the first attenuation, and
    lists only the layers before it as where it fades further."""
    import zoo as zoo_module
    original = torch.manual_seed
    torch.manual_seed = lambda seed: original(int(seed) + 1)
    try:
        run = deep_sigmoid_mlp_plateau()
    finally:
        torch.manual_seed = original
    run.options = {**run.options, "every": every}
    top = zoo_module.train(run).explain()[0]
    assert (top.cause, top.layer, top.step) == (Cause.VANISHING_GRADIENTS, "2", 0)
    further = [line for line in top.chain if "fades further toward the input" in line]
    assert all("`2`" not in line for line in further) and all("`0`" in line for line in further)
