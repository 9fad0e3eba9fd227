"""Model families: an architecture, its learnable task, its healthy optimizer, its two widths and
two depths, and the places in it where a fault can be put (its sites).

A ``Build`` is one run being put together: the family's model and task at one variation, which a
mechanism then changes (``faults.py``). Names are those of ``model.named_modules()``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import models as M
from . import tasks as T


@dataclass(frozen=True)
class Variation:
    """One row of the design: what changes between runs of the same family and fault."""

    seed: int          # model initialisation
    data_seed: int
    width: int         # level 0 or 1
    depth: int         # level 0 or 1
    steps: int
    batch: int

    @property
    def key(self) -> str:
        return f"s{self.seed}d{self.data_seed}w{self.width}h{self.depth}n{self.steps}b{self.batch}"


@dataclass(frozen=True)
class Opt:
    kind: str                       # "sgd" | "adam" | "adamw"
    lr: float
    kwargs: tuple = ()              # ((name, value), ...)

    def make(self, params) -> torch.optim.Optimizer:
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[self.kind]
        return cls(params, lr=self.lr, **dict(self.kwargs))

    def scaled(self, factor: float) -> "Opt":
        return Opt(self.kind, self.lr * factor, self.kwargs)


@dataclass(frozen=True)
class ActSite:
    """An activation a fault can kill or saturate: where a verdict names it, the layer feeding it and
    the parameters that set its input's offset and scale."""

    place: str
    pre: str                        # the module whose output the activation consumes
    bias: str | None                # parameter (qualified name) offsetting its input
    weight: str | None              # weight of the nearest weight layer before it
    positive_input: bool = False    # that weight layer reads non-negative values (a ReLU's output)
    blocking: bool = True           # everything downstream passes through it (no skip around it)
    act: str = "relu"               # relu | gelu | tanh | sigmoid


@dataclass(frozen=True)
class AttnSite:
    place: str                      # the attention module
    q: Callable[[nn.Module], torch.Tensor]   # the query / key projection weights, as views to scale
    k: Callable[[nn.Module], torch.Tensor]


@dataclass
class Sites:
    relu: list[ActSite] = field(default_factory=list)      # ReLU-family activations on the main path
    squash: list[ActSite] = field(default_factory=list)    # tanh / sigmoid activations
    weights: list[str] = field(default_factory=list)       # weight layers along the main path, in order
    stack: list[str] = field(default_factory=list)         # every module of the main path, in order
    recurrent: str | None = None
    attention: list[AttnSite] = field(default_factory=list)

    def middle(self, kind: str, **need) -> ActSite | None:
        """The site in the middle of the path among those with the given properties."""
        found = [s for s in getattr(self, kind) if all(getattr(s, k) == v for k, v in need.items())]
        return found[len(found) // 2] if found else None


_RELU_TYPES = (nn.ReLU, nn.GELU)
_ACT_NAMES = {nn.ReLU: "relu", nn.GELU: "gelu", nn.Tanh: "tanh", nn.Sigmoid: "sigmoid"}
_SQUASH_TYPES = (nn.Tanh, nn.Sigmoid)
_WEIGHT_TYPES = (nn.Linear, nn.Conv2d)


def scan(model: nn.Module, prefix: str = "") -> Sites:
    """Sites of a model whose leaf modules run in the order they are defined (Sequential style)."""
    sites = Sites()
    last_weight = last_norm = None
    nonneg = reads_nonneg = False   # the signal here is a ReLU's output / the last weight layer read one
    for name, m in model.named_modules():
        if name == "" or list(m.children()):
            continue
        q = prefix + name
        sites.stack.append(q)
        if isinstance(m, _WEIGHT_TYPES):
            last_weight, last_norm, reads_nonneg, nonneg = q, None, nonneg, False
            sites.weights.append(q)
        elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            last_norm, nonneg = q, False
        elif isinstance(m, (_RELU_TYPES, _SQUASH_TYPES)):
            pre = last_norm or last_weight
            site = ActSite(q, pre, f"{pre}.bias", f"{last_weight}.weight",
                           positive_input=reads_nonneg and last_norm is None, act=_ACT_NAMES[type(m)])
            (sites.relu if isinstance(m, _RELU_TYPES) else sites.squash).append(site)
            nonneg = isinstance(m, nn.ReLU)
        elif not isinstance(m, (nn.Flatten, nn.AdaptiveAvgPool2d, nn.Identity)):
            nonneg = False
    return sites


# -- the families ------------------------------------------------------------------------------------

@dataclass
class Build:
    """One run being put together. ``core`` is the family's model; ``model`` what is trained (the core,
    or the core wrapped by a fault, its names then under ``prefix``)."""

    family: "Family"
    var: Variation
    arch: dict = field(default_factory=dict)         # architecture changes a fault asks for
    task_maker: Callable | None = None               # a fault's own task (batch, seed) -> Task
    core: nn.Module | None = None
    model: nn.Module | None = None
    prefix: str = ""
    task: T.Task | None = None
    clean_task: T.Task | None = None                 # the task before a fault changes its data
    loss: Callable | None = None
    opt: Opt | None = None
    schedule: list = field(default_factory=list)     # before_step(step, optimizer) callables

    @property
    def size(self) -> tuple[int, int]:
        f = self.family
        width = self.arch.get("width", f.widths[self.var.width])
        depth = self.arch.get("depth", f.depths[self.var.depth] if f.depths else 0)
        return width, depth

    @property
    def steps(self) -> int:
        return self.var.steps

    def materialize(self) -> "Build":
        f = self.family
        self.task = self.clean_task = (self.task_maker or f.task)(self.var.batch, self.var.data_seed)
        torch.manual_seed(self.var.seed)
        self.core = self.model = f.build(self.task, *self.size, **{k: v for k, v in self.arch.items()
                                                                     if k not in ("width", "depth")})
        self.loss = self.task.loss
        self.opt = f.opt
        return self

    def sites(self) -> Sites:
        return self.family.sites(self.core, self.prefix)

    def param(self, qualified: str) -> torch.Tensor:
        return dict(self.model.named_parameters())[qualified]

    def wrap(self, model: nn.Module, prefix: str) -> None:
        self.model, self.prefix = model, prefix


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable                 # (task, width, depth, **arch) -> nn.Module
    task: Callable                  # (batch, data_seed) -> Task
    opt: Opt                        # the healthy optimizer
    widths: tuple[int, int]
    depths: tuple[int, int] | None  # None: the family has no depth to vary
    traits: frozenset               # what faults can use: float_input, tokens, classes, binary, regression,
                                    # relu, squash, recurrent, attention, norm, sgd, mlp_stack
    sites_of: Callable | None = None

    def sites(self, core: nn.Module, prefix: str = "") -> Sites:
        return (self.sites_of or scan)(core, prefix)

    def has(self, *traits: str) -> bool:
        return all(t in self.traits for t in traits)


def functional_cnn_sites(model: M.FunctionalCNN, prefix: str) -> Sites:
    s = Sites()
    act = "relu" if model.act is F.relu else "sigmoid"
    kind = s.relu if act == "relu" else s.squash
    for i in range(1, model.depth + 1):
        normed = isinstance(getattr(model, f"bn{i}"), nn.BatchNorm2d)
        pre = f"{prefix}bn{i}" if normed else f"{prefix}conv{i}"   # the module F.relu consumes
        kind.append(ActSite(pre, pre, f"{pre}.bias", f"{prefix}conv{i}.weight", act=act))
        s.weights.append(f"{prefix}conv{i}")
        s.stack += [f"{prefix}conv{i}"] + ([f"{prefix}bn{i}"] if normed else [])
    kind.append(ActSite(f"{prefix}fc1", f"{prefix}fc1", f"{prefix}fc1.bias", f"{prefix}fc1.weight",
                        positive_input=act == "relu", act=act))
    s.weights += [f"{prefix}fc1", f"{prefix}fc2"]
    s.stack += [f"{prefix}fc1", f"{prefix}fc2"]
    return s


def rescnn_sites(model: M.ResCNN, prefix: str) -> Sites:
    s = scan(model, prefix)
    s.relu = [r if not r.place.endswith("relu1") else ActSite(**{**r.__dict__, "blocking": False}) for r in s.relu]
    return s


def recurrent_sites(model: M.RecurrentClassifier, prefix: str) -> Sites:
    s = scan(model, prefix)
    s.recurrent = f"{prefix}rnn"
    s.stack = [f"{prefix}rnn", f"{prefix}fc"]
    return s


def transformer_sites(model: M.TinyTransformer, prefix: str) -> Sites:
    s = Sites()
    for i, block in enumerate(model.blocks):
        place = f"{prefix}blocks.{i}.attn"
        if isinstance(block.attn, nn.MultiheadAttention):
            d = block.attn.embed_dim
            s.attention.append(AttnSite(place, lambda m, i=i, d=d: m.blocks[i].attn.in_proj_weight[:d],
                                        lambda m, i=i, d=d: m.blocks[i].attn.in_proj_weight[d:2 * d]))
        else:
            s.attention.append(AttnSite(place, lambda m, i=i: m.blocks[i].attn.q.weight,
                                        lambda m, i=i: m.blocks[i].attn.k.weight))
        s.stack += [place, f"{prefix}blocks.{i}.ff"]
    s.weights = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    s.weights = [prefix + n for n in s.weights]
    s.stack = [f"{prefix}tok"] + s.stack + [f"{prefix}head"]
    return s


def mlp_family(act: str):
    def build(task, width, depth, act_override: str | None = None, **_):
        return M.mlp(task.n_in, width, depth, task.n_out, act=act_override or act)
    return build


def _cnn(task, width, depth, act_override: str | None = None, norm: bool = True, **_):
    return M.cnn_bn(width, depth, task.n_out, act=act_override or "relu", norm=norm)


def _fcnn(task, width, depth, act_override: str | None = None, norm: bool = True, **_):
    return M.FunctionalCNN(width, depth, task.n_out, act=act_override or "relu", norm=norm)


def _rescnn(task, width, depth, **_):
    return M.ResCNN(width, depth, task.n_out)


def recurrent_family(cell: str):
    def build(task, width, depth, **_):
        return M.RecurrentClassifier(cell, task.n_in, width, depth, task.n_out)
    return build


def transformer_family(pre_ln: bool, attention: str):
    def build(task, width, depth, scale_power: float = -0.5, **_):
        return M.TinyTransformer(task.n_in, width, depth, pre_ln, attention, n_out=task.n_out,
                                 scale_power=scale_power)
    return build


def _bag(task, width, depth, act_override: str | None = None, **_):
    return M.BagOfEmbeddings(task.n_in, width, depth, task.n_out, act=act_override or "tanh")


def _autoencoder(task, width, depth, **_):
    return M.Autoencoder(task.n_in, width, depth)


def _logreg(task, width, depth, **_):
    return M.LogisticRegression(task.n_in)


SGD = Opt("sgd", 0.05, (("momentum", 0.9),))
FS = frozenset


def _family_list() -> list[Family]:
    mlp_traits = {"float_input", "classes", "sgd", "mlp_stack"}
    tf_traits = FS({"tokens", "classes", "attention", "norm", "adam"})
    return [
        Family("logistic_regression", _logreg, lambda b, s: T.linear_binary(16, b, s), Opt("sgd", 0.5),
               (16, 16), None, FS({"float_input", "binary", "sgd"})),
        Family("mlp_relu", mlp_family("relu"), lambda b, s: T.teacher_classes(10, 4, b, s), SGD, (32, 128), (2, 4),
               FS(mlp_traits | {"relu"})),
        Family("mlp_tanh", mlp_family("tanh"), lambda b, s: T.teacher_classes(10, 4, b, s), SGD, (32, 128), (2, 4),
               FS(mlp_traits | {"squash"})),
        Family("cnn_bn", _cnn, lambda b, s: T.stripes(b, s), SGD, (8, 16), (2, 3),
               FS({"float_input", "classes", "relu", "norm", "sgd", "image"})),
        Family("cnn_bn_functional", _fcnn, lambda b, s: T.stripes(b, s), SGD, (8, 16), (2, 3),
               FS({"float_input", "classes", "relu", "norm", "sgd", "image"}), functional_cnn_sites),
        Family("residual_cnn", _rescnn, lambda b, s: T.stripes(b, s), SGD, (8, 16), (1, 2),
               FS({"float_input", "classes", "relu", "norm", "sgd", "image"}), rescnn_sites),
        Family("lstm", recurrent_family("lstm"), lambda b, s: T.sequence_sign(b, s), Opt("adam", 1e-2), (16, 32),
               (1, 2),
               FS({"float_input", "classes", "recurrent", "adam"}), recurrent_sites),
        Family("transformer_preln_mha", transformer_family(True, "mha"), lambda b, s: T.token_majority(b, s),
               Opt("adamw", 3e-3), (16, 32), (1, 2), tf_traits, transformer_sites),
        Family("transformer_postln_mha", transformer_family(False, "mha"), lambda b, s: T.token_majority(b, s),
               Opt("adamw", 3e-3), (16, 32), (1, 2), tf_traits, transformer_sites),
        Family("transformer_postln_custom", transformer_family(False, "custom"), lambda b, s: T.token_majority(b, s),
               Opt("adamw", 3e-3), (16, 32), (1, 2), FS(tf_traits | {"custom_attention"}), transformer_sites),
        Family("embedding_bag", _bag, lambda b, s: T.token_majority(b, s, cls=False), Opt("adam", 1e-2),
               (16, 32), (1, 2), FS({"tokens", "classes", "squash", "adam", "mlp_stack"})),
        Family("autoencoder", _autoencoder, lambda b, s: T.reconstruction(16, b, s), Opt("adam", 3e-3),
               (16, 32), (1, 2), FS({"float_input", "regression", "squash", "relu", "adam"})),
    ]


FAMILIES: dict[str, Family] = {f.name: f for f in _family_list()}
