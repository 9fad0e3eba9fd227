"""Held-out failure zoo: faulty runs (each with the root cause a practitioner would name) and healthy
runs that must stay quiet, kept apart from the zoo the rules and default thresholds were chosen on.
``test_zoo_heldout.py`` runs them; the known misses are marked there, with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo import NaiveSoftmax, Run, nll_of_probs, teacher_classes


@dataclass
class Expect:
    accepted: list          # list of (cause, layer); the first is the primary verdict
    onset: tuple = (0, 10**9)
    note: str = ""


# -- data ------------------------------------------------------------------------------------------------

def mlp_teacher(n_in, n_out, batch=32, seed=7, scale=None, hidden=16):
    """Labels from a random nonlinear teacher (one hidden tanh layer); scale: per-feature input multiplier."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(n_in, hidden, generator=g)
    w2 = torch.randn(hidden, n_out, generator=g)

    def data(step):
        gs = torch.Generator().manual_seed(seed * 7919 + step)
        x = torch.randn(batch, n_in, generator=gs)
        y = (torch.tanh(x @ w1 / math.sqrt(n_in)) @ w2).argmax(1)
        if scale is not None:
            x = x * scale
        return x, y
    return data


def multi_regression(n_in, n_out, batch=32, seed=11, nan_from=None, target_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, n_out, generator=g) / math.sqrt(n_in)

    def data(step):
        gs = torch.Generator().manual_seed(seed * 7919 + step)
        x = torch.randn(batch, n_in, generator=gs)
        y = torch.sin(x @ w) * target_scale
        if nan_from is not None and step >= nan_from:
            y[2, 1] = float("nan")
        return x, y
    return data


def images_1ch(batch=32, size=8, seed=5, scale=1.0, nan_at=None, n_out=3):
    """Grayscale noisy textures; class 0 = horizontal stripes, 1 = vertical stripes, 2 = checkerboard."""
    r = torch.arange(size)
    pats = torch.stack([(r[:, None] % 2).expand(size, size), (r[None, :] % 2).expand(size, size),
                        (r[:, None] + r[None, :]) % 2]).float() * 2 - 1

    def data(step):
        gs = torch.Generator().manual_seed(seed * 7919 + step)
        y = torch.randint(0, n_out, (batch,), generator=gs)
        amp = 0.3 + 0.7 * torch.rand(batch, 1, 1, generator=gs)
        x = (pats[y] * amp + torch.randn(batch, size, size, generator=gs))[:, None]
        x = x * scale
        if nan_at is not None and step == nan_at:
            x[1, 0, 2, 3] = float("inf")
        return x, y
    return data


def token_task(vocab=30, length=6, batch=32, seed=3):
    """Class = whether token 0 appears more often than token 1 ... simplified: parity of count of tokens < vocab/3."""
    def data(step):
        gs = torch.Generator().manual_seed(seed * 7919 + step)
        x = torch.randint(0, vocab, (batch, length), generator=gs)
        y = ((x < vocab // 3).sum(1) >= 2).long()
        return x, y
    return data


def seq_task(n_in=3, length=10, batch=32, seed=9, which="sum"):
    def data(step):
        gs = torch.Generator().manual_seed(seed * 7919 + step)
        x = torch.randn(batch, length, n_in, generator=gs)
        if which == "sum":
            y = (x[:, :, 1].sum(1) > 0).long()
        else:  # first element decides: needs memory across the whole sequence
            y = (x[:, 0, 0] > 0).long()
        return x, y
    return data


# -- modules ---------------------------------------------------------------------------------------------

class RecurrentClassifier(nn.Module):
    def __init__(self, rnn, hidden, n_out=2):
        super().__init__()
        self.rnn = rnn
        self.fc = nn.Linear(hidden, n_out)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class AttnClassifier(nn.Module):
    """Post-norm attention encoder, mean-pooled."""

    def __init__(self, vocab=30, dim=24, heads=2, n_out=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, 6, dim) * 0.02)
        self.mha = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln1 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.ln2 = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, n_out)

    def forward(self, tok):
        h = self.tok(tok) + self.pos[:, : tok.shape[1]]
        h = self.ln1(h + self.mha(h, h, h, need_weights=False)[0])
        h = self.ln2(h + self.mlp(h))
        return self.out(h.mean(1))


class EmbedMLP(nn.Module):
    def __init__(self, vocab=30, dim=16, n_out=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, n_out))

    def forward(self, tok):
        return self.body(self.emb(tok).mean(1))


class LearnedDivisor(nn.Module):
    """num(x) / relu(den(x)): a learned per-sample scale kept non-negative with relu (the bug: relu instead of
    softplus + eps). It starts at ~0.3 and training drives it to exactly 0 for some sample around step 30."""

    def __init__(self, n_in, n_out, b0=0.3):
        super().__init__()
        self.num = nn.Linear(n_in, n_out)
        self.den = nn.Linear(n_in, 1)
        with torch.no_grad():
            self.den.bias.fill_(b0)
            self.den.weight.mul_(0.1)

    def forward(self, x):
        return self.num(x) / F.relu(self.den(x))


class SqrtFeatures(nn.Module):
    """sqrt of a learned projection: positive at init (bias +1), nothing keeps it positive afterwards."""

    def __init__(self, n_in, n_out, bias0=1.0):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)
        with torch.no_grad():
            self.proj.bias.fill_(bias0)

    def forward(self, x):
        return torch.sqrt(self.proj(x))


class BatchStandardize(nn.Module):
    """Hand-written per-feature standardisation, without an epsilon: a constant feature is 0/0."""

    def forward(self, x):
        return (x - x.mean(0, keepdim=True)) / x.std(0, keepdim=True)


class TiedAutoencoder(nn.Module):
    def __init__(self, n_in=16, n_hid=8):
        super().__init__()
        self.enc = nn.Linear(n_in, n_hid)
        self.act = nn.SiLU()
        self.dec_bias = nn.Parameter(torch.zeros(n_in))

    def forward(self, x):
        return F.linear(self.act(self.enc(x)), self.enc.weight.t(), self.dec_bias)


def conv_net(act=nn.ReLU, c=12, n_out=3, norm=None):
    def block(cin, cout):
        layers = [nn.Conv2d(cin, cout, 3, padding=1)]
        if norm is not None:
            layers.append(norm(cout))
        layers.append(act())
        return layers
    return nn.Sequential(*block(1, c), *block(c, c), *block(c, c), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(c, n_out))


# -- faulty scenarios --------------------------------------------------------------------------------------

def gru_recurrent_x30():
    """A GRU whose recurrent weights start 30x too large: gates and state saturate (16% of outputs |h|>0.99 at
    step 0), loss 0.84 -> 0.70 in 40 steps where the default init reaches 0.13; the root is the recurrent init
    scale (a GRU cannot overflow: its state is bounded)."""
    torch.manual_seed(0)
    gru = nn.GRU(3, 24, batch_first=True)
    with torch.no_grad():
        gru.weight_hh_l0.mul_(30.0)
    model = RecurrentClassifier(gru, 24)
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), seq_task(), steps=40)


def conv_dead_middle_bias():
    """Middle conv of a 3-conv ReLU CNN with bias -40: the ReLU after it is dead from step 0."""
    torch.manual_seed(0)
    model = conv_net()
    with torch.no_grad():
        model[2].bias.fill_(-40.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), images_1ch(), steps=40)


def attention_adam_lr1():
    """Attention encoder under Adam lr=1.0 (~1000x too high)."""
    torch.manual_seed(0)
    model = AttnClassifier()
    return Run(model, torch.optim.Adam(model.parameters(), lr=1.0), token_task(), steps=50)


def embed_mlp_sgd_lr1e7():
    """Embedding + MLP under SGD lr=1e-7: nothing moves."""
    torch.manual_seed(0)
    model = EmbedMLP()
    return Run(model, torch.optim.SGD(model.parameters(), lr=1e-7), token_task(), steps=80)


def learned_divisor_hits_zero():
    """A learned divisor clamped with relu reaches 0 mid-run: x/0 = Inf, then NaN (loss NaN from ~step 33)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), LearnedDivisor(32, 4, 0.3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), mlp_teacher(10, 4), steps=50)


def sqrt_goes_negative():
    """sqrt of a projection that starts positive and is trained below zero mid-run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), SqrtFeatures(32, 16, bias0=1.0), nn.Linear(16, 4))
    return Run(model, torch.optim.Adam(model.parameters(), lr=2e-2), mlp_teacher(10, 4), steps=60)


def standardize_constant_feature():
    """In-model standardisation without epsilon; feature 4 is constant in the data: 0/0 = NaN at step 0.
    The module is the root (a constant feature is legitimate data)."""
    torch.manual_seed(0)
    base = mlp_teacher(8, 3)

    def data(step):
        x, y = base(step)
        x[:, 4] = 1.0
        return x, y
    model = nn.Sequential(BatchStandardize(), nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, steps=20)


def late_nan_targets_multireg():
    """Multi-output regression (SiLU MLP, SGD+momentum) whose targets carry a NaN from step 25 on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU(), nn.Linear(48, 3))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
               multi_regression(12, 3, nan_from=25), loss=F.mse_loss, steps=40)


def cnn_inputs_1e4():
    """A ReLU CNN fed images in the 1e4 range (a unit bug), Adam."""
    torch.manual_seed(0)
    model = conv_net()
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), images_1ch(scale=1e4), steps=40)


def relu_cnn_lr_jump_to_5():
    """A ReLU CNN trains fine with SGD 0.1 + momentum (loss ~0.3 by step 40); a schedule bug sets lr=5 at step 40."""
    torch.manual_seed(0)
    model = conv_net()

    def schedule(step, opt):
        if step == 40:
            for g in opt.param_groups:
                g["lr"] = 5.0
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), images_1ch(), steps=70,
               before_step=schedule)


def tanh_rnn_tiny_recurrent():
    """A tanh RNN whose recurrent weights are x0.01: the state forgets everything but the last step; the
    label depends on the first step. The root is the recurrent init (gradient through time vanishes)."""
    torch.manual_seed(0)
    rnn = nn.RNN(3, 24, batch_first=True, nonlinearity="tanh")
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(0.01)
    model = RecurrentClassifier(rnn, 24)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), seq_task(which="first"), steps=60)


def frozen_layer_and_lr_high():
    """First layer frozen (requires_grad False); the trainable rest runs with SGD lr=8. The frozen layer
    is not a learning-rate-too-low fault; the root is the learning rate of the rest."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 4))
    for p in model[0].parameters():
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return Run(model, torch.optim.SGD(trainable, lr=8.0), mlp_teacher(10, 4), steps=50)


def compiled_cnn_inf_input():
    """A compiled (aot_eager) CNN; the batch at step 7 carries an Inf pixel."""
    torch.manual_seed(0)
    model = conv_net()
    compiled = torch.compile(model, backend="aot_eager")
    return Run(compiled, torch.optim.Adam(model.parameters(), lr=1e-3), images_1ch(nan_at=7), steps=12)


def sigmoid_bias_plus30():
    """A sigmoid MLP whose middle Linear has bias +30: the sigmoid after it is pinned at 1 from step 0.
    By analogy with the zoo's dead_middle_relu, the root named is the saturated sigmoid (the bias shows in
    the chain); bad_initialization of that Linear is an acceptable alternative."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Sigmoid(), nn.Linear(32, 32), nn.Sigmoid(), nn.Linear(32, 4))
    with torch.no_grad():
        model[2].bias.fill_(30.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.1), mlp_teacher(10, 4), steps=60)


def one_raw_feature_column():
    """One input column left in raw units (x1e4) among standardised ones; GELU MLP, SGD."""
    torch.manual_seed(0)
    scale = torch.ones(10)
    scale[3] = 1e4
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.02), mlp_teacher(10, 4, scale=scale), steps=50)


def regression_targets_1e5():
    """Regression targets in raw units (~1e5) with MSE and SGD: the loss and gradients are ~1e10x off."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 3))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), multi_regression(12, 3, target_scale=1e5),
               loss=F.mse_loss, steps=40)


def lstm_sgd_lr_50():
    """An LSTM with SGD lr=50."""
    torch.manual_seed(0)
    model = RecurrentClassifier(nn.LSTM(3, 16, batch_first=True), 16)
    return Run(model, torch.optim.SGD(model.parameters(), lr=50.0), seq_task(), steps=50)


def deep_linear_gain_1p5():
    """12 Linear layers, no activation, each initialised with a gain of 1.5 (weights N(0, 1.5^2/fan_in)):
    no single layer is far off, but the spread compounds ~130x by the output (loss ~100 at step 0) and
    the first SGD steps blow it up to NaN. The root is the init scale, not the learning rate."""
    torch.manual_seed(0)
    layers = [nn.Linear(10, 32)] + [nn.Linear(32, 32) for _ in range(10)] + [nn.Linear(32, 4)]
    with torch.no_grad():
        for l in layers:
            l.weight.normal_(0.0, 1.5 / math.sqrt(l.in_features))
    model = nn.Sequential(*layers)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), mlp_teacher(10, 4), steps=30)


def relu_bias_plus50():
    """A ReLU MLP whose second Linear (`2`) has bias +50: its outputs sit at ~50 (small spread, huge
    offset), the next Linear turns that offset into outputs ~60x out of scale. The root is `2`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
    with torch.no_grad():
        model[2].bias.fill_(50.0)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), mlp_teacher(10, 4), steps=40)


def cnn_adam_lr_1e7_small_batch():
    """A ReLU CNN under Adam lr=1e-7 with batches of 8: nothing moves, but the batch loss is noisy
    (+-5%), so a dip of the smoothed loss must not pass for progress."""
    torch.manual_seed(0)
    model = conv_net()
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-7), images_1ch(batch=8), steps=60)


def seg_bce_masks_0_255():
    """A small fully-convolutional segmenter trained with binary_cross_entropy_with_logits on masks loaded
    as 0/255 instead of 0/1: the loss is unbounded below (-254 x the logit on foreground pixels), so it
    falls through zero and keeps falling while the logits grow. The targets are the root."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 1, 1))

    def data(step):
        gs = torch.Generator().manual_seed(4242 + step)
        x = torch.randn(8, 1, 12, 12, generator=gs)
        mask = (F.avg_pool2d(x, 3, 1, 1) > 0).float() * 255.0
        return x, mask
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=F.binary_cross_entropy_with_logits,
               steps=50)



class ClippedSGD(torch.optim.SGD):
    """SGD that clips the gradient norm before every step (the bug: max_norm=1e-8, meant as an eps)."""

    def __init__(self, params, lr, max_norm):
        super().__init__(params, lr=lr)
        self.max_norm = max_norm

    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], self.max_norm)
        return super().step(closure)


def gru_grad_clip_1e_8():
    """A GRU classifier whose gradients are clipped to norm 1e-8 before each SGD step: the weights do not
    move at any learning rate. 40 steps, shorter than a plateau."""
    torch.manual_seed(0)
    model = RecurrentClassifier(nn.GRU(3, 24, batch_first=True), 24)
    return Run(model, ClippedSGD(model.parameters(), lr=0.5, max_norm=1e-8), seq_task(), steps=40)


def attention_warmup_1e6_steps():
    """An attention encoder under Adam lr=1e-3 with a linear warm-up over a million steps (a unit slip):
    the first steps run at lr ~1e-9. 40 steps, shorter than a plateau."""
    torch.manual_seed(0)
    model = AttnClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 1e6)

    def step_sched(step, o):
        if step > 0:
            sched.step()
    return Run(model, opt, token_task(), steps=40, before_step=step_sched)


class TemperaturePool(nn.Module):
    """Attention pooling over tokens with a learned temperature kept non-negative by relu: nothing keeps it
    off 0. Holds its temperature and query itself (its projection is a child)."""

    def __init__(self, dim, t0):
        super().__init__()
        self.key = nn.Linear(dim, dim)
        self.query = nn.Parameter(torch.randn(dim) / math.sqrt(dim))
        self.temperature = nn.Parameter(torch.tensor(float(t0)))

    def forward(self, h):
        scores = self.key(h) @ self.query / F.relu(self.temperature)
        return (torch.softmax(scores, dim=1).unsqueeze(-1) * h).sum(1)


class TokenPoolClassifier(nn.Module):
    def __init__(self, vocab=30, dim=16, t0=0.1, n_out=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pool = TemperaturePool(dim, t0)
        self.out = nn.Linear(dim, n_out)

    def forward(self, tok):
        return self.out(self.pool(self.tok(tok)))


def pool_temperature_decays_to_zero():
    """Adam's L2 weight decay (weight_decay=1) on every parameter, the temperature included, walks it from 0.1
    through 0 (below it after the update of step 23): relu(t) = 0, the scores divide by 0 and the softmax
    turns NaN at step 24. The pooling module is the root, whatever the learning rate."""
    torch.manual_seed(0)
    model = TokenPoolClassifier()
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1.0), token_task(), steps=30)



class TemperedSoftmax(NaiveSoftmax):
    """The hand-written softmax with a learned log-temperature of its own."""

    def __init__(self):
        super().__init__()
        self.log_t = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        e = torch.exp(x / self.log_t.exp())
        return e / e.sum(dim=-1, keepdim=True)


def softmax_head_sgd_lr(lr, head=NaiveSoftmax):
    """An MLP ending in a hand-written softmax under SGD at an absurd learning rate: updates many times the
    weights overflow its exp within a few steps, before any loss can be seen to diverge."""
    def build():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3), head())
        return Run(model, torch.optim.SGD(model.parameters(), lr=lr), teacher_classes(8, 3), loss=nll_of_probs)
    return build


FAULTY = {
    "gru_recurrent_x30": (gru_recurrent_x30, Expect([("bad_initialization", "rnn"),
                                                     ("saturated_activations", "rnn")], (0, 0),
                                                    "saturation of rnn is an acceptable alternative")),
    "conv_dead_middle_bias": (conv_dead_middle_bias, Expect([("dead_units", "3")], (0, 0))),
    "attention_adam_lr1": (attention_adam_lr1, Expect([("learning_rate_too_high", "")], (0, 5))),
    "embed_mlp_sgd_lr1e7": (embed_mlp_sgd_lr1e7, Expect([("learning_rate_too_low", "")], (0, 5))),
    "learned_divisor_hits_zero": (learned_divisor_hits_zero, Expect([("non_finite", "2")], (25, 40),
                                                                    "onset is when the divisor reaches 0")),
    "sqrt_goes_negative": (sqrt_goes_negative, Expect([("non_finite", "2")], (1, 60))),
    "standardize_constant_feature": (standardize_constant_feature, Expect([("non_finite", "0")], (0, 0))),
    "late_nan_targets_multireg": (late_nan_targets_multireg, Expect([("data", "input")], (25, 25))),
    "cnn_inputs_1e4": (cnn_inputs_1e4, Expect([("data", "input")], (0, 0))),
    "relu_cnn_lr_jump_to_5": (relu_cnn_lr_jump_to_5, Expect([("learning_rate_too_high", "")], (40, 45))),
    "tanh_rnn_tiny_recurrent": (tanh_rnn_tiny_recurrent, Expect([("bad_initialization", "rnn"),
                                                                 ("vanishing_gradients", "rnn")], (0, 0))),
    "frozen_layer_and_lr_high": (frozen_layer_and_lr_high, Expect([("learning_rate_too_high", "")], (0, 3))),
    "compiled_cnn_inf_input": (compiled_cnn_inf_input, Expect([("data", "input")], (7, 7))),
    "sigmoid_bias_plus30": (sigmoid_bias_plus30, Expect([("saturated_activations", "3"),
                                                         ("bad_initialization", "2")], (0, 0))),
    "one_raw_feature_column": (one_raw_feature_column, Expect([("data", "input")], (0, 0))),
    "regression_targets_1e5": (regression_targets_1e5, Expect([("data", "input")], (0, 0))),
    "lstm_sgd_lr_50": (lstm_sgd_lr_50, Expect([("learning_rate_too_high", "")], (0, 5))),
    "deep_linear_gain_1p5": (deep_linear_gain_1p5, Expect([("bad_initialization", "")], (0, 0),
                                                          "all twelve layers share the fault")),
    "relu_bias_plus50": (relu_bias_plus50, Expect([("bad_initialization", "2")], (0, 0))),
    "seg_bce_masks_0_255": (seg_bce_masks_0_255, Expect([("data", "input")], (0, 10))),
    "cnn_adam_lr_1e7_small_batch": (cnn_adam_lr_1e7_small_batch, Expect([("learning_rate_too_low", "")], (0, 5))),
    "naive_softmax_sgd_lr100": (softmax_head_sgd_lr(100.0), Expect([("learning_rate_too_high", "")], (0, 1))),
    "gru_grad_clip_1e_8": (gru_grad_clip_1e_8, Expect([("learning_rate_too_low", "")], (0, 5),
                                                      "the clip is the root; the closest cause is the step size")),
    "attention_warmup_1e6_steps": (attention_warmup_1e6_steps, Expect([("learning_rate_too_low", "")], (0, 5))),
    "pool_temperature_decays_to_zero": (pool_temperature_decays_to_zero,
                                        Expect([("non_finite", "pool")], (24, 24), "step 23's update takes t below 0")),
}


# -- healthy scenarios -------------------------------------------------------------------------------------

def healthy_gru():
    torch.manual_seed(0)
    model = RecurrentClassifier(nn.GRU(3, 24, batch_first=True), 24)
    return Run(model, torch.optim.Adam(model.parameters(), lr=5e-3), seq_task(), steps=50)


def healthy_groupnorm_cnn():
    torch.manual_seed(0)
    model = conv_net(norm=lambda c: nn.GroupNorm(3, c))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), images_1ch(), steps=50)


def healthy_silu_adamw():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 4))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05), mlp_teacher(10, 4),
               steps=60)


def healthy_tied_autoencoder():
    torch.manual_seed(0)
    model = TiedAutoencoder()
    g = torch.Generator().manual_seed(1)
    basis = torch.randn(4, 16, generator=g)

    def data(step):
        gs = torch.Generator().manual_seed(500 + step)
        x = torch.randn(32, 4, generator=gs) @ basis
        return x, x
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), data, loss=F.mse_loss, steps=60)


def healthy_frozen_embedding_head():
    torch.manual_seed(0)
    model = EmbedMLP()
    model.emb.weight.requires_grad_(False)
    return Run(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3),
               token_task(), steps=60)


class EvalInLoop:
    """Wraps the loss so that every 5 steps a validation forward runs under torch.no_grad() (a real loop would
    compute it separately; the model sees no_grad forwards between training steps)."""

    def __init__(self, model, val):
        self.model, self.val, self.calls = model, val, 0

    def __call__(self, out, y):
        loss = F.cross_entropy(out, y)
        if self.calls % 5 == 0:
            was = self.model.training
            self.model.eval()
            with torch.no_grad():
                xv, yv = self.val
                F.cross_entropy(self.model(xv), yv)
            self.model.train(was)
        self.calls += 1
        return loss


def healthy_eval_no_grad_in_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 48), nn.ReLU(), nn.Dropout(0.1), nn.Linear(48, 4))
    data = mlp_teacher(10, 4)
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), data, loss=EvalInLoop(model, data(10_000)),
               steps=50)


def healthy_cosine_clip_conv1d():
    """Conv1d + max-pool on sequences, SGD momentum, cosine schedule and grad clipping (done via the schedule
    hook only for lr; clipping is irrelevant here)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(3, 12, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(12, 12, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(12, 2))
    base = seq_task()

    def data(step):
        x, y = base(step)
        return x.transpose(1, 2), y

    def schedule(step, opt):
        for g in opt.param_groups:
            g["lr"] = 0.05 * 0.5 * (1 + math.cos(math.pi * step / 60))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data, steps=60,
               before_step=schedule)


class SoftplusDivisor(LearnedDivisor):
    """The fixed LearnedDivisor: softplus + eps keeps the divisor positive."""

    def forward(self, x):
        return self.num(x) / (F.softplus(self.den(x)) + 1e-3)


def healthy_softplus_divisor():
    """Control for learned_divisor_hits_zero: same model, same Adam lr=1e-2, divisor kept positive."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), SoftplusDivisor(32, 4, 0.3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), mlp_teacher(10, 4), steps=50)


class DictOutputNet(nn.Module):
    """Returns a dict; one layer under a weight_norm parametrization; a parameter shared by two branches."""

    def __init__(self):
        super().__init__()
        self.inp = nn.utils.parametrizations.weight_norm(nn.Linear(10, 32))
        self.shared = nn.Linear(32, 32)
        self.act = nn.GELU()
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.act(self.inp(x))
        h = self.act(self.shared(h)) + self.act(self.shared(h * 0.5))
        return {"logits": self.head(h), "feat": h}


def healthy_dict_output_weightnorm():
    torch.manual_seed(0)
    model = DictOutputNet()
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), mlp_teacher(10, 4),
               loss=lambda out, y: F.cross_entropy(out["logits"], y), steps=50)


def healthy_tiny_inputs_batchnorm_cnn():
    """Inputs at 1e-3 scale fed to a CNN with BatchNorm after every conv: BatchNorm restores the scale, so
    the convs after it must not count the input's smallness as their amplification."""
    torch.manual_seed(0)
    model = conv_net(norm=nn.BatchNorm2d)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), images_1ch(scale=1e-3), steps=60)


def healthy_deep_kaiming_relu():
    """Ten Linear+ReLU blocks with kaiming_normal_ init: each Linear doubles the variance the ReLU halves
    (a gain of ~1.7 per Linear in RMS), and the scale stays put end to end."""
    torch.manual_seed(0)
    layers = []
    for i in range(10):
        lin = nn.Linear(10 if i == 0 else 48, 48)
        nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        layers += [lin, nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(48, 4))
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), mlp_teacher(10, 4), steps=60)


class MeanAndVariance(nn.Module):
    """A regression head that predicts a mean and a variance, trained with a Gaussian NLL."""

    def __init__(self, n_in=12, n_out=3):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, 48), nn.SiLU(), nn.Linear(48, 48), nn.SiLU())
        self.mu = nn.Linear(48, n_out)
        self.var = nn.Linear(48, n_out)

    def forward(self, x):
        h = self.body(x)
        return self.mu(h), F.softplus(self.var(h)) + 1e-6


def healthy_gaussian_nll():
    """A Gaussian NLL starts near 0 (0.15) and goes negative as the predicted variance shrinks (targets with
    little noise: to -1.1 in 100 steps): a loss crossing zero, with batch noise as large as its start, is
    neither diverging nor oscillating, nor a loss unbounded below."""
    torch.manual_seed(0)
    model = MeanAndVariance()
    base = multi_regression(12, 3)

    def data(step):
        x, y = base(step)
        return x, y + 0.01 * torch.randn(y.shape, generator=torch.Generator().manual_seed(step))
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), data,
               loss=lambda out, y: F.gaussian_nll_loss(out[0], y, out[1]), steps=100)



class LogTemperaturePool(TemperaturePool):
    """The same pooling with the temperature learned as its log: it stays positive whatever the updates."""

    def forward(self, h):
        scores = self.key(h) @ self.query / self.temperature.exp()
        return (torch.softmax(scores, dim=1).unsqueeze(-1) * h).sum(1)


def healthy_pool_log_temperature():
    """The temperature pool done right (log-temperature) under AdamW: learns, nothing to report."""
    torch.manual_seed(0)
    model = TokenPoolClassifier()
    model.pool = LogTemperaturePool(16, math.log(0.1))
    return Run(model, torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01), token_task(), steps=40)


HEALTHY = {
    "healthy_pool_log_temperature": healthy_pool_log_temperature,
    "healthy_gaussian_nll": healthy_gaussian_nll,
    "healthy_tiny_inputs_batchnorm_cnn": healthy_tiny_inputs_batchnorm_cnn,
    "healthy_deep_kaiming_relu": healthy_deep_kaiming_relu,
    "healthy_softplus_divisor": healthy_softplus_divisor,
    "healthy_dict_output_weightnorm": healthy_dict_output_weightnorm,
    "healthy_gru": healthy_gru,
    "healthy_groupnorm_cnn": healthy_groupnorm_cnn,
    "healthy_silu_adamw": healthy_silu_adamw,
    "healthy_tied_autoencoder": healthy_tied_autoencoder,
    "healthy_frozen_embedding_head": healthy_frozen_embedding_head,
    "healthy_eval_no_grad_in_loop": healthy_eval_no_grad_in_loop,
    "healthy_cosine_conv1d": healthy_cosine_clip_conv1d,
}
