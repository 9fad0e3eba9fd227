"""Seeded synthetic tasks that a healthy model of each family learns in a few hundred steps.

A task is a batch function ``data(step) -> (x, y)`` (the same batches for the same seed, whatever
else runs), the loss a user would write for it, and the loss of the best input-blind guess
(``baseline``: the entropy of the labels, or the targets' variance) that a model which learns
nothing sits at.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Task:
    data: Callable[[int], Batch]
    loss: Callable
    kind: str              # "classes" | "binary" | "regression"
    n_in: int              # features (float inputs) or vocabulary size (token inputs)
    n_out: int
    tokens: bool = False   # inputs are token ids

    def with_data(self, data: Callable[[int], Batch]) -> "Task":
        return replace(self, data=data)

    def baseline(self, batches: int = 32) -> float:
        """The loss of the best constant prediction, on the task's own batches."""
        ys = torch.cat([self.data(10_000 + i)[1] for i in range(batches)])
        if self.kind == "regression":
            return float(ys.float().var(dim=0, unbiased=False).mean())
        if self.kind == "binary":
            p = float(ys.float().mean().clamp(1e-6, 1 - 1e-6))
            return -(p * math.log(p) + (1 - p) * math.log(1 - p))
        p = torch.bincount(ys.long().flatten(), minlength=self.n_out).float()
        p = p[p > 0] / p.sum()
        return float(-(p * p.log()).sum())


def _gen(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 100_003 + step)


def bce_logits(out, y):
    return F.binary_cross_entropy_with_logits(out.squeeze(-1), y)


# -- float features ----------------------------------------------------------------------------------

def teacher_classes(n_in: int, n_out: int, batch: int, seed: int, hidden: int = 16) -> Task:
    """Labels from a fixed random one-hidden-layer tanh teacher."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(n_in, hidden, generator=g) / math.sqrt(n_in)
    w2 = torch.randn(hidden, n_out, generator=g)

    def data(step: int) -> Batch:
        x = torch.randn(batch, n_in, generator=_gen(seed, step))
        return x, (torch.tanh(2 * x @ w1) @ w2).argmax(1)
    return Task(data, F.cross_entropy, "classes", n_in, n_out)


def linear_binary(n_in: int, batch: int, seed: int, noise: float = 0.05) -> Task:
    """0/1 labels from a fixed random hyperplane, a fraction ``noise`` of them flipped: what logistic
    regression is for (the classes overlap, so the best loss is well above zero)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, generator=g)

    def data(step: int) -> Batch:
        gs = _gen(seed, step)
        x = torch.randn(batch, n_in, generator=gs)
        flip = torch.rand(batch, generator=gs) < noise
        return x, ((x @ w > 0) ^ flip).float()
    return Task(data, bce_logits, "binary", n_in, 1)


def xor_binary(n_in: int, batch: int, seed: int) -> Task:
    """0/1 labels = the sign of x0 * x1: no hyperplane does better than chance."""
    def data(step: int) -> Batch:
        x = torch.randn(batch, n_in, generator=_gen(seed, step))
        return x, (x[:, 0] * x[:, 1] > 0).float()
    return Task(data, bce_logits, "binary", n_in, 1)


def reconstruction(n_in: int, batch: int, seed: int, rank: int = 4) -> Task:
    """Inputs on a smooth low-dimensional manifold; the target is the input."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(rank, n_in, generator=g) / math.sqrt(rank)

    def data(step: int) -> Batch:
        x = torch.tanh(torch.randn(batch, rank, generator=_gen(seed, step)) @ basis) * 1.5
        return x, x.clone()
    return Task(data, F.mse_loss, "regression", n_in, n_in)


# -- images ------------------------------------------------------------------------------------------

def stripes(batch: int, seed: int, size: int = 8) -> Task:
    """Noisy 1-channel textures: horizontal stripes, vertical stripes or a checkerboard."""
    r = torch.arange(size)
    pats = torch.stack([(r[:, None] % 2).expand(size, size), (r[None, :] % 2).expand(size, size),
                        (r[:, None] + r[None, :]) % 2]).float() * 2 - 1
    shift = seed % 2  # the data seed moves the phase of every pattern

    def data(step: int) -> Batch:
        g = _gen(seed, step)
        y = torch.randint(0, 3, (batch,), generator=g)
        amp = 0.4 + 0.6 * torch.rand(batch, 1, 1, generator=g)
        x = pats.roll(shift, dims=2)[y] * amp + torch.randn(batch, size, size, generator=g)
        return x[:, None], y
    return Task(data, F.cross_entropy, "classes", size * size, 3)


# -- sequences ---------------------------------------------------------------------------------------

def sequence_sign(batch: int, seed: int, length: int = 10, n_in: int = 3, memory: bool = False) -> Task:
    """Float sequences; the class is the sign of a weighted sum of feature 0 over time (memory=True:
    of the first step only, so the state must carry it through the whole sequence)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(length, generator=g) + 0.5

    def data(step: int) -> Batch:
        x = torch.randn(batch, length, n_in, generator=_gen(seed, step))
        s = x[:, 0, 0] if memory else (x[:, :, 0] * w).sum(1)
        return x, (s > 0).long()
    return Task(data, F.cross_entropy, "classes", n_in, 2)


# -- tokens ------------------------------------------------------------------------------------------

CLS = 0  # token id reserved for the classification position


def token_majority(batch: int, seed: int, vocab: int = 16, length: int = 9, cls: bool = True) -> Task:
    """Token sequences (a CLS token first when ``cls``); the class is whether most of the other tokens
    come from a fixed half of the vocabulary (chosen by the data seed)."""
    g = torch.Generator().manual_seed(seed)
    low = torch.zeros(vocab, dtype=torch.bool)
    low[1 + torch.randperm(vocab - 1, generator=g)[: (vocab - 1) // 2]] = True

    def data(step: int) -> Batch:
        x = torch.randint(1, vocab, (batch, length), generator=_gen(seed, step))
        y = (low[x[:, 1:]].float().mean(1) > 0.5).long()
        if cls:
            x[:, 0] = CLS
        return x, y
    return Task(data, F.cross_entropy, "classes", vocab, 2, tokens=True)


def token_order(batch: int, seed: int, vocab: int = 16, length: int = 9) -> Task:
    """The class is whether the first token's id is below the last one's: invisible to a model that
    only sees the bag of tokens."""
    def data(step: int) -> Batch:
        x = torch.randint(1, vocab, (batch, length), generator=_gen(seed, step))
        return x, (x[:, 0] < x[:, -1]).long()
    return Task(data, F.cross_entropy, "classes", vocab, 2, tokens=True)
