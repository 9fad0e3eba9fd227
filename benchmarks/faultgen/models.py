"""The models of the families, written as a user writes them, plus the few hand-written modules
that faults put into them. Nothing here knows about faults or about NeuralDbg."""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def mlp(n_in: int, width: int, depth: int, n_out: int, act: str = "relu") -> nn.Sequential:
    """``depth`` hidden layers of ``width`` units: Linear, activation, ..., Linear."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(n_in if i == 0 else width, width), ACTIVATIONS[act]()]
    return nn.Sequential(*layers, nn.Linear(width if depth else n_in, n_out))


class LogisticRegression(nn.Module):
    def __init__(self, n_in: int):
        super().__init__()
        self.linear = nn.Linear(n_in, 1)

    def forward(self, x):
        return self.linear(x)


def cnn_bn(channels: int, depth: int, n_out: int = 3, act: str = "relu", norm: bool = True) -> nn.Sequential:
    """Conv-BatchNorm-ReLU blocks with nn.ReLU modules, global pooling and a linear head."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Conv2d(1 if i == 0 else channels, channels, 3, padding=1)]
        layers += [nn.BatchNorm2d(channels)] if norm else []
        layers += [ACTIVATIONS[act]()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, n_out))


class FunctionalCNN(nn.Module):
    """The same kind of CNN written with F.relu, plus a hidden fully connected layer."""

    def __init__(self, channels: int, depth: int, n_out: int = 3, act: str = "relu", norm: bool = True):
        super().__init__()
        self.depth, self.act = depth, {"relu": F.relu, "sigmoid": torch.sigmoid}[act]
        for i in range(1, depth + 1):
            setattr(self, f"conv{i}", nn.Conv2d(1 if i == 1 else channels, channels, 3, padding=1))
            setattr(self, f"bn{i}", nn.BatchNorm2d(channels) if norm else nn.Identity())
        self.fc1 = nn.Linear(channels, 2 * channels)
        self.fc2 = nn.Linear(2 * channels, n_out)

    def forward(self, x):
        for i in range(1, self.depth + 1):
            x = self.act(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        x = self.act(self.fc1(x))
        return self.fc2(x)


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu2 = nn.ReLU()

    def forward(self, x):
        return self.relu2(x + self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))


class ResCNN(nn.Module):
    def __init__(self, channels: int, blocks: int, n_out: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU())
        self.blocks = nn.Sequential(*[ResBlock(channels) for _ in range(blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, n_out)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


class RecurrentClassifier(nn.Module):
    """An LSTM or GRU over the sequence, a linear head on the last time step."""

    def __init__(self, cell: str, n_in: int, hidden: int, layers: int, n_out: int = 2):
        super().__init__()
        self.rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell](n_in, hidden, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(hidden, n_out)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class SelfAttention(nn.Module):
    """Multi-head self-attention written by hand: softmax(q k^T / sqrt(d)) v (``scale_power``: the power of
    d the scores are multiplied by, -0.5 as it should be)."""

    def __init__(self, dim: int, heads: int, scale_power: float = -0.5):
        super().__init__()
        self.heads, self.scale_power = heads, scale_power
        self.key_bias: torch.Tensor | None = None   # added to every query's scores (a padding mask)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def scores(self, x):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, -1).transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** self.scale_power
        return s if self.key_bias is None else s + self.key_bias

    def forward(self, x):
        b, t, d = x.shape
        att = self.scores(x).softmax(dim=-1)
        v = self.v(x).view(b, t, self.heads, -1).transpose(1, 2)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A Transformer encoder block, pre-LN or post-LN, with either kind of attention."""

    def __init__(self, dim: int, heads: int, pre_ln: bool, attention: str, scale_power: float = -0.5):
        super().__init__()
        self.pre_ln = pre_ln
        if attention == "mha":
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        else:
            self.attn = SelfAttention(dim, heads, scale_power=scale_power)
        self.ln1 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.ln2 = nn.LayerNorm(dim)

    def _attend(self, x):
        if isinstance(self.attn, nn.MultiheadAttention):
            return self.attn(x, x, x, need_weights=False)[0]
        return self.attn(x)

    def forward(self, x):
        if self.pre_ln:
            x = x + self._attend(self.ln1(x))
            return x + self.ff(self.ln2(x))
        x = self.ln1(x + self._attend(x))
        return self.ln2(x + self.ff(x))


class TinyTransformer(nn.Module):
    """Token and position embeddings, encoder blocks, a head on the first (CLS) position."""

    def __init__(self, vocab: int, dim: int, depth: int, pre_ln: bool, attention: str, heads: int = 2,
                 length: int = 9, n_out: int = 2, scale_power: float = -0.5):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(length, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, pre_ln, attention, scale_power) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim) if pre_ln else nn.Identity()
        self.head = nn.Linear(dim, n_out)

    def forward(self, tok):
        h = self.tok(tok) + self.pos(torch.arange(tok.shape[1]))
        return self.head(self.norm(self.blocks(h))[:, 0])


class BagOfEmbeddings(nn.Module):
    """Mean of token embeddings, then a tanh MLP."""

    def __init__(self, vocab: int, dim: int, depth: int, n_out: int = 2, act: str = "tanh"):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = mlp(dim, 2 * dim, depth, n_out, act=act)

    def forward(self, tok):
        return self.mlp(self.embed(tok).mean(dim=1))


class Autoencoder(nn.Module):
    """A tanh encoder to a small code, a ReLU decoder back."""

    def __init__(self, n_in: int, width: int, depth: int, code: int = 4):
        super().__init__()
        enc: list[nn.Module] = []
        dec: list[nn.Module] = []
        for i in range(depth):
            enc += [nn.Linear(n_in if i == 0 else width, width), nn.Tanh()]
            dec += [nn.Linear(code if i == 0 else width, width), nn.ReLU()]
        self.encoder = nn.Sequential(*enc, nn.Linear(width, code))
        self.decoder = nn.Sequential(*dec, nn.Linear(width, n_in))

    def forward(self, x):
        return self.decoder(self.encoder(x))


# -- hand-written modules that faults bring in -------------------------------------------------------

class LogFeatures(nn.Module):
    """log of a learned projection of the input (nothing keeps the projection positive)."""

    def __init__(self, n: int):
        super().__init__()
        self.proj = nn.Linear(n, n)

    def forward(self, x):
        return torch.log(self.proj(x))


class HalfTemperedSoftmax(nn.Module):
    """A softmax with a temperature, computed by hand in float16 to save memory: exp(logit / t) leaves
    the fp16 range (65504) once a logit exceeds ~11 t."""

    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, x):
        e = torch.exp(x.half() / self.temperature)
        return (e / e.sum(dim=-1, keepdim=True)).float()


def nll_of_probs(p, y):
    return F.nll_loss(torch.log(p + 1e-12), y)


def front(name: str, module: nn.Module, model: nn.Module) -> nn.Sequential:
    """``module`` applied to the input before ``model`` (named ``name`` and ``net``)."""
    return nn.Sequential(OrderedDict([(name, module), ("net", model)]))


def back(model: nn.Module, name: str, module: nn.Module) -> nn.Sequential:
    """``module`` applied to the output of ``model`` (named ``net`` and ``name``)."""
    return nn.Sequential(OrderedDict([("net", model), (name, module)]))


class _GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class GradientScale(nn.Module):
    """Identity forward; multiplies the gradient flowing back through it by ``factor`` (a loss-weighting trick
    gone wrong; with a negative factor, a gradient reversal layer)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return _GradScale.apply(x, self.factor)
