"""Extraction: functional operations that no module hook sees, attributed to modules.

Most models apply their nonlinearities as functions (``x = F.relu(self.conv2(x))``), compute
attention inside a module's forward, and take logs and roots where they need them. A
``torch.overrides.TorchFunctionMode``, entered for sampled forward passes only, sees those calls;
a module tracker (global forward pre/post hooks, for the same passes) says which module runs and
which module produced a tensor. Attribution:

- an activation (``F.relu``, ``torch.tanh``, ``F.softmax``, ...) belongs to the module whose output
  it consumes: ``F.relu(self.conv2(x))`` is "F.relu after `conv2`"; so is ``F.relu(self.conv2(x) * mask)``,
  or a ReLU reading what a forward hook made of ``conv2``'s output: through operations with one input
  that needs a gradient (a mask, a shift, a reshape, a sum with data or a buffer: ``WALK_DEPTH`` of
  them at most), not through one with another (a residual sum, a learned scale);
- any other operation, and an activation whose input is no module's output, belongs to the
  innermost module running at that moment ("softmax in `blocks.0.attn`"); an operation written in
  the model's own forward on a module's output belongs to that module;
- an operation that is a module's whole computation (``F.relu`` inside ``nn.ReLU``) is that module's.

A softmax whose input descends from a product of two activations (``q @ k.transpose(-2, -1)``,
then scaled, masked, soft-capped: any op that keeps its shape) is an attention softmax; so are
``F.scaled_dot_product_attention`` and ``F.multi_head_attention_forward``. Numerics-sensitive ops
(exp, log, div, sqrt, pow, ...) are located only when NaN/Inf appears (see ``nanhunt``): then every
operation of the replayed pass is checked.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module
from torch.overrides import TorchFunctionMode

from .layers import Kind, classify


class Role(str, Enum):
    ACTIVATION = "activation"   # measured like an activation module's output
    ATTENTION = "attention"     # attention statistics from its logits
    NUMERIC = "numeric"         # can leave its domain or overflow: located by the NaN hunt
    PRODUCT = "product"         # a product of two tensors: may be attention logits


class Relation(str, Enum):
    AFTER = "after"   # consumes the named module's output
    IN = "in"         # runs inside the named module's forward

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OpSpec:
    label: str                                  # how the op is written: "F.relu", "torch.exp"
    role: Role
    kind: Kind = Kind.OTHER
    bounds: tuple[float, float] | None = None


_CLAMP = "x.clamp(min=0)"  # a ReLU written as a clamp: only when it clamps at 0 from below (see _clamps_at_zero)


def _clamps_at_zero(args, kwargs) -> bool:
    """``x.clamp(min=0)``, ``x.clamp_min(0)`` of a tensor that needs a gradient: a ReLU. Any other clamp (into
    a range, of data or a mask) is no activation."""
    x = args[0] if args else kwargs.get("input")
    lo = kwargs.get("min", args[1] if len(args) > 1 else None)
    hi = kwargs.get("max", args[2] if len(args) > 2 else None)
    return (isinstance(x, torch.Tensor) and x.requires_grad and isinstance(lo, (int, float)) and lo == 0
            and hi is None)


# a ReLU written with its own sign: ``x * (x > 0)``, ``x * (x > 0).float()``, ``torch.where(x > 0, x, 0)``,
# ``x.masked_fill(x < 0, 0)``; seen as a comparison of a tensor that needs a gradient with 0, then a product of that
# tensor with its positive mask, or its negative entries filled with 0 (a mask made from another tensor, or compared
# with another value, is no activation)
_POSITIVE = frozenset({torch.gt, torch.Tensor.gt, torch.Tensor.__gt__, torch.ge, torch.Tensor.ge, torch.Tensor.__ge__,
                       torch.greater, torch.greater_equal})
_NEGATIVE = frozenset({torch.lt, torch.Tensor.lt, torch.Tensor.__lt__, torch.le, torch.Tensor.le, torch.Tensor.__le__,
                       torch.less, torch.less_equal})
_COMPARES = _POSITIVE | _NEGATIVE
_PRODUCTS = frozenset({torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.multiply})
_FILLS_ZERO = frozenset({torch.Tensor.masked_fill, torch.Tensor.masked_fill_, torch.masked_fill})
# what a mask goes through and stays the same mask: a change of dtype, a detach; or turns into the other sign's
_CASTS = frozenset(getattr(torch.Tensor, n) for n in ("float", "double", "half", "bfloat16", "int", "long", "to",
                                                      "type", "type_as", "detach"))
_INVERTS = frozenset({torch.Tensor.__invert__, torch.logical_not, torch.Tensor.logical_not})
_KEEPS = _CASTS | _INVERTS


def _is_zero(v) -> bool:
    """A number 0, or a tensor of zeros that needs no gradient (read only where a mask of a sign meets it)."""
    if isinstance(v, torch.Tensor):
        return not v.requires_grad and v.numel() > 0 and bool((v == 0).all())
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


def _sign_of(args, kwargs) -> torch.Tensor | None:
    """The tensor ``x`` of ``x > 0`` (``x >= 0``), when it needs a gradient; else None."""
    x = args[0] if args else kwargs.get("input")
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if (isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point() and isinstance(other, (int, float))
            and not isinstance(other, bool) and other == 0):
        return x
    return None


def _table() -> dict[Callable, OpSpec]:
    T = torch.Tensor
    rows: list[tuple[str, Role, Kind, tuple | None, list]] = [
        ("F.relu", Role.ACTIVATION, Kind.RELU, None, [F.relu, torch.relu, T.relu, F.relu_, torch.relu_, T.relu_]),
        ("F.relu6", Role.ACTIVATION, Kind.RELU, None, [F.relu6]),
        ("F.threshold", Role.ACTIVATION, Kind.RELU, None, [F.threshold, torch.threshold]),
        (_CLAMP, Role.ACTIVATION, Kind.RELU, None, [torch.clamp, T.clamp, T.clamp_, torch.clamp_min, T.clamp_min,
                                                    T.clamp_min_]),
        ("torch.sigmoid", Role.ACTIVATION, Kind.BOUNDED, (0.0, 1.0), [torch.sigmoid, T.sigmoid, F.sigmoid, T.sigmoid_]),
        ("torch.tanh", Role.ACTIVATION, Kind.BOUNDED, (-1.0, 1.0), [torch.tanh, T.tanh, F.tanh, T.tanh_]),
        ("F.hardtanh", Role.ACTIVATION, Kind.BOUNDED, (-1.0, 1.0), [F.hardtanh]),
        ("F.softsign", Role.ACTIVATION, Kind.BOUNDED, (-1.0, 1.0), [F.softsign]),
        ("F.hardsigmoid", Role.ACTIVATION, Kind.BOUNDED, (0.0, 1.0), [F.hardsigmoid]),
        ("F.gelu", Role.ACTIVATION, Kind.SMOOTH, None, [F.gelu]),
        ("F.silu", Role.ACTIVATION, Kind.SMOOTH, None, [F.silu]),
        ("F.elu", Role.ACTIVATION, Kind.SMOOTH, None, [F.elu, F.celu, F.selu, torch.selu]),
        ("F.leaky_relu", Role.ACTIVATION, Kind.SMOOTH, None, [F.leaky_relu]),
        ("F.mish", Role.ACTIVATION, Kind.SMOOTH, None, [F.mish]),
        ("F.softplus", Role.ACTIVATION, Kind.SMOOTH, None, [F.softplus]),
        ("F.hardswish", Role.ACTIVATION, Kind.SMOOTH, None, [F.hardswish]),
        ("F.logsigmoid", Role.ACTIVATION, Kind.SMOOTH, None, [F.logsigmoid]),
        ("F.glu", Role.ACTIVATION, Kind.SMOOTH, None, [F.glu]),
        ("F.softmax", Role.ACTIVATION, Kind.SMOOTH, None, [F.softmax, torch.softmax, T.softmax]),
        ("F.log_softmax", Role.ACTIVATION, Kind.SMOOTH, None, [F.log_softmax, torch.log_softmax, T.log_softmax]),
        ("F.scaled_dot_product_attention", Role.ATTENTION, Kind.ATTENTION, None, [F.scaled_dot_product_attention]),
        ("F.multi_head_attention_forward", Role.ATTENTION, Kind.ATTENTION, None, [F.multi_head_attention_forward]),
        ("torch.exp", Role.NUMERIC, Kind.OTHER, None, [torch.exp, T.exp, T.exp_, torch.expm1, T.expm1]),
        ("torch.log", Role.NUMERIC, Kind.OTHER, None, [torch.log, T.log, T.log_, torch.log2, T.log2, torch.log10,
                                                       T.log10, torch.log1p, T.log1p]),
        ("torch.sqrt", Role.NUMERIC, Kind.OTHER, None, [torch.sqrt, T.sqrt, T.sqrt_, torch.rsqrt, T.rsqrt]),
        ("torch.pow", Role.NUMERIC, Kind.OTHER, None, [torch.pow, T.pow, T.pow_, T.__pow__, T.__rpow__]),
        ("torch.div", Role.NUMERIC, Kind.OTHER, None, [torch.div, T.div, T.div_, T.__truediv__, T.__rtruediv__,
                                                       torch.true_divide, torch.reciprocal, T.reciprocal]),
        ("torch.matmul", Role.PRODUCT, Kind.OTHER, None, [torch.matmul, T.matmul, T.__matmul__, torch.bmm, T.bmm,
                                                          torch.einsum, torch.baddbmm, T.baddbmm]),
    ]
    return {fn: OpSpec(label, role, kind, bounds) for label, role, kind, bounds, fns in rows for fn in fns}


OPS: dict[Callable, OpSpec] = _table()

# dropouts: the share of entries each drops in training (its ``p``) is read; their output is their input's
# for attribution, so ``F.relu(F.dropout(self.bn2(x)))`` is "F.relu after `bn2`", as without the dropout
DROPOUTS = frozenset({F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
                      torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
                      torch.dropout_, torch.alpha_dropout_, torch.feature_dropout_, torch.feature_alpha_dropout_})


def dropout_rate(args, kwargs) -> float | None:
    """The share a dropout call drops: its ``p`` when it runs in training, 0 when not; None if unreadable."""
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    train = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
    if isinstance(p, torch.Tensor):  # a 0-d tensor on the host (one on a device would wait for it: not read)
        p = p.item() if p.numel() == 1 and p.device.type == "cpu" else None
    try:
        rate = float(p) if p is not None and not isinstance(p, (bool, str)) else None  # (numpy's floats too)
    except (TypeError, ValueError):
        rate = None
    if rate is None or rate != rate or not isinstance(train, bool):
        return None
    return rate if train else 0.0
ACTIVATION_KINDS = frozenset({Kind.RELU, Kind.BOUNDED, Kind.SMOOTH})
# ops that write a chosen value (an attention mask's -inf) rather than compute one
_FILLS = frozenset(getattr(torch.Tensor, n) for n in ("masked_fill", "masked_fill_", "fill_", "new_full", "index_fill",
                                                      "index_fill_", "masked_scatter", "masked_scatter_")) | {
    torch.where, torch.Tensor.where, torch.full_like, torch.masked_fill}


def label_of(func: Callable) -> str:
    spec = OPS.get(func)
    if spec is not None:
        return spec.label
    name = getattr(func, "__name__", None) or str(func)
    return f"torch.{name.strip('_')}"


def first_tensor(args, kwargs) -> torch.Tensor | None:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
    for k in ("input", "query", "self"):
        if isinstance(kwargs.get(k), torch.Tensor):
            return kwargs[k]
    return None


def _is_weight(t) -> bool:
    return isinstance(t, nn.Parameter) or isinstance(getattr(t, "_base", None), nn.Parameter)


def _softmax_dim(args, kwargs) -> int | None:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim if isinstance(dim, int) else None


def _undispatched():
    """A context in which torch functions run as they are: no function mode, no subclass dispatch."""
    return torch._C.DisableTorchFunction()


WALK_DEPTH = 4  # operations of one input walked back from an activation's input to a module's output


class ModuleTracker:
    """For one forward pass: the stack of running modules and the module that produced each tensor.

    Global module hooks, registered only while the pass runs; modules outside ``names`` (another
    model) are ignored. ``hooks``: per module (by id), a forward hook called with its output, after the
    tracker's own bookkeeping (one global hook serves every layer: nothing to register per module).
    The hooks run with torch functions undispatched: a function mode active for the pass does not see
    what they compute."""

    def __init__(self, names: dict[int, str], hooks: dict[int, Callable] | None = None):
        self.names = names
        self.hooks = hooks or {}
        self.stack: list[str] = []
        self._outputs: dict[int, tuple[weakref.ref, str]] = {}
        # the autograd node of each output, for this pass (None: a functional activation's, see ``opaque``)
        self._nodes: dict[int, tuple[object, str | None]] = {}
        self.versions: dict[int, int] = {}   # per module: the version counter of its first input when it started
        self.calls: dict[str, int] = {}      # per module: how many times it has started in this pass
        # per module, over the passes tracked: the module whose output its first input is, or was computed from,
        # and whether through operations between (``source_of``), as first seen ((None, False): the model's own
        # input, a sum of several, a tensor with no autograd node)
        self.reads: dict[str, tuple[str | None, bool]] = {}
        self.through = False
        self._handles: list = []
        self._full = True

    def __enter__(self) -> "ModuleTracker":
        return self.start()

    def start(self, full: bool = True, keep: bool = False) -> "ModuleTracker":
        """Start tracking a pass. ``full=False``: only call ``hooks`` (no stack of running modules, no
        producers, no input versions: what a function mode needs to attribute operations). ``keep``: the same
        pass goes on (tracked again after a pause): what it knows of the pass so far is kept."""
        if not keep:
            self.stack.clear()
            self._outputs.clear()
            self._nodes.clear()
            self.versions.clear()
            self.calls.clear()
        self._full = full
        self._handles = [_module.register_module_forward_hook(self._post, always_call=True)]
        if full:
            self._handles.append(_module.register_module_forward_pre_hook(self._pre))
        return self

    def pause(self) -> None:
        """Stop tracking until ``start(keep=True)``, keeping what is known of the pass."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __exit__(self, *exc) -> None:
        self.pause()
        self._outputs.clear()
        self._nodes.clear()
        self.versions.clear()
        self.stack.clear()

    def _pre(self, module, args):
        name = self.names.get(id(module))
        if name is not None:
            self.stack.append(name)
            self.calls[name] = self.calls.get(name, 0) + 1
            if args and isinstance(args[0], torch.Tensor):
                with _undispatched():
                    if not args[0].is_inference():
                        self.versions[id(module)] = args[0]._version
                if name not in self.reads:
                    self.reads[name] = self.source_of(args[0])

    def entered(self, module, args) -> None:
        """``module`` started before the tracker did (the tracker started from its own pre-hook)."""
        if self._full and self._handles:
            self._pre(module, args)

    def unchanged(self, module, t: torch.Tensor) -> bool | None:
        """Whether ``t``, the input ``module`` received this pass, was not modified in place since
        (None: not known)."""
        v = self.versions.get(id(module))
        return None if v is None or t.is_inference() else t._version == v

    def _post(self, module, args, output):
        name = self.names.get(id(module))
        if name is None:
            return None
        if self._full:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            first = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(first, torch.Tensor):
                self._outputs[id(first)] = (weakref.ref(first), name)
                with _undispatched():
                    node = first.grad_fn
                if node is not None:  # (held for the pass: its id stays its own; the innermost module's, first)
                    held = self._nodes.get(id(node))
                    if held is None or held[1] is None:
                        self._nodes[id(node)] = (node, name)
        hook = self.hooks.get(id(module))
        if hook is not None:
            with _undispatched():
                hook(module, args, output)
        return None

    @property
    def inner(self) -> str:
        """The innermost module running now (``""``, the model, outside any submodule)."""
        return self.stack[-1] if self.stack else ""

    def alias(self, out, t) -> None:
        """``out`` stands for ``t`` (a dropout of it): produced by the module that produced ``t``, if any."""
        hit = self._outputs.get(id(t)) if isinstance(t, torch.Tensor) else None
        if hit is not None and hit[0]() is t and isinstance(out, torch.Tensor):
            self._outputs[id(out)] = (weakref.ref(out), hit[1])

    def producer(self, t) -> str | None:
        """The module whose output ``t`` is, if any, in this pass, or whose output ``t`` was computed from by
        operations of one input that needs a gradient (see the module docstring)."""
        return self.origin(t)[0]

    def origin(self, t) -> tuple[str | None, bool]:
        """``producer(t)``, and whether ``t`` was computed from that module's output by operations between."""
        hit = self._outputs.get(id(t)) if isinstance(t, torch.Tensor) else None
        if hit is not None and hit[0]() is t:
            return hit[1], False
        found = self._computed_from(t) if isinstance(t, torch.Tensor) and self._nodes else None
        return (found[0], found[1] > 0) if found is not None else (None, False)

    def source_of(self, t) -> tuple[str | None, bool]:
        """The innermost module whose output ``t`` is, as its autograd node says (a tensor changed in place
        since is no module's output as it was), and whether operations between made ``t`` of it."""
        found = self._computed_from(t) if isinstance(t, torch.Tensor) and self._nodes else None
        return (found[0], found[1] > 0) if found is not None else (None, False)

    def opaque(self, t) -> None:
        """``t`` is a functional activation's output, a layer of its own: what is computed from it is not
        ``_computed_from`` the module before it (a module whose output it is still is its producer)."""
        if isinstance(t, torch.Tensor):
            with _undispatched():
                node = t.grad_fn
            if node is not None and id(node) not in self._nodes:
                self._nodes[id(node)] = (node, None)

    def _computed_from(self, t: torch.Tensor) -> tuple[str, int] | None:
        """The module whose output's autograd node ``t``'s is, or is reached from through nodes of one input
        (a parameter is an input: a learned scale is a computation of its own; a functional activation is a
        layer of its own), and how many nodes back."""
        with _undispatched():
            node = t.grad_fn
            for hops in range(WALK_DEPTH + 1):
                if node is None:
                    return None
                hit = self._nodes.get(id(node))
                if hit is not None and hit[0] is node:
                    return (hit[1], hops) if hit[1] is not None else None
                inputs = [f for f, _ in node.next_functions if f is not None]
                if len(inputs) != 1:
                    return None
                node = inputs[0]
        return None

    def attribute(self, spec_role: Role, x) -> tuple[str, Relation]:
        """Where an op on input ``x`` belongs (see the module docstring). ``through`` says, until the next
        call, whether an op ``after`` a module reads what operations between made of its output."""
        producer, through = self.origin(x)
        inner = self.inner
        self.through = False
        # (only an activation is followed back through operations between: any other op on what they made of a
        # module's output, in the model's forward or in the loss, is no more that module's)
        if producer is not None and (spec_role == Role.ACTIVATION or inner == "" and not through):
            self.through = through
            return producer, Relation.AFTER
        return inner, Relation.IN


Sink = Callable[[str, Relation, OpSpec, torch.Tensor | None, torch.Tensor | None], None]


class FunctionalObserver(TorchFunctionMode):
    """Sees functional activations and attention during one sampled forward pass and hands each,
    attributed, to ``sink(owner, relation, spec, output, attention_logits)``."""

    def __init__(self, tracker: ModuleTracker, skip: set[int], sink: Sink, attention: Callable,
                 dropout: Callable[[str, float, bool], None] | None = None,
                 dropout_leaves: frozenset[int] | set[int] = frozenset()):
        super().__init__()
        self.tracker = tracker
        self.skip_names = {tracker.names[i] for i in skip if i in tracker.names}  # activation modules: their row
        self.sink = sink
        self.attention = attention          # (func, args, kwargs) -> logits or None
        self.dropout = dropout              # (owner, share dropped, inside the owner) of a functional dropout
        self.dropout_names = {tracker.names[i] for i in dropout_leaves if i in tracker.names}  # read by their module
        self._marked: dict[int, weakref.ref] = {}
        self._activated: dict[int, tuple[weakref.ref, str]] = {}   # an activation's output -> its owner
        # a mask x > 0 (positive) or x < 0 -> (the mask, x, positive)
        self._gates: dict[int, tuple[weakref.ref, weakref.ref, bool]] = {}

    def _is_marked(self, t) -> bool:
        hit = self._marked.get(id(t)) if isinstance(t, torch.Tensor) else None
        return hit is not None and hit() is t

    def _mark(self, t) -> None:
        if isinstance(t, torch.Tensor):
            self._marked[id(t)] = weakref.ref(t)

    def _gated(self, t, positive: bool = True) -> torch.Tensor | None:
        """The tensor ``x`` that ``t`` is the mask ``x > 0`` (``positive``; else ``x < 0``) of, or a copy of that
        mask in another dtype."""
        hit = self._gates.get(id(t)) if isinstance(t, torch.Tensor) else None
        return hit[1]() if hit is not None and hit[0]() is t and hit[2] == positive else None

    def _dropout(self, args, kwargs, out) -> None:
        x = first_tensor(args, kwargs)
        self.tracker.alias(out, x)
        if self.dropout is None or self.tracker.inner in self.dropout_names or not torch.is_grad_enabled():
            return
        rate = dropout_rate(args, kwargs)
        if rate is None:
            return
        # the module whose output it drops; else the owner of the activation whose output it drops
        hit = self._activated.get(id(x)) if isinstance(x, torch.Tensor) else None
        owner = self.tracker.producer(x) or (hit[1] if hit is not None and hit[0]() is x else None)
        self.dropout(owner if owner is not None else self.tracker.inner, rate, owner is None)

    def _attention_dropout(self, func, args, kwargs, owner: str) -> None:
        """The dropout an attention function applies to its weights, inside the module that calls it
        (``scaled_dot_product_attention`` drops whenever its ``dropout_p`` is above 0; a module's attention
        forward, in training)."""
        if self.dropout is None:
            return
        if func is F.scaled_dot_product_attention:
            p, train = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0), True
        elif func is F.multi_head_attention_forward:
            p = kwargs.get("dropout_p", args[10] if len(args) > 10 else None)
            train = kwargs.get("training", args[13] if len(args) > 13 else True)
        else:
            return
        rate = dropout_rate((None, p, train), {})
        if rate is not None:
            self.dropout(owner, rate, True)

    def _gate(self, func, args, kwargs, out) -> tuple[torch.Tensor, OpSpec] | None:
        """Follows masks ``x > 0`` and ``x < 0`` through what keeps their shape; returns ``x`` and the ReLU's row
        when ``out`` is ``x`` times its positive mask (``torch.where(x > 0, x, 0)``) or ``x`` with its negative
        entries set to 0."""
        if not isinstance(out, torch.Tensor):
            return None
        if func in _COMPARES:
            x = _sign_of(args, kwargs)
            if x is not None:
                self._gates[id(out)] = (weakref.ref(out), weakref.ref(x), func in _POSITIVE)
            return None
        if not self._gates:
            return None
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        if func in _PRODUCTS and len(ts) == 2:
            a, b = ts
            if self._gated(b) is a or self._gated(a) is b:
                return (a if self._gated(b) is a else b), _GATED["mul"]
        if func is torch.where and len(args) == 3:  # torch.where(x > 0, x, 0)
            cond, x, other = args
        elif func is torch.Tensor.where and len(args) == 3:  # x.where(x > 0, 0)
            x, cond, other = args
        else:
            cond = x = other = None
        if cond is not None and isinstance(x, torch.Tensor) and self._gated(cond) is x and _is_zero(other):
            return x, _GATED["where"]
        if func in _FILLS_ZERO and len(args) >= 2:  # x.masked_fill(x < 0, 0)
            value = args[2] if len(args) > 2 else kwargs.get("value")
            x = args[0]
            if isinstance(x, torch.Tensor) and self._gated(args[1], positive=False) is x and _is_zero(value):
                return x, _GATED["fill"]
        if func in _KEEPS and ts and out.shape == ts[0].shape:  # (x > 0).float(), ~(x > 0)
            for positive in (True, False):
                x = self._gated(ts[0], positive)
                if x is not None:
                    self._gates[id(out)] = (weakref.ref(out), weakref.ref(x), positive != (func in _INVERTS))
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        spec = OPS.get(func)
        out = func(*args, **kwargs)
        if func in DROPOUTS:
            self._dropout(args, kwargs, out)
            return out
        if spec is not None and spec.label == _CLAMP and not _clamps_at_zero(args, kwargs):
            spec = None
        if spec is None and (func in _COMPARES or self._gates):
            gated = self._gate(func, args, kwargs, out)
            if gated is not None and torch.is_grad_enabled() and self.tracker.inner not in self.skip_names:
                owner, rel = self.tracker.attribute(Role.ACTIVATION, gated[0])
                self.sink(owner, rel, gated[1], out, None)
                self.tracker.opaque(out)
                return out
        if spec is None or spec.role == Role.NUMERIC:
            if self._marked:  # the logits of an attention keep their provenance through same-shape ops
                x = first_tensor(args, kwargs)
                if (isinstance(out, torch.Tensor) and self._is_marked(x) and out.shape == x.shape):
                    self._mark(out)
            return out
        if spec.role == Role.PRODUCT:
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            if len(ts) >= 2 and not any(_is_weight(t) for t in ts[-2:]) and ts[-1].is_floating_point():
                self._mark(out)
            return out
        if not torch.is_grad_enabled() or self.tracker.inner in self.skip_names:
            return out
        x = first_tensor(args, kwargs)
        if spec.role == Role.ATTENTION:
            owner, rel = self.tracker.inner, Relation.IN
            self.sink(owner, rel, spec, _first_float(out), self.attention(func, args, kwargs))
            self._attention_dropout(func, args, kwargs, owner)
            return out
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        dim = _softmax_dim(args, kwargs) if spec.label == "F.softmax" else None
        if dim is not None and self._is_marked(x) and dim in (-1, x.dim() - 1):
            self.sink(self.tracker.inner, Relation.IN, _ATTENTION_SOFTMAX, out, x)
            return out
        owner, rel = self.tracker.attribute(spec.role, x)
        self.sink(owner, rel, _with_bounds(spec, args, kwargs), out, None)
        if spec.role == Role.ACTIVATION:
            self._activated[id(out)] = (weakref.ref(out), owner)
            self.tracker.opaque(out)
        return out


def _first_float(out) -> torch.Tensor | None:
    for o in (out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(o, torch.Tensor) and o.is_floating_point():
            return o
    return None


_ATTENTION_SOFTMAX = OpSpec("F.softmax", Role.ATTENTION, Kind.ATTENTION)
# a ReLU written with its sign, named as written
_GATED = {k: OpSpec(label, Role.ACTIVATION, Kind.RELU) for k, label in (
    ("mul", "x * (x > 0)"), ("where", "torch.where(x > 0, x, 0)"), ("fill", "x.masked_fill(x < 0, 0)"))}


def _with_bounds(spec: OpSpec, args, kwargs) -> OpSpec:
    if spec.label != "F.hardtanh":
        return spec
    lo = kwargs.get("min_val", args[1] if len(args) > 1 else -1.0)
    hi = kwargs.get("max_val", args[2] if len(args) > 2 else 1.0)
    return OpSpec(spec.label, spec.role, spec.kind, (float(lo), float(hi)))


def activation_leaves(model: nn.Module) -> set[int]:
    """Leaf modules that are an activation themselves: the functional call inside is their own output."""
    return {id(m) for m in model.modules() if not any(True for _ in m.children()) and classify(m) in ACTIVATION_KINDS}


class NonFiniteWatch(TorchFunctionMode):
    """For the NaN hunt's replay: the operations whose finite inputs give a NaN/Inf output, or whose inputs
    free of NaN give a NaN (Inf - Inf, 0 * Inf, a softmax of a row masked to -Inf everywhere: a fill of -Inf
    is no origin, what turns it into NaN is), attributed, in order (the first ``limit``). An Inf that a
    module absorbs (x / exp(t) with exp(t) = Inf is 0) is no origin by itself: the replay takes the first
    one left when a module's output is not finite."""

    def __init__(self, tracker: ModuleTracker, leaves: dict[str, Kind], limit: int = 16):
        super().__init__()
        self.tracker = tracker
        self.leaves = leaves        # standard leaf modules: an op inside them is their computation
        self.limit = limit
        self.found: list[tuple[str, Relation, str, str]] = []   # owner, relation, op label, dtype

    def absorbed(self, module: str) -> None:
        """``module``'s output is finite: what its own operations made was absorbed (x / Inf is 0)."""
        self.found = [f for f in self.found if module and f[0] != module and not f[0].startswith(module + ".")]

    @property
    def first(self) -> tuple[str, Relation, str, str] | None:
        return self.found[0] if self.found else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if len(self.found) >= self.limit or func in _FILLS:
            return out
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.is_floating_point()]
        if not outs:
            return out
        ins = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if not ins:
            return out
        with torch.no_grad():
            if all(bool(torch.isfinite(o).all()) for o in outs):
                return out
            if not all(bool(torch.isfinite(t).all()) for t in ins) and (
                    any(bool(torch.isnan(t).any()) for t in ins) or not any(bool(torch.isnan(o).any()) for o in outs)):
                return out
        spec = OPS.get(func)
        owner, rel = self.tracker.attribute(spec.role if spec else Role.NUMERIC, first_tensor(args, kwargs))
        label = "" if self.leaves.get(owner) is not None and rel == Relation.IN else label_of(func)
        self.found.append((owner, rel, label, str(outs[0].dtype).replace("torch.", "")))
        return out
