"""What a watched layer is: its name, kind, activation bounds and the layout of its units."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeGuard

import torch
from torch import nn
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.nn.utils import parametrize


class Kind(str, Enum):
    """The family a module belongs to, as far as diagnosis is concerned."""

    RELU = "relu"            # outputs exactly zero below a threshold: can die
    BOUNDED = "bounded"      # sigmoid/tanh family: can saturate
    SMOOTH = "smooth"        # GELU, SiLU, ELU, LeakyReLU...: neither dies nor saturates hard
    LINEAR = "linear"
    CONV = "conv"
    NORM = "norm"
    EMBEDDING = "embedding"
    RECURRENT = "recurrent"
    ATTENTION = "attention"
    DROPOUT = "dropout"
    POOL = "pool"
    OTHER = "other"


# Layers whose relative weight gradient is comparable along depth (embeddings see sparse rows and
# norm layers have their own scale, so neither is a yardstick for attenuation or amplification).
GRADIENT_KINDS = frozenset(Kind) - {Kind.EMBEDDING, Kind.NORM}
# weight layers whose gain (output scale over input scale) points at their weights' scale
GAIN_KINDS = frozenset({Kind.LINEAR, Kind.CONV, Kind.RECURRENT, Kind.ATTENTION})

_KIND_BY_TYPE: list[tuple[tuple[type, ...], Kind]] = [
    ((nn.ReLU, nn.ReLU6, nn.Threshold), Kind.RELU),
    ((nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Softsign, nn.Hardsigmoid), Kind.BOUNDED),
    ((nn.GELU, nn.SiLU, nn.ELU, nn.SELU, nn.CELU, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.Mish,
      nn.Softplus, nn.Hardswish, nn.LogSigmoid, nn.Softmax, nn.LogSoftmax, nn.GLU), Kind.SMOOTH),
    ((nn.Linear, nn.Bilinear), Kind.LINEAR),
    ((nn.modules.conv._ConvNd,), Kind.CONV),
    ((nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm,
      getattr(nn, "RMSNorm", nn.LayerNorm)), Kind.NORM),
    ((nn.Embedding, nn.EmbeddingBag), Kind.EMBEDDING),
    ((nn.RNNBase, nn.RNNCellBase), Kind.RECURRENT),
    ((nn.MultiheadAttention,), Kind.ATTENTION),
    ((nn.modules.dropout._DropoutNd,), Kind.DROPOUT),
    ((nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
      nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd), Kind.POOL),
]

# Modules whose 3-D outputs are (batch, channels, length) rather than (batch, time, features).
_CHANNELS_FIRST = (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d, nn.MaxPool1d,
                   nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)


def classify(module: nn.Module) -> Kind:
    for types, kind in _KIND_BY_TYPE:
        if isinstance(module, types):
            return kind
    return Kind.OTHER


def output_bounds(module: nn.Module) -> tuple[float, float] | None:
    """The range a bounded activation maps into, or None when the module is not bounded."""
    if isinstance(module, (nn.Sigmoid, nn.Hardsigmoid)):
        return (0.0, 1.0)
    if isinstance(module, (nn.Tanh, nn.Softsign)):
        return (-1.0, 1.0)
    if isinstance(module, nn.Hardtanh):  # also ReLU6 (0, 6)
        return (float(module.min_val), float(module.max_val))
    return None


@dataclass
class LayerInfo:
    """A watched module. ``index`` is its row in the trace; ``order`` its place in forward execution."""

    index: int
    name: str
    type_name: str
    kind: Kind
    bounds: tuple[float, float] | None = None
    n_params: int = 0
    n_trainable: int = 0
    channels_first: bool = False
    order: int | None = None             # set when first seen in a forward pass
    # "recurrent_scale", "weight_scale" (vs the default init, when watching starts); "bias_rms": the RMS of a
    # Linear or convolution layer's bias when watching starts; "pruned": the share of its weights a pruning mask
    # (torch.nn.utils.prune) holds at 0 when watching starts; "equal_weights": the one
    # value every weight of a Linear or convolution holds when watching starts (zero, or a constant); for a functional
    # operation (a "site"): "owner", the module it is attributed to,
    # and "relation", "after" (it consumes that module's output) or "in" (it runs in its forward);
    # "passthrough": the module ran but only returned its input; "bidirectional": a recurrent module that runs
    # both ways along the sequence; "positions": outputs per unit in a batch (where dead units are counted);
    # "applications": the most times it ran in one sampled pass, where more than once (a block shared across
    # depth, a cell applied per time step); "reads": the module whose output its input is, or was computed from
    # by operations of one input (a mask, a shift), where known; "through": what it reads (its "reads", or the
    # module a functional operation is "after") went through such operations first
    extra: dict = field(default_factory=dict)

    @property
    def owner(self) -> str | None:
        """For a functional operation, the module it belongs to (a name in ``named_modules()``)."""
        return self.extra.get("owner")

    @property
    def is_site(self) -> bool:
        return "owner" in self.extra

    def where(self) -> str:
        """How a text names this row: "`conv2`", or for a functional operation "F.relu after `conv2`"."""
        if not self.is_site:
            return f"`{self.name}`"
        owner = f"`{self.owner}`" if self.owner else "the model's forward"
        return f"{self.type_name} {self.extra.get('relation', 'in')} {owner}"

    @property
    def frozen(self) -> bool:
        return self.n_params > 0 and self.n_trainable == 0

    def unit_dim(self, ndim: int) -> int | None:
        """Which dimension of an output of this rank holds the units (None: no unit structure)."""
        if ndim < 2:
            return None
        if ndim >= 4 or self.channels_first:
            return 1
        return ndim - 1

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "type": self.type_name, "kind": self.kind.value,
                "bounds": list(self.bounds) if self.bounds else None, "n_params": self.n_params,
                "n_trainable": self.n_trainable, "channels_first": self.channels_first, "order": self.order,
                "recurrent_scale": self.extra.get("recurrent_scale"), "weight_scale": self.extra.get("weight_scale"),
                "equal_weights": self.extra.get("equal_weights"), "bias_rms": self.extra.get("bias_rms"),
                "pruned": self.extra.get("pruned"),
                "positions": self.extra.get("positions"), "applications": self.extra.get("applications"),
                **{k: self.extra[k] for k in _EXTRA_TEXT + _EXTRA_FLAGS if k in self.extra}}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerInfo":
        bounds = d.get("bounds")
        extra: dict = {k: float(d[k]) for k in ("recurrent_scale", "weight_scale", "equal_weights", "bias_rms",
                                                "pruned") if d.get(k) is not None}
        extra.update({k: int(d[k]) for k in ("positions", "applications") if d.get(k) is not None})
        extra.update({k: str(d[k]) for k in _EXTRA_TEXT if d.get(k) is not None})
        extra.update({k: True for k in _EXTRA_FLAGS if d.get(k)})
        return cls(index=int(d["index"]), name=str(d["name"]), type_name=str(d["type"]), kind=Kind(d["kind"]),
                   bounds=(float(bounds[0]), float(bounds[1])) if bounds else None,
                   n_params=int(d.get("n_params", 0)), n_trainable=int(d.get("n_trainable", 0)),
                   channels_first=bool(d.get("channels_first", False)),
                   order=None if d.get("order") is None else int(d["order"]), extra=extra)


_EXTRA_TEXT = ("owner", "relation", "follows", "reads")
_EXTRA_FLAGS = ("passthrough", "bidirectional", "through")


def parametrizing_modules(model: nn.Module) -> set[int]:
    """The modules (by id) that compute a parametrized module's tensors (``torch.nn.utils.parametrize``: a
    spectral or weight norm, an orthogonal map): part of the module they parametrize, run on its weights when
    it reads them, not layers of the forward pass."""
    out: set[int] = set()
    for m in model.modules():
        plist = _parametrizations(m)
        if plist is not None:
            out.update(id(x) for x in plist.modules())
    return out


def _parametrizations(module: nn.Module) -> nn.Module | None:
    """A parametrized module's ``parametrizations`` (a ModuleDict); None for any other module."""
    plist = getattr(module, "parametrizations", None)
    return plist if parametrize.is_parametrized(module) and isinstance(plist, nn.Module) else None


def own_named_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """A module's own parameters, by name: those it holds directly and those its parametrizations compute its
    tensors from (a spectral-normed weight's ``parametrizations.weight.original``: the weight it trains)."""
    own = list(module.named_parameters(recurse=False))
    plist = _parametrizations(module)
    if plist is not None:
        seen = {id(p) for _, p in own}
        own += [(f"parametrizations.{n}", p) for n, p in plist.named_parameters() if id(p) not in seen]
    return own


def own_parameters(module: nn.Module) -> list[nn.Parameter]:
    """A module's own parameters (``own_named_parameters`` without the names)."""
    return [p for _, p in own_named_parameters(module)]


def watched_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Leaf modules, plus containers that own parameters directly (their own computation is otherwise unseen).
    A parametrized module is a leaf: its parametrizations are part of it."""
    inside = parametrizing_modules(model)
    out = []
    for name, module in model.named_modules():
        if id(module) in inside:
            continue
        has_children = any(id(c) not in inside for c in module.children())
        if not name:
            if not has_children:
                out.append((name, module))  # the model itself is a single layer
            continue
        if not has_children or own_parameters(module):
            out.append((name, module))
    return out


def recurrent_scale(module: nn.Module) -> float | None:
    """The spread of a recurrent layer's hidden-to-hidden weights against PyTorch's default init
    (uniform in +-1/sqrt(hidden): std 1/sqrt(3 hidden)); the largest over its layers and directions.
    1 at the default, ~1.7 for an orthogonal init of a plain RNN; far from 1, the state explodes or forgets
    through time."""
    if not isinstance(module, (nn.RNNBase, nn.RNNCellBase)):
        return None
    hidden = getattr(module, "hidden_size", 0)
    ratios = []
    with torch.no_grad():
        for pname, p in module.named_parameters(recurse=False):
            if pname.startswith("weight_hh") and p.numel() > 1 and hidden > 0 and not p.is_meta:
                ratios.append(float(p.detach().float().std()) * math.sqrt(3 * hidden))
    return max(ratios, key=lambda r: abs(math.log(r)) if r > 0 else math.inf) if ratios else None


def _readable(t) -> TypeGuard[torch.Tensor]:
    """A tensor with values to read: not on the meta device, not a lazy module's parameter before its first
    forward."""
    return (isinstance(t, torch.Tensor) and not isinstance(t, (UninitializedParameter, UninitializedBuffer))
            and not t.is_meta)


def _weight(module: nn.Module):
    """``module.weight`` read without side effects: a parametrized weight (``torch.nn.utils.parametrizations``)
    is computed with its parametrizations as in eval mode, so a spectral norm's power iteration does not
    advance its vectors (reading it must not change the run it watches)."""
    plist = getattr(module, "parametrizations", None)
    if not isinstance(plist, nn.Module):
        return getattr(module, "weight", None)
    modes = [(m, m.training) for m in plist.modules()]
    for m, _ in modes:
        m.training = False
    try:
        with torch.no_grad():
            return getattr(module, "weight", None)
    finally:
        for m, mode in modes:
            m.training = mode


def weight_scale(module: nn.Module) -> float | None:
    """The spread of a Linear or convolution layer's weights against PyTorch's default init (uniform in
    +-1/sqrt(fan_in): std 1/sqrt(3 fan_in)): 1 at the default, within a few times of it for the usual inits
    (Kaiming, Xavier, N(0, 0.02) at the usual widths). None for other layers and weights that are all
    zero (a deliberate zero init)."""
    if not isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        return None
    w = _weight(module)
    if not _readable(w) or w.dim() < 2 or w.numel() < 2:
        return None
    with torch.no_grad():
        std = float(w.detach().float().std())
    fan_in = w[0].numel()
    return std * math.sqrt(3 * fan_in) if std > 0 and math.isfinite(std) else None


def bias_rms(module: nn.Module) -> float | None:
    """The RMS of a Linear or convolution layer's bias (None without one): what its output is when its input
    is near zero."""
    b = getattr(module, "bias", None)
    if not isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) or not _readable(b) or b.numel() == 0:
        return None
    with torch.no_grad():
        rms = float(b.detach().float().pow(2).mean().sqrt())
    return rms if math.isfinite(rms) else None


def equal_weights(module: nn.Module) -> float | None:
    """The one value all the weights of a Linear or convolution layer with several units hold (zero, or a
    constant init), else None: its units compute the same output."""
    if not isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)):
        return None
    w = _weight(module)
    if not _readable(w) or w.dim() < 2 or w.shape[0] < 2 or w.numel() == 0:
        return None
    with torch.no_grad():
        flat = w.detach().reshape(-1)
        first = flat[0]
        same = bool((flat == first).all()) and bool(torch.isfinite(first))
    return float(first) if same else None


def pruned_share(module: nn.Module) -> float | None:
    """The largest share of a tensor's entries that a pruning mask holds at 0 (``torch.nn.utils.prune``: a
    ``<name>_mask`` buffer beside a ``<name>_orig`` parameter), None when the module is not pruned."""
    shares = []
    with torch.no_grad():
        for key, mask in module.named_buffers(recurse=False):
            if key.endswith("_mask") and isinstance(getattr(module, key[:-5] + "_orig", None), nn.Parameter) \
                    and isinstance(mask, torch.Tensor) and mask.numel() and not mask.is_meta:
                shares.append(float((mask == 0).float().mean()))
    return max(shares) if shares else None


def describe(index: int, name: str, module: nn.Module) -> LayerInfo:
    own = own_parameters(module)
    pruned = pruned_share(module)
    scale = recurrent_scale(module)
    equal = equal_weights(module)
    wscale = weight_scale(module) if equal is None else None  # equal weights have no spread to compare
    brms = bias_rms(module)
    return LayerInfo(index=index, name=name, type_name=type(module).__name__, kind=classify(module),
                     bounds=output_bounds(module), n_params=sum(p.numel() for p in own),
                     n_trainable=sum(p.numel() for p in own if p.requires_grad),
                     channels_first=isinstance(module, _CHANNELS_FIRST),
                     extra={**({} if scale is None else {"recurrent_scale": scale}),
                            **({} if wscale is None else {"weight_scale": wscale}),
                            **({} if brms is None else {"bias_rms": brms}),
                            **({} if equal is None else {"equal_weights": equal}),
                            **({} if not pruned else {"pruned": pruned}),
                            **({"bidirectional": True} if getattr(module, "bidirectional", False) is True else {})})
