"""The models the speed benchmarks train (``overhead.py`` in a script, ``notebook_cell.py`` in a kernel).

Each builder returns ``(model, batches)``: a freshly initialised model (seeded) and four fixed
(input, target) batches that the loop cycles through, so that both the bare and the watched loop
spend their time in the model, not in making data.
"""
from __future__ import annotations

import torch
from torch import nn


def _batches(make_x, n_classes: int, n: int = 4):
    out = []
    for _ in range(n):
        x = make_x()
        out.append((x, torch.randint(0, n_classes, (x.shape[0],))))
    return out


def wide_mlp():
    layers: list[nn.Module] = []
    for _ in range(7):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(1024, 10)), _batches(lambda: torch.randn(256, 1024), 10)


def deep_net():
    blocks: list[nn.Module] = []
    for _ in range(50):
        blocks += [nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()]
    return nn.Sequential(*blocks, nn.Linear(64, 10)), _batches(lambda: torch.randn(64, 64), 10)


def net50():
    blocks: list[nn.Module] = []
    for _ in range(16):
        blocks += [nn.Linear(128, 128), nn.LayerNorm(128), nn.GELU()]
    return nn.Sequential(*blocks, nn.Linear(128, 10)), _batches(lambda: torch.randn(64, 128), 10)


def small_cnn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    model = nn.Sequential(*block(3, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64), *block(64, 64),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    return model, _batches(lambda: torch.randn(64, 3, 32, 32), 10)


class SmallTransformer(nn.Module):
    """Token classification by a two-layer post-LN encoder (nn.TransformerEncoderLayer, dropout on)."""

    def __init__(self, vocab: int = 64, d: int = 64, heads: int = 4, layers: int = 2, n_classes: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.1, batch_first=True), layers,
            enable_nested_tensor=False)
        self.head = nn.Linear(d, n_classes)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def small_transformer():
    return SmallTransformer(), _batches(lambda: torch.randint(0, 64, (32, 32)), 8)


def tiny_mlp():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    return model, _batches(lambda: torch.randn(32, 16), 4, n=8)


# name -> (builder, label); the labels are the README's
WORKLOADS = {
    "wide_mlp": (wide_mlp, "wide MLP (8 Linear of 1024, batch 256)"),
    "cnn": (small_cnn, "small CNN + BatchNorm (batch 64)"),
    "deep": (deep_net, "deep net (151 layers: Linear 64 + LayerNorm + GELU, batch 64)"),
    "net50": (net50, "50-layer net (16 x Linear 128 + LayerNorm + GELU, batch 64)"),
    "transformer": (small_transformer, "small Transformer (2 post-LN layers, d 64, batch 32 x 32 tokens)"),
}


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return WORKLOADS[name][0]()
