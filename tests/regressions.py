"""Runs as researchers wrote them, whose verdicts went wrong: each builder returns a zoo ``Run``.

They are written the way they were met (module names, optimizers, lengths), not reduced to the
fault generator's families, so that a verdict right on the generator and wrong here still shows.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run


def _regression_batches(n_in: int, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, 1, generator=g) / math.sqrt(n_in)

    def data(step: int):
        x = torch.randn(batch, n_in, generator=torch.Generator().manual_seed(seed * 10_000 + step))
        return x, 3 * torch.sin(2 * x @ w)
    return data


def tanh_mlp_sgd(lr: float = 0.5, steps: int = 100, seed: int = 0) -> Run:
    """A tanh MLP regressed with MSE under SGD at lr 0.5: within ~15 steps the loss climbs to inf, then
    NaN (at lr 0.05 the same run trains)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128),
                          nn.Tanh(), nn.Linear(128, 1))
    return Run(model, torch.optim.SGD(model.parameters(), lr=lr), _regression_batches(16, 64), loss=F.mse_loss,
               steps=steps)


class PostLNClassifier(nn.Module):
    """nn.TransformerEncoder (post-LN, the default) over token and position embeddings, mean-pooled."""

    def __init__(self, vocab: int = 32, dim: int = 64, heads: int = 4, layers: int = 2, length: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, length, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 4)

    def forward(self, tok):
        return self.head(self.encoder(self.embed(tok) + self.pos).mean(dim=1))


def _token_batches(vocab: int = 32, length: int = 16, batch: int = 32, seed: int = 0):
    """The class is the quarter of the vocabulary most of the tokens come from."""
    def data(step: int):
        x = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed * 10_000 + step))
        return x, F.one_hot(x * 4 // vocab, 4).sum(1).argmax(1)
    return data


def postln_transformer_adamw(lr: float = 3e-2, steps: int = 300, seed: int = 0) -> Run:
    """A post-LN Transformer under AdamW at lr 3e-2 from the first step, no warm-up."""
    torch.manual_seed(seed)
    model = PostLNClassifier()
    return Run(model, torch.optim.AdamW(model.parameters(), lr=lr), _token_batches(), steps=steps)


class FunctionalCNN(nn.Module):
    """A CNN in the usual style: activations with F.relu, no BatchNorm."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 3)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def _pixel_batches(batch: int = 32, seed: int = 0):
    """8x8 colour images whose class is the brightest channel, normalised."""
    def data(step: int):
        x = torch.rand(batch, 3, 8, 8, generator=torch.Generator().manual_seed(seed * 10_000 + step))
        return (x - 0.5) / 0.29, x.mean(dim=(2, 3)).argmax(1)
    return data


def functional_cnn_adam(lr: float = 5e-2, steps: int = 150, seed: int = 0) -> Run:
    """The F.relu CNN under Adam at lr 5e-2: the first updates push the units after conv2 and fc1 below
    zero for every input."""
    torch.manual_seed(seed)
    model = FunctionalCNN()
    return Run(model, torch.optim.Adam(model.parameters(), lr=lr), _pixel_batches(), steps=steps)


class LSTMClassifier(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.lstm = nn.LSTM(4, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 2)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def _sequence_batches(batch: int = 32, length: int = 20, seed: int = 0):
    def data(step: int):
        x = torch.randn(batch, length, 4, generator=torch.Generator().manual_seed(seed * 10_000 + step))
        return x, (x[:, :, 0].sum(1) > 0).long()
    return data


def lstm_recurrent_too_large(scale: float = 20.0, steps: int = 100, seed: int = 0) -> Run:
    """An LSTM whose recurrent weights start far too large (a custom init that forgot the fan-in):
    the gradient norm is in the thousands at step 0. Adam at a usual 1e-3."""
    torch.manual_seed(seed)
    model = LSTMClassifier()
    with torch.no_grad():
        model.lstm.weight_hh_l0.mul_(scale)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _sequence_batches(), steps=steps)


class _ReverseBlock(nn.Module):
    def __init__(self, width: int, heads: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.self_attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.self_attn(h, h, h, need_weights=False)[0]
        return x + self.ff(self.norm2(x))


class ReverseLM(nn.Module):
    """Eight pre-LN blocks over token and position embeddings, a token head at every position."""

    def __init__(self, vocab: int = 32, width: int = 32, length: int = 16, blocks: int = 8):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(_ReverseBlock(width) for _ in range(blocks))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def reverse_transformer(lr: float = 0.05, steps: int = 80, seed: int = 0) -> Run:
    """A pre-LN Transformer learning to reverse token sequences under Adam at 0.05: the loss sits near
    chance for ~50 steps, then falls to a fifth to a third of it (the CPU's kernels set how fast). Each query
    attending to one key (its mirror) is the solution, not a collapse: the run is healthy."""
    torch.manual_seed(seed)
    model = ReverseLM()

    def data(step: int, vocab: int = 32):
        x = torch.randint(0, vocab, (32, 16), generator=torch.Generator().manual_seed(seed * 10_000 + step))
        return x, x.flip(1)
    return Run(model, torch.optim.Adam(model.parameters(), lr=lr), data,
               loss=lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()), steps=steps)


def train_recording(run: Run):
    """``zoo.train``, also keeping each step's loss and the gradient norm of step 0 (to check that the
    run is the failure it is said to be)."""
    from neuraldbg import NeuralDbg

    losses, grad0 = [], None
    with NeuralDbg(run.model, optimizer=run.opt) as dbg:
        for step in range(run.steps):
            x, y = run.data(step)
            run.opt.zero_grad()
            loss = run.loss(run.model(x), y)
            loss.backward()
            if grad0 is None:
                grad0 = float(torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in run.model.parameters() if p.grad is not None])))
            run.opt.step()
            dbg.record_loss(loss)
            losses.append(float(loss.detach()))
    return dbg, losses, grad0
