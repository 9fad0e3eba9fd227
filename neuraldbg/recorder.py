"""Extraction: hooks on the model and optimizer that turn a training loop into trace rows.

Costs, by design:
- every step: a forward pre/post hook on the model itself, one gradient hook on its output,
  a finiteness check of the output, its gradient and the parameter gradients (one fused norm),
  and the optimizer step hooks;
- sampled steps only (see ``Schedule``): a hook on every watched layer, each computing a few
  statistics on the tensor's device, and (eager mode) a ``functional.FunctionalObserver`` that
  measures the functional activations and attention computations no module hook sees; all of them
  reach the host in one transfer at step end.
In eager mode the per-layer hooks and the observer exist only during the forward pass of a sampled
step. For a ``torch.compile``d model the hooks stay registered, excluded from compilation (no
recompiles), and return at once on unsampled steps; functional operations inside the compiled
graph are not observed there (the NaN hunt, which replays the pass eagerly, still sees them).

A module that passes its input through unchanged (an identity, a dropout at p=0 or in eval mode)
is not measured: it is "not observed", like a module whose forward never runs.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import weakref
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_flatten, tree_map

from . import distributed, leak, losspath, mixing, nanhunt, order
from .attention import attention_stats, mha_logits, sdpa_logits
from .functional import FunctionalObserver, ModuleTracker, OpSpec, Relation, Role, activation_leaves
from .layers import GAIN_KINDS, Kind, LayerInfo, describe, own_parameters, parametrizing_modules, watched_modules
from .paramnorms import ParamNorms
from .schedule import LossTurn, Schedule, SpikeWatch, Throttle
from .stats import (ATTENTION_STATS, BATCH_NUMEL, FORWARD_STATS, GRAD_STATS, N_STATS, PARAM_STATS,
                    SATURATION_MARGIN, Stat, dtype_max, finite_norm, forward_stats, forward_stats_batch, grad_stats,
                    grad_stats_batch, input_stats, max_abs)
from .trace import GLOBAL_COLUMNS, NonFiniteOrigin, Trace

_ACT_COLS = [int(s) for s in FORWARD_STATS]
_GRAD_COLS = [int(s) for s in GRAD_STATS]
_PARAM_COLS = [int(s) for s in PARAM_STATS]
_ATTN_COLS = [int(s) for s in ATTENTION_STATS]
# gradient statistics that carry a GradScaler's scale (divided by it when it is known)
_SCALED_COLS = [int(Stat.GRAD_RMS), int(Stat.W_GRAD_NORM)]
_SCALE_COL = GLOBAL_COLUMNS.index("loss_scale")
_SCALER_DEPTH = 6  # frames above the optimizer's step hook searched for a GradScaler's step calling it
_SPREAD_COL = GLOBAL_COLUMNS.index("input_spread")
_INPUT_MEAN_COL = GLOBAL_COLUMNS.index("input_mean")  # (input_std follows it)
_IN_COL = int(Stat.IN_RMS)
# "Units never positive" is measured where a zero output means a unit that stopped learning.
_DEAD_KINDS = (Kind.RELU, Kind.SMOOTH, Kind.OTHER)


# autograd nodes (other than weights' leaves) walked back from a layer's inputs to find its previous
# application's output, at most
CHAIN_NODES = 64


def _reaches(nodes: list, target) -> bool:
    """Whether autograd node ``target`` is among the first ``CHAIN_NODES`` nodes reached walking back from
    ``nodes`` (a layer's input was computed from that output, a few operations away). Each node is walked once;
    a leaf's accumulator (a weight, an input that needs a gradient) ends its branch uncounted."""
    todo, seen, walked = deque(nodes), set(), 0
    while todo and walked < CHAIN_NODES:
        n = todo.popleft()
        if n is None or id(n) in seen:
            continue
        if n is target:
            return True
        seen.add(id(n))
        nxt = n.next_functions
        if nxt:
            walked += 1
            todo.extend(f for f, _ in nxt)
    return False


# calls of one functional operation per iteration of a loop, at most (a loop's period, see ``_loop_period``)
LOOP_PERIOD_MAX = 8
# a pass's first calls of an operation read to find its loop's period, at most (the walks are paid once, but a
# recurrence over a thousand steps need not be walked whole to tell its period)
LOOP_PERIOD_CALLS = 8 * LOOP_PERIOD_MAX


def _loop_period(calls: list[tuple[int, object]]) -> int | None:
    """How many calls of one operation a loop makes an iteration (two gates a step, two layers stacked in a
    step): the ``k`` up to ``LOOP_PERIOD_MAX`` for which the most of a pass's calls read the call ``k`` before
    (call ``n`` reaches call ``n - k``'s output within ``CHAIN_NODES`` autograd nodes), the fewest among equals
    (a loop of period 1 also reads two calls back), and more than half of them: an unrelated call before the
    loop does not hide it. Read over the first ``LOOP_PERIOD_CALLS`` calls; None when no ``k`` does."""
    best, share = None, 0.5
    calls = calls[:LOOP_PERIOD_CALLS]
    for k in range(1, min(LOOP_PERIOD_MAX, len(calls) - 1) + 1):
        pairs = [(calls[n][1], calls[n - k][1]) for n in range(k, len(calls))]
        reached = sum(_reaches([f for f, _ in a.next_functions], b) for a, b in pairs) / len(pairs)
        if reached > share:
            best, share = k, reached
    return best


def _first_node(output):
    """The autograd node of a module's output: of its first floating-point tensor, for one that returns several
    (an LSTM cell's (h, c), attention's (output, weights)); None when it has none."""
    if isinstance(output, torch.Tensor):
        return output.grad_fn
    outs = nanhunt.float_tensors(output)
    return outs[0].grad_fn if outs else None


def _release_nodes(rec: "_StepRecord") -> None:
    """The forward pass is over: the outputs and autograd nodes kept to find a layer's applications in a chain
    are let go (held on, they would keep the pass's graph, and the tensors it holds, alive past its backward)."""
    rec.first_out.clear()
    rec.calls.clear()
    rec.site_calls.clear()


def _note_positions(layer: LayerInfo, shape, unit_dim: int | None) -> None:
    """Where dead units are counted: how many outputs each unit has in a batch (the batch times the positions
    it is applied at), in the layer's ``extra``, as of its latest output: the level of firing at which a unit
    shows no output > 0 in a batch depends on it."""
    if layer.kind in _DEAD_KINDS and unit_dim is not None and len(shape) > unit_dim and shape[unit_dim] > 0:
        layer.extra["positions"] = math.prod(shape) // shape[unit_dim]


def _class_loss(paths: list | None) -> str | None:
    """What the recorded loss's operations say of its targets: classes, a binary label, or neither."""
    kinds = set()
    for path in paths or []:
        if not losspath.rows_kept(path):
            return None
        ops = [op for op in path if op.split("@")[0] not in losspath.SHAPE_OPS]
        names = [op.split("@")[0] for op in ops]
        # an NLL of a log-softmax over the classes' dimension (a cross-entropy), or a binary cross-entropy with
        # logits, taken of the model's output itself (the path's last node); every path to the output so
        # (another term on the output, as label smoothing adds, changes its gradient)
        if len(ops) >= 3 and names[-3:-1] == ["NllLoss", "LogSoftmax"] and ops[-2] == "LogSoftmax":
            kinds.add("classes")
        elif len(ops) >= 2 and names[-2] == "NllLoss" and ops[-1] == "LogSoftmax":
            kinds.add("log_probs")  # the model returns log-probabilities (a LogSoftmax as its last layer)
        elif len(names) >= 2 and names[-2] == "BinaryCrossEntropyWithLogits":
            kinds.add("binary")
        else:
            return None
    return kinds.pop() if len(kinds) == 1 else None


def _batch_rows(inputs) -> int | None:
    """The number of samples in a pass's input: the first dimension of its first tensor (inside a dict or a
    list of the arguments, too: a batch handed over as ``model(batch)``)."""
    args, kwargs = inputs
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() >= 1:
            return int(v.shape[0])
    leaves, _ = tree_flatten((args, kwargs))
    return next((int(v.shape[0]) for v in leaves if isinstance(v, torch.Tensor) and v.dim() >= 1), None)


def _sample_input(inputs) -> torch.Tensor | None:
    """The input a batch's statistics are read from: its first floating tensor with more than one value (a
    scalar handed along, such as a trainer's item count, has no spread to read); None when it has none."""
    return next((t for t in nanhunt.float_tensors(inputs) if t.numel() > 1), None)


def _fingerprint(inputs, device) -> torch.Tensor:
    """A number that tells one batch from another: a weighted sum of 64 values of each of the pass's first
    input tensors (integer ones too: token ids, node indices), at positions spread by a prime step (an even
    stride would land on the same column of every row: each sequence's first token). The same at every
    sampled pass: the same batch at every step. NaN with no input tensor."""
    parts = []
    for t in _input_tensors(inputs)[:4]:
        flat = t.detach().reshape(-1)
        if flat.numel() == 0 or flat.is_complex():
            continue
        at = (torch.arange(64, device=flat.device) * 7919 + 13) % flat.numel()
        picked = flat[at].float()  # (float32: a device such as Apple's has no float64; the same batch sums alike)
        weights = torch.arange(1, picked.numel() + 1, device=picked.device, dtype=torch.float32)
        parts.append((picked * weights).sum().to(device))
    return torch.stack(parts).sum() if parts else torch.full((), math.nan, device=device)


def _input_tensors(inputs, depth: int = 3) -> list[torch.Tensor]:
    """The tensors of a pass's arguments, also inside a mapping (a tokenizer's ``BatchEncoding``) or a
    dataclass that the pytree does not flatten, ``depth`` levels down."""
    out = []
    for v in tree_flatten(inputs)[0]:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif depth and isinstance(v, Mapping):
            out += _input_tensors(list(v.values()), depth - 1)
        elif depth and dataclasses.is_dataclass(v) and not isinstance(v, type):
            out += _input_tensors([getattr(v, f.name) for f in dataclasses.fields(v)], depth - 1)
    return out


class _GlobalHook:
    """A global optimizer step hook that calls ``recorder._adopt`` through a weak reference (a session left
    running and dropped does not stay alive through it: the hook removes itself), kept among the session's
    handles and removed with them."""

    handle = None

    def install(self, recorder: "Recorder") -> None:
        ref = weakref.ref(recorder)

        def hook(optimizer, args, kwargs):
            owner = ref()
            if owner is None:
                self.remove()
                return None
            return owner._adopt(optimizer, args, kwargs)
        self.handle = register_optimizer_step_pre_hook(hook)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


class _Unmoved:
    """Tensors watched for a change on sampled steps, ``checks`` times at most, through weak references and
    their norms (in float32 without a copy of a 16-bit tensor; wherever each lives). ``check`` says "moved"
    (one changed: something steps it), "freed" (all of them), "gone" (no longer readable: a sharded tensor),
    "still", or "done" (still after the last check)."""

    def __init__(self, tensors: list, checks: int):
        self.refs = [weakref.ref(t) for t in tensors]
        self.norms = self.read(tensors)
        self.left = checks

    @staticmethod
    def read(tensors: list) -> list[float]:
        with torch.no_grad():
            return torch.stack([torch.linalg.vector_norm(t.detach(), dtype=torch.float32).cpu()
                                for t in tensors]).tolist()

    def check(self) -> str:
        alive = [(t, n) for t, n in ((r(), n) for r, n in zip(self.refs, self.norms)) if t is not None]
        if not alive:
            return "freed"
        try:
            now = self.read([t for t, _ in alive])
        except Exception:  # noqa: BLE001 - a tensor that cannot be read this way: nothing is said of it
            return "gone"
        if now != [n for _, n in alive]:
            return "moved"
        self.left -= 1
        return "still" if self.left > 0 else "done"


def _keeps_state(optimizer) -> bool:
    """Whether ``optimizer`` carries a state from step to step: any but plain SGD without momentum."""
    if type(optimizer) is not torch.optim.SGD:
        return True
    return any(g.get("momentum", 0) for g in optimizer.param_groups)


def _queue_backward_callback(fn: Callable[[], None]) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _weak_hook(owner, method: str) -> Callable:
    """``owner.method`` as a tensor hook that does not keep ``owner`` alive: a parameter's hooks are not
    seen by the garbage collector, so a recorder they held would keep its model alive through them."""
    ref = weakref.ref(owner)

    def hook(g):
        live = ref()
        return getattr(live, method)(g) if live is not None else None
    return hook


def _disable_under_compile(fn):
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


def _callable_children(module: nn.Module, prefix: str = "", seen: set | None = None) -> list[tuple[str, nn.Module]]:
    """The modules a model driven by its parts calls: its children, and in place of a container with no
    forward of its own (an nn.ModuleList, an nn.ModuleDict), that container's, by their dotted names; each
    module once (the first name it is reached by), and none of a parametrization's (run on a weight as it is
    read, not called by the loop)."""
    seen = set() if seen is None else seen
    out = []
    for name, m in module.named_children():
        if id(m) in seen or (name == "parametrizations" and parametrize.is_parametrized(module)):
            continue
        seen.add(id(m))
        if type(m).forward is nn.Module.forward and next(m.children(), None) is not None:
            out += _callable_children(m, f"{prefix}{name}.", seen)
        else:
            out.append((f"{prefix}{name}", m))
    return out


def _cut(v):
    """A tensor cut from the graph it was made in, needing a gradient as it did."""
    if not isinstance(v, torch.Tensor):
        return v
    return v.detach().requires_grad_(v.requires_grad) if v.is_floating_point() or v.is_complex() else v.detach()


class _PartsReplay:
    """A chain of calls of the model's children (a pass the model's own forward did not drive, see
    ``Recorder._parts``), to replay on a copy of the model: each child again, on its inputs as they were
    (detached: the gradient that reached each output is known, so each backward is replayed on its own)."""

    __slots__ = ("calls", "outputs", "grads", "final", "ids", "owners")

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []  # (child's name, args, kwargs), in call order
        self.outputs: list[torch.Tensor] = []       # their outputs that require a gradient
        self.owners: list[str] = []                 # the child each came from
        self.grads: list[torch.Tensor | None] = []  # the gradient that reached each
        self.final: list[bool] = []                 # per output: no other child took it as input
        self.ids: dict[int, int] = {}               # id of an output -> its index

    def add(self, t: torch.Tensor, owner: str) -> int:
        self.ids[id(t)] = len(self.outputs)
        self.outputs.append(t)
        self.owners.append(owner)
        self.grads.append(None)
        self.final.append(True)
        return len(self.outputs) - 1

    def take(self, inputs: list) -> bool:
        """A child is called on ``inputs``: those that are outputs of the chain are no longer final. Whether
        any was."""
        took = False
        for t in inputs:
            i = self.ids.get(id(t))
            if i is not None and self.outputs[i] is t:
                self.final[i], took = False, True
        return took

    def __call__(self, model: nn.Module) -> list:
        detach = partial(tree_map, _cut)
        return [model.get_submodule(name)(*detach(args), **detach(kwargs)) for name, args, kwargs in self.calls]


class _StepRecord:
    """What one sampled step has gathered so far (device tensors, not yet on the host)."""

    __slots__ = ("fwd", "grad", "fwd_small", "grad_small", "params", "input", "prev_params", "forward_done", "dropout",
                 "norm_values", "dtype", "attn", "fwd_kept", "fwd_rows", "grad_kept", "watch", "seen", "grads",
                 "stepped", "unchanged", "moved", "unscaled", "out_of", "input_id", "in_src", "in_rms", "first_out",
                 "calls", "site_calls")

    def __init__(self):
        self.fwd: dict[int, object] = {}    # per layer index: its stats row, or True once stashed below
        self.grad: dict[int, object] = {}
        self.fwd_small: dict[tuple, list] = {}   # batching key -> [(layer index, tensor copy)]
        self.grad_small: dict[tuple, list] = {}
        # outputs kept as they are (no copy: their layer is known not to change them in place afterwards),
        # measured together when the forward pass ends, their gradients retained and measured at step end
        self.seen: list[tuple[int, torch.Tensor, int]] = []  # settled layers' outputs as the hooks saw them:
        # (layer index, output, its version), sorted into ``fwd_kept`` and ``grad_kept`` when the forward pass ends
        self.fwd_kept: dict[tuple, list] = {}    # batching key -> [(layer index, output, its version)]
        self.fwd_rows: list[tuple[list[int], torch.Tensor]] = []  # (layer indices, their stats rows)
        self.grad_kept: list[tuple[int, torch.Tensor, tuple]] = []  # (layer index, output, its gradient's key)
        self.watch: list[tuple[int, torch.Tensor, int]] = []  # copied outputs seen for the first time
        self.dtype: dict[int, torch.dtype] = {}  # per layer index: the dtype of its output
        self.attn: dict[int, torch.Tensor] = {}  # per layer index: attention statistics (2,)
        self.params: torch.Tensor | None = None      # (3, n_layers): weight, grad, update norms
        self.input: torch.Tensor | None = None
        self.unchanged: torch.Tensor | None = None  # 16-bit weights: the share of entries the update left as they were
        self.prev_params: list | None = None
        self.forward_done = False
        self.dropout: dict[str, float] = {}  # per place: the most a dropout there drops in this pass
        self.norm_values: dict[str, int] = {}  # per batch normalisation on batch statistics: values per channel
        self.grads = True  # the layers' output gradients are retained and measured on this step
        self.stepped: torch.Tensor | None = None  # per-layer gradient norms as the optimizer steps on them
        self.moved: torch.Tensor | None = None  # per layer: how far its weights are from where they started, over
        #                                         their norm then
        self.unscaled = False  # the weights' gradients were read after a GradScaler's unscale_ (read_gradients)
        # what each weight layer read: the output of a layer measured in this pass (its index, -1: the pass's
        # input), or, when no measured output is what it read, its input's RMS measured there
        # id of a measured output -> (layer index, it, its version then)
        self.out_of: dict[int, tuple[int, weakref.ref, int]] = {}
        self.input_id = (0, 0)  # the pass's input tensor whose statistics are read: its id, its version then
        self.in_src: dict[int, int] = {}
        self.in_rms: dict[int, torch.Tensor] = {}
        # per layer: its first output in the pass; and for one applied in a chain, the latest application's
        # autograd node and how many so far (see ``Recorder._applied_again``)
        self.first_out: dict[int, object] = {}
        self.calls: dict[int, tuple[object, int]] = {}
        # per functional operation in one place: its calls in this pass, in order (site row, output's autograd node)
        self.site_calls: dict[tuple, list[tuple[int, object]]] = {}



def _synced(module: nn.Module) -> int:
    """How many processes a batch normalisation's statistics are taken over: a SyncBatchNorm's, its process
    group's (the whole world's by default), in training under torch.distributed; else 1."""
    if not (isinstance(module, nn.SyncBatchNorm) and module.training and torch.distributed.is_available()
            and torch.distributed.is_initialized()):
        return 1
    return int(torch.distributed.get_world_size(module.process_group))


def _precision_meta(params: list, optimizer) -> dict:
    """The dtype most of the watched weights are stored in, the optimizer's ``eps`` (what an update in that
    dtype divides by), its ``momentum`` (SGD's, RMSprop's: a step sums ~1 / (1 - momentum) gradients), its
    ``betas`` (Adam's) and its
    groups' largest ``weight_decay``, when it has them."""
    out: dict = {}
    sizes: dict[str, int] = {}
    for p in params:
        if p.requires_grad:
            key = str(p.dtype).replace("torch.", "")
            sizes[key] = sizes.get(key, 0) + p.numel()
    if sizes:
        out["param_dtype"] = max(sizes, key=sizes.__getitem__)
    eps = getattr(optimizer, "defaults", {}).get("eps") if optimizer is not None else None
    if isinstance(eps, (int, float)) and not isinstance(eps, bool):
        out["optimizer_eps"] = float(eps)
    momentum = getattr(optimizer, "defaults", {}).get("momentum") if optimizer is not None else None
    if isinstance(momentum, (int, float)) and not isinstance(momentum, bool):
        out["optimizer_momentum"] = float(momentum)
    betas = getattr(optimizer, "defaults", {}).get("betas") if optimizer is not None else None
    if isinstance(betas, (tuple, list)) and len(betas) == 2:  # Adam's and its kin's (floats, or tensors)
        try:
            out["optimizer_betas"] = [float(betas[0]), float(betas[1])]
        except (TypeError, ValueError, RuntimeError):
            pass
    decays = [g.get("weight_decay") for g in getattr(optimizer, "param_groups", None) or []]
    decays = [float(d) for d in decays if isinstance(d, (int, float)) and not isinstance(d, bool)]
    if decays:  # the largest group's: the one that may hold weights down
        out["optimizer_weight_decay"] = max(decays)
    if optimizer is not None:  # the torch.optim class it is, or derives from (a subclass steps as its base does)
        out["optimizer_kind"] = next((c.__name__ for c in type(optimizer).__mro__ if c.__name__ != "Optimizer"
                                      and c.__module__.startswith("torch.optim")), "")
    return out

class Recorder:
    """Attaches to a model (and optionally its optimizer) and fills a ``Trace``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 every: int | None = None, capacity: int = 2048, schedule: Schedule | None = None,
                 on_step: Callable[[], None] | None = None, throttle: Throttle | None = None,
                 after_step: Callable[[], None] | None = None, scaler=None, spike_factor: float = 10.0,
                 creeping: float | None = None, next_token_share: float = 0.9):
        if not isinstance(model, nn.Module):
            raise TypeError(f"NeuralDbg watches a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.inner: nn.Module = getattr(model, "_orig_mod", model)  # torch.compile wrapper -> original
        self.compiled = self.inner is not model
        lazy = [n for n, p in self.inner.named_parameters() if isinstance(p, nn.parameter.UninitializedParameter)]
        if lazy:
            raise ValueError(f"the model has parameters that are not materialised yet ({lazy[0]}"
                             f"{f' and {len(lazy) - 1} more' if len(lazy) > 1 else ''}: lazy modules such as "
                             "nn.LazyLinear): run one forward pass with a sample batch before watching it, and make "
                             "the optimizer after that pass")
        if scaler is not None and not (hasattr(scaler, "scale") and hasattr(scaler, "update")):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.optimizer = optimizer
        self.scaler = scaler
        self.schedule = schedule or Schedule(every)
        self.on_step = on_step
        self.after_step = after_step
        self.throttle = throttle or Throttle()

        mods = watched_modules(self.inner)
        self.modules = [m for _, m in mods]
        self.layers: list[LayerInfo] = [describe(i, name, m) for i, (name, m) in enumerate(mods)]
        self._index_of_name = {l.name: l.index for l in self.layers}
        index_of = {id(m): i for i, m in enumerate(self.modules)}
        # functional operations: which module runs, which produced a tensor; their rows ("sites")
        self._tracker = ModuleTracker({id(m): name for name, m in self.inner.named_modules()})
        # modules whose operations are no functional operation to watch: an activation module's are its own
        # output; those of the modules computing a parametrized module's weights are on weights
        self._opaque = activation_leaves(self.inner) | parametrizing_modules(self.inner)
        # dropout modules, read by themselves on sampled steps (name, module); functional ones by the function mode
        self._dropouts = [(name, m, self._index_of_name[name]) for name, m in self.inner.named_modules()
                          if isinstance(m, nn.modules.dropout._DropoutNd) and name in self._index_of_name]
        self._dropout_inside: set[str] = set()  # places whose dropout runs inside their own forward
        # batch normalisations, by layer index: how many values their statistics take per channel is read on
        # sampled passes (those that normalise by the batch's statistics: in training, or without running ones)
        self._batch_norms = {self._index_of_name[name]: name for name, m in self.inner.named_modules()
                             if isinstance(m, nn.modules.batchnorm._BatchNorm) and name in self._index_of_name}
        # embeddings, by layer index: which of their tokens' positions the loss reaches is read on sampled passes
        self._embeddings = {self._index_of_name[name]: name for name, m in self.inner.named_modules()
                            if isinstance(m, nn.Embedding) and name in self._index_of_name}
        self._observer: FunctionalObserver | None = None
        self._tracking = False       # the tracker's hooks are on (a sampled eager pass)
        self._ops_found = False      # the function mode has seen a functional operation
        self._quiet_passes = 0       # sampled passes so far that showed none
        self._sites: dict[tuple, int] = {}      # (owner, relation, op, occurrence in the pass) -> layer index
        self._loop_seen: set[int] = set()       # sites looked at for a loop (``_find_loops``)
        self._loop_period: dict[tuple, int] = {}  # per operation in one place: its loop's period (0: none)
        self._pass_ops: dict[tuple, int] = {}   # (owner, op, call of owner) -> occurrences so far
        owner_of: dict[int, int] = {}
        for name, m in self.inner.named_modules():
            for p in own_parameters(m):
                if id(p) in owner_of:
                    continue  # shared parameter: counted once, at its first owner
                # a parameter of an unwatched container belongs to the model as a whole: skip
                if id(m) in index_of:
                    owner_of[id(p)] = index_of[id(m)]
        all_params = {id(p): p for p in self.inner.parameters()}
        self._start_params = set(all_params)  # (a parameter the forward registers later is made by it)
        self._params = [all_params[k] for k in owner_of]
        self._owner_list = [owner_of[id(p)] for p in self._params]
        sparse = {i for i, o in enumerate(self._owner_list) if getattr(self.modules[o], "sparse", False)}
        self._pnorms = ParamNorms(self._params, self._owner_list, sparse)
        # per layer, its smallest trainable parameter: NaN/Inf flowing back through a layer reaches
        # it, so checking these few small gradients every step is enough to notice a bad backward
        smallest: dict[int, nn.Parameter] = {}
        for p, o in zip(self._params, self._owner_list):
            if p.requires_grad and (o not in smallest or p.numel() < smallest[o].numel()):
                smallest[o] = p
        # (a sparse embedding's gradient is never checked: it holds only the rows a batch used)
        self._sentinels = [p for o, p in smallest.items() if not getattr(self.modules[o], "sparse", False)]
        if optimizer is not None:
            self._check_optimizer(optimizer)

        self.trace = Trace(self.layers, capacity=capacity)
        self.trace.meta.update(model=type(self.inner).__name__, compiled=self.compiled,
                               optimizer=type(optimizer).__name__ if optimizer is not None else None,
                               **_precision_meta(self._params, optimizer))
        self.step = 0                 # completed steps
        self.passes = 0               # completed backward passes through the model
        self._rec: _StepRecord | None = None
        self._sample_now = self.schedule.should_sample(0)
        self._handles: list = []
        self._opt_handles: list = []
        self._any_step = _GlobalHook()  # the global optimizer step hook, removed with the other handles
        self._explicit = False        # a pass begun by ``begin_pass``, its forward part not yet ended
        self._replay_run: Callable | None = None  # how to replay the latest pass (None: the model's forward)
        self._next_order = 0
        self._pass_step = 0           # the step the latest forward pass belongs to
        self._began = False           # a pass began since the last step ended
        self._root_depth = 0          # calls of the model's own forward in progress
        # a model driven by its parts (the loop calls its children, never its own forward: a container with no
        # forward, SimSiam's encoder, projector and predictor, a GAN's two networks): a pass begins at the
        # first child called in a step, with gradients on, and its forward part lasts until its backward
        self._parts: dict[int, str] = {}  # id of a child of the model -> its name (empty: not driven so)
        self._part_depth = 0              # calls of those children in progress
        self._part_open = False           # a pass begun by a child, its backward not yet ended
        self._part_run: _PartsReplay | None = None  # the latest chain of children's calls
        self._part_first = (0, 0)         # where the open pass begins in it: (output, call)
        self._seen_lr = self._lr(sync=False)  # the learning rate of the latest step, to see it rise
        self._seen_lr_value: object = None    # ... as the optimizer holds it (unchanged while it is the same object)
        self._pending_losses: list = []
        self._layer_nodes = losspath.NodeMap()  # see _read_layer_terms
        self._out_grads: list = []
        self._out_leaves: list = []
        self._last_inputs = None
        self._rng_state = None
        # whether the forward pass draws random numbers (dropout...), as seen on sampled passes: only then
        # must the random state be kept every pass, for a replay to draw the same (None: not seen yet)
        self._forward_draws: bool | None = None
        self._autocast: list = []
        # NaN/Inf in the latest pass's gradients: a fault once the optimizer steps on them, a skipped
        # step (a GradScaler's business) when the next pass starts without an optimizer step
        self._bad_pass = False
        self._awaiting = False     # a backward pass ended since the last optimizer step
        self._stepped = False      # the optimizer stepped since a gradient last reached the first weights
        self._in_step = False      # inside optimizer.step (a closure runs the pass there)
        self._step_depth = 0       # optimizer.step calls in progress (a subclass's step may call its parent's)
        self._round = None         # the GradScaler's per-step state then: replaced by its update()
        # spikes between sampled steps: the largest gradient, read every step anyway (a loss spike is too
        # often batch noise to start a burst: it is found in the recorded loss instead)
        self._grad_spikes = SpikeWatch(spike_factor, self.schedule.warmup)
        # updates entering their warning band (the largest update-to-weight ratio past ``creeping``, and up on
        # the sample before) start a burst: the trend of a signal in its band is read on dense samples
        self._creeping = creeping
        self._next_token_share = next_token_share  # (Thresholds.next_token_share, when watching starts)
        self._last_ratio = math.nan
        self._loss_spikes = SpikeWatch(spike_factor, self.schedule.warmup)
        # the loss turning back up (its smoothed level, not one batch) starts a burst: what the layers do while
        # it rises is read on dense samples
        self._loss_turn = LossTurn(warmup=self.schedule.warmup)
        self._backward_queued = False
        self._replaying = False
        self._own_leaves: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # inputs it made
        self.attached = False
        self._no_params = np.array([i for i, l in enumerate(self.layers) if l.n_params == 0], dtype=np.int64)
        # layers whose small outputs need no copy on a sampled pass: seen once, and nothing changed them in
        # place before the pass ended (a layer followed by an in-place op, e.g. ReLU(inplace=True), is copied)
        self._settled: set[int] = set()
        # weight layers, whose input scale is read on sampled passes (see ``_read_input``)
        self._gain_layers = {i for i, l in enumerate(self.layers) if l.n_params > 0 and l.kind in GAIN_KINDS}
        self._fwd_hooks = [self._make_forward_hook(i, l) for i, l in enumerate(self.layers)]
        # eager sampled passes: the tracker's one global hook calls each layer's (none to register per layer)
        self._tracker.hooks = {id(m): h for m, h in zip(self.modules, self._fwd_hooks)}
        self._out_grad_hooks: list[Callable] = []  # by output index, made once
        self._keys: dict[int, tuple] = {}  # per layer: the batching key of its latest small output

    # -- attach / detach ---------------------------------------------------------------------------
    def attach(self) -> None:
        if self.attached:
            return
        if getattr(self.model, "_neuraldbg_watcher", None) is not None and self.model._neuraldbg_watcher() is not None:
            raise RuntimeError("this model is already watched by another NeuralDbg session; close that one first")
        self.model._neuraldbg_watcher = weakref.ref(self)
        self.schedule.resume()
        try:
            self._handles.append(self.model.register_forward_pre_hook(self._on_forward_start, with_kwargs=True))
            # always called, also when the forward raises: the observer never outlives the pass
            self._handles.append(self.model.register_forward_hook(self._on_forward_end,
                                                                  always_call=True))
            self._hook_optimizer()
            first = next((p for p in self._sentinels if p.requires_grad), None)  # (frozen since: skipped)
            if first is not None:  # the first gradient to reach the model's first trainable weights after a step
                self._carry_sentinel = first
                self._handles.append(first.register_hook(_weak_hook(self, "_on_sentinel_grad")))
            if self._parts or (not self.compiled and type(self.inner).forward is nn.Module.forward):
                self._watch_parts()  # (a container with no forward of its own: driven by its parts from the start)
            if not self.compiled:  # a recurrent module's input, per time step, on sampled passes
                for idx, (m, l) in enumerate(zip(self.modules, self.layers)):
                    if isinstance(m, nn.RNNBase):
                        self._handles.append(m.register_forward_pre_hook(self._make_time_hook(idx)))
            if self.compiled:  # permanent, excluded from the graph: no recompiles
                for m, h in zip(self.modules, self._fwd_hooks):
                    self._handles.append(m.register_forward_hook(_disable_under_compile(h)))
        except BaseException:
            self.detach()
            raise
        self.attached = True

    def detach(self) -> None:
        """Remove every hook; safe to call more than once, from any exit path."""
        self._stop_observer()
        # the run stops after a pass with no optimizer step: skipped by a loss scaler, or NaN/Inf left as it is
        if (self._awaiting and self.optimizer is not None and self._scaler_moved_on()
                or self._bad_pass and (self.scaler is not None or self.trace.skipped.n)):
            self._end_skipped_step()
        elif self._bad_pass:
            self._commit_nonfinite()
        if self._origin is not None and self.trace.nonfinite is None and self.step:
            try:  # where the weights are as watching stops
                self._note_moved(self._moved(len(self.layers)).cpu().numpy())
            except RuntimeError:  # weights moved to another device since the first read: the last read stands
                pass
        for h in self._handles + self._opt_handles:
            h.remove()
        self._handles.clear()
        self._opt_handles.clear()
        self._rec = None
        self._explicit = False
        self._root_depth = self._part_depth = 0
        self._part_open, self._part_run = False, None
        self._backward_queued = False
        self._in_step = False
        self._step_depth = 0
        self._out_fns = ()
        self._replay_run = None
        if getattr(self.model, "_neuraldbg_watcher", None) is not None:
            try:
                del self.model._neuraldbg_watcher
            except AttributeError:
                pass
        self.flush_losses()
        self.attached = False

    # -- optimizer ---------------------------------------------------------------------------------
    _trains = False  # the optimizer holds weights of the model that require a gradient (set by _check_optimizer)

    def _check_optimizer(self, optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if owned and not any(id(p) in owned for p in self.inner.parameters()):
            raise ValueError("the optimizer does not own any parameter of the model: was it made for another model, "
                             "or before the layers it should train were replaced (model.fc = nn.Linear(...))? "
                             "Make it from the model's parameters once the model is complete")
        # it steps weights of the model that should learn: a step with no backward pass through the model is news
        self._trains = any(id(p) in owned and p.requires_grad for p in self.inner.parameters())

    def _hook_optimizer(self) -> None:
        if self.optimizer is not None:
            self._opt_handles.append(self.optimizer.register_step_pre_hook(self._on_optimizer_pre))
            self._opt_handles.append(self.optimizer.register_step_post_hook(self._on_optimizer_post))
        if not any(h is self._any_step for h in self._handles):
            # every optimizer's steps, given one or not: the first to step on the model's weights while none is
            # watched (none given, or the one watched was dropped: made again inside the loop)
            self._handles.append(self._any_step)
            self._any_step.install(self)

    _adopted_step = False  # the step an optimizer was adopted at: its pass was counted at its backward end
    _backward_counted = False  # with no optimizer watched, a backward pass ended (and counted a step) since one
    _foreign: frozenset = frozenset()  # ids of optimizers seen stepping on none of the model's weights

    def _adopt(self, optimizer, args, kwargs):
        """No optimizer is watched (a training cell that makes its own; or the one watched was dropped, the
        optimizer being made again inside the loop): the first optimizer that steps on the model's trainable
        weights is watched from its next step on, as if it had been given (updates, the learning rate, steps
        counted by it). The step it is found at was already counted at its backward end. One adopted after
        another was dropped is counted in ``meta["optimizer_remade"]`` = [times, whether it keeps a state
        from step to step: momentum, an adaptive optimizer's moments]."""
        if self.optimizer is not None or not self.attached:
            return None
        foreign = id(optimizer) in self._foreign  # (its parameters are looked at once, not every step)
        if not foreign:
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            foreign = not any(id(p) in owned and p.requires_grad for p in self.inner.parameters())
            if foreign:
                self._foreign = self._foreign | {id(optimizer)}
        if foreign:  # an optimizer of other weights (one made for a model since re-created): counted
            self.trace.meta["foreign_steps"] = self.trace.meta.get("foreign_steps", 0) + 1
            return None
        if self._had_optimizer:
            count, stateful = self.trace.meta.get("optimizer_remade", (0, False))
            self.trace.meta["optimizer_remade"] = [count + 1, bool(stateful or _keeps_state(optimizer))]
        counted = self._backward_counted
        self.set_optimizer(optimizer)
        self.trace.meta["optimizer_adopted"] = True
        self._adopted_step = counted  # (a pass no hook saw end: this step is counted as the optimizer's)
        return None

    _opt_ref: Callable | None = None
    _had_optimizer = False  # an optimizer was watched: one adopted later replaces it

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer watched, held by a weak reference: one the loop drops (made again at every step or
        epoch) is no longer watched, and the next one that steps on the model's weights is adopted."""
        return self._opt_ref() if self._opt_ref is not None else None

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._opt_ref = weakref.ref(optimizer) if optimizer is not None else None
        self._had_optimizer = self._had_optimizer or optimizer is not None

    def set_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count steps by ``optimizer`` from now on, in place of any optimizer given before (one that a
        training framework creates only once training begins)."""
        self._check_optimizer(optimizer)
        self._backward_counted = False
        for h in self._opt_handles:
            h.remove()
        self._opt_handles.clear()
        self.optimizer = optimizer
        self.trace.meta["optimizer"] = type(optimizer).__name__
        self.trace.meta.update(_precision_meta(self._params, optimizer))
        self._seen_lr = self._lr(sync=False)
        if self.attached:
            self._hook_optimizer()

    # -- loss --------------------------------------------------------------------------------------
    _loss_path_seen = False
    _loss_path_tries = 0
    _loss_wanted = False  # a loss was recorded: the output's nodes are held for the next one to be read against
    _out_fns: list | tuple = ()

    def _read_loss_path(self, loss: torch.Tensor) -> None:
        """Once: the autograd operations between the model's output and the recorded loss (what turns outputs
        into a loss is no module: hooks do not see it), as names, into the trace's meta."""
        paths = losspath.paths(loss.grad_fn, self._out_fns)
        if paths:
            own = {id(p) for p in self.inner.parameters()}
            self._watch_outside(losspath.outside_leaves(loss.grad_fn, self._out_fns, own) + self._foreign_parts())
            self._watch_unregistered(list(self._out_fns), own)
            self._read_layer_terms(loss.grad_fn, self._out_fns)
        made = losspath.made_by(self._out_fns[0]) if paths and self._out_fns else ""
        self._out_fns = ()
        self._loss_path_tries += 1
        if paths:
            self.trace.meta["loss_paths"] = paths
            if made:
                self.trace.meta["output_op"] = made
        # found, or not found in the first few losses (a loss that does not come from the output): not looked for
        # again, so no step pays for a walk through the graph after these
        self._loss_path_seen = bool(paths) or self._loss_path_tries >= losspath.TRIES

    def _read_layer_terms(self, loss_fn, outputs) -> None:
        """Terms of the loss on watched layers' outputs other than through the model's outputs (an activity
        penalty), from a sampled pass's layer outputs: into the trace's meta as [layer, op, op ...]."""
        nodes, self._layer_nodes = self._layer_nodes, losspath.NodeMap()
        if not nodes:
            return
        terms = losspath.layer_terms(loss_fn, list(outputs) + nodes.outputs,
                                     {k: idx for k, (_, idx) in nodes.items()})
        if terms:
            self.trace.meta["loss_terms"] = [[self.layers[idx].name] + ops for idx, ops in terms]

    def _foreign_parts(self) -> list:
        """A model driven by its children: the weights of the children whose outputs the loss reads and of which
        the watched optimizer holds nothing (a GAN's discriminator, in the generator's loss), as if outside it."""
        run = self._part_run
        if run is None or self.optimizer is None or not isinstance(self._replay_run, _PartsReplay):
            return []
        owned = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        read = {o for o, final in zip(run.owners, run.final) if final}
        out = []
        for name in read:
            params = [p for p in self.inner.get_submodule(name).parameters() if p.requires_grad]
            if params and not any(id(p) in owned for p in params):
                out += params
        return out

    _outside: _Unmoved | None = None  # the largest tensor outside the model the loss depends on
    OUTSIDE_CHECKS = 64  # sampled steps a tensor outside the model is looked at, at most, for a change

    def _watch_outside(self, leaves: list) -> None:
        """Weight matrices outside the model on the loss's path that the watched optimizer does not step (a
        discriminator's, a critic's; not a learned loss weight, a vector): the largest is watched until an
        update moves it (another optimizer trains it), for ``OUTSIDE_CHECKS`` sampled steps at most; from
        then on the loss is a moving objective. Without a watched optimizer nothing says who steps what."""
        if self.optimizer is None:
            return
        owned = {id(p) for g in getattr(self.optimizer, "param_groups", ()) for p in g["params"]}
        free = [t for t in leaves if id(t) not in owned and t.dim() >= 2]
        if free:
            try:
                self._outside = _Unmoved([max(free, key=lambda t: t.numel())], self.OUTSIDE_CHECKS)
            except Exception:  # noqa: BLE001 - a tensor that cannot be read this way: nothing is said of it
                return
            self.trace.meta["loss_outside"] = sum(t.numel() for t in free)

    def _check_outside(self) -> None:
        if self._outside is None:
            return
        found = self._outside.check()
        if found == "moved":
            self.trace.meta["loss_moving"] = True
        if found != "still":  # moved; or gone, or never moved: a fixed network in the loss
            self._outside = None

    _unregistered: _Unmoved | None = None  # weights outside the model's parameters that its forward uses
    UNREGISTERED_KEPT = 8  # such weights looked at, at most (the largest)

    def _watch_unregistered(self, outputs: list, own: set[int]) -> None:
        """Once, from the first loss read: weights the forward pass computes the outputs from that are not the
        model's parameters (``losspath.inner_graph``: modules kept in a plain list, a tensor made with
        ``requires_grad=True``, a layer the forward itself makes and registers) and that the watched optimizer
        does not hold; and whether that graph is one linear map of the input (``meta["linear_maps"]``: its weight
        layers, two or more). The largest are watched for a change at sampled steps, ``OUTSIDE_CHECKS`` at most:
        one that moves is stepped by something (another optimizer, a hand-written update) and ends the watch;
        ``meta["unregistered"]["still"]`` counts the sampled steps at which none had moved, and ``renewed`` says
        they were all freed by a later sampled step (the forward makes new ones at every pass)."""
        ins = _input_tensors(self._last_inputs)
        if not ins or mixing._sharded(self.inner):
            return  # where the model's graph begins is not known (an input in a container not looked into)
        stop = ({id(t) for t in ins} | {id(t.grad_fn) for t in ins if t.grad_fn is not None}
                | set(self._own_leaves.keys()))
        found, linear = losspath.inner_graph(outputs, own & self._start_params, stop)
        if linear >= 2:  # weight layers with nothing nonlinear between them: one linear map of the input
            self.trace.meta["linear_maps"] = linear
        if self.optimizer is not None:
            held = {id(p) for g in getattr(self.optimizer, "param_groups", ()) for p in g["params"]}
            found = [t for t in found if id(t) not in held]
        if not found:
            return
        found.sort(key=lambda t: -t.numel())
        try:
            self._unregistered = _Unmoved(found[:self.UNREGISTERED_KEPT], self.OUTSIDE_CHECKS)
        except Exception:  # noqa: BLE001 - weights this way cannot be read (a sharded tensor): nothing is said
            return
        self.trace.meta["unregistered"] = {"tensors": len(found), "numel": int(sum(t.numel() for t in found)),
                                           "shapes": [list(t.shape) for t in found[:3]], "still": 0,
                                           "parameters": sum(isinstance(t, nn.Parameter) for t in found)}

    def _check_unregistered(self) -> None:
        if self._unregistered is None:
            return
        found, info = self._unregistered.check(), self.trace.meta.get("unregistered")
        if found in ("moved", "gone") or info is None:
            self.trace.meta.pop("unregistered", None)  # stepped by something, or no longer readable
            self._unregistered = None
            return
        if found == "freed":  # the next passes use new ones: layers made in the forward, or temporaries (an
            if info.get("parameters"):  # initial state made with requires_grad=True, an input made to need one)
                info["renewed"] = True
            else:
                self.trace.meta.pop("unregistered", None)
            self._unregistered = None
            return
        info["still"] += 1
        if found == "done":
            self._unregistered = None

    def record_loss(self, loss) -> None:
        self._loss_wanted = True
        if not self._loss_path_seen and isinstance(loss, torch.Tensor) and loss.grad_fn is not None and self._out_fns:
            self._read_loss_path(loss)
        if isinstance(loss, torch.Tensor) and loss.is_cpu and loss.dtype is torch.float32 and loss.numel() == 1:
            value = loss.item()  # the usual case: no copy to make
        elif isinstance(loss, torch.Tensor):
            value = loss.detach()
            value = value.float().mean() if value.numel() != 1 else value.reshape(()).float()
            if value.device.type == "cpu":
                value = float(value)
        else:
            value = float(loss)
        if isinstance(value, float):
            if self._loss_spikes(value):
                self._input_at_spike(self._pass_step)
            if self._loss_turn(value):
                self.schedule.burst(self.step, reason="loss")
        self._pending_losses.append((self._pass_step, value))
        if len(self._pending_losses) >= 256:
            self.flush_losses()

    # at most this many unsampled steps have their input read at a loss spike
    MAX_SPIKE_INPUTS = 32

    def _input_at_spike(self, step: int) -> None:
        """The loss, known on the host, spiked at an unsampled step: the step's input is still held (for a
        replay), so its scale is read now (a batch out of scale is the usual reason), into the trace's meta
        as [step, mean, std, absmax, nonfinite, spread]."""
        st = self.trace.stats
        if self._last_inputs is None or self._rec is not None or (st.n and int(st.steps[-1]) == step):
            return  # nothing held, or sampled (being sampled): its input is in the trace
        spikes = self.trace.meta.setdefault("input_at_spikes", [])
        if spikes and spikes[-1][0] == step:
            return  # one row a step (a second micro-batch of the same step)
        x = _sample_input(self._last_inputs)
        if x is not None and len(spikes) < self.MAX_SPIKE_INPUTS:
            spikes.append([int(step)] + [float(v) for v in input_stats(x).tolist()])

    def latest_loss(self) -> float | None:
        """The loss recorded last, if it is not in the trace yet (None otherwise)."""
        if not self._pending_losses:
            return None
        value = self._pending_losses[-1][1]
        return float(value) if isinstance(value, torch.Tensor) else value

    def flush_losses(self) -> None:
        if not self._pending_losses:
            return
        pending, self._pending_losses = self._pending_losses, []
        tensors = [v for _, v in pending if isinstance(v, torch.Tensor)]
        host = iter(torch.stack(tensors).cpu().tolist()) if tensors else iter(())
        for step, v in pending:
            self.trace.add_loss(step, next(host) if isinstance(v, torch.Tensor) else v)

    # -- forward -----------------------------------------------------------------------------------
    def begin_pass(self, args: tuple = (), kwargs: dict | None = None, run: Callable | None = None) -> None:
        """A training pass starts that may not call the model's own forward (see ``NeuralDbg.begin_pass``)."""
        if not self.attached or self._replaying:
            return
        self._stop_observer()  # a pass begun and never ended (a skipped step)
        self._explicit = True
        self._start_pass(args, kwargs or {}, run)

    def end_forward(self, outputs) -> None:
        """The forward part of a pass begun by ``begin_pass`` is over; ``outputs`` go to the backward."""
        if not self._explicit:
            return
        self._explicit = False
        self._explicit_ended = True
        last, self._last_out = self._last_out, None
        if not self._loss_path_seen and last:
            self._read_explicit_path(outputs, last[0])
        self._end_forward(outputs)

    # the output of the watched module that ran last in a sampled pass begun by begin_pass (held in a list that
    # a copy of the model does not copy: a tensor of the graph cannot be)
    _last_out: losspath.Nodes | None = None

    _inner_tries = 0

    def _read_inner_path(self, leaves: list) -> None:
        """The model returned a scalar (its loss) with its other outputs: the loss's operations are read back
        to those outputs at once, whatever the loop records (a detached loss, a trainer's logged float). A
        scalar that does not lead to them (an auxiliary loss) is given up after ``TRIES`` passes, leaving the
        recorded loss its own tries."""
        self._inner_tries += 1
        losses = [t for t in leaves if t.dim() == 0 and t.grad_fn is not None]
        outs = [t.grad_fn for t in leaves if t.dim() > 0 and t.grad_fn is not None]
        paths = losspath.paths(losses[0].grad_fn, outs) if losses and outs else []
        if paths:
            self.trace.meta["loss_paths"] = paths
            self._loss_path_seen = True

    def _read_explicit_path(self, outputs, last: torch.Tensor) -> None:
        """A pass driven from outside the model's forward (a trainer's training step) has no model output:
        the loss's operations are read back to the output of the watched module that ran last (the head),
        from the loss handed to ``end_forward`` with its graph, before the backward pass frees it."""
        loss = outputs if isinstance(outputs, torch.Tensor) else next(iter(nanhunt.float_tensors(outputs)), None)
        if loss is None or loss.grad_fn is None or last.grad_fn is None or last.grad_fn is loss.grad_fn:
            return
        paths = losspath.paths(loss.grad_fn, [last.grad_fn])
        self._loss_path_tries += 1
        if paths:
            self.trace.meta["loss_paths"] = paths
            own = {id(p) for p in self.inner.parameters()}
            self._watch_outside(losspath.outside_leaves(loss.grad_fn, [last.grad_fn], own))
            self._watch_unregistered([last.grad_fn], own)
            self._read_layer_terms(loss.grad_fn, [last.grad_fn])
        self._loss_path_seen = bool(paths) or self._loss_path_tries >= losspath.TRIES

    def _on_forward_start(self, module, args, kwargs):
        self._root_depth += 1
        if self._explicit and not self._replaying and self.trace.nonfinite is None:
            # a pass a trainer began before it opened its precision's autocast: the forward runs under this one
            self._autocast = nanhunt.autocast_state()
        if self._explicit or self._replaying or not torch.is_grad_enabled():
            return None  # evaluation passes under no_grad are neither steps nor statistics
        self._start_pass(args, kwargs, None)
        return None

    def _start_pass(self, args, kwargs, run: Callable | None, chained: bool = False) -> None:
        """``chained``: the pass goes on with a computation the last one began (a child fed another's output):
        its input, its replay and its random state are that computation's, and it is no new step."""
        if (not chained and self._awaiting and self.optimizer is not None
                and (self._bad_pass or self._scaler_moved_on())):
            self._end_skipped_step()  # the last pass's NaN/Inf gradients were not stepped on (replayed as they ran)
        self._replay_run = run
        self._began = True
        if self._pass_step != self.step:  # the first forward pass of a step (not a second, accumulated one)
            self._pass_step = self.step
            self._watch_lr()
            if self._layer_nodes:
                self._layer_nodes = losspath.NodeMap()
        if not chained:
            self._last_inputs = (args, kwargs)
        if self.trace.nonfinite is None:
            if not chained and (self._sample_now or self._forward_draws is not False):
                self._rng_state = torch.get_rng_state()
            self._autocast = nanhunt.autocast_state()
        if self._sample_now and (self._rec is None or not self._rec.forward_done):
            if self._rec is None:
                self._rec = _StepRecord()
                self._rec.grads = self._output_grads_now()
                self._note_mode()
            x = None if chained else _sample_input((args, kwargs))
            if x is not None:
                self._rec.input = input_stats(x)
                self._rec.input_id = (id(x), x._version)
            if not self.compiled:
                self._start_observer()

    def _note_mode(self) -> None:
        """A sampled training pass of a model with batch normalisations: whether it runs in eval mode
        (``model.training`` False: ``model.eval()`` left on, after a validation pass), in which they normalise
        with their running statistics, and do not update them, in place of the batch's. Counted in the trace's
        meta as ``eval_mode`` {"passes": in eval mode, "sampled": sampled training passes, "step": the first in
        eval mode, "norms": the batch normalisations that read their running statistics then}."""
        if not self._batch_norms:
            return
        seen = self.trace.meta.setdefault("eval_mode", {"passes": 0, "sampled": 0, "step": -1, "norms": []})
        seen["sampled"] += 1
        if self.inner.training:
            return
        norms = self._moving_norms()
        if not norms:
            return
        seen["passes"] += 1
        if seen["step"] < 0:
            seen["step"], seen["norms"] = int(self.step), norms

    def _moving_norms(self) -> list[str]:
        """The batch normalisations in eval mode that read running statistics while what they normalise moves as
        the model trains: they, or a layer that runs before them, have trainable weights. Those behind a frozen
        backbone (a linear probe, evaluated in eval mode on purpose) read statistics that still hold."""
        trainable = {o for p, o in zip(self._params, self._owner_list) if p.requires_grad}
        orders = [self.layers[i].order for i in trainable if self.layers[i].order is not None]
        first = min(orders) if orders else None
        out = []
        for idx, name in self._batch_norms.items():
            m, order = self.modules[idx], self.layers[idx].order
            if m.training or m.running_mean is None:
                continue
            if idx in trainable or first is not None and order is not None and first < order:
                out.append(name)
        return out

    _grad_passes = 0  # sampled passes under the auto schedule, counted to measure output gradients on half

    def _output_grads_now(self) -> bool:
        """Whether a sampled pass retains its layers' output gradients (``Stat.GRAD_RMS``/``GRAD_NONFINITE``):
        on every one when the user fixed the interval; under the auto schedule, on one in two (the first
        included). No diagnosis reads their size (the parameters' gradient norms carry the gradient flow; a
        NaN/Inf pass is caught every step and replayed): they draw the chart's gradient flow, where a sample
        without them shows the one before. Retaining them costs about as much as the rest of a sampled step's
        output statistics on a model of small layers."""
        if self.schedule.every is not None:
            return True
        self._grad_passes += 1
        return self._grad_passes % 2 == 1

    # A model whose forward passes showed no functional operation (every activation a module, no
    # attention written as functions) is looked at again on one sampled pass in this many: a function
    # mode costs a Python call per torch call of the forward pass.
    QUIET_OPS_EVERY = 8
    QUIET_OPS_FIRST = 4  # ... after this many sampled passes that showed none

    def _watch_ops(self) -> bool:
        """Whether this sampled pass runs the function mode."""
        if self._ops_found:
            return True
        self._quiet_passes += 1
        return self._quiet_passes <= self.QUIET_OPS_FIRST or self._quiet_passes % self.QUIET_OPS_EVERY == 0

    _ops_now = False  # the sampled pass in progress runs the function mode

    def _start_observer(self, resume: bool = False) -> None:
        """``resume``: again within the same pass (its next child, see ``_parts``), which it goes on counting."""
        if not resume:
            self._pass_ops.clear()
            self._ops_now = self._watch_ops()
        ops = self._ops_now
        self._tracker.start(full=ops, keep=resume)
        self._tracking = True
        if not ops:
            return
        try:
            self._observer = FunctionalObserver(self._tracker, self._opaque, self._on_op, _attention_logits,
                                                dropout=self._on_dropout,
                                                dropout_leaves={id(m) for _, m, _ in self._dropouts})
            self._observer.__enter__()
        except BaseException:
            self._observer = None
            self._tracking = False
            self._tracker.__exit__(None, None, None)
            raise

    def _stop_observer(self, pause: bool = False) -> None:
        """``pause``: the pass goes on later (its next child, see ``_parts``): the tracker keeps what it knows."""
        obs, self._observer = self._observer, None
        if not self._tracking:
            return
        self._tracking = False
        try:
            if obs is not None:
                try:
                    from torch.overrides import _get_current_function_mode_stack
                    top = _get_current_function_mode_stack()[-1:]
                except (ImportError, AttributeError):  # a torch without it: ours is the one on top
                    top = [obs]
                if top and top[0] is obs:  # never pop a mode the user entered inside the forward
                    obs.__exit__(None, None, None)
        finally:
            if pause:
                self._tracker.pause()
            else:
                self._tracker.__exit__(None, None, None)
            self._note_reads()

    _reads_noted = 0  # how many of the tracker's ``reads`` are in the layer table

    def _note_reads(self) -> None:
        """Into the layer table (``extra["reads"]``): the module whose output a module reads, first seen."""
        reads = self._tracker.reads
        if len(reads) == self._reads_noted:
            return
        for name, (src, through) in list(reads.items())[self._reads_noted:]:
            idx = self._index_of_name.get(name)
            if idx is not None and src is not None and src != name and "reads" not in self.layers[idx].extra:
                self.layers[idx].extra["reads"] = src
                if through:
                    self.layers[idx].extra["through"] = True
        self._reads_noted = len(reads)

    def _on_forward_end(self, module, args, output):
        self._root_depth = max(self._root_depth - 1, 0)
        if self._explicit:
            return None  # the model's forward inside a pass begun by begin_pass: the pass goes on
        if self._tracking:
            self._stop_observer()
        if self._replaying or not torch.is_grad_enabled():
            return None
        self._end_forward(output)
        return None

    def _end_forward(self, output) -> None:
        if self._tracking:
            self._stop_observer()
        rec = self._rec
        if rec is not None:
            if not rec.forward_done:
                self._forward_seen(rec)
            rec.forward_done = True
            self._find_loops(rec)
            _release_nodes(rec)
        # NaN/Inf in the output shows up in the gradient arriving at it: checked at backward end
        if isinstance(output, torch.Tensor):  # the usual case, without a walk through a structure
            leaves = [output] if output.requires_grad and output.is_floating_point() else []
        else:
            leaves = [t for t in nanhunt.float_tensors(output) if t.requires_grad]
        self._out_leaves = leaves
        self._out_grads = [None] * len(leaves)
        self._backward_queued = False
        if (not self._loss_path_seen and self._inner_tries < losspath.TRIES and len(leaves) > 1
                and any(t.dim() == 0 for t in leaves)):
            self._read_inner_path(leaves)  # a model that returns its loss with its outputs (Hugging Face style)
        # the loop records losses (or may: the first pass, before any was recorded, in case it is the only one to
        # end, a loss NaN at step 0 stopping the loop): until one shows its ops
        if (self._loss_wanted or self.passes == 0) and not self._loss_path_seen:
            self._out_fns = losspath.Nodes(t.grad_fn for t in leaves if t.grad_fn is not None)
            if self._layer_nodes:  # every pass's outputs of the step: a loss may read two (a consistency term)
                self._layer_nodes.outputs.extend(self._out_fns)
        hooks = self._out_grad_hooks
        for i, t in enumerate(leaves):
            if i == len(hooks):
                hooks.append(self._make_output_grad_hook(i))
            t.register_hook(hooks[i])

    def _forward_seen(self, rec: _StepRecord) -> None:
        """The forward pass (or a child's part of it) is over: whether it drew random numbers; what it kept."""
        if self._forward_draws is not True and self._rng_state is not None:
            self._forward_draws = not torch.equal(torch.get_rng_state(), self._rng_state)
        self._measure_kept(rec)

    def _measure_kept(self, rec: _StepRecord) -> None:
        """The forward pass is over: outputs copied for the first time tell which layers need no copy
        (nothing changed them since); outputs kept as they are are measured now, stacked by shape. One
        that something did change is dropped (not measured this step) and copied from now on."""
        for idx, t, version in rec.watch:
            if t._version == version:
                self._settled.add(idx)
        rec.watch = []
        nodes = None if self._loss_path_seen else self._layer_nodes
        for idx, t, version in rec.seen:
            if nodes is not None and t.grad_fn is not None:
                nodes[id(t.grad_fn)] = (t.grad_fn, idx)
            rec.dtype[idx] = t.dtype
            self._keep(rec, idx, t, version, self._key(idx, self.layers[idx], t))
        rec.seen = []
        if not rec.fwd_kept:
            return
        changed = set()
        with torch.no_grad():
            for key, items in rec.fwd_kept.items():
                ok = [(i, t) for i, t, v in items if t._version == v]
                changed.update(i for i, t, v in items if t._version != v)
                if ok:
                    stats = forward_stats_batch(torch.stack([t for _, t in ok]), key[3], key[4], key[5])
                    rec.fwd_rows.append(([i for i, _ in ok], stats))
        rec.fwd_kept = {}
        if changed:
            self._settled -= changed
            for i in changed:
                rec.fwd.pop(i, None)
                rec.dtype.pop(i, None)
            rec.grad_kept = [g for g in rec.grad_kept if g[0] not in changed]

    # -- a model driven by its parts ---------------------------------------------------------------
    def _watch_parts(self) -> None:
        """Hook the model's children: from now on a pass may begin at the first of them called in a step, when
        the model's own forward does not run (see ``_parts``). Their hooks do nothing inside that forward."""
        parts = _callable_children(self.inner)
        self._parts = {id(m): name for name, m in parts}
        for _, m in parts:
            self._handles.append(m.register_forward_pre_hook(self._on_part_start, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._on_part_end, always_call=True))

    MAX_CHAIN = 256  # calls a chain of passes holds at most (a state carried from step to step undetached)

    def _is_part_call(self, module) -> bool:
        """A child called on its own, for training: gradients on, in training mode (one evaluated in eval
        mode without ``no_grad`` is no pass), outside the model's forward and any other child's."""
        return not (self._part_depth > 1 or self._root_depth or self._explicit or self._replaying
                    or not torch.is_grad_enabled() or not module.training)

    def _on_part_start(self, module, args, kwargs):
        self._part_depth += 1
        if not self._is_part_call(module):
            return None
        run = self._part_run
        inputs = _input_tensors((args, kwargs))
        if not self._part_open:  # the first child called since the last backward pass
            # one fed another child's output (a GAN's discriminator on the generator's) goes on with the same
            # computation: the same chain of calls, replayed as one, its first input still the pass's input
            chained = run is not None and len(run.calls) < self.MAX_CHAIN and run.take(inputs)
            if not chained:
                run = _PartsReplay()
                self._part_run = run
                self._out_fns = losspath.Nodes(())
            self._start_pass(args, kwargs, run, chained=chained)
            self._part_open, self._part_first = True, (len(run.outputs), len(run.calls))
            self._backward_queued = False
        else:
            run.take(inputs)
            if self._rec is not None and not self._rec.forward_done and not self.compiled:
                self._start_observer(resume=True)  # a later child of the same sampled pass
        if self._tracking:
            self._tracker.entered(module, args)  # (its global pre-hook ran before the tracker started)
        run.calls.append((self._parts[id(module)], args, kwargs))
        return None

    def _on_part_end(self, module, args, output):
        self._part_depth = max(self._part_depth - 1, 0)
        if not self._part_open or not self._is_part_call(module):
            return None
        if self._tracking:
            self._stop_observer(pause=True)
        run = self._part_run
        if output is None and sys.exc_info()[0] is not None:
            # the child raised, and the loop may go on: its pass is given up (no backward pass follows)
            n_out, n_calls = self._part_first
            del run.calls[n_calls:], run.outputs[n_out:], run.grads[n_out:], run.final[n_out:], run.owners[n_out:]
            run.ids = {k: i for k, i in run.ids.items() if i < n_out}
            self._part_open = False
            return None
        rec = self._rec
        if rec is not None and not rec.forward_done:
            self._forward_seen(rec)
        leaves = [t for t in nanhunt.float_tensors(output) if t.requires_grad]
        name = self._parts[id(module)]
        for t in leaves:
            t.register_hook(self._make_part_grad_hook(run, run.add(t, name)))
        if (self._loss_wanted or self.step == 0) and not self._loss_path_seen:  # (every pass of the first step)
            fns = [t.grad_fn for t in leaves if t.grad_fn is not None]
            self._out_fns = losspath.Nodes(list(self._out_fns) + fns)
            if self._layer_nodes:
                self._layer_nodes.outputs.extend(fns)
        return None

    def _make_part_grad_hook(self, run: _PartsReplay, i: int):
        def hook(g):
            if i < len(run.grads):
                run.grads[i] = g
            self._backward_began()
            return None
        return hook

    def _close_parts(self) -> None:
        """The backward pass of a pass begun by a child ended: its outputs are those of its calls that no other
        child took."""
        self._part_open = False
        if self._tracking:
            self._stop_observer()
        else:  # (paused after its last child: what it knew of the pass is done with)
            self._tracker.__exit__(None, None, None)
        if self._rec is not None:
            self._rec.forward_done = True
            self._find_loops(self._rec)
            _release_nodes(self._rec)
        run = self._part_run
        keep = [i for i in range(self._part_first[0], len(run.outputs)) if run.final[i]]
        self._out_leaves = [run.outputs[i] for i in keep]
        self._out_grads = [run.grads[i] for i in keep]

    def _make_forward_hook(self, idx: int, layer: LayerInfo):
        settled = self._settled
        tensor = torch.Tensor
        batch_norms, embeddings, gain_layers = self._batch_norms, self._embeddings, self._gain_layers

        def hook(module, args, output):
            rec = self._rec
            if rec is None or rec.forward_done or self._replaying:
                return None
            if self._explicit and type(output) is tensor:  # the head, once the pass is over (loss path)
                self._last_out = losspath.Nodes((output,))
            if rec.fwd.get(idx) is not None:  # applied again in the pass: measured at its first application
                self._applied_again(rec, idx, layer, args, output)
                return None
            rec.first_out[idx] = output  # (its autograd node is looked up only if it runs again)
            if idx in gain_layers and args:
                self._read_input(rec, idx, args[0])
            if idx in batch_norms and type(output) is tensor and output.dim() >= 2 and output.shape[1] > 0 and (
                    module.training or module.running_mean is None):
                rec.norm_values[batch_norms[idx]] = output.numel() // output.shape[1] * _synced(module)
            if idx in embeddings and not self.compiled:
                self._watch_positions(embeddings[idx], args, output)
            if (idx in settled and type(output) is tensor and output.is_floating_point()
                    and output.numel() <= BATCH_NUMEL):
                # the usual case, once a layer is known: kept as it is, sorted out when the pass ends
                rec.fwd[idx] = True
                rec.seen.append((idx, output, output._version))
                rec.out_of[id(output)] = (idx, weakref.ref(output), output._version)
                return None
            outs = nanhunt.float_tensors(output)
            if not outs:
                return None
            if layer.order is None and self._passes_through(module, args, outs[0]):
                layer.extra["passthrough"] = True  # returns its input: nothing of its own to observe
                return None
            self._record(rec, idx, layer, outs[0])
            return None
        return hook

    @staticmethod
    def _applied_again(rec: _StepRecord, idx: int, layer: LayerInfo, args: tuple, output) -> None:
        """Layer ``idx`` runs again in this sampled pass. Applications in a chain, each reading what the one before
        made (a block shared across depth, a cell applied per time step), are counted: the most in one pass is
        ``extra["applications"]``. One applied side by side to several inputs (a siamese encoder) is no chain."""
        before = rec.calls.get(idx)
        last, n = before if before is not None else (_first_node(rec.first_out.get(idx)), 1)
        if last is None:
            return
        # any input it reads may carry the chain (a cell's state comes after the step's input: cell(x_t, h))
        starts = [a.grad_fn for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor) and a.grad_fn is not None]
        if not starts or not _reaches(starts, last):
            return
        rec.calls[idx] = (_first_node(output), n + 1)
        if n + 1 > layer.extra.get("applications", 1):
            layer.extra["applications"] = n + 1

    # sampled steps whose gradient through time is kept per recurrent layer, at most
    MAX_TIME_SAMPLES = 256

    def _make_time_hook(self, idx: int):
        """Before a recurrent module runs on a sampled pass: its input sequence's gradient, per time step, is
        read in the backward pass (what arrives at the first step against the most any step gets: how much
        of the gradient passes through time inside the module, which no module hook sees). An input that
        needs no gradient (raw data) is given a copy that does, for that pass: the graph before it is the
        same (there is none)."""
        name = self.layers[idx].name

        def pre(module, args):
            if self._rec is None or self._replaying or not args or not torch.is_grad_enabled():
                return None
            x = args[0]
            if type(x) is not torch.Tensor or not x.is_floating_point() or x.dim() < 2:
                return None  # a PackedSequence, or no sequence
            time_dim = 1 if getattr(module, "batch_first", False) and x.dim() == 3 else 0
            if x.shape[time_dim] < 2:
                return None
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
                self._own_leaves[id(x)] = x  # (no weight of the model's: the graph walks stop at it)
                args = (x, *args[1:])
            step = self.step
            x.register_hook(lambda g, step=step, t=time_dim: self._through_time(name, step, g, t))
            return args
        return pre

    def _watch_positions(self, name: str, args: tuple, out) -> None:
        """An embedding of a 2-D batch of tokens ran on a sampled pass: which of their positions the loss's
        gradient reaches, along each of the two dimensions, is read in the backward pass (a causal model whose
        output is read at position 0 gives a gradient to the first token only: nothing after it can change the
        prediction)."""
        x = args[0] if args else None
        if (type(x) is not torch.Tensor or x.dim() != 2 or type(out) is not torch.Tensor or out.dim() != 3
                or not out.requires_grad or max(x.shape) < 2):
            return
        if x.shape[1] >= 2 and bool((x.diff(dim=1) == 1).all()):
            return  # position ids (0, 1, 2, ...): the positions themselves, with no padding to tell
        step, ids = self.step, x.detach()
        out.register_hook(lambda g: self._positions_read(name, step, g, ids))

    def _positions_read(self, name: str, step: int, g: torch.Tensor, ids: torch.Tensor) -> None:
        """One row a sampled pass: [step, then for dimension 0 and for dimension 1: the sequences' length
        along it, and the positions up to the last one the gradient reaches], each the median over the
        sequences the gradient reaches at all. A sequence's length leaves out its padding: a trailing run of
        two or more of one token (padded positions that a mask hides get no gradient, and are not read)."""
        rows = self.trace.meta.setdefault("positions_read", {}).setdefault(name, [])
        if len(rows) >= self.MAX_TIME_SAMPLES:
            return
        with torch.no_grad():
            hit = g.detach().ne(0).any(dim=2)
            if not bool(hit.any()):
                return
            found = []
            for d in (0, 1):
                h, x = (hit, ids) if d == 1 else (hit.t(), ids.t())
                n = h.shape[1]
                reached = (h * torch.arange(1, n + 1, device=h.device)).amax(dim=1)
                run = torch.flip(x == x[:, -1:], [1]).int().cumprod(dim=1).sum(dim=1)
                length = torch.where(run >= 2, n - run, n)
                keep = reached > 0
                found.append(torch.stack([length[keep].float().median(), reached[keep].float().median()]))
            read = torch.cat(found).tolist()  # one transfer
        rows.append([int(step)] + [int(v) for v in read])

    def _through_time(self, name: str, step: int, g: torch.Tensor, time_dim: int) -> None:
        """One row a sampled pass: [step, gradient at the first time step / the most any step gets, time
        steps, time steps up to the last one that gets any gradient (the output read before its end: a
        unidirectional layer's step t reaches only its outputs from t on), gradient at the first time step /
        at that last one (how much it grows, or fades, back through time)]."""
        dims = [d for d in range(g.dim()) if d != time_dim]
        rms = g.detach().float().pow(2).mean(dim=dims).sqrt().tolist()  # one transfer
        rows = self.trace.meta.setdefault("through_time", {}).setdefault(name, [])
        top = max(rms)
        if top > 0 and all(math.isfinite(v) for v in rms) and len(rows) < self.MAX_TIME_SAMPLES:
            reached = max(t for t, v in enumerate(rms) if v > 0) + 1
            rows.append([int(step), rms[0] / top, len(rms), reached, rms[0] / rms[reached - 1]])

    def _passes_through(self, module, args, out: torch.Tensor) -> bool:
        """The module returned its own input, unmodified (an in-place activation modifies it)."""
        if not args or out is not args[0]:
            return False
        unchanged = self._tracker.unchanged(module, out)
        return unchanged if unchanged is not None else not getattr(module, "inplace", False)

    def _record(self, rec: _StepRecord, idx: int, layer: LayerInfo, t: torch.Tensor) -> None:
        """Measure ``t`` as the output of layer ``idx`` this step (stashed for batching when small)."""
        if layer.order is None:
            layer.order = self._next_order
            self._next_order += 1
        if not self._loss_path_seen and t.grad_fn is not None:  # until the loss's graph is read: what it may read
            self._layer_nodes[id(t.grad_fn)] = (t.grad_fn, idx)
        rec.dtype[idx] = t.dtype
        rec.out_of[id(t)] = (idx, weakref.ref(t), t._version)
        if t.numel() <= BATCH_NUMEL:
            key = self._key(idx, layer, t)
            unit_dim = key[3]
            rec.fwd[idx] = True
            if idx in self._settled:  # kept as it is: measured when the pass ends, its gradient retained
                self._keep(rec, idx, t, t._version, key)
                return
            # a copy: later in-place ops must not change what we measure
            rec.fwd_small.setdefault(key, []).append((idx, t.detach().clone()))
            if not self.compiled:
                rec.watch.append((idx, t, t._version))
        else:
            unit_dim = layer.unit_dim(t.dim())
            rec.fwd[idx] = forward_stats(t, unit_dim, layer.bounds, dead=layer.kind in _DEAD_KINDS)
            _note_positions(layer, t.shape, unit_dim)
        if t.requires_grad and rec.grads:
            t.register_hook(self._make_grad_hook(idx, unit_dim, rec))

    @staticmethod
    def _read_input(rec: _StepRecord, idx: int, x) -> None:
        """What weight layer ``idx`` reads: a layer's output measured in this pass, the pass's input, or (an
        input computed outside any module: a concatenation, a sum of branches, a module's later application)
        its RMS, measured here."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not x.numel():
            return
        seen = rec.out_of.get(id(x))
        if seen is not None and seen[1]() is x and seen[2] == x._version:
            rec.in_src[idx] = seen[0]
        elif id(x) == rec.input_id[0] and x._version == rec.input_id[1]:
            rec.in_src[idx] = -1
        else:  # (or one changed in place since it was measured)
            with torch.no_grad():
                v = x.detach()
                wide = v.dtype in (torch.float32, torch.float64)  # (a narrower one is reduced in float32, uncopied)
                norm = torch.linalg.vector_norm(v) if wide else torch.linalg.vector_norm(v, dtype=torch.float32)
                rec.in_rms[idx] = norm.float() / math.sqrt(x.numel())

    def _key(self, idx: int, layer: LayerInfo, t: torch.Tensor) -> tuple:
        """The batching key of a small output of layer ``idx``: (shape, dtype, device, unit dim, bounds,
        whether dead units are counted), made once per layer and output layout."""
        shape, dtype, device = t.shape, t.dtype, t.device
        hit = self._keys.get(idx)
        if hit is not None and hit[0] == shape and hit[1] is dtype and hit[2] == device:
            return hit
        key = (tuple(shape), dtype, device, layer.unit_dim(len(shape)), layer.bounds, layer.kind in _DEAD_KINDS)
        self._keys[idx] = key
        _note_positions(layer, shape, key[3])
        return key

    def _keep(self, rec: _StepRecord, idx: int, t: torch.Tensor, version: int, key: tuple) -> None:
        """Measure output ``t`` as it is when the pass ends (no copy), and retain its gradient."""
        rec.fwd_kept.setdefault(key, []).append((idx, t, version))
        if t.requires_grad and rec.grads:
            if t.grad_fn is not None:
                t.retain_grad()
                rec.grad_kept.append((idx, t, key[:3] + (None,)))  # a gradient has its tensor's layout
            else:
                t.register_hook(self._make_grad_hook(idx, key[3], rec))

    # -- functional operations ------------------------------------------------------------------------
    def _on_op(self, owner: str, rel: Relation, spec: OpSpec, out: torch.Tensor | None, logits) -> None:
        """A functional activation or attention computation seen by the observer (a sampled pass)."""
        self._ops_found = True
        rec = self._rec
        if rec is None or rec.forward_done or self._replaying:
            return
        own = self._index_of_name.get(owner)
        if spec.role == Role.ATTENTION and own is not None and self.layers[own].kind == Kind.ATTENTION:
            idx = own  # nn.MultiheadAttention: its attention goes to its own row, its output hook measures it
        else:
            idx = self._site(owner, rel, spec)
            if out is not None and rec.fwd.get(idx) is None:
                self._record(rec, idx, self.layers[idx], out)
                rec.site_calls.setdefault((owner, rel.value, spec.label), []).append((idx, out.grad_fn))
        if logits is not None and idx not in rec.attn:
            with torch.no_grad():
                rec.attn[idx] = attention_stats(logits)
            if self.layers[idx].order is None:
                self.layers[idx].order = self._next_order
                self._next_order += 1

    def _on_dropout(self, owner: str, rate: float, inside: bool) -> None:
        """A functional dropout seen by the observer (a sampled pass): the share it drops, for ``owner`` (inside
        its forward, or on its output)."""
        rec = self._rec
        if rec is not None and not rec.forward_done and not self._replaying:
            self._ops_found = True  # the function mode runs on every sampled pass from now on: a rate may change
            rec.dropout[owner] = max(rec.dropout.get(owner, 0.0), rate)
            if inside and owner not in self._dropout_inside:
                self._dropout_inside.add(owner)
                self.trace.meta["dropout_inside"] = sorted(self._dropout_inside)

    MAX_DROPOUT_ROWS = 64  # per place: the rates a schedule of the dropout goes through, as sampled

    def _note_dropouts(self, rec: _StepRecord) -> None:
        """Into the trace's meta (``dropout``): per place, [step, the most its dropouts drop in training] from
        the first sampled pass and wherever that share changed since."""
        for name, m, idx in self._dropouts:
            if idx in rec.fwd:  # it ran (and changed its input) in this pass
                rec.dropout[name] = max(rec.dropout.get(name, 0.0), float(m.p) if m.training else 0.0)
        table = self.trace.meta.setdefault("dropout", {}) if rec.dropout else None
        for owner, rate in rec.dropout.items():
            rows = table.setdefault(owner, [])
            if (not rows or rows[-1][1] != rate) and len(rows) < self.MAX_DROPOUT_ROWS:
                rows.append([int(self.step), rate])

    MAX_NORM_ROWS = 16  # per batch normalisation: its latest readings

    def _note_norm_values(self, rec: _StepRecord) -> None:
        """Into the trace's meta (``norm_values``): per batch normalisation that ran on the batch's statistics,
        the number of values each channel's mean and variance were taken over (batch x positions), latest
        readings last."""
        if not rec.norm_values:
            return
        table = self.trace.meta.setdefault("norm_values", {})
        for name, n in rec.norm_values.items():
            rows = table.setdefault(name, [])
            rows.append(int(n))
            del rows[:-self.MAX_NORM_ROWS]

    def _find_loops(self, rec: _StepRecord) -> None:
        """The forward pass is over: calls of one functional operation in one place that make a loop, each reading
        what the same call one iteration back made, a few operations away (a recurrence written by hand, layers
        stacked in a ``for``), ``follow`` that call (``extra``). An iteration may call the operation several
        times (a GRU's update and reset gates): the loop's period (``_loop_period``), found once, on a pass
        whose calls all have an autograd node. Each site is looked at once."""
        for group, calls in rec.site_calls.items():
            if len(calls) < 2:
                continue
            k = self._loop_period.get(group)
            if k is None:
                if any(node is None for _, node in calls):
                    continue  # (a pass with parts frozen or out of the graph: looked at again on a later pass)
                k = _loop_period(calls)
                if k is None and len(calls) <= 2 * LOOP_PERIOD_MAX:
                    continue  # (too few calls to tell yet: looked at again on a later pass)
                k = self._loop_period[group] = k or 0
            for n in range(k, len(calls) if k else 0):
                idx, node = calls[n]
                if idx in self._loop_seen:
                    continue
                self._loop_seen.add(idx)
                before = calls[n - k][1]
                if node is not None and before is not None and _reaches([f for f, _ in node.next_functions], before):
                    self.layers[idx].extra["follows"] = self.layers[calls[n - k][0]].name

    def _site(self, owner: str, rel: Relation, spec: OpSpec) -> int:
        """The row of the ``n``-th call of ``spec`` attributed to ``owner`` within one call of it (a cell
        called once per time step repeats the same operations: the same rows), made on first sight."""
        count = (owner, spec.label, self._tracker.calls.get(owner, 0))
        n = self._pass_ops.get(count, 0)
        self._pass_ops[count] = n + 1
        key = (owner, rel.value, spec.label, n)
        idx = self._sites.get(key)
        if idx is not None:
            return idx
        base = f"{owner or '(model)'}:{spec.label.rsplit('.', 1)[-1]}"
        name, k = base, 2
        while name in self._index_of_name:
            name, k = f"{base}#{k}", k + 1
        src = self._index_of_name.get(owner)
        info = LayerInfo(index=len(self.layers), name=name, type_name=spec.label, kind=spec.kind, bounds=spec.bounds,
                         channels_first=src is not None and self.layers[src].channels_first,
                         extra={"owner": owner, "relation": rel.value, **({"through": True} if self._tracker.through
                                                                           and rel == Relation.AFTER else {})})
        self.trace.add_layers([info])  # the recorder's layer list is the trace's
        self._index_of_name[name] = info.index
        self._sites[key] = info.index
        self._no_params = np.append(self._no_params, info.index)
        return info.index

    def _make_grad_hook(self, idx: int, unit_dim: int | None, rec: _StepRecord):
        def hook(g):
            if g is not None and rec.grad.get(idx) is None:
                if g.numel() <= BATCH_NUMEL:
                    key = (tuple(g.shape), g.dtype, g.device, unit_dim)
                    rec.grad_small.setdefault(key, []).append((idx, g.detach().clone()))
                    rec.grad[idx] = True
                else:
                    rec.grad[idx] = grad_stats(g, unit_dim)
            return None
        return hook

    def _make_output_grad_hook(self, i: int):
        def hook(g):
            if i < len(self._out_grads):
                self._out_grads[i] = g
            self._backward_began()
            return None
        return hook

    def _backward_began(self) -> None:
        """A gradient reached an output of the pass: its end is called once, when the backward pass is over."""
        if not self._backward_queued:
            self._backward_queued = True
            _queue_backward_callback(self._on_backward_end)

    _carry_sentinel: torch.Tensor | None = None  # the weight the check reads

    _sentinel_reached = False  # a gradient reached the first trainable weight since the last optimizer step
    _explicit_ended = False    # a pass begun by begin_pass ended its forward since the last optimizer step

    def _on_sentinel_grad(self, g):
        self._sentinel_reached = True
        if self._stepped:
            self._stepped = False
            self._check_carried()
        return None

    def _check_carried(self) -> None:
        """The first gradient since an optimizer step reaches the first layer's smallest weight, before it is
        added to what that weight holds: does it still hold one (no zero_grad)? Read there, not as the backward
        pass begins: a pass that does not reach it (a GAN's discriminator loss, before the generator's gradients
        are cleared) says nothing of it. ``zero_grad()`` leaves None (free to see); a gradient left in place is
        read, on the CPU, or on a sampled step that reads back its statistics anyway. Counted in the trace's
        meta as (checked, carried)."""
        if self._carry_sentinel is None:
            return
        g = self._carry_sentinel.grad
        if g is None:
            carried = False
        elif g.device.type == "cpu" or self._rec is not None:
            carried = bool(g.detach().ne(0).any())
        else:
            return
        checked, was = self.trace.meta.get("gradients_carried", (0, 0))
        self.trace.meta["gradients_carried"] = (checked + 1, was + int(carried))

    def _cleared(self) -> bool | None:
        """A backward pass fed the model's weights gradients, and the optimizer is about to step with none on
        them: they were cleared in between (``zero_grad()`` after ``loss.backward()``, or ``step()`` before
        ``backward()``). Seen as gradients set to None (``zero_grad()``'s default), at the cost of one
        attribute read a step; gradients zeroed in place are not told apart from gradients that are zero (a
        dead output, a loss whose gradient is 0), so they are not read. None: not known on this step."""
        if not self._sentinels or self._sentinels[0].grad is not None or not self._fed:
            return None if not self._sentinels or not self._fed else False
        return all(p.grad is None for p in self._sentinels)

    # -- backward / optimizer -----------------------------------------------------------------------
    def _on_backward_end(self) -> None:
        if not self.attached:
            return
        if self._part_open:
            self._close_parts()
        self.passes += 1
        self._awaiting = True
        # a backward pass ends outside any optimizer step (or in a closure's, which the step's own end closes):
        # a step that an exception left unfinished no longer counts as one in progress
        self._step_depth = 0
        if self.step == 0 and self.optimizer is not None:  # backward passes, and the optimizer never stepped
            self.trace.meta["unstepped_passes"] = self.passes
        if self.scaler is not None:
            self._round = getattr(self.scaler, "_per_optimizer_states", None)
        level = self._grad_level()
        if level is not None and not level[0]:
            self._nonfinite_pass()
        elif level is not None and self._grad_spikes(level[1]) and self.schedule.burst(self.step):
            # a gradient spike between sampled steps: this step's updates are measured, and the next steps
            self._sample_now = True
            if self._rec is None:
                self._rec = _StepRecord()
                self._rec.forward_done = True
                # the pass's forward ran unsampled; its input is still held (for a replay): a batch out of
                # scale, the usual reason for such a spike, is read now
                x = _sample_input(self._last_inputs) if self._last_inputs is not None else None
                if x is not None:
                    self._rec.input = input_stats(x)
        if self._rec is not None:
            self._read_param_grads(self._rec)
            self._read_classes()
            self._read_floor()
            self._read_blocked()
            if self._leak_tries:
                self._read_next_tokens()
            if self._padding_tries:
                self._read_padding()
            if self._order_tries and self._rec.attn:
                self._read_order()
        if self.optimizer is None:
            self._backward_counted = True
            self._finish_step()

    _leak_tries = 4   # sampled passes whose output may still be read for next-token targets
    _padding_tries = 8  # sampled passes on which the loss may still be read for the padding it counts
    _order_tries = 4  # sampled passes with attention that may still replay a reordered sample
    _order_next = 0   # the step from which the next one may

    def _read_order(self) -> None:
        """A model that ran attention over a batch of tokens and outputs one row per sample (a sequence
        classifier): does its output change when the order of a sample's tokens does (``order.sees_order``)?
        Into the trace's meta as ``order_blind`` = {"step", "positions"} when it does not; read again later
        (from 4x its step + 16 on, a few times), since positions that start at zero (a position embedding
        initialised to zeros) are learned in the first steps, and dropped if the order is seen then. A pass
        driven from outside the model's forward, a compiled model or a run already non-finite is not
        replayed."""
        outs = self._out_leaves
        if (len(outs) != 1 or outs[0].dim() != 2 or self._last_inputs is None or self._replay_run is not None
                or self.compiled or self.trace.nonfinite is not None or self._pass_step < self._order_next):
            return
        args, kwargs = self._last_inputs
        ids = order.token_ids(args, kwargs, int(outs[0].shape[0]))
        if ids is None:
            return
        self._order_tries -= 1
        sees = self._replay(order.sees_order, distributed.unwrap(self.inner), ids, args, kwargs, self._autocast)
        if sees:
            self._order_tries = 0
            self.trace.meta.pop("order_blind", None)
        elif sees is not None:
            self.trace.meta["order_blind"] = {"step": int(self._pass_step), "positions": int(ids.shape[1])}
            self._order_next = 4 * int(self._pass_step) + 16

    def _replay(self, probe: Callable, *args):
        """``probe(*args)``, a replay of a pass on a copy of the model, with the hooks told so; None when the
        model cannot be replayed that way (nothing is said of it then)."""
        self._replaying = True
        try:
            return probe(*args)
        except Exception:  # noqa: BLE001 - a model that cannot be replayed this way: nothing is said of it
            return None
        finally:
            self._replaying = False

    def _position_grad(self) -> torch.Tensor | None:
        """The output's gradient with a row per position (batch, length, classes), when the pass has one."""
        return next((g for g in self._out_grads if g is not None and g.dim() == 3 and g.shape[-1] >= 2), None)

    def _read_next_tokens(self) -> None:
        """A model whose output has a row per position of a token input (batch, length, vocabulary): are the
        targets the next input tokens (``leak.next_token_share``)? If so, once, does a position's output see
        the tokens after it (``leak.sees_ahead``)? Into the trace's meta as ``next_token`` = {"step", "share",
        "positions", "sees_ahead", "layer": the first module that does, "ahead_by": 1, or 2 when the targets
        are the token after the next one (labels shifted twice), 0 when they are the position's own token and the
        model reads no token after it (labels not shifted, under a causal model)}. A pass driven from outside the
        model's forward, a compiled model or a run already non-finite is not replayed; a model whose replay fails
        is left alone."""
        g = self._position_grad()
        if g is None or self._last_inputs is None or self._replay_run is not None or self.compiled:
            return
        args, kwargs = self._last_inputs
        inputs = leak.token_inputs(args, kwargs, int(g.shape[0]), int(g.shape[1]))
        if not inputs:
            return
        self._leak_tries -= 1
        try:
            # of a model fed two token inputs (a source, and the target shifted), the one the targets follow
            reads = [(r, ids) for ids in inputs if (r := leak.next_token_share(ids, g)) is not None]
        except Exception:  # noqa: BLE001 - a gradient this way cannot be read (a sharded vocabulary): not again
            self._leak_tries = 0
            return
        if not reads:
            return
        read, ids = max(reads, key=lambda r: r[0][0])
        self._leak_tries = 0
        share, positions, ahead_by = read
        if share < self._next_token_share or self.trace.nonfinite is not None:
            return
        # the first sample's positions the loss reads: its gradient there is not all zero (not an ignore_index)
        carries = g[0].detach().ne(0).any(dim=-1)
        ahead = self._replay(leak.sees_ahead, distributed.unwrap(self.inner), ids, args, kwargs, self._autocast,
                             carries)
        if ahead_by == 0 and (ahead is None or ahead[0] or not ahead[2]):
            # targets that are the inputs themselves, of a model that reads ahead (an autoencoder's), or a tensor
            # of the targets handed to the model (labels=, a target it shifts itself): no input it reads
            return
        if ahead is not None or ahead_by == 2:
            sees, layer = ahead[:2] if ahead is not None else (False, "")
            self.trace.meta["next_token"] = {"step": int(self._pass_step), "share": share, "positions": positions,
                                             "sees_ahead": sees, "layer": layer, "ahead_by": ahead_by}

    _class_kind: tuple = (None, None, False)  # (the loss paths, what they say of the targets, other terms added)
    MAX_CLASS_ROWS = 512  # sampled batches whose classes are kept; past it, every other one is dropped
    MAX_FACTORS = 64      # the latest readings of the loss's gradient scale kept

    def _read_classes(self) -> None:
        """The classes of a sampled batch, read off the gradient at the model's output (targets are not the
        model's input, and the loss's saved targets are freed by the backward pass; see
        ``losspath.classes_from_gradient``: a hard target's row only). Kept in the trace's meta as [step,
        classes, counts]. Only for a loss taken of the model's output as a classification (``_class_loss``)
        of one output whose rows are the input's samples (not a sequence's positions)."""
        paths = self.trace.meta.get("loss_paths")
        if self._class_kind[0] is not paths:
            self._class_kind = (paths, _class_loss(paths), losspath.added_terms(paths))
        kind = self._class_kind[1]
        if kind is None or len(self._out_grads) != 1 or self._last_inputs is None:
            return
        g = self._out_grads[0]
        rows = _batch_rows(self._last_inputs)
        if g is None or rows is None or g.dim() == 0 or g.shape[0] != rows or rows < 2:
            return
        out = self._out_leaves[0] if len(self._out_leaves) == 1 else None
        if out is None or out.shape != g.shape:
            return
        read = losspath.classes_from_gradient(kind, g, out, term=self._class_kind[2])
        if read is None:
            return
        cls, scale, term = read
        with torch.no_grad():
            counts = torch.bincount(cls) if cls.numel() else cls
            present = torch.nonzero(counts).flatten()
            # (one transfer: the classes present, their counts, the scale, the classification term and the
            # batch's fingerprint)
            values = torch.cat([present.float(), counts[present].float(), scale.float().reshape(1),
                                term.float().reshape(1),
                                _fingerprint(self._last_inputs, g.device).float().reshape(1)]).tolist()
        k = (len(values) - 3) // 2
        found, n, scale_read = [int(v) for v in values[:k]], [int(v) for v in values[k:2 * k]], values[-3]
        fingerprint, term_read = values[-1], values[-2]
        if self._class_kind[2] and math.isfinite(term_read):
            # a loss that adds other terms to its classification (a penalty, an auxiliary loss): that term alone
            terms = self.trace.meta.setdefault("class_term", [])
            if len(terms) >= self.MAX_CLASS_ROWS:
                del terms[1::2]
            terms.append([int(self._pass_step), float(term_read)])
        # the loss's gradient per row against a mean's (1/N); a scaler the session knows has its scale in it
        if math.isfinite(scale_read) and scale_read > 0 and self.scaler is None:
            factors = self.trace.meta.setdefault("loss_gradient_factor", [])
            factors.append(float(scale_read * rows))
            del factors[:-self.MAX_FACTORS]
        if not found:
            return
        table = self.trace.meta.setdefault("batch_classes", [])
        if len(table) >= self.MAX_CLASS_ROWS:
            del table[1::2]
        table.append([int(self._pass_step), found, n, float(fingerprint)])

    # (the loss paths, what they take of the output's rows: "log_softmax" (a cross-entropy), "logits" or
    # "probabilities" (a binary cross-entropy of a softmax, in the loss or the model), "" (none of these))
    _floor_kind: tuple = (None, "")

    def _read_floor(self) -> None:
        """For a loss taken of a log-softmax over the output's classes (dimension 1) and nothing else of the
        output (a cross-entropy, with or without label smoothing or soft targets), what its targets are, read
        off the output's gradient (``losspath.read_targets``): the least the loss can reach, the mean entropy of
        its targets, kept in the trace's meta as ``loss_floor`` [[step, entropy, classes], ...] where the
        gradient reads as a distribution per row; or, as ``target_count`` [[step, mean targets per row, share
        of rows with several], ...], targets that mark several classes in a row (multi-hot labels). For a
        binary cross-entropy of a softmax over the rows (``losspath.read_bce_targets``), the same count, and
        ``target_loss`` = "bce_softmax" in the meta."""
        paths = self.trace.meta.get("loss_paths")
        if self._floor_kind[0] is not paths:
            ends = [[op for op in path if op.split("@")[0] not in losspath.SHAPE_OPS][-2:] for path in paths or []]
            log_softmax = bool(ends) and all(len(e) == 2 and e[0] == "LogSoftmax" for e in ends) and all(
                losspath.rows_kept(path) for path in paths or [])
            self._floor_kind = (paths, "log_softmax" if log_softmax else losspath.bce_of_softmax(paths))
        kind = self._floor_kind[1]
        if not kind or len(self._out_grads) != 1 or len(self._out_leaves) != 1:
            return
        g, out = self._out_grads[0], self._out_leaves[0]
        if g is None or out is None or g.dim() != 2 or out.shape != g.shape:
            return
        if kind == "log_softmax":
            floor, count, several = losspath.read_targets(g, out).tolist()
        else:
            floor, n = math.nan, 1 if losspath.summed(paths) else g.numel()
            count, several = losspath.read_bce_targets(g, out, kind == "logits", n).tolist()
            if math.isfinite(count):
                self.trace.meta["target_loss"] = "bce_softmax"
        for key, row in (("loss_floor", [int(self._pass_step), floor, int(g.shape[1])]),
                         ("target_count", [int(self._pass_step), count, several])):
            if math.isfinite(row[1]):
                rows = self.trace.meta.setdefault(key, [])
                if len(rows) >= self.MAX_CLASS_ROWS:
                    del rows[1::2]
                rows.append(row)

    _bound_kind: tuple = (None, None)  # (the loss paths, the bounds of the output they say a regression is of)
    MAX_BLOCKED = 64  # the latest readings of the share of the output's gradient that its bound blocks

    def _read_padding(self) -> None:
        """A model given an ``attention_mask`` (batch, length) by keyword, whose output has a row per position of
        the token input the mask belongs to (batch, length, classes), as a language model's: the share of the
        positions the loss reads (their gradient is not all zero) where the mask is 0, the padding (labels that
        keep the pad token instead of -100). Into the trace's meta as ``padding_counted`` = [[step, share,
        positions read], ...] for the sampled passes that have padding. The output is taken to be that input's
        only where its targets are that input's next tokens (``leak.next_token_share``, one or two ahead): a
        decoder's output of the same length as its encoder's masked input is not, even where its targets are
        that input's own tokens. A mask given by position, or as floats, is not read."""
        g = self._position_grad()
        if g is None or self._last_inputs is None:
            return
        args, kwargs = self._last_inputs
        mask = kwargs.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.shape != g.shape[:2] or mask.is_floating_point():
            return
        ids = kwargs.get("input_ids")
        if not isinstance(ids, torch.Tensor) or ids.shape != mask.shape:
            inputs = [t for t in leak.token_inputs(args, kwargs, int(g.shape[0]), int(g.shape[1])) if t is not mask]
            ids = inputs[0] if len(inputs) == 1 else None
        self._padding_tries -= 1
        try:
            read = leak.next_token_share(ids, g) if ids is not None else None
        except Exception:  # noqa: BLE001 - a gradient this way cannot be read (a sharded vocabulary): not again
            self._padding_tries = 0
            return
        if read is None or read[0] < self._next_token_share or read[2] == 0:
            return  # an output that is not this input's next tokens: the mask may be another input's
        with torch.no_grad():
            pad = mask.to(g.device) == 0
            read = g.detach().ne(0).any(dim=-1)
            values = torch.stack([pad.sum(), read.sum(), (read & pad).sum()]).tolist()  # one transfer
        padded, n, counted = (int(v) for v in values)
        if padded and n:
            rows = self.trace.meta.setdefault("padding_counted", [])
            rows.append([int(self._pass_step), counted / n, n])

    def _read_blocked(self) -> None:
        """For a regression loss of an output a bounded activation makes (``losspath.regression_bound``: a
        ReLU, softplus, sigmoid or tanh last): the share of the squared gradient at the output that sits on
        entries at a bound the loss pushes past (a ReLU's 0 where the gradient would take it below), which no
        step can move. For a squared error that is the share of the loss on targets the output cannot reach.
        Kept in the trace's meta as ``output_blocked`` [[step, share], ...]."""
        paths = self.trace.meta.get("loss_paths")
        if self._bound_kind[0] is not paths:
            self._bound_kind = (paths, losspath.regression_bound(paths, str(self.trace.meta.get("output_op") or "")))
        bound = self._bound_kind[1]
        if bound is None or len(self._out_grads) != 1 or len(self._out_leaves) != 1:
            return
        g, out = self._out_grads[0], self._out_leaves[0]
        # the output itself made by the activation (one applied in the loss, to an output of a view, or a loss
        # returned as the output, bounds what the loss sees, not what is read here)
        if g is None or g.shape != out.shape or not out.dim() or losspath.made_by(out.grad_fn) != bound[0]:
            return
        _, lo, hi = bound
        # a bound is reached within the margin a bounded layer counts as saturated; a softplus never reaches 0
        margin = SATURATION_MARGIN * ((hi - lo) if math.isfinite(hi) else 1.0)
        with torch.no_grad():
            y, g = out.detach().float(), g.detach().float()
            pushed = ((y <= lo + margin) & (g > 0)) | ((y >= hi - margin) & (g < 0))
            g2 = g * g
            total = g2.sum()
            share = float(torch.where(total > 0, (g2 * pushed).sum() / total, torch.nan))
        if math.isfinite(share):
            table = self.trace.meta.setdefault("output_blocked", [])
            table.append([int(self._pass_step), share])
            del table[:-self.MAX_BLOCKED]

    def read_gradients(self) -> None:
        """Measure the parameter gradients as they are now, for the step in progress."""
        if self.attached and self._rec is not None:
            self._read_param_grads(self._rec)
            # read after the scaler's unscale_ (or with no scaler known yet, as they are): the weights' gradients
            # are not divided by its scale again should one be found later in the step
            self._rec.unscaled = self.scaler is None or self._unscaled()

    def _unscaled(self) -> bool:
        """The GradScaler watched has unscaled the optimizer's gradients for the step in progress."""
        states = getattr(self.scaler, "_per_optimizer_states", None) if self.scaler is not None else None
        state = states.get(id(self.optimizer)) if isinstance(states, dict) and self.optimizer is not None else None
        stage = state.get("stage") if isinstance(state, dict) else None
        return getattr(stage, "name", "") == "UNSCALED"

    def _read_param_grads(self, rec: _StepRecord) -> None:
        """Per-layer weight and gradient norms of a sampled step. Every read replaces the last one, so
        under gradient accumulation the step keeps the gradient of its whole window."""
        if not self._params:
            return
        n = len(self.layers)
        w = self._pnorms.weights(n) if rec.params is None else rec.params[0]
        gn = self._pnorms.grads(n)
        upd = torch.full_like(w, float("nan")) if rec.params is None else rec.params[2]
        rec.params = torch.stack([w, gn.to(w.device), upd])

    _fed = False  # the last backward pass left a gradient on a layer's smallest parameter
    _origin: tuple | None = None  # (the weights' first snapshot, their per-layer norms then)
    _moved_next = 0  # the step from which the distance from that snapshot is read again

    def _grad_level(self) -> tuple[bool, float] | None:
        """The every-step check, over the output's gradient and each layer's smallest parameter's: whether
        all are finite, and their norm (for spikes), read back to the host together (the only per-step
        sync). None when nothing was checked."""
        checked = [g for g in [p.grad for p in self._sentinels] if g is not None]
        self._fed = bool(checked)
        checked += [g for g in self._out_grads if g is not None]
        return finite_norm(checked) if checked else None

    def _nonfinite_pass(self) -> None:
        """NaN/Inf in this pass's gradients. Whether it is a fault shows later: the optimizer steps on them,
        or the next pass starts without a step (skipped, as a GradScaler does). Either way the pass is
        replayed then, before any update, with the weights it ran with."""
        self._bad_pass = True
        if self.optimizer is None or self._in_step:  # no step to wait for, or inside it (a closure): applied
            self._commit_nonfinite()

    def _locate(self) -> NonFiniteOrigin:
        args, kwargs = self._last_inputs if self._last_inputs is not None else ((), {})
        self._replaying = True
        try:
            run = self._replay_run
            grads = run.grads if isinstance(run, _PartsReplay) else self._out_grads
            return nanhunt.locate(self.inner, args, kwargs, self._rng_state, list(grads), self._pass_step,
                                  run=run, autocast=self._autocast)
        finally:
            self._replaying = False

    def _commit_nonfinite(self) -> None:
        """The NaN/Inf gradients are applied (the optimizer steps on them, or there is no optimizer): a fault."""
        if self.trace.nonfinite is None:
            self.trace.nonfinite = self._locate()
            self._last_inputs = None
        self._bad_pass = False

    def _output_nonfinite(self) -> bool:
        outs = [t.detach() for t in self._out_leaves]
        return bool(outs) and not math.isfinite(float(max_abs(outs)))

    def _scaler_moved_on(self) -> bool:
        """The GradScaler's ``update()`` ran since the last backward pass (it replaces its per-step state)."""
        return self.scaler is not None and getattr(self.scaler, "_per_optimizer_states", None) is not self._round

    def _end_skipped_step(self) -> None:
        """The optimizer did not step on the last pass's NaN/Inf gradients: a skipped step, not counted.
        What its sampled forward pass showed is kept; its gradients (overflowed) are not."""
        scale = float("nan")
        if self.scaler is not None:  # the scale the step overflowed at, before the scaler's backoff
            try:
                scale = float(self.scaler.get_scale()) / float(self.scaler.get_backoff_factor())
            except (AttributeError, TypeError, ValueError, ZeroDivisionError):
                pass
        # where the NaN/Inf comes from: located for the first skipped step, and again when a later one has a
        # forward pass that overflows while the one located did not (calibrating scalers overflow backward)
        first = self.trace.overflow
        if first is None or (first.phase != "forward" and self._output_nonfinite()):
            self.trace.overflow = self._locate()
        self.trace.add_skipped(self.step, scale)
        self._bad_pass, self._awaiting = False, False
        self._stop_observer()
        rec, self._rec = self._rec, None
        if rec is not None:
            rec.grad.clear()
            rec.grad_small.clear()
            rec.grad_kept = []
            rec.params, rec.prev_params = None, None
            self._flush(rec, scale=None)
        self.schedule.step_done(self.step, sampled=rec is not None)
        self._sample_now = self.schedule.should_sample(self.step)
        self._out_grads = []
        self._out_leaves = []

    def _on_optimizer_pre(self, optimizer, args, kwargs):
        if self._adopted_step:
            return None
        self._step_depth += 1
        if self._step_depth > 1:  # a subclass's step calling its parent's, both hooked: one step
            return None
        if self._bad_pass:
            self._commit_nonfinite()
        self._in_step = True
        if self._rec is None and self._sample_now:  # the step's forward runs inside optimizer.step (a closure)
            self._rec = _StepRecord()
        cleared = None
        if self._awaiting and self._trains:
            cleared = self._cleared()
            if cleared is not None:  # counted as (checked, cleared)
                checked, was = self.trace.meta.get("steps_cleared", (0, 0))
                self.trace.meta["steps_cleared"] = (checked + 1, was + int(cleared))
        rec = self._rec
        if rec is not None and (self.scaler is None or self._scaler_found):
            self._find_scaler()
        if rec is not None and self._params and not cleared:  # a step on no gradients is no update to measure
            rec.prev_params = self._pnorms.snapshot()
            if self._origin is None:  # where the weights start: kept to measure how far they go (``_note_moved``)
                n = len(self.layers)
                self._origin = (rec.prev_params, self._pnorms.weights(n) if rec.params is None else rec.params[0])
            if rec.params is not None and self._clip_read_now():  # read at backward end: clipped since?
                rec.stepped = self._pnorms.grads(len(self.layers))
        return None

    _scaler_found = False  # the GradScaler watched was found stepping the optimizer, not given

    def _find_scaler(self) -> None:
        """A GradScaler none was given for, whose ``step`` calls the optimizer's (a caller of this hook, a few
        frames up), is watched from this sampled step on as if it had been given: the gradients it scaled are
        read back at the loss's scale (a clip before its ``unscale_`` then shows for what it is), and the steps it
        skips are known. Looked for on every sampled step (a scaler made again, each epoch, replaces the one
        found)."""
        frame = sys._getframe(2)
        for _ in range(_SCALER_DEPTH):
            if frame is None:
                return
            found = frame.f_locals.get("self") if frame.f_code.co_name in ("step", "_maybe_opt_step") else None
            if isinstance(found, torch.amp.GradScaler) and found.is_enabled():
                if found is not self.scaler:
                    self.scaler, self._scaler_found = found, True
                    # the loss's gradient read so far carried its unknown scale: not the loss's own
                    self.trace.meta.pop("loss_gradient_factor", None)
                return
            frame = frame.f_back

    def _grads_held(self) -> bool:
        """A step none of whose passes the hooks saw end still found gradients that are not all zero on the
        model's weights (their layers' smallest parameters): a backward pass reached them through modules of
        the model called on their own (a container whose own forward never runs, as a GAN's holding both
        networks). Read only on such steps (one transfer)."""
        grads = [p.grad for p in self._sentinels if p.grad is not None]
        if not grads:
            return False
        with torch.no_grad():
            tops = torch.stack([g.detach().abs().amax().float().to(grads[0].device) for g in grads])
            return bool(tops.gt(0).any())

    def _on_optimizer_post(self, optimizer, args, kwargs):
        if self._adopted_step:
            self._adopted_step = False
            return
        self._step_depth = max(self._step_depth - 1, 0)
        if self._step_depth:
            return
        self._in_step = False
        self._stepped = True
        # a pass a trainer ended with its loss (``end_forward``) ends its backward whether or not the loss reached
        # the model; the first trainable weight's gradient hook says whether one did, and where it did not, a
        # step on weights none of which holds a gradient at all (no value read) had none reach them (a loss
        # rebuilt from .item() with requires_grad=True)
        if (self._explicit_ended and not self._sentinel_reached and self._awaiting and self._trains
                and all(p.grad is None for p in self._sentinels)):
            self.trace.meta["steps_unreached"] = self.trace.meta.get("steps_unreached", 0) + 1
        if not self._awaiting and self._trains:
            if not self._grads_held():  # no backward pass reached the model since the last step
                self.trace.meta["steps_unreached"] = self.trace.meta.get("steps_unreached", 0) + 1
            elif not self._began and not self.passes and not self._parts and not self.compiled:
                # one did, through children of the model called on their own: passes begin at them from now on
                self._watch_parts()
        self._explicit_ended = self._sentinel_reached = False
        rec = self._rec
        if rec is not None and (id(optimizer), len(optimizer.param_groups)) != self._left_out_groups:
            self._note_left_out(optimizer)
        elif rec is not None and self._left_out_kept:
            self._drop_moved_left_out()
        if rec is not None and rec.prev_params is not None:
            n = len(self.layers)
            upd = self._pnorms.updates(rec.prev_params, n)
            if rec.params is None:
                nan = torch.full_like(upd, float("nan"))
                rec.params = torch.stack([self._pnorms.weights(n).to(upd.device), nan, nan])
            rec.params[2] = upd.to(rec.params.device)
            rec.prev_params = None
            if self._origin is not None and self.step >= self._moved_next:
                # read again at sampled steps a growing share of the run apart (a quarter: a few dozen reads in a
                # long run), and once more when watching stops
                self._moved_next = self.step + max(self.step // 4, 1)
                try:
                    rec.moved = self._moved(n)
                except RuntimeError:  # the weights moved to another device since the first read: no more reads
                    self._moved_next = 1 << 62
            if self._pnorms.unchanged is not None and self._pnorms.narrow_read:  # read with the step's statistics
                rec.unchanged = self._pnorms.unchanged.float() / self._pnorms.narrow_read
        self._finish_step()

    _left_out_groups: tuple = ()  # the optimizer and its group count when ``_note_left_out`` last read them
    _left_out_kept: list = []     # [(module, name, parameter, its norm then)] of those found left out

    def _note_left_out(self, optimizer) -> None:
        """The parameters that require a gradient and that no group of the optimizer holds, of the modules
        whose other parameters it does hold (meta ``left_out``: {module: [names]}), and the modules it holds none
        of (meta ``unheld``): read on a sampled step,
        again whenever the optimizer or its groups change (``add_param_group``). Such a layer moves (its bias is
        stepped while its weight is left out), so only this tells that part of it stands still; a layer left
        out whole shows in its updates. One that moves between sampled steps all the same is stepped by
        another optimizer (weights and biases split between two) and is dropped (``_drop_moved_left_out``)."""
        self._left_out_groups = (id(optimizer), len(optimizer.param_groups))
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        left: dict[str, list[tuple[str, torch.Tensor]]] = {}
        held: set[str] = set()
        for name, p in self.inner.named_parameters():
            module, _, short = name.rpartition(".")
            if id(p) in owned:
                held.add(module)
            elif p.requires_grad:
                left.setdefault(module, []).append((short, p))
        kept = [(module, short, p) for module, items in left.items() if module in held for short, p in items]
        with torch.no_grad():
            self._left_out_kept = [(module, short, p, p.detach().float().norm()) for module, short, p in kept]
        self._write_left_out()
        # modules none of whose parameters a group holds: their updates tell whether they stand still (one
        # another optimizer steps moves), so only their names are kept (meta ``unheld``)
        whole = sorted(module for module in left if module not in held)
        if whole:
            self.trace.meta["unheld"] = whole
        else:
            self.trace.meta.pop("unheld", None)

    def _drop_moved_left_out(self) -> None:
        """Parameters found left out whose values changed since they were read: another optimizer steps them."""
        with torch.no_grad():
            now = torch.stack([p.detach().float().norm().to(n0.device) for _, _, p, n0 in self._left_out_kept])
            moved = (now != torch.stack([n0 for *_, n0 in self._left_out_kept])).tolist()  # one transfer
        if any(moved):
            self._left_out_kept = [k for k, m in zip(self._left_out_kept, moved) if not m]
            self._write_left_out()

    def _write_left_out(self) -> None:
        out: dict[str, list[str]] = {}
        for module, short, _, _ in self._left_out_kept:
            out.setdefault(module, []).append(short)
        if out:
            self.trace.meta["left_out"] = out
        else:
            self.trace.meta.pop("left_out", None)

    # -- step end ----------------------------------------------------------------------------------
    _mixing_tries = 3  # sampled steps on which a replay of the pass is tried, to see samples mixed

    def _check_mixing(self) -> None:
        """Once a run, on a sampled step: does one sample's output reach the other samples' inputs (a module
        fed another layout than it expects, see ``mixing``)? Into the trace's meta (``batch_mixing``). A pass
        driven from outside the model's forward, a compiled model or a run already non-finite is not
        replayed; a model whose replay fails is left alone (its training is not disturbed)."""
        self._mixing_tries -= 1
        if (self._last_inputs is None or self._replay_run is not None or self.compiled
                or self.trace.nonfinite is not None):
            return
        args, kwargs = self._last_inputs
        base = distributed.unwrap(self.inner)
        names = {id(m): name for name, m in base.named_modules()}
        found = self._replay(mixing.probe, base, [names[id(m)] for m in self.modules if id(m) in names], args,
                             kwargs, self._autocast)
        if found is not None:
            self.trace.meta["batch_mixing"] = {"step": int(self._pass_step), **found}
            self._mixing_tries = 0

    def _finish_step(self) -> None:
        self._awaiting = False
        self._began = False
        rec, self._rec = self._rec, None
        if rec is not None:
            self._flush(rec)
            if self._mixing_tries and self.step >= 1:
                self._check_mixing()
        schedule = self.schedule
        schedule.step_done(self.step, rec is not None)
        self.step += 1
        self._sample_now = schedule.should_sample(self.step)
        self._out_grads = []
        self._out_leaves = []
        if self.after_step is not None:
            self.after_step()
        if self.on_step is not None and self.throttle.ready():
            self.on_step()

    def _flush(self, rec: _StepRecord, scale: torch.Tensor | None | bool = True) -> None:
        """Move one sampled step's statistics to the host in a single transfer (with the GradScaler's
        scale, when one is given and ``scale`` is not None: the gradients are divided by it)."""
        self._check_outside()
        self._check_unregistered()
        if scale is True:
            scale = getattr(self.scaler, "_scale", None) if self.scaler is not None else None
        fwd_idx, fwd_parts = self._rows(rec.fwd, rec.fwd_small,
                                        lambda x, key: forward_stats_batch(x, key[3], key[4], key[5]))
        for ids, stats in rec.fwd_rows:
            fwd_idx.extend(ids)
            fwd_parts.append(stats)
        grad = rec.grad
        for idx, t, key in rec.grad_kept:  # retained gradients, batched as the hooks' copies are
            g = t.grad
            if g is not None and grad.get(idx) is None:
                rec.grad_small.setdefault(key, []).append((idx, g))
                grad[idx] = True
        rec.grad_kept = []
        grad_idx, grad_parts = self._rows(rec.grad, rec.grad_small, lambda x, key: grad_stats_batch(x, key[3]))
        parts = fwd_parts + grad_parts
        attn_idx = list(rec.attn)
        parts += [rec.attn[i] for i in attn_idx]
        if rec.params is not None:
            parts.append(rec.params.reshape(-1))
        if rec.input is not None:
            parts.append(rec.input)
        if rec.stepped is not None:
            parts.append(rec.stepped)
        if rec.unchanged is not None:
            parts.append(rec.unchanged)
        if rec.moved is not None:
            parts.append(rec.moved)
        in_idx = list(rec.in_rms)
        if in_idx:
            parts.append(torch.stack([rec.in_rms[i].to(rec.in_rms[in_idx[0]].device) for i in in_idx]))
        if isinstance(scale, torch.Tensor):
            parts.append(scale.detach().reshape(-1)[:1].float())
        row = np.full((len(self.layers), N_STATS), np.nan, dtype=np.float32)
        g = np.full(len(GLOBAL_COLUMNS), np.nan, dtype=np.float32)
        if parts:
            dev = parts[0].device
            flat = torch.cat([p.reshape(-1).to(dev) for p in parts]).cpu().numpy()
            k = 0
            nf, ng = len(fwd_idx) * len(_ACT_COLS), len(grad_idx) * len(_GRAD_COLS)
            if fwd_idx:
                row[np.ix_(fwd_idx, _ACT_COLS)] = flat[k:k + nf].reshape(len(fwd_idx), -1)
            k += nf
            if grad_idx:
                row[np.ix_(grad_idx, _GRAD_COLS)] = flat[k:k + ng].reshape(len(grad_idx), -1)
            k += ng
            if attn_idx:
                row[np.ix_(attn_idx, _ATTN_COLS)] = flat[k:k + 2 * len(attn_idx)].reshape(len(attn_idx), 2)
            k += 2 * len(attn_idx)
            if rec.params is not None:
                n = rec.params.shape[1]
                row[:n, _PARAM_COLS] = flat[k:k + 3 * n].reshape(3, n).T
                k += 3 * n
            if rec.input is not None:
                g[1:5] = flat[k:k + 4]
                g[_SPREAD_COL] = flat[k + 4]
                k += 5
            stepped = None
            if rec.stepped is not None:
                stepped = flat[k:k + len(rec.stepped)]
                k += len(rec.stepped)
            if rec.unchanged is not None:
                kept = self.trace.meta.setdefault("updates_unchanged", [])
                kept.append([int(self.step), float(flat[k])])
                del kept[:-self.MAX_FACTORS]
                k += 1
            if rec.moved is not None:
                self._note_moved(flat[k:k + len(rec.moved)])
                k += len(rec.moved)
            if in_idx:
                row[in_idx, _IN_COL] = flat[k:k + len(in_idx)]
                k += len(in_idx)
            if isinstance(scale, torch.Tensor):
                g[_SCALE_COL] = flat[k]
                if flat[k] > 0:  # the gradients of a scaled loss, back to the loss's own scale
                    row[:, _SCALED_COLS[:1] if rec.unscaled else _SCALED_COLS] /= flat[k]
            if stepped is not None:
                self._note_clip(row[:, int(Stat.W_GRAD_NORM)], stepped)
        if rec.in_src:  # read from the layer whose output it is: its RMS, offset included
            dst = list(rec.in_src)
            with np.errstate(invalid="ignore"):
                rms = np.hypot(row[:, int(Stat.ACT_MEAN)], row[:, int(Stat.ACT_STD)])
                first = float(np.hypot(g[_INPUT_MEAN_COL], g[_INPUT_MEAN_COL + 1]))
            row[dst, _IN_COL] = [first if rec.in_src[i] < 0 else rms[rec.in_src[i]] for i in dst]
        row[np.ix_(self._no_params, _PARAM_COLS)] = np.nan
        if rec.dtype:
            idx = list(rec.dtype)
            limits = {d: dtype_max(d) for d in set(rec.dtype.values())}
            row[idx, int(Stat.ACT_RANGE)] = row[idx, int(Stat.ACT_ABSMAX)] / np.array(
                [limits[rec.dtype[i]] for i in idx], dtype=np.float32)
        g[0] = self._lr()
        self._note_lr_groups()
        self._note_dropouts(rec)
        self._note_norm_values(rec)
        self._note_lr_base()
        # backward passes per optimizer step so far, this one's included (more than one: gradient accumulation)
        self.trace.meta["passes_per_step"] = self.passes / (self.step + 1)
        self.trace.add_sample(self.step, row, g)
        self.flush_losses()
        if self._creeping is not None and rec.params is not None:
            with np.errstate(all="ignore"):
                ratios = row[:, int(Stat.W_UPDATE_NORM)] / row[:, int(Stat.W_NORM)]
            ratios = ratios[np.isfinite(ratios)]
            ratio = float(ratios.max()) if len(ratios) else math.nan
            if (ratio >= self._creeping and ratio > self._last_ratio
                    and self.schedule.burst(self.step + 1, reason="band")):
                self._sample_now = True
            if ratio == ratio:
                self._last_ratio = ratio

    CLIP_KEPT = 64  # sampled steps whose gradient norm before and after clipping are kept (the latest)
    CLIP_EVERY = 4  # one sampled step in this many reads the gradients again as the optimizer steps
    _clip_reads = 0

    def _moved(self, n: int) -> torch.Tensor:
        before, norm = self._origin  # type: ignore[misc]  # (read only once it is set)
        return self._pnorms.distance(before, n).to(norm.device) / norm

    def _note_moved(self, moved: np.ndarray) -> None:
        """How far each layer's weights are from where they started, over their norm then (the distance itself,
        where the sum of the update-to-weight ratios bounds it from above: steps that cancel do not add up),
        as last read: the trace's meta ``weights_moved`` = {"step", "layers": {name: share}}."""
        shares = {self.layers[i].name: float(v) for i, v in enumerate(moved) if math.isfinite(float(v))}
        if shares:
            self.trace.meta["weights_moved"] = {"step": int(self.step), "layers": shares}

    def _clip_read_now(self) -> bool:
        """Whether this sampled step reads the gradients' norms a second time, as the optimizer steps (the
        first sampled step, then one in ``CLIP_EVERY``): a clip acts on every step, so a few of them say it,
        and the reading costs about a tenth of what a sampled step adds on a model of small layers."""
        self._clip_reads += 1
        return self._clip_reads % self.CLIP_EVERY == 1

    def _note_clip(self, backward: np.ndarray, stepped: np.ndarray) -> None:
        """The gradients' whole norm at backward end (back at the loss's scale) and as the optimizer steps on
        them (after a ``clip_grad_norm_``/``clip_grad_value_``, and a GradScaler's unscale): into the trace's
        meta, ``grad_clip`` = [[norm at backward end, norm stepped on], ...] for the latest sampled steps."""
        with np.errstate(all="ignore"):
            before, after = float(np.sqrt(np.nansum(backward ** 2))), float(np.sqrt(np.nansum(stepped ** 2)))
        if not (before > 0 and math.isfinite(before) and math.isfinite(after)):
            return
        kept = self.trace.meta.setdefault("grad_clip", [])
        kept.append([before, after])
        del kept[:-self.CLIP_KEPT]

    @staticmethod
    def _rows(single: dict, small: dict, batch_fn) -> tuple[list[int], list[torch.Tensor]]:
        """Layer indices and their stats rows: reduced-at-once ones, then stacked same-shape groups."""
        idx = [i for i, v in single.items() if isinstance(v, torch.Tensor)]
        parts = [single[i].reshape(1, -1) for i in idx]
        for key, items in small.items():
            idx.extend(i for i, _ in items)
            parts.append(batch_fn(torch.stack([t for _, t in items]), key))
        return idx, parts

    _lr_moved = False  # the learning rate changed between two steps of this session

    def _watch_lr(self) -> None:
        """A learning rate that rises (x2 or more, e.g. a schedule) starts a burst of sampled steps: what
        a new learning rate does shows in its first steps."""
        groups = self.optimizer.param_groups if self.optimizer is not None else None
        raw = groups[0].get("lr") if groups else None
        if raw is self._seen_lr_value and type(raw) is float:
            return  # the very value of the last step: unchanged (a tensor may have changed in place)
        self._seen_lr_value = raw
        lr, seen = self._lr(sync=False), self._seen_lr
        self._seen_lr = lr
        if lr > 0 and seen > 0 and lr != seen:
            self._lr_moved = True
        if lr > 0 and seen > 0 and lr >= 2 * seen and self.schedule.burst(self.step):
            self._sample_now = True

    _group_layers: tuple = (None, ())  # (the optimizer's list of parameter groups, the layers each holds)

    def _note_lr_groups(self) -> None:
        """With several parameter groups: each one's learning rate and the layers it holds, as of this step."""
        groups = getattr(self.optimizer, "param_groups", None)
        if not groups or len(groups) < 2:
            return
        if self._group_layers[0] is not groups or len(self._group_layers[1]) != len(groups):
            layer_of = {id(p): self.layers[o].name for p, o in zip(self._params, self._owner_list)}
            held = tuple(sorted({layer_of[id(p)] for p in g["params"] if id(p) in layer_of}) for g in groups)
            self._group_layers = (groups, held)
        rows = []
        for g, names in zip(groups, self._group_layers[1]):
            try:
                lr = float(g.get("lr", math.nan))
            except (TypeError, ValueError):
                lr = math.nan
            rows.append([lr, list(names)])
        self.trace.meta["lr_groups"] = rows

    def _note_lr_base(self) -> None:
        """The rate a schedule scales (``initial_lr``: torch's schedulers, and those built on them, set it on
        each group when made) or heads to (a one-cycle's ``max_lr``, when larger), for the first group, whose
        rate is the one recorded."""
        groups = getattr(self.optimizer, "param_groups", None)
        # (a scheduler wraps the optimizer's step when made: an initial_lr restored from a checkpoint without one
        # says nothing of this run; a framework's wrapper around the optimizer, as accelerate's under Hugging
        # Face's Trainer, may carry the scheduler instead: then a rate that changes from step to step shows one)
        wrapped = getattr(getattr(self.optimizer, "step", None), "_wrapped_by_lr_sched", False) or self._lr_moved
        if not groups or not wrapped:
            return
        # a one-cycle schedule starts at a fraction of the rate it heads to (``max_lr``, set on each group too)
        rates = {key: _positive(groups[0].get(key)) for key in ("initial_lr", "max_lr")}
        key = max(rates, key=lambda k: rates[k] if rates[k] == rates[k] else -1.0)
        if rates[key] == rates[key]:
            self.trace.meta["lr_base"] = rates[key]
            self.trace.meta["lr_base_key"] = key

    def _lr(self, sync: bool = True) -> float:
        """The first parameter group's learning rate; NaN when unknown, or when it is a tensor on an
        accelerator and ``sync`` is False (reading it would wait for the device)."""
        if self.optimizer is None or not self.optimizer.param_groups:
            return float("nan")
        lr = self.optimizer.param_groups[0].get("lr", float("nan"))
        if not sync and isinstance(lr, torch.Tensor) and lr.device.type != "cpu":
            return float("nan")
        try:
            return float(lr)
        except (TypeError, ValueError):
            return float("nan")


def _positive(value) -> float:
    """A positive float, or NaN."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if value > 0 else math.nan


def _attention_logits(func, args, kwargs) -> torch.Tensor | None:
    """The logits of an attention computation, recomputed for its statistics (None if that fails: a
    statistic never breaks the user's pass)."""
    import torch.nn.functional as F
    try:
        with torch.no_grad():
            if func is F.multi_head_attention_forward:
                return mha_logits(*args, **kwargs)
            return sdpa_logits(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an argument layout this version does not know: no statistic
        return None
