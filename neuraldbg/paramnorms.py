"""Extraction: per-layer norms of the parameters, of their gradients and of an optimizer step's
updates, on sampled steps.

Every parameter belongs to one layer (its first owner); a layer's norm is the square root of the
sum of its parameters' squared norms. A parameter of up to ``PARAM_SAMPLE`` elements is read whole;
a larger one through an evenly strided subset, its square scaled up to the whole. The layout (who
owns what, which parameters are subsampled, by how much) is worked out once, and a sampled step
reduces all the tensors together, in two batches: the many small ones (biases, norm scales) flattened
into one vector, squared and summed per tensor (``torch.segment_reduce``), the others reduced one
kernel each (``torch._foreach_norm``: one fused kernel on an accelerator). Per-layer sums follow on
the device (``index_add_``). Parameters of several dtypes or devices are all reduced one by one.
"""
from __future__ import annotations

import torch

from .stats import PARAM_SAMPLE, norms

try:
    _flatten = torch._C._nn.flatten_dense_tensors
except AttributeError:  # pragma: no cover - an older torch
    def _flatten(tensors):
        return torch.cat([t.reshape(-1) for t in tensors])

# Tensors of up to this many elements are flattened together: for them a kernel per tensor costs
# more than the copy (a bias, a norm's scale); larger ones are reduced in place.
_FLATTEN_NUMEL = 1024


class _Batch:
    """Some of the parameters (positions ``pos``), reduced the same way."""

    def __init__(self, pos: list[int], owner: torch.Tensor, scale: torch.Tensor, lengths: torch.Tensor, flat: bool):
        self.pos = pos
        self.flat = flat
        self._host = {"owner": owner[pos], "scale": scale[pos], "lengths": lengths[pos]}
        self._on_device: dict = {}

    def on(self, name: str, device) -> torch.Tensor:
        hit = self._on_device.get((name, device))
        if hit is None:
            hit = self._on_device[(name, device)] = self._host[name].to(device)
        return hit

    def squares(self, views: list[torch.Tensor]) -> torch.Tensor:
        """The scaled squared norm of each of ``views`` (this batch's tensors, in order)."""
        if self.flat:
            flat = _flatten(views)
            sq = torch.segment_reduce(flat * flat, "sum", lengths=self.on("lengths", flat.device))
        else:
            sq = norms(views) ** 2
        return sq.float() * self.on("scale", sq.device)

    def copy(self, views: list[torch.Tensor]) -> list[torch.Tensor]:
        return [_flatten(views)] if self.flat else list(torch._foreach_mul(views, 1.0))

    def change(self, views: list[torch.Tensor], before: list[torch.Tensor]) -> torch.Tensor:
        """The scaled squared norm of each tensor's change since ``copy``."""
        if self.flat:
            diff = _flatten(views) - before[0]
            sq = torch.segment_reduce(diff * diff, "sum", lengths=self.on("lengths", diff.device))
        else:
            sq = norms(list(torch._foreach_sub(views, before))) ** 2
        return sq.float() * self.on("scale", sq.device)


class ParamNorms:
    """The parameters of a model's layers (``owners[i]``: the layer of ``params[i]``); ``sparse``: the
    indices of those whose gradient may be sparse (a sparse embedding's: left out of gradient norms)."""

    def __init__(self, params: list[torch.Tensor], owners: list[int], sparse: set[int] | frozenset = frozenset()):
        self.params = params
        self.owners = owners
        self.owner = torch.tensor(owners, dtype=torch.long)
        # a large parameter is read every ``stride``-th element, its square scaled by n / (elements read)
        self._stride = [None if p.numel() <= PARAM_SAMPLE else -(-p.numel() // PARAM_SAMPLE) for p in params]
        read = [p.numel() if s is None else len(range(0, p.numel(), s)) for p, s in zip(params, self._stride)]
        lengths = torch.tensor(read, dtype=torch.long)
        self.scale = torch.tensor([p.numel() / r if r else 1.0 for p, r in zip(params, read)], dtype=torch.float32)
        kinds = {(p.dtype, p.device) for p in params}
        flat_ok = len(kinds) == 1 and next(iter(kinds))[0] in (torch.float32, torch.float64)
        small = [i for i, r in enumerate(read) if flat_ok and r <= _FLATTEN_NUMEL]
        big = [i for i in range(len(params)) if i not in set(small)]
        self._batches = [_Batch(pos, self.owner, self.scale, lengths, flat)
                         for pos, flat in ((small, True), (big, False)) if pos]
        self._maybe_sparse = sorted(sparse)
        self._present = torch.zeros(0, dtype=torch.bool)  # the layers with parameters, sized on first use
        self._present_on: dict = {}

    def _views(self, tensors: list[torch.Tensor], pos: list[int]) -> list[torch.Tensor]:
        """``tensors[i]`` for i in ``pos``, the large ones as their strided subsets (views, no copy)."""
        stride = self._stride
        return [tensors[i] if stride[i] is None else tensors[i].detach().reshape(-1)[::stride[i]] for i in pos]

    def _per_layer(self, parts: list[tuple[torch.Tensor, torch.Tensor]], n_layers: int) -> torch.Tensor:
        """sqrt of the summed squares per layer from (owners, squares) pairs: (n_layers,), 0 for none."""
        device = parts[0][1].device
        out = torch.zeros(n_layers, dtype=torch.float32, device=device)
        for owner, sq in parts:
            out.index_add_(0, owner, sq.to(device))
        return out.sqrt()

    def _masked(self, out: torch.Tensor, owners: list[int] | None) -> torch.Tensor:
        """``out`` with NaN for the layers that have no tensor (``owners``: those that do; None: every owner)."""
        n = out.shape[0]
        if owners is None:
            if self._present.shape[0] != n:
                self._present = torch.zeros(n, dtype=torch.bool)
                self._present[self.owner] = True
                self._present_on = {}
            present = self._present_on.get(out.device)
            if present is None:
                present = self._present_on[out.device] = self._present.to(out.device)
        else:
            present = torch.zeros(n, dtype=torch.bool)
            present[owners] = True
            present = present.to(out.device)
        return torch.where(present, out, torch.full_like(out, float("nan")))

    def _all(self, tensors: list[torch.Tensor], n_layers: int) -> torch.Tensor:
        parts = [(b.on("owner", tensors[b.pos[0]].device), b.squares(self._views(tensors, b.pos)))
                 for b in self._batches]
        return self._masked(self._per_layer(parts, n_layers), None)

    def weights(self, n_layers: int) -> torch.Tensor:
        """Per-layer norm of the parameters; NaN for a layer without any."""
        if not self.params:
            return torch.full((n_layers,), float("nan"))
        with torch.no_grad():
            return self._all(self.params, n_layers)

    def grads(self, n_layers: int) -> torch.Tensor:
        """Per-layer norm of the gradients (sparse ones left out); NaN for a layer with none."""
        grads = [p.grad for p in self.params]
        sparse = [i for i in self._maybe_sparse if (g := grads[i]) is not None and g.is_sparse]
        with torch.no_grad():
            if not sparse and all(g is not None for g in grads):
                return self._all([g for g in grads if g is not None], n_layers)
            index = [i for i, g in enumerate(grads) if g is not None and i not in sparse]
            if not index:
                return torch.full((n_layers,), float("nan"))
            views = self._views([g for g in grads], index)  # type: ignore[misc]  # None only outside ``index``
            sq = (norms(views) ** 2) * self.scale[index].to(views[0].device)
            out = self._per_layer([(self.owner[index].to(sq.device), sq)], n_layers)
            return self._masked(out, [self.owners[i] for i in index])

    def snapshot(self) -> list[list[torch.Tensor]]:
        """A copy of the (subsampled) parameters, to measure the step that follows."""
        with torch.no_grad():
            return [b.copy(self._views(self.params, b.pos)) for b in self._batches]

    def updates(self, before: list[list[torch.Tensor]], n_layers: int) -> torch.Tensor:
        """Per-layer norm of the change since ``snapshot()`` (0 for a layer without parameters)."""
        with torch.no_grad():
            parts = [(b.on("owner", self.params[b.pos[0]].device), b.change(self._views(self.params, b.pos), prev))
                     for b, prev in zip(self._batches, before)]
            return self._per_layer(parts, n_layers)
