"""Model builders, data and a training loop for the failure zoo: small, seeded, CPU-only.

Each builder returns a ``Run``: a model, its optimizer, a batch function ``data(step) -> (x, y)``
and a loss function. ``train`` runs the real NeuralDbg over the real loop, as a user would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from faultgen.models import GradientScale
from neuraldbg import NeuralDbg


@dataclass
class Run:
    model: nn.Module
    opt: torch.optim.Optimizer
    data: Callable[[int], tuple]
    loss: Callable = F.cross_entropy
    steps: int = 30
    options: dict = field(default_factory=dict)
    before_step: Callable[[int, torch.optim.Optimizer], None] | None = None  # e.g. a learning-rate schedule


def train(run: Run) -> NeuralDbg:
    with NeuralDbg(run.model, optimizer=run.opt, **run.options) as dbg:
        for step in range(run.steps):
            if run.before_step is not None:
                run.before_step(step, run.opt)
            x, y = run.data(step)
            run.opt.zero_grad()
            loss = run.loss(run.model(x), y)
            loss.backward()
            run.opt.step()
            dbg.record_loss(loss)
    return dbg


# -- data ------------------------------------------------------------------------------------------------

def teacher_classes(n_in: int, n_out: int, batch: int = 64, seed: int = 0, scale: float = 1.0,
                    shape: tuple | None = None, nan_input_at: int | None = None):
    """A learnable classification task: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, n_out, generator=g)

    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randn(batch, n_in, generator=gs)
        y = (x @ w).argmax(dim=1)
        x = x * scale
        if nan_input_at is not None and step == nan_input_at:
            x[3, 0] = float("nan")
        return (x.reshape(batch, *shape) if shape else x), y
    return data


def teacher_regression(n_in: int, batch: int = 64, seed: int = 0, nan_target_at: int | None = None):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, 1, generator=g) / n_in ** 0.5

    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randn(batch, n_in, generator=gs)
        y = x @ w
        if nan_target_at is not None and step >= nan_target_at:
            y[5, 0] = float("nan")
        return x, y
    return data


def pixels(batch: int = 32, channels: int = 3, size: int = 8, seed: int = 0, raw: bool = False,
           nan_at: int | None = None):
    """Images whose class is the brightest channel; raw=True keeps them in 0-255."""
    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.rand(batch, channels, size, size, generator=gs)
        y = x.mean(dim=(2, 3)).argmax(dim=1)
        x = x * 255.0 if raw else (x - 0.5) / 0.29
        if nan_at is not None and step == nan_at:
            x[0, 0, 0, 0] = float("nan")
        return x, y
    return data


def tokens(vocab: int = 50, length: int = 8, batch: int = 32, seed: int = 0):
    """Sequences of token ids; the class is whether most tokens are in the lower half of the vocabulary."""
    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randint(0, vocab, (batch, length), generator=gs)
        y = ((x < vocab // 2).float().mean(dim=1) > 0.5).long()
        return x, y
    return data


def sequences(n_in: int = 4, length: int = 12, batch: int = 32, seed: int = 0):
    """Float sequences; the class is the sign of the sum of the first feature."""
    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randn(batch, length, n_in, generator=gs)
        y = (x[:, :, 0].sum(dim=1) > 0).long()
        return x, y
    return data


# -- modules ---------------------------------------------------------------------------------------------

def mlp(widths: list[int], act: type = nn.ReLU, final_act: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(act())
    if final_act is not None:
        layers.append(final_act)
    return nn.Sequential(*layers)


class SeqClassifier(nn.Module):
    """RNN/LSTM over a sequence, then a head on the last time step."""

    def __init__(self, cell: nn.Module, hidden: int, n_out: int = 2, head: nn.Module | None = None):
        super().__init__()
        self.rnn = cell
        self.head = head if head is not None else nn.Linear(hidden, n_out)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class LogFeatures(nn.Module):
    """A hand-written feature map: log of a learned projection (which can turn negative)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.proj = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.log(self.proj(x))


class NaiveSoftmax(nn.Module):
    """Softmax written by hand, with a sharpening temperature: exp overflows for large logits."""

    def __init__(self, sharpness: float = 1.0):
        super().__init__()
        self.sharpness = sharpness

    def forward(self, x):
        e = torch.exp(x * self.sharpness)
        return e / e.sum(dim=-1, keepdim=True)


class GradientReversal(GradientScale):
    """Identity forward; the backward multiplies the gradient by -coefficient (domain-adversarial training)."""

    def __init__(self, coefficient: float = 1.0):
        super().__init__(-coefficient)


def nll_of_probs(p, y):
    return F.nll_loss(torch.log(p + 1e-12), y)


class TransformerBlock(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, n_out: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, n_out)

    def forward(self, tok):
        h = self.embed(tok)
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.ff(self.norm2(h))
        return self.head(h.mean(dim=1))


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    def __init__(self, c: int = 8, blocks: int = 3, n_out: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(*[ResBlock(c) for _ in range(blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, n_out)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


class EmbeddingBagModel(nn.Module):
    def __init__(self, vocab: int = 200, dim: int = 16, n_out: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, sparse=True)
        self.head = nn.Linear(dim, n_out)

    def forward(self, tok):
        return self.head(self.embed(tok).mean(dim=1))
