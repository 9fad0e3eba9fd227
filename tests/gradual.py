"""Slowly failing runs for the early-warning tests: small real models, each with one fault that grows at a
constant rate from a healthy start, so that one signal drifts through its warning band into its failure.

Each builder returns a ``zoo.Run``; ``train`` watches it with a fixed sampling interval (the tests read
the forecast against the crossing, and a fixed interval makes both repeatable) and calls ``seen`` with the
session every ``look`` steps, as a live view would.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from faultgen.models import GradientScale
from neuraldbg import NeuralDbg
from zoo import Run, mlp, pixels, teacher_classes

EVERY = 2


def train(run: Run, seen: Callable[[NeuralDbg], None] | None = None, look: int = 10, every: int = EVERY,
          scaler: torch.amp.GradScaler | None = None) -> NeuralDbg:
    with NeuralDbg(run.model, optimizer=run.opt, every=every, scaler=scaler) as dbg:
        for step in range(run.steps):
            if run.before_step is not None:
                run.before_step(step, run.opt)
            x, y = run.data(step)
            run.opt.zero_grad()
            if scaler is None:
                loss = run.loss(run.model(x), y)
                loss.backward()
                run.opt.step()
            else:
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = run.loss(run.model(x), y)
                scaler.scale(loss).backward()
                scaler.step(run.opt)
                scaler.update()
            dbg.record_loss(loss)
            if seen is not None and step % look == look - 1:
                seen(dbg)
    return dbg


def bias_walks_down(seed: int = 0) -> Run:
    """The bias before the middle ReLU is walked down a little every step: more of its units die each step."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 32, 3])

    def walk(step, opt):
        with torch.no_grad():
            model[2].bias.sub_(0.006)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3), steps=200, before_step=walk)


def shift_walks_down(seed: int = 0) -> Run:
    """The shift of a BatchNorm before a ReLU, in a CNN, is walked down every step: every channel of the ReLU
    fires for fewer positions each step, all at the same rate, and they die together."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))

    def walk(step, opt):
        with torch.no_grad():
            model[4].bias.sub_(0.025)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.02), pixels(batch=16, channels=3), steps=200,
               before_step=walk)


def bias_walks_up(seed: int = 0) -> Run:
    """The bias before the middle tanh is walked up every step: more of its outputs sit at +1 each step."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 32, 3], act=nn.Tanh)

    def walk(step, opt):
        with torch.no_grad():
            model[2].bias.add_(0.02)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3), steps=200, before_step=walk)


class Fader(GradientScale):
    """Passes its input on; multiplies the gradient flowing back through it by ``factor`` (1 at first)."""

    def __init__(self):
        super().__init__(1.0)


def gradient_fades(seed: int = 0) -> Run:
    """The gradient reaching the first layer is multiplied by 0.93 every step: it fades decade by decade."""
    torch.manual_seed(seed)
    fader = Fader()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), fader, nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def fade(step, opt):
        fader.factor = 0.93 ** step
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), teacher_classes(8, 3), steps=200, before_step=fade)


def warmup_never_ends(seed: int = 0, steps: int = 200) -> Run:
    """The learning rate rises 3% every step, and never stops (a warm-up with no end)."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 3])

    def ramp(step, opt):
        for g in opt.param_groups:
            g["lr"] = 0.005 * 1.03 ** step
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.005), teacher_classes(8, 3), steps=steps,
               before_step=ramp)


class SharpeningAttention(nn.Module):
    """Self-attention over tokens (``F.scaled_dot_product_attention``) with a temperature that a schedule
    sets: the higher it is, the fewer keys each query attends to."""

    def __init__(self, vocab: int = 20, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, 2)
        self.temperature = 1.0

    def forward(self, tok):
        q, k, v = self.qkv(self.emb(tok)).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q, k, v, scale=self.temperature / math.sqrt(q.shape[-1]))
        return self.out(a.mean(dim=1))


def attention_sharpens(seed: int = 0) -> Run:
    """The attention temperature rises 4% every step: its entropy slides toward a collapse."""
    torch.manual_seed(seed)
    model = SharpeningAttention()

    def data(step):
        tok = torch.randint(0, 20, (32, 12), generator=torch.Generator().manual_seed(step))
        return tok, ((tok < 10).sum(dim=1) > 6).long()

    def sharpen(step, opt):
        model.temperature = 1.04 ** step
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), data, steps=200, before_step=sharpen)


def inputs_grow(seed: int = 0) -> Run:
    """The inputs grow 3% every step (a normalisation whose statistics drift)."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 3])
    base = teacher_classes(8, 3)

    def data(step):
        x, y = base(step)
        return x * 1.03 ** step, y
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05), data, steps=200)


def weights_decay(seed: int = 0) -> Run:
    """Weight decay (0.4 at lr 0.05) that walks the weights toward zero faster than the task holds them."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 3])
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=0.4), teacher_classes(8, 3),
               steps=200)


def loss_grows(seed: int = 0) -> Run:
    """A loss multiplied by a factor that doubles every 6 steps, trained in float16 with a GradScaler: its
    gradients overflow again and again, and the scaler halves its scale each time."""
    torch.manual_seed(seed)
    model = mlp([8, 32, 32, 3])
    weight = {"now": 1.0}

    def grow(step, opt):
        weight["now"] = 2.0 ** (step / 6)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.01), teacher_classes(8, 3),
               loss=lambda out, y: F.cross_entropy(out.float(), y) * weight["now"], steps=120, before_step=grow)
