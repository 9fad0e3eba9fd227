"""Small Transformers for the attention tests: nn.TransformerEncoderLayer, a hand-written softmax over
q @ k^T, and F.scaled_dot_product_attention; pre-LN and post-LN; trained on a task whose solution is
sharp attention (predict the token before each position: one key per query)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


class HandAttention(nn.Module):
    """Multi-head self-attention written out: softmax over the scaled q @ k^T (or, with ``sdpa``,
    F.scaled_dot_product_attention)."""

    def __init__(self, dim: int, heads: int, sdpa: bool = False):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
            a = scores.softmax(dim=-1) @ v
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, pre_ln: bool, sdpa: bool = False):
        super().__init__()
        self.pre_ln = pre_ln
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = HandAttention(dim, heads, sdpa)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        if self.pre_ln:
            x = x + self.attn(self.norm1(x))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.fc2(F.gelu(self.fc1(x))))


class TinyTransformer(nn.Module):
    """Token and position embeddings, two blocks, a head over the vocabulary at every position.
    ``kind``: "module" (nn.TransformerEncoderLayer), "hand" (softmax over q @ k^T) or "sdpa"."""

    def __init__(self, kind: str = "module", pre_ln: bool = False, vocab: int = 16, seq: int = 16, dim: int = 32,
                 layers: int = 2, heads: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        if kind == "module":
            layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=pre_ln)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        else:
            self.blocks = nn.Sequential(*[Block(dim, heads, pre_ln, sdpa=kind == "sdpa") for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens) + self.pos))


def previous_token(vocab: int = 16, seq: int = 16, batch: int = 32, seed: int = 0):
    """Random tokens; the target at each position is the token before it (a sharp attention solves it)."""
    def data(step: int):
        g = torch.Generator().manual_seed(seed * 100_000 + step)
        x = torch.randint(0, vocab, (batch, seq), generator=g)
        return x, torch.roll(x, 1, dims=1)
    return data


def train_transformer(kind: str = "module", pre_ln: bool = False, lr: float = 3e-2, warmup: int = 0,
                      steps: int = 160, seed: int = 0, seq: int = 16, dim: int = 32, **options) -> NeuralDbg:
    """AdamW at ``lr``, with a linear warm-up over ``warmup`` steps (0: none)."""
    torch.manual_seed(seed)
    model = TinyTransformer(kind, pre_ln, seq=seq, dim=dim)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    data = previous_token(seq=seq, seed=seed)
    with NeuralDbg(model, optimizer=opt, **options) as dbg:
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / warmup) if warmup else lr
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg
