"""Whether the samples of a batch reach each other's outputs: one replay of a pass, once per run.

A model treats the samples of a batch apart: sample ``j``'s output depends on sample ``j``'s input only
(BatchNorm aside, which is put in eval mode for the replay). A module fed another layout than the one it
expects breaks that: ``nn.LSTM``/``nn.GRU``/``nn.MultiheadAttention`` left at ``batch_first=False`` and fed
``(batch, time, features)`` run their recurrence or attention across the batch; a ``view`` where a
transpose was meant mixes samples too. No hook sees it (every layer's statistics look fine); the gradient
of one sample's output does: it reaches the other samples' inputs.

The replay runs a copy of the model, without its hooks, in eval mode (no dropout, BatchNorm on its running
statistics), with the same input, and takes the gradient of the output row of the middle sample with
respect to the input (or the first layer's output, for token inputs) and to every watched layer's output.
Per place: how much of that gradient lands on the other samples' rows, against the sample's own
(``spread``). A second pass on the
batch in reverse order says whether the model is equivariant to the batch's order (a function of each
sample alone, or of the batch as a set, as a hand-written batch normalisation or attention across the
batch is); a recurrence across the batch is not. The mixing module is the first layer, in the order the
forward runs, whose output's gradient stays on the sample's own row after the layers before it have it
spread: an attention or a recurrent module there reads the batch as its sequence.
"""
from __future__ import annotations

import contextlib
import io
import math
import random

import numpy as np
import torch
from torch import nn

from . import nanhunt

TINY = 1e-3     # a gradient on other rows below this share of the sample's own is rounding, not mixing
EQUAL = 1e-4    # relative difference under which two outputs of the same batch are the same


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.detach().float().reshape(n, -1).norm(dim=1)


def _spread(g: torch.Tensor | None, n: int, j: int) -> tuple[float, float] | None:
    """(sum, largest) of the other rows' gradient norms, over the sample's own (infinite when the sample's
    output gets nothing of its own row and something of others'); None without a gradient."""
    if g is None:
        return None
    r = _rows(g, n)
    own = float(r[j])
    others = torch.cat([r[:j], r[j + 1:]])
    total, largest = float(others.sum()), float(others.max())
    if not own > 0:
        return (math.inf, math.inf) if total > 0 else None
    return total / own, largest / own


def _first_out(output, n: int) -> torch.Tensor | None:
    return next((t for t in nanhunt.float_tensors(output) if t.dim() >= 1 and t.shape[0] == n), None)


def _equivariant(model: nn.Module, x: torch.Tensor, out: torch.Tensor, args: tuple, kwargs: dict,
                 autocast: list | None) -> bool | str | None:
    """Whether the outputs of the batch in reverse order are the outputs in reverse order; a difference
    counts when the model gives the same outputs twice for the same batch (None when it does not: a model
    that draws noise in eval mode). "relation": a square output whose rows and columns both follow the
    batch's order (every sample against every other)."""
    flipped = _pass(model, x, args, kwargs, autocast, flip=True)
    if flipped is None or flipped.shape != out.shape:
        return None
    if _same(flipped.flip(0), out):
        return True
    if out.shape[1] == len(x) and _same(flipped.flip(0).flip(1), out):
        return "relation"
    again = _pass(model, x, args, kwargs, autocast, flip=False)
    return False if again is not None and _same(again, out) else None


def _pass(model: nn.Module, x: torch.Tensor, args: tuple, kwargs: dict, autocast: list | None,
          flip: bool) -> torch.Tensor | None:
    """The first output of one more pass, every argument with a row per sample (a padding mask, lengths) in
    reverse order when ``flip``."""
    with torch.no_grad(), torch.random.fork_rng(), nanhunt._autocast(autocast):
        swap = ((lambda v: v.flip(0) if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == len(x)
                 else v) if flip else (lambda v: v))
        return _first_out(model(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()}), len(x))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float((a - b).abs().max()) <= EQUAL * (float(b.abs().max()) or 1.0)


def _ignores_input(model: nn.Module, x: torch.Tensor, out: torch.Tensor, args: tuple, kwargs: dict,
                   autocast: list | None) -> bool:
    """The batch in reverse order gives the very same outputs, in the same order: they are computed without
    the input (a forward that replaces it), not merely outside its graph (a ``.detach()`` on the way, after
    which the outputs still follow the input). Only for a batch whose rows differ."""
    if bool((x == x.flip(0)).all()):
        return False
    flipped = _pass(model, x, args, kwargs, autocast, flip=True)
    return flipped is not None and flipped.shape == out.shape and _same(flipped, out)


_SEQUENCE_MODULES = (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoderLayer,
                     nn.TransformerDecoderLayer, nn.TransformerEncoder, nn.TransformerDecoder)


def _sharded(model: nn.Module) -> bool:
    """A module sharded across processes: its forward gathers from the others, which a replay on one
    process alone would wait for."""
    return any("FullyShard" in type(m).__name__ or "FSDP" in type(m).__name__ for m in model.modules())


MAX_COPY_BYTES = 512 * 2 ** 20  # a model whose weights and buffers take more is not copied to be replayed


def probe(model: nn.Module, watched: list[str], args: tuple, kwargs: dict,
          autocast: list | None = None) -> dict | None:
    """Replay one pass of ``model`` on ``(args, kwargs)`` and measure how far one sample's output reaches the
    others' inputs. The replay runs on a copy of the model without its hooks (what the forward changes in the
    model, a counter, a cache, is changed in the copy; what it prints is not shown), and only for a model of
    ``MAX_COPY_BYTES`` at most. ``watched``: the watched layers' names. None when the pass does not lend itself:
    no batch dimension shared by the input and a 2-D output (a sequence's positions flattened, a
    sequence-first layout whose first dimension is time), fewer than 4 samples, a model too large to copy or
    sharded across processes."""
    if (_batch_input(args, kwargs) is None or _sharded(model)
            or sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) > MAX_COPY_BYTES):
        return None
    py_state, np_state = random.getstate(), np.random.get_state()  # a forward may draw from them too
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            replica = nanhunt.copy_without_hooks(model)
            named = dict(replica.named_modules())
            layers = [(name, named[name]) for name in watched if name in named]
            return _measure(replica, layers, args, kwargs, autocast)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _batch_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The pass's first tensor argument, when its first dimension can be told to be the batch's: at least 4
    samples, and not as many as a sequence's positions beside them. None, too, when another argument holds
    indices that are not one row per sample (a graph's edges, ``edge_index`` of shape (2, E)): the rows are
    then nodes that the model connects by design."""
    tensors = [v for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor) and v.dim() >= 1]
    x = tensors[0] if tensors else None
    if x is None or x.shape[0] < 4:
        return None
    if x.dim() >= 2 and x.shape[1] == x.shape[0] and (x.dim() >= 3 or not x.is_floating_point()):
        return None
    n = x.shape[0]
    if any(not (t.is_floating_point() or t.dtype == torch.bool) and t.shape[0] != n for t in tensors[1:]):
        return None
    if any(t.dim() >= 2 and t.shape[0] == n and t.shape[1] == n for t in tensors[1:]):
        return None  # a relation between the rows (a graph's adjacency): connected by design
    return x


def _measure(model: nn.Module, watched: list[tuple[str, nn.Module]], args: tuple, kwargs: dict,
             autocast: list | None) -> dict | None:
    x = _batch_input(args, kwargs)
    if x is None:
        return None
    n = int(x.shape[0])
    leaf = x.detach().clone().requires_grad_(True) if x.is_floating_point() else None
    taken: list[tuple[int, torch.Tensor]] = []   # (watched layer, its output), in the order they finish
    unbatched: set[int] = set()                  # sequence modules given one unbatched sequence (2-D)

    def keep(i):
        def hook(m, inputs, output):
            nonlocal leaf
            if (isinstance(m, _SEQUENCE_MODULES) and inputs and isinstance(inputs[0], torch.Tensor)
                    and inputs[0].dim() == 2):
                unbatched.add(i)
            t = _first_out(output, n)
            if t is None:
                return None
            if leaf is None and t.is_floating_point():
                # token input: the first float output with the batch's rows stands for the input
                leaf = t.detach().clone().requires_grad_(True)
                return leaf if isinstance(output, torch.Tensor) else None
            if t.requires_grad:
                taken.append((i, t))
            return None
        return hook

    def swap(v):
        return leaf if leaf is not None and v is x else v

    model.eval()
    handles = [m.register_forward_hook(keep(i)) for i, (_, m) in enumerate(watched)]
    try:
        with torch.enable_grad(), torch.random.fork_rng(), nanhunt._autocast(autocast):
            out = _first_out(model(*[swap(a) for a in args], **{k: swap(v) for k, v in kwargs.items()}), n)
        for h in handles:
            h.remove()
        if out is None or out.dim() != 2 or leaf is None or not out.requires_grad:
            return None
        if x.dim() == 3 and out.shape[1] == x.shape[1]:
            return None  # an output that keeps a sequence input's second dimension: that may be the batch, time first
        j = n // 2
        grads = torch.autograd.grad(out[j].float().sum(), [leaf] + [t for _, t in taken], allow_unused=True)
        if grads[0] is None:
            # the input is outside the output's graph: computed without it (the forward replaces it: zeros_like(x),
            # a batch it stored, fresh noise; or reads another variable), no sample's output depends on its input
            if _ignores_input(model, x, out.detach(), args, kwargs, autocast):
                return {"rows": n, "spread": 0.0, "largest": 0.0, "equivariant": None, "layer": "", "unused": True}
            return None
        at_input = _spread(grads[0], n, j)
        if at_input is None:
            return None
        layers = [(watched[i][0], _spread(g, n, j)) for (i, _), g in zip(taken, grads[1:])]
        equivariant = _equivariant(model, x, out.detach(), args, kwargs, autocast)
        if equivariant == "relation":
            return None  # a relation of every sample to every other (a contrastive model's similarities)
    finally:
        for h in handles:
            h.remove()
    place, at = "", -1
    spread_before = at_input[0] > TINY
    for (i, _), (name, s) in zip(taken, layers):  # the first layer whose output's gradient is the sample's own,
        if s is None:                              # after a spread one
            continue
        if s[0] > TINY:
            spread_before, place = True, ""
        elif spread_before and not place:
            place, at = name, i
    if at in unbatched:
        return None  # a recurrence or attention over one unbatched sequence: its rows are time steps, by design
    return {"rows": n, "spread": at_input[0], "largest": at_input[1], "equivariant": equivariant, "layer": place}
