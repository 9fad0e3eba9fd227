"""The operations between the model's output and the loss, read once from the autograd graph.

What turns the outputs into a loss is no module, so no hook sees it. The recorded loss's ``grad_fn`` leads
back, node by node, to the output's: the names met on the way (``NllLossBackward0``, ``LogSoftmaxBackward0``,
``SoftmaxBackward0`` ...) say which functions made the loss. Extraction keeps them as names (``paths``); their
reading (``misuse``) is a fact about how the loss is computed, the same for every step:

| ops, loss side first | misuse |
|---|---|
| log-softmax of a softmax (``F.cross_entropy`` on an ``nn.Softmax`` output) | softmax twice |
| NLL of a softmax or sigmoid (``F.nll_loss`` without the log) | NLL of probabilities |
| a with-logits loss, or a log-softmax, of a sigmoid | a logits loss on probabilities |
| a with-logits loss, or a log-softmax, of a ReLU, tanh or softplus (logits cut at 0 or held) | logits bounded |
| a regression loss of an expanded output (shapes ``(N, 1)`` against ``(N,)``) | broadcast |
| NLL of a log-softmax over another dimension than the classes (``dim=0``: over the batch) | normalised over the batch |

Shape-only operations (views, squeezes, transposes, selections, copies) between two of them are skipped.
"""
from __future__ import annotations

import math
import re
from enum import Enum

MAX_NODES = 256   # autograd nodes visited at most
MAX_INNER_NODES = 4096  # autograd nodes of the forward pass visited at most, once, for weights outside the model
MAX_PATHS = 4     # paths from the loss to an output kept at most
TRIES = 8         # recorded losses looked at, at most, for a path to the output

_SUFFIX = re.compile(r"Backward\d*$")
SHAPE_OPS = frozenset({"View", "UnsafeView", "Reshape", "ReshapeAlias", "Squeeze", "Unsqueeze", "Permute",
                       "Transpose", "T", "Select", "Slice", "Clone", "ToCopy", "Alias", "Index", "AsStrided",
                       "Split", "SplitWithSizes", "Unbind", "Cat"})


class LossMisuse(str, Enum):
    SOFTMAX_TWICE = "softmax_twice"
    NLL_OF_PROBABILITIES = "nll_of_probabilities"
    LOGITS_LOSS_ON_PROBABILITIES = "logits_loss_on_probabilities"
    LOGITS_BOUNDED = "logits_bounded"
    BROADCAST = "broadcast"
    NORMALISED_OVER_BATCH = "normalised_over_batch"


_PROBABILITIES = frozenset({"Softmax", "Sigmoid"})
# activations that cut logits at 0 or hold them in [-1, 1] (relu6 and F.hardtanh are Hardtanh); a clamp is
# left alone (logits clamped to +-20 for stability lose nothing)
_BOUNDING = frozenset({"Relu", "Hardtanh", "Tanh", "Softplus"})
_NLL = ("NllLoss", "NllLoss2D")
_REGRESSION = frozenset({"MseLoss", "L1Loss", "SmoothL1Loss", "HuberLoss"})
# (an op on the loss side, the op just before it on the model's side) -> what it says
_PAIRS: dict[tuple[str, str], LossMisuse] = {
    ("LogSoftmax", "Softmax"): LossMisuse.SOFTMAX_TWICE,
    ("LogSoftmax", "Sigmoid"): LossMisuse.LOGITS_LOSS_ON_PROBABILITIES,
    **{(nll, p): LossMisuse.NLL_OF_PROBABILITIES for nll in _NLL for p in _PROBABILITIES},
    **{("BinaryCrossEntropyWithLogits", p): LossMisuse.LOGITS_LOSS_ON_PROBABILITIES for p in _PROBABILITIES},
    **{(r, "Expand"): LossMisuse.BROADCAST for r in _REGRESSION},
    **{(lg, b): LossMisuse.LOGITS_BOUNDED for lg in ("LogSoftmax", "BinaryCrossEntropyWithLogits") for b in _BOUNDING},
}


class Nodes(list):
    """The output's autograd nodes, held until a loss is recorded. A copy of the watched model (an EMA, a
    best checkpoint) copies its recorder: the nodes are not copied with it (autograd nodes cannot be)."""

    def __deepcopy__(self, memo) -> "Nodes":
        return Nodes()

    def __reduce__(self):
        return (Nodes, ())


class NodeMap(dict):
    """Layer outputs' autograd nodes by id (node id -> (node, layer index)), and the model's output nodes of
    every pass of the step (``outputs``), held until a loss is read; like ``Nodes``, not copied with a copy
    of the model."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outputs: list = []

    def __deepcopy__(self, memo) -> "NodeMap":
        return NodeMap()

    def __reduce__(self):
        return (NodeMap, ())


def op_name(fn) -> str:
    return _SUFFIX.sub("", type(fn).__name__)


_NORMALISING = frozenset({"Softmax", "LogSoftmax"})
_OFF_CLASSES = "@off_classes"   # marks a (log-)softmax over another dimension than a batch's classes (dim 1)
_SINGLE = "@single"             # marks a (log-)softmax over a dimension of size 1: constant (1, its log 0)
_SUM = "@sum"                   # marks a loss function that sums over its elements (reduction="sum")
_SUM_REDUCTION = 2              # the value of an autograd node's ``_saved_reduction`` for reduction="sum"
_WEIGHTED = "@weighted"         # marks a loss function given weights per class or sample
_SCALAR = "@scalar"             # marks it dividing a single number (a loss's sum by a count)
_CONSTANT = "@constant"         # marks a division by a value with no graph (a temperature, a count of the data)
_TARGET = "@target"             # marks a loss function reached through its target argument (the second)
_GUARDED = "@guarded"           # marks a division whose denominator is kept off 0 where it is made
# loss functions whose target argument is differentiable (a with-logits loss given the model's output there
# has its arguments swapped)
_TARGETED = frozenset({"BinaryCrossEntropy", "BinaryCrossEntropyWithLogits"})


def _name(fn) -> str:
    """The op's name; a softmax or log-softmax over a dimension given as 0, or as 2 and more, is marked: a
    batch's classes are on dimension 1, where NLL reads them (a sequence model's transposes come between, and
    say so). A dimension counted from the end (-1) is not marked as another dimension: the classes of a
    sequence's outputs are on the last one. A (log-)softmax over a dimension of size 1 (read from the shape
    the node keeps) is marked as such: it is 1 (its log 0) whatever its input. (A lone sample's classes are on
    dimension 0: a 1-D input to NLL would be marked; batches are what training loops feed.)"""
    name = op_name(fn)
    if name in _NORMALISING:
        dim = getattr(fn, "_saved_dim", None)
        if isinstance(dim, int) and dim >= 1 << 63:  # stored unsigned: a dimension counted from the end
            dim -= 1 << 64
        if isinstance(dim, int) and _size(fn, dim) == 1:
            return name + _SINGLE
        if isinstance(dim, int) and dim >= 0 and dim != 1:
            return name + _OFF_CLASSES
    if getattr(fn, "_saved_reduction", None) == _SUM_REDUCTION:
        return name + _SUM
    if _weighted(fn):
        return name + _WEIGHTED
    if name == "Div" and _constant_divisor(fn):
        return name + _CONSTANT + (_SCALAR if _scalar(fn) else "")
    if name == "Div" and _guarded_divisor(fn):
        return name + _GUARDED
    return name


def _scalar(fn) -> bool:
    """The node made a single number (a loss reduced to its value)."""
    try:
        return tuple(fn._input_metadata[0].shape) == ()
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return False


def _constant_divisor(fn) -> bool:
    """A division whose divisor has no graph: a number (a temperature; the batch size a library loss divides
    its sum by, whose node has a single input), or a tensor of the data (a count)."""
    nxt: tuple = tuple(getattr(fn, "next_functions", ()))
    return len(nxt) == 1 or (len(nxt) == 2 and nxt[1][0] is None)


# ops that keep a value off 0 from below (an add counts when what it adds has no graph: an eps)
_KEEPS_OFF_ZERO = frozenset({"Clamp", "ClampMin", "Maximum"})


def _guarded_divisor(fn) -> bool:
    """A division whose divisor (its graph, past expands and shape ops) is made by a clamp or a maximum
    (F.normalize's ``x / norm.clamp_min(eps)``), or by adding a value with no graph to it (``d + 1e-8``): kept
    off 0, it is no division by 0. A sum of two values of the graph (``a / (a + b)``) is no such guard."""
    nxt: tuple = tuple(getattr(fn, "next_functions", ()))
    node = nxt[1][0] if len(nxt) == 2 else None
    for _ in range(8):
        if node is None:
            return False
        name = op_name(node)
        if name not in SHAPE_OPS and name != "Expand":
            break
        inner = [n for n, _ in getattr(node, "next_functions", ()) if n is not None]
        node = inner[0] if len(inner) == 1 else None
    name = op_name(node)
    if name in _KEEPS_OFF_ZERO:
        return True
    inputs: tuple = tuple(getattr(node, "next_functions", ()))
    return name == "Add" and (len(inputs) == 1 or any(n is None for n, _ in inputs))


def _size(fn, dim: int) -> int | None:
    """The size along ``dim`` of the tensor an autograd node made (its shape is kept with the node after the
    backward pass frees what it saved); None when not known."""
    try:
        shape = tuple(fn._input_metadata[0].shape)
    except (AttributeError, IndexError, RuntimeError, TypeError):
        return None
    return int(shape[dim]) if -len(shape) <= dim < len(shape) else None


def _weighted(fn) -> bool:
    """A loss node given weights per class or sample (``weight``, ``pos_weight``): a saved tensor there (read
    after the backward pass freed it, asking for it raises; never given, it reads None)."""
    for attr in ("_saved_weight", "_saved_pos_weight"):
        try:
            if getattr(fn, attr, None) is not None:
                return True
        except RuntimeError:
            return True
    return False


def paths(loss_fn, outputs: list) -> list[list[str]]:
    """The op names on each path from ``loss_fn`` back to one of the ``outputs``' nodes (loss side first,
    the output's own node last); at most ``MAX_PATHS``, after at most ``MAX_NODES`` nodes."""
    targets = {id(fn) for fn in outputs}
    found: list[list[str]] = []
    stack: list[tuple[object, list[str]]] = [(loss_fn, [])] if loss_fn is not None else []
    seen = 0
    while stack and seen < MAX_NODES and len(found) < MAX_PATHS:
        fn, trail = stack.pop()
        seen += 1
        trail = trail + [_name(fn)]
        if id(fn) in targets:
            found.append(trail)
            continue
        targeted = trail[:-1] + [trail[-1] + _TARGET] if op_name(fn) in _TARGETED else trail
        for k, (nxt, _) in enumerate(getattr(fn, "next_functions", ())):
            if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                stack.append((nxt, targeted if k else trail))
    return found


def outside_leaves(loss_fn, outputs: list, inside: set[int]) -> list:
    """The trainable tensors the loss depends on between itself and the ``outputs``' nodes that are not the
    model's own (ids in ``inside``): a discriminator's or a critic's weights, a learned loss weight. At most
    ``MAX_NODES`` nodes are visited; the walk does not enter the model through its outputs."""
    stop = {id(fn) for fn in outputs}
    found: dict[int, object] = {}
    stack = [loss_fn] if loss_fn is not None else []
    visited: set[int] = set()
    while stack and len(visited) < MAX_NODES:
        fn = stack.pop()
        if id(fn) in visited or id(fn) in stop:
            continue
        visited.add(id(fn))
        leaf = getattr(fn, "variable", None)
        if leaf is not None:
            if id(leaf) not in inside:
                found[id(leaf)] = leaf
            continue
        stack.extend(nxt for nxt, _ in getattr(fn, "next_functions", ()) if nxt is not None)
    return list(found.values())


# a weight layer's own op: a matrix product with a weight, or a convolution
_WEIGHT_OPS = frozenset({"Addmm", "Mm", "Convolution", "ConvolutionOverrideable", "MkldnnConvolution"})
# ops whose output is affine in their inputs (shape-only ones included): a forward made of these and weight
# ops alone is one affine map of its input, however many layers it has (a fused dropout is a diagonal map;
# products count only with a weight, see ``_by_weight``)
_AFFINE_OPS = SHAPE_OPS | _WEIGHT_OPS | {"Add", "Sub", "Neg", "Mul", "Div", "Mean", "Sum", "Expand", "NativeDropout",
                                         "AccumulateGrad"}
_PRODUCTS = frozenset({"Mul", "Div", "Mm"})


def _is_weight(fn) -> bool:
    """The node is a trainable leaf, or reaches one through shape-only ops (a weight's transpose)."""
    while fn is not None and op_name(fn) in SHAPE_OPS:
        nxt = [n for n, _ in getattr(fn, "next_functions", ()) if n is not None]
        fn = nxt[0] if len(nxt) == 1 else None
    return fn is not None and op_name(fn) == "AccumulateGrad"


def _by_weight(fn) -> bool:
    """A product of exactly one weight and something else (``h @ W.T`` without a bias, ``h * w``, the input
    itself times a weight, which needs no gradient and has no node): affine in the input. Any other (``h * h``;
    a computed tensor times one that needs no gradient: a mask ``h * (h > 0)``, a dropout's mask, a constant,
    which cannot be told apart after the backward pass) is not read as affine."""
    nxt = [n for n, _ in getattr(fn, "next_functions", ())]
    return len(nxt) == 2 and sum(n is not None and _is_weight(n) for n in nxt) == 1


def inner_graph(outputs: list, inside: set[int], stop: set[int]) -> tuple[list, int]:
    """The forward pass's graph behind the model's ``outputs`` (their nodes), back to its input (ids of its
    tensors and of their nodes in ``stop``, where the walk ends); at most ``MAX_INNER_NODES`` nodes.

    Returns the trainable tensors it is computed from that are not the model's own parameters (ids in
    ``inside``): weights that ``model.parameters()`` does not list (modules held in a plain Python list or
    dict, a tensor made with ``requires_grad=True`` rather than as an ``nn.Parameter``); and the number of
    weight layers when every op of the whole graph is affine (``_AFFINE_OPS``: linear layers applied one after
    another with no activation between them), else 0."""
    found: dict[int, object] = {}
    stack = list(outputs)
    visited: set[int] = set()
    weights, affine = 0, True
    while stack and len(visited) < MAX_INNER_NODES:
        fn = stack.pop()
        if fn is None or id(fn) in visited or id(fn) in stop:
            continue
        visited.add(id(fn))
        name = op_name(fn)
        weights += name in _WEIGHT_OPS
        affine = affine and name in _AFFINE_OPS and (name not in _PRODUCTS or _by_weight(fn))
        leaf = getattr(fn, "variable", None)
        if leaf is not None:
            if id(leaf) not in inside and id(leaf) not in stop:
                found[id(leaf)] = leaf
            continue
        stack.extend(nxt for nxt, _ in getattr(fn, "next_functions", ()) if nxt is not None)
    return list(found.values()), weights if affine and not stack else 0


def layer_terms(loss_fn, outputs: list, layers: dict[int, int]) -> list[tuple[int, list[str]]]:
    """Terms of the loss on a watched layer's output other than through the model's outputs (an activity
    penalty such as ``w * h.abs().mean()``, a feature-matching loss): ``layers`` maps the id of a layer
    output's node to the layer's index. Each layer reached is returned once, with the op names from the loss
    to it (loss side first, shape-only ops left out, the layer's own node not included). The walk does not
    enter the model through its outputs, nor go on past a layer it reached; at most ``MAX_NODES`` nodes."""
    stop = {id(fn) for fn in outputs}
    found: dict[int, list[str]] = {}
    stack: list[tuple[object, list[str]]] = [(loss_fn, [])] if loss_fn is not None else []
    visited: set[int] = set()
    while stack and len(visited) < MAX_NODES:
        fn, trail = stack.pop()
        if id(fn) in visited or id(fn) in stop:
            continue
        visited.add(id(fn))
        idx = layers.get(id(fn))
        if idx is not None:
            found.setdefault(idx, trail)
            continue
        name = op_name(fn)
        step = trail if name in SHAPE_OPS or name == "AccumulateGrad" else trail + [name]
        stack.extend((nxt, step) for nxt, _ in getattr(fn, "next_functions", ()) if nxt is not None)
    return list(found.items())


def summed(recorded: list[list[str]] | None) -> bool:
    """The loss sums over the batch rather than averaging: a loss function with reduction="sum", or a sum
    as the loss's last operation (``per_sample_loss.sum()``). Its gradient grows with the batch size."""
    return any(path and (path[0] == "Sum" or any(_SUM in op for op in path)) for path in recorded or [])


def added_terms(recorded: list[list[str]] | None) -> bool:
    """The loss adds other terms to what reaches the model's output (``ce + lam * penalty``, an auxiliary
    loss): a sum or difference on the way from the loss to it, or a stack of terms (then reduced). Its value is
    then not that of its criterion."""
    return any(op.split("@")[0] in ("Add", "Sub", "Stack") for path in recorded or [] for op in path[:-1])


def weighted(recorded: list[list[str]] | None) -> bool:
    """A loss function given weights per class or sample on the way: its rows' gradients are no 1/N each."""
    return any(_WEIGHTED in op for path in recorded or [] for op in path)


def misuse(recorded: list[list[str]] | None) -> LossMisuse | None:
    """What the recorded paths say of how the loss is computed (None: nothing wrong seen)."""
    for path in recorded or []:
        for near_loss, near_model in zip(path, path[1:]):  # directly: a transpose between moves the classes
            if near_loss.split("@")[0] in _NLL and near_model == "LogSoftmax" + _OFF_CLASSES:
                return LossMisuse.NORMALISED_OVER_BATCH
        path = [op.split("@")[0] for op in path]
        ops = [op for op in path if op not in SHAPE_OPS]
        for near_loss, near_model in zip(ops, ops[1:]):
            found = _PAIRS.get((near_loss, near_model))
            if found is not None:
                return found
    return None


# ops whose derivative is zero wherever it is defined: a loss reached only through them gives no gradient
_FLAT_OPS = frozenset({"Round", "Floor", "Ceil", "Trunc", "Sign"})


def no_gradient(recorded: list[list[str]] | None) -> str:
    """How the loss's code gives the model's outputs no gradient, on every path from the loss to them: "single"
    (a log-softmax over a dimension of size 1, one output where a cross-entropy wants one per class: the
    probability is 1, the loss 0), "single_softmax" (a softmax over one output, then any loss: a constant 1
    where a sigmoid's probability or the raw output was meant), or the op whose derivative is zero
    (``torch.round`` of the outputs: "Round"); "": a path carries a gradient, or the walk stopped at
    ``MAX_PATHS`` (one not read may)."""
    if recorded is not None and len(recorded) >= MAX_PATHS:
        return ""
    found = ""
    for path in recorded or []:
        if not path:
            continue
        op = next((op for op in path if op.endswith(_SINGLE) or op.split("@")[0] in _FLAT_OPS), None)
        if op is None:
            return ""
        if not found:
            found = (op.split("@")[0] if not op.endswith(_SINGLE) else
                     "single" if op.startswith("LogSoftmax") else "single_softmax")
    return found


# library losses that cannot be negative for targets in their range
_NON_NEGATIVE = frozenset(_NLL) | _REGRESSION | {"BinaryCrossEntropy", "BinaryCrossEntropyWithLogits"}
# log-probabilities: a log-(soft)max, or a log taken of a probability
_LOG_PROBABILITIES = frozenset({"LogSoftmax", "LogSigmoid"})
_NEGATING = frozenset({"Neg"})
_FACTORS = frozenset({"Mul", "Div"})
# what a loss may do to a criterion or a log-probability on its way to one number: reduce it, pick the
# targets' entries, scale it
_REDUCING = frozenset({"Mean", "Sum", "Gather", "Mul", "Div", "IndexSelect", "Diagonal"})


def unbounded_form(recorded: list[list[str]] | None) -> str:
    """How the loss's own code makes it unbounded below, read when it falls below zero without end: "negated"
    (a minus sign before a loss that cannot be negative: ``-F.cross_entropy(...)``), "swapped" (the model's
    output given as a with-logits loss's target: its arguments swapped), "nll_not_log" (nll_loss
    of outputs that are not log-probabilities: ``-output[target]`` has no floor), "log_likelihood" (a
    log-probability of the targets minimised as it is, without its minus sign), "scaled" (a factor between
    the loss and a criterion that no target takes below zero, a cross-entropy of class indices or a squared or
    absolute error: ``loss * -1``, a per-sample loss weighted by advantages), "hand_term" (squared or absolute
    errors plus a term written by hand, which alone can fall below zero: a KL subtracted); "": none of these (a
    library loss of outputs it expects: targets outside its range). Only ops that reduce, pick or scale are followed
    from the loss to its criterion; anything else on the way says nothing."""
    for path in recorded or []:
        if any(op.split("@")[0] in _TARGETED and _TARGET in op for op in path):
            return "swapped"
        ops = [op.split("@")[0] for op in path]
        ops = [op for op in ops if op not in SHAPE_OPS]
        flips, scaled = 0, False
        for i, op in enumerate(ops):
            if op in _NEGATING:
                flips += 1
                continue
            nxt = ops[i + 1] if i + 1 < len(ops) else ""
            if op in _NLL and nxt not in _LOG_PROBABILITIES and not (nxt == "Log" and _probability_next(ops, i + 1)):
                return "nll_not_log"
            if op in _NON_NEGATIVE:
                if flips % 2:
                    return "negated"
                if scaled and op not in _TARGETED:  # no target takes it below zero: the factor does
                    return "scaled"
                break
            scaled = scaled or op in _FACTORS
            if op in _LOG_PROBABILITIES or op == "Log" and _probability_next(ops, i):
                if not flips % 2:
                    return "log_likelihood"
                break
            if op not in _REDUCING:
                break
    return "hand_term" if _hand_term(recorded) else ""


def _hand_term(recorded: list[list[str]] | None) -> bool:
    """The loss adds to squared or absolute errors (which no target takes below zero) a term written by hand
    on the outputs, reached through no library loss (a KL divergence, a penalty): a fall below zero is that
    term's."""
    paths = [[op.split("@")[0] for op in path] for path in recorded or [] if path]
    losses = [{op for op in ops if op in _NON_NEGATIVE} for ops in paths]
    return (any(not found for found in losses) and any(losses)
            and all(found <= _REGRESSION for found in losses))


_MEANS = frozenset({"Mean", "Sum"})


def hand_written(recorded: list[list[str]] | None) -> bool:
    """The loss's graph was read and none of its paths to the outputs passes through a cross-entropy, an NLL,
    a binary cross-entropy or a squared or absolute error: a likelihood written as code (which may rightly go
    negative), or a library loss made of plain ops (a KL divergence, a Gaussian NLL)."""
    paths = [[op.split("@")[0] for op in path] for path in recorded or [] if path]
    return bool(paths) and not any(op in _NON_NEGATIVE for ops in paths for op in ops)


# errors that grow as their size does, not as its square (Huber and smooth L1 past their small-error bend)
_LINEAR_ERRORS = frozenset({"L1Loss", "SmoothL1Loss", "HuberLoss"})


def linear_error(recorded: list[list[str]] | None) -> bool:
    """Every path from the loss reaches, through means only, an error that grows linearly with its size, itself
    a mean: an absolute error (``F.l1_loss``, or ``(out - y).abs().mean()`` written out), Huber or smooth L1
    (with its bend at 1, PyTorch's default: a larger ``delta`` scales it). Such a loss is on the scale of the
    errors themselves, where a squared error's is on their square's; a sum over the batch is not."""
    found = False
    for path in recorded or []:
        ops = [op.split("@")[0] for op in path if op.split("@")[0] not in SHAPE_OPS]
        while ops and ops[0] == "Mean":
            ops = ops[1:]
        if not (ops[:2] == ["Abs", "Sub"] or ops and ops[0] in _LINEAR_ERRORS) or _SUM in "".join(path):
            return False
        found = True
    return found


def non_negative(recorded: list[list[str]] | None) -> bool:
    """Every path from the loss reaches, through means and sums only, a library loss that cannot be negative
    for targets in its range (cross-entropy, NLL, BCE, a squared or absolute error), reached through its input:
    such a loss below zero says its targets are out of that range. A factor between (``loss * w``, whose sign
    the graph no longer holds after the backward pass) says nothing."""
    found = False
    for path in recorded or []:
        if any(_TARGET in op for op in path):
            return False
        ops = [op.split("@")[0] for op in path]
        ops = [op for op in ops if op not in SHAPE_OPS]
        head = next((op for op in ops if op not in _MEANS), "")
        if head not in _NON_NEGATIVE:
            return False
        found = True
    return found


# activations whose outputs stay within a range, by autograd node (a hardtanh's bounds are not in its name)
_BOUNDED_RANGE = {"Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0)}


def made_by(fn) -> str:
    """The op that made the model's output, past the shape-only ops at its end (``nn.Flatten`` after a
    sigmoid: "Sigmoid"); "" when it is not one op."""
    for _ in range(MAX_NODES):
        name = op_name(fn)
        nxt = [n for n, _ in getattr(fn, "next_functions", ()) if n is not None]
        if name not in SHAPE_OPS or len(nxt) != 1:
            return name if name not in SHAPE_OPS else ""
        fn = nxt[0]
    return ""


def bounded_output(recorded: list[list[str]] | None, output_op: str = "") -> tuple[str, float, float] | None:
    """A regression loss (mean squared, L1, Huber) of outputs a sigmoid or tanh bounds, directly (shape ops
    aside; ``output_op``: the op that made the model's output, past the shape ops at its end): (the
    activation, its low, its high); None otherwise, and for a loss summed over the batch (the bound is one
    element's)."""
    for path in recorded or []:
        ops = [op for op in path if op.split("@")[0] not in SHAPE_OPS]
        if not ops or ops[0] not in _REGRESSION:
            continue
        act = ops[1] if len(ops) >= 2 else output_op
        if act in _BOUNDED_RANGE:
            lo, hi = _BOUNDED_RANGE[act]
            return act, lo, hi
    return None


# activations whose outputs stop at a bound on one side (a ReLU's 0; a softplus comes near 0 and stays above)
_HALF_BOUNDED = {"Relu": (0.0, math.inf), "Softplus": (0.0, math.inf)}


def regression_bound(recorded: list[list[str]] | None, output_op: str = "") -> tuple[str, float, float] | None:
    """Like ``bounded_output``, for every activation whose outputs stop at a bound: a sigmoid or tanh, and a
    ReLU or softplus, bounded below at 0 alone (high: inf); a loss summed over the batch counts too (what
    is read of it is a share of its gradient, not a bound on one element's error), and one written out (a power
    or absolute value of a difference). Every path from the loss must be a regression loss of the model's
    output: another term would share its gradient."""
    found = None
    for path in recorded or []:
        ops = [op.split("@")[0] for op in path if op.split("@")[0] not in SHAPE_OPS]
        while ops and ops[0] in _MEANS:  # (a loss per element, then averaged)
            ops = ops[1:]
        if ops[:2] in (["Pow", "Sub"], ["Abs", "Sub"]):  # written out: ((out - y) ** 2).mean(), l1_loss
            ops = ["MseLoss"] + ops[2:]
        if not ops or ops[0] not in _REGRESSION or len(ops) > 2:
            return None
        act = ops[1] if len(ops) == 2 else output_op
        bounds = _BOUNDED_RANGE.get(act) or _HALF_BOUNDED.get(act)
        if bounds is None:
            return None
        found = (act, *bounds)
    return found


def _probability_next(ops: list[str], i: int) -> bool:
    """The op after ``ops[i]`` (a log), past a pick of the targets' entries, is a softmax or sigmoid: a
    log-probability."""
    rest = [op for op in ops[i + 1:] if op != "Gather"]
    return bool(rest) and rest[0] in _PROBABILITIES


# operations that can turn finite values into NaN/Inf: out of their domain (log, sqrt, a division by 0) or
# overflowing (exp, pow); a library loss (cross_entropy, mse_loss ...) of finite inputs and targets cannot
DOMAIN_OPS = frozenset({"Log", "Log2", "Log10", "Log1p", "Div", "Reciprocal", "Sqrt", "Rsqrt", "Pow", "Exp", "Exp2",
                        "Acos", "Asin", "Atanh", "Logit", "Xlogy", "Erfinv", "Digamma", "Lgamma", "Tan"})
# between a probability and such an operation, an eps added or a clamp keeps it in its domain
_GUARDS = frozenset({"Add", "Clamp", "ClampMin", "ClampMax", "Maximum", "Minimum", "Where", "NanToNum"})


# exponentials: a division by a value with no graph right before one is a temperature (no count of 0)
_EXPONENTIALS = frozenset({"Exp", "Exp2"})


def domain_op(recorded: list[list[str]] | None) -> tuple[str, str] | None:
    found = _domain(recorded)
    return None if found is None else found[1:]


def _domain(recorded: list[list[str]] | None) -> tuple[str, str, str] | None:
    """The operation of the loss, nearest the model's output, that can turn finite values into NaN/Inf, with
    the probability (``Softmax``, ``Sigmoid``) it is taken of, if it is taken of one unguarded (``""`` else):
    ``torch.log(torch.sigmoid(out))`` -> ("Log", "Sigmoid"); ``torch.log(p + 1e-8)`` is no such operation.
    None when no path from the loss to the output has one (a library loss of the outputs). A division by a
    value with no graph inside what is exponentiated (a probability, an exp) is a temperature, no division by 0:
    ``torch.log(F.softmax(out / tau))`` is a log of a softmax, ``torch.exp(sim / tau)`` an exp that may overflow;
    elsewhere (a masked mean's count) it is one. A division whose denominator is clamped or given an eps
    (``F.normalize``) is none either."""
    for path in recorded or []:
        ops = [op for op in path if op.split("@")[0] not in SHAPE_OPS]
        for i in range(len(ops) - 1, -1, -1):  # from the model's side
            name = ops[i].split("@")[0]
            if name not in DOMAIN_OPS or _GUARDED in ops[i] or (_CONSTANT in ops[i] and (
                    any(op.split("@")[0] in _PROBABILITIES for op in ops[:i])
                    or i > 0 and ops[i - 1].split("@")[0] in _EXPONENTIALS)):
                continue
            between = [op.split("@")[0] for op in ops[i + 1:]]
            prob = next((j for j, op in enumerate(between) if op in _PROBABILITIES), None)
            if prob is not None and any(op in _GUARDS for op in between[:prob]):
                break  # guarded: this path's log cannot see a 0
            return ops[i], name, between[prob] if prob is not None else ""
    return None


def saturates(probability: str, absmax: float, spread: float, dtype: str) -> bool:
    """Whether outputs of this largest magnitude (``absmax``), and largest spread within a row (``spread``),
    round a ``probability`` of them to exactly 0 or 1 in ``dtype``: a sigmoid past log(2 / eps) is 1 (and
    1 - p is 0), a softmax row whose entries lie further apart than -log(smallest subnormal) has an entry
    that underflows to 0."""
    import torch
    try:
        info = torch.finfo(getattr(torch, dtype or "float32"))
    except (AttributeError, TypeError):
        info = torch.finfo(torch.float32)
    if probability == "Sigmoid":
        return absmax >= math.log(2.0 / info.eps)
    if probability == "Softmax":
        return spread >= -math.log(info.smallest_normal * info.eps)
    return False


def nonfinite_op(origin, recorded: list[list[str]] | None, rounding_rank: float = 0.9) -> str:
    """The loss's own operation that turned the model's finite output into NaN/Inf (``origin``: where the
    replay found NaN/Inf first, phase "loss"): the operation seen doing it in a replayed step, or the loss's
    operation that leaves its domain (``domain_op``) when what it is taken of can reach its edge (a sigmoid or
    softmax of outputs large enough to round to exactly 0 or 1). Where the rows whose gradient is NaN/Inf are
    known (``origin.rows``), they must be those the operation makes so: every row, for a division of the whole
    loss by a value with no graph (a count of 0 divides every row's share alike); rows whose spread reaches
    ``rounding_rank`` of the others', for a softmax that rounds, or past all others toward a rounding, for a
    sigmoid (they do so there first, whatever scales them). "":
    NaN/Inf in the loss from something else (its targets), or not in the loss."""
    if origin is None or origin.phase != "loss":
        return ""
    if origin.op:
        return origin.op
    found = _domain(recorded)
    if found is None:
        return ""
    raw, op, probability = found
    if len(origin.rows) == 3:
        share, rank, past = origin.rows
        if ((raw.endswith(_SCALAR) and not probability and share < 1.0)
                or (probability == "Softmax" and rank < rounding_rank) or (probability == "Sigmoid" and not past)):
            return ""
    if probability and not (len(origin.reach) == 2
                            and (transformed(recorded, probability)
                                 or saturates(probability, origin.reach[0], origin.reach[1], origin.dtype))):
        return ""
    return f"{op} of {probability}" if probability else op


# ops that set chosen entries to a value of their own (a mask filled with -1e9 or -inf)
_FILLS = frozenset({"MaskedFill", "IndexPut", "Where"})


def transformed(recorded: list[list[str]] | None, probability: str) -> str:
    """Whether the loss scales the outputs before taking ``probability`` of them (a temperature:
    ``softmax(out / 0.07)``), or fills some of their entries (a mask: ``out.masked_fill(mask, -1e9)``): the
    outputs' own range then does not say what the probability sees. A shift (``out - out.max()``) leaves a
    softmax as it is and is no such scale. "filled", "scaled", or "" (neither)."""
    scales = _FACTORS if probability == "Softmax" else _FACTORS | {"Add", "Sub"}
    for path in recorded or []:
        ops = [op.split("@")[0] for op in path]
        ops = [op for op in ops if op not in SHAPE_OPS]
        before = ops[ops.index(probability) + 1:-1] if probability in ops else []  # (the last op is the output's)
        if any(op in _FILLS for op in before):
            return "filled"
        if any(op in scales for op in before):
            return "scaled"
    return ""


# a hard target's gradient is the loss's scale times (prediction - target): over the entries the target leaves
# at zero, gradient / prediction is that scale; a row whose ratios differ by more than this share has another
# target (soft labels, label smoothing) and is not read
HARD_TARGET_TOL = 1e-3
_READABLE = 1e-6  # predictions below this are too small for their ratio to be read


def classes_from_gradient(kind: str, g, out, term: bool = False):
    """The class of each row of a batch, read off the gradient ``g`` a classification loss left at the model's
    output ``out`` (logits): ``kind`` "classes" (a cross-entropy over dimension 1) or "binary" (a binary
    cross-entropy with logits). A row whose gradient is not that of a hard target (soft labels, label
    smoothing), or is zero while the model's prediction is not saturated (an ignored index, a masked
    sample), is left out; a row with no entry pushed up whose prediction is saturated is a sample the model
    fits all but exactly (its class's gradient rounds to zero), its class the one predicted. Returns a 1-D
    tensor of class ids and, as 0-d tensors, the scale of the hard targets' rows (the loss's gradient per
    unit of prediction error: 1/N for a mean over N rows; NaN where none is read) and, with ``term``, their
    mean cross-entropy against the classes read (what the classification term of the loss is, whatever else
    the loss adds; NaN without), or None when the shapes do not fit."""
    import torch

    # the ratios are read as precisely as the gradient was computed (bfloat16 keeps 8 bits)
    tol = max(HARD_TARGET_TOL, 4 * torch.finfo(g.dtype).eps) if g.is_floating_point() else HARD_TARGET_TOL
    nan = torch.full((), torch.nan, device=g.device)  # (on the gradient's device: read back with it)
    with torch.no_grad():
        g, z = g.detach().float(), out.detach().float()
        if kind == "log_probs" and g.dim() == 2 and g.shape[1] >= 2 and z.shape == g.shape:
            # an NLL of the model's own log-probabilities: the class's entry alone has a gradient
            low, cls = g.min(dim=1)
            hard = (low < 0) & ((g != 0).sum(dim=1) == 1) & torch.isfinite(g).all(dim=1)
            ce = _mean(-z.gather(1, cls[:, None]).squeeze(1)[hard]) if term else nan
            return cls[hard], _median(-low[hard]), ce
        if kind == "classes" and g.dim() == 2 and g.shape[1] >= 2 and z.shape == g.shape:
            p = z.softmax(dim=1)
            low, cls = g.min(dim=1)
            others = torch.ones_like(g, dtype=torch.bool).scatter_(1, cls[:, None], False) & (p > _READABLE)
            ratio = torch.where(others, g / p.clamp_min(_READABLE), torch.nan)
            mid = ratio.nanmedian(dim=1).values
            consistent = (((ratio - mid[:, None]).abs() <= tol * mid.abs()[:, None]) | ~others).all(dim=1)
            # one entry pushed up and no other; the others' ratios agree (or are all too small to read: a
            # sample fitted all but exactly)
            hard = ((g < 0).sum(dim=1) == 1) & (consistent & (mid > 0) | ~others.any(dim=1))
            # fitted all but exactly: the class's own entry rounds to no gradient (its probability to 1)
            fitted = (g >= 0).all(dim=1) & (p.amax(dim=1) >= 1.0 - _READABLE)
            keep = (hard | fitted) & torch.isfinite(g).all(dim=1)
            found = torch.where(hard, cls, z.argmax(dim=1))
            ce = _mean((z.logsumexp(dim=1) - z.gather(1, found[:, None]).squeeze(1))[keep]) if term else nan
            return found[keep], _median(mid[hard & keep]), ce
        if kind == "binary" and (g.dim() == 1 or g.dim() == 2 and g.shape[1] == 1) and z.numel() == g.numel():
            g, z = g.reshape(-1), z.reshape(-1)
            s = z.sigmoid()
            pos = g < 0
            scale = torch.where(pos, g / (s - 1).clamp_max(-_READABLE), g / s.clamp_min(_READABLE))
            hard = torch.zeros_like(pos)
            negatives = nan
            for side in (pos, (g > 0)):  # the scale is one per class (a pos_weight scales the positives)
                if side.any():
                    mid = scale[side].median()
                    hard |= side & ((scale - mid).abs() <= tol * mid.abs())
                    negatives = mid  # (the negatives' last: no pos_weight on them)
            fitted = (g == 0) & ((s == 0) | (s == 1))
            keep = (hard | fitted) & torch.isfinite(g)
            found = torch.where(hard, pos, z > 0)
            ce = (_mean(torch.nn.functional.binary_cross_entropy_with_logits(z, found.float(), reduction="none")[keep])
                  if term else nan)
            return found.long()[keep], negatives, ce
        return None


def read_targets(g, out):
    """What the targets of a cross-entropy over dimension 1 averaged over its rows are, read off the gradient
    ``g`` it left at the logits ``out``: for targets t summing to s in a row that gradient is (s p - t) / N, N
    the rows the mean counts (rows with no gradient at all, an ignored index or a mask, are left out of both),
    so q = p - N g = t + (1 - s) p. Only forms that tell themselves apart are read. Returns a (3,) tensor
    (NaN where not read):
    - the least the loss can reach, the mean entropy of the targets: 0 where most rows read as a hard target
      under a loss scaled by some factor c (q = (1 - c) p + c e_y: every entry but the class's at one ratio of
      p; a loss divided for gradient accumulation, a mean of two losses); else the entropy of q where every
      row reads as a hard or a smoothed target (every entry but its largest equal: a label smoothing, 0
      included). Soft targets of other shapes (a teacher's, mixup), or smoothed ones under a scaled loss, are
      not told from a scale and are not read;
    - where most rows read as 0/1 targets and some sum to more than one (several labels marked in a row, a
      multi-hot vector), the mean number of targets per row and the share of rows with several, over those
      rows (a target of 0 has the row's lowest q / p, 1 - s, which gives s and t).
    Class weights or a term added on the output read as neither. The tolerance widens with the gradient's
    precision (bfloat16 keeps 8 bits)."""
    import torch

    nan = torch.full((3,), torch.nan, device=g.device)
    tol = max(HARD_TARGET_TOL, 4 * torch.finfo(g.dtype).eps) if g.is_floating_point() else HARD_TARGET_TOL
    with torch.no_grad():
        if g.dim() != 2 or g.shape[1] < 2 or out.shape != g.shape:
            return nan
        g = g.detach().float()
        p = out.detach().float().softmax(dim=1)
        # N: every row (a row of targets all 0 counts in the mean and leaves no gradient), or the rows with a
        # gradient (an ignored index or a mask leaves a row out of the mean): the one whose targets read
        # (a prediction's ratio is read as precisely as the gradient: in 16 bits, only where it is not tiny)
        readable = _READABLE if tol <= HARD_TARGET_TOL else tol
        read = _targets_of(p, g, g.shape[0], tol, readable)
        counted = (g != 0).any(dim=1)
        return torch.where(torch.isnan(read).all() & ~counted.all(),
                           _targets_of(p[counted], g[counted], counted.sum(), tol, readable), read)


def _targets_of(p, g, n, tol: float, readable: float):
    """``read_targets`` for predictions ``p`` and gradient rows ``g`` of a mean over ``n`` rows."""
    import torch

    q = p - g * n
    finite = torch.isfinite(q).all() & (q.shape[0] > 0)
    ratio = torch.where(p > readable, q / p.clamp_min(readable), torch.inf)
    low = ratio.amin(dim=1)  # 1 - s per row
    apart = ((ratio - low[:, None]).abs() > tol * low.abs().clamp_min(1.0)[:, None]).sum(dim=1)
    scaled = (apart == 1).float().mean() > 0.5
    top = q.amax(dim=1, keepdim=True)
    rest = torch.where(q == top, torch.nan, q)  # (a row whose largest entries tie is no smoothed one)
    smoothed = ((q >= -tol).all() & ((rest.nan_to_num(-1.0).amax(dim=1) - rest.nan_to_num(2.0).amin(dim=1))
                                     <= tol).all())
    qc = q.clamp(0.0, 1.0)
    h = -(qc * qc.clamp_min(1e-30).log()).sum(dim=1).mean()
    floor = torch.where(scaled, 0.0, torch.where(smoothed, h, torch.nan))
    t = q - low[:, None] * p
    # rows of 0/1 targets (a row with every label set has no 0 to read s by, and reads otherwise)
    binary = ((t.abs() <= tol) | ((t - 1).abs() <= tol)).all(dim=1)
    rows = ((1 - low) > 1 + tol) & binary
    # (rows of one label among them read as hard ones, unscaled: only a scale other than 1 rules the count out)
    rescaled = ((apart == 1) & (low.abs() > tol)).float().mean() > 0.5
    several = finite & (binary.float().mean() > 0.5) & rows.any() & ~rescaled
    count = ((1 - low) * binary).sum() / binary.sum().clamp_min(1)
    nan = torch.full((), torch.nan, device=g.device)
    return torch.stack([torch.where(finite & ~several, floor, nan), torch.where(several, count, nan),
                        torch.where(several, rows.sum() / binary.sum().clamp_min(1), nan)])


# ops that move a tensor's dimensions: past one, an operation over dimension 1 is over another of the output's
_MOVING = frozenset({"Permute", "Transpose", "T"})


def rows_kept(path: list[str]) -> bool:
    """No op between the loss and the model's output (its own node, the path's last, aside) moves the
    output's dimensions: what the loss takes over dimension 1 is over the output's classes, one row per sample.
    A symmetric contrastive loss (``ce(logits) + ce(logits.t())``) also reads the output's columns as rows."""
    return not any(op.split("@")[0] in _MOVING for op in path[:-1])


def bce_of_softmax(paths) -> str:
    """Whether every path is a binary cross-entropy (a mean, or a sum) of a softmax over the output's rows
    (dimension 1), taken in the loss's code (``"logits"``: the output is the softmax's input) or as the model's
    last operation (``"probabilities"``: the output is the softmax's); ``""`` otherwise (class weights included:
    they are not read)."""
    kinds = set()
    for path in paths or []:
        if not rows_kept(path):
            return ""
        ops = [op for op in path if op.split("@")[0] not in SHAPE_OPS]
        at = ops.index("Softmax") if "Softmax" in ops else -1
        if at < 1 or ops[at - 1] not in ("BinaryCrossEntropy", "BinaryCrossEntropy" + _SUM) or len(ops) - at > 2:
            return ""
        kinds.add("probabilities" if at == len(ops) - 1 else "logits")
    return kinds.pop() if len(kinds) == 1 else ""


def read_bce_targets(g, out, of_logits: bool, count: float):
    """For a binary cross-entropy of a softmax over dimension 1 (``F.binary_cross_entropy(F.softmax(out, 1),
    t)``, or of a model's own softmax output): how many targets each row marks, read off the gradient ``g`` at
    ``out`` (the softmax's input when ``of_logits``, else its output p) for a loss over ``count`` entries (their
    number for a mean, 1 for a sum). Each entry's loss -t log p - (1 - t) log(1 - p) leaves count x dL/dp =
    u = (p - t) / (p (1 - p)): 1 / (1 - p) where t = 0, -1 / p where t = 1. At the softmax's input, count x g / p
    is u less a constant of the row, which its entry of largest u gives (a 0, unless every target of the row is
    1). Returns a (2,) tensor: the mean number of targets per row and the share of rows with several, over the
    rows that read as 0/1 targets, where most rows do and some have several; NaN otherwise."""
    import torch

    nan = torch.full((2,), torch.nan, device=g.device)
    tol = max(HARD_TARGET_TOL, 4 * torch.finfo(g.dtype).eps) if g.is_floating_point() else HARD_TARGET_TOL
    readable = _READABLE if tol <= HARD_TARGET_TOL else tol
    with torch.no_grad():
        if g.dim() != 2 or g.shape[1] < 2 or out.shape != g.shape:
            return nan
        g = g.detach().float()
        p = out.detach().float().softmax(dim=1) if of_logits else out.detach().float()
        ok = ((p > readable) & (1 - p > readable)).all(dim=1)
        p, g = p[ok].clamp(readable, 1 - readable), g[ok]
        u = count * g / p if of_logits else count * g
        zero, one = 1 / (1 - p), -1 / p
        if of_logits:
            top = u.argmax(dim=1, keepdim=True)
            u = u + (zero.gather(1, top) - u.gather(1, top))
        t1 = (u - one).abs() <= tol * one.abs()
        binary = (t1 | ((u - zero).abs() <= tol * zero)).all(dim=1)
        marked = (t1 & binary[:, None]).sum(dim=1).float()
        rows = binary.sum()
        several = (ok.sum() > 0) & (rows > 0.5 * ok.shape[0]) & ((marked > 1) & binary).any()
        return torch.where(several, torch.stack([marked.sum() / rows.clamp_min(1),
                                                 ((marked > 1) & binary).sum() / rows.clamp_min(1)]), nan)


def _median(values):
    import torch
    return values.median() if values.numel() else torch.full((), torch.nan, device=values.device)


def _mean(values):
    import torch
    return values.mean() if values.numel() else torch.full((), torch.nan, device=values.device)

