"""Extraction: per-layer norms of the parameters, of their gradients and of an optimizer step's
updates, on sampled steps.

Every parameter belongs to one layer (its first owner); a layer's norm is the square root of the
sum of its parameters' squared norms. A parameter of up to ``PARAM_SAMPLE`` elements is read whole;
a larger one through an evenly strided subset, its square scaled up to the whole. The layout (who
owns what, which parameters are subsampled, by how much) is worked out once; a sampled step then
reduces every tensor at once (``torch._foreach_norm``: one fused kernel on an accelerator) and
combines them per layer on the device, with no per-parameter work in Python beyond listing them.
"""
from __future__ import annotations

import torch

from .stats import PARAM_SAMPLE, norms


class ParamNorms:
    """The parameters of a model's layers (``owners[i]``: the layer of ``params[i]``)."""

    def __init__(self, params: list[torch.Tensor], owners: list[int], sparse: set[int] | frozenset = frozenset()):
        self.params = params
        self.owners = owners
        self.owner = torch.tensor(owners, dtype=torch.long)
        # a large parameter is read every ``stride``-th element, its square scaled by n / (elements read)
        self._stride = [None if p.numel() <= PARAM_SAMPLE else -(-p.numel() // PARAM_SAMPLE) for p in params]
        self.scale = torch.tensor([1.0 if s is None else p.numel() / len(range(0, p.numel(), s))
                                   for p, s in zip(params, self._stride)], dtype=torch.float32)
        self._uniform = len({(p.dtype, p.device) for p in params}) <= 1
        # ``sparse``: the parameters whose gradient may be sparse (a sparse embedding's); only they are checked
        self._maybe_sparse = sorted(sparse)
        self.present = torch.zeros(0, dtype=torch.bool)  # layers with parameters, sized on first use
        self._device_cache: dict = {}

    def views(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` (one per parameter, in order), the large ones as their strided subsets (views)."""
        return [t if s is None else t.detach().reshape(-1)[::s] for t, s in zip(tensors, self._stride)]

    def _on(self, t: torch.Tensor, device) -> torch.Tensor:
        key = (id(t), device)
        hit = self._device_cache.get(key)
        if hit is None:
            hit = self._device_cache[key] = t.to(device)
        return hit

    def _per_layer(self, views: list[torch.Tensor], n_layers: int, index: list[int] | None = None) -> torch.Tensor:
        """sqrt(sum of scaled squared norms) per layer: (n_layers,), 0 for a layer with none."""
        sq = norms(views, uniform=self._uniform) ** 2
        if index is None:
            scale, owner = self._on(self.scale, sq.device), self._on(self.owner, sq.device)
        else:
            idx = torch.tensor(index, dtype=torch.long)
            scale, owner = self.scale[idx].to(sq.device), self.owner[idx].to(sq.device)
        out = torch.zeros(n_layers, dtype=torch.float32, device=sq.device)
        out.index_add_(0, owner, sq * scale)
        return out.sqrt()

    def _masked(self, out: torch.Tensor, owners: list[int] | None) -> torch.Tensor:
        """``out`` with NaN for the layers that have no tensor (``owners``: those that do; None: all owners)."""
        n = out.shape[0]
        if owners is None:
            if self.present.shape[0] != n:
                self.present = torch.zeros(n, dtype=torch.bool)
                self.present[self.owner] = True
                self._device_cache.clear()
            present = self._on(self.present, out.device)
        else:
            present = torch.zeros(n, dtype=torch.bool)
            present[owners] = True
            present = present.to(out.device)
        return torch.where(present, out, torch.full_like(out, float("nan")))

    def weights(self, n_layers: int) -> torch.Tensor:
        """Per-layer norm of the parameters; NaN for a layer without any."""
        if not self.params:
            return torch.full((n_layers,), float("nan"))
        with torch.no_grad():
            return self._masked(self._per_layer(self.views(self.params), n_layers), None)

    def grads(self, n_layers: int) -> torch.Tensor:
        """Per-layer norm of the gradients (sparse ones left out); NaN for a layer with none."""
        grads = [p.grad for p in self.params]
        sparse = [i for i in self._maybe_sparse if grads[i] is not None and grads[i].is_sparse]
        if sparse or any(g is None for g in grads):
            index = [i for i, g in enumerate(grads) if g is not None and i not in sparse]
            if not index:
                return torch.full((n_layers,), float("nan"))
            kept = [grads[i] for i in index]
            views = [t if self._stride[i] is None else t.detach().reshape(-1)[::self._stride[i]]
                     for t, i in zip(kept, index)]
            with torch.no_grad():
                return self._masked(self._per_layer(views, n_layers, index), [self.owners[i] for i in index])
        with torch.no_grad():
            return self._masked(self._per_layer(self.views(grads), n_layers), None)

    def snapshot(self) -> list[torch.Tensor]:
        """A copy of the (subsampled) parameters, to measure the step that follows (one fused copy)."""
        with torch.no_grad():
            return list(torch._foreach_mul(self.views(self.params), 1.0))

    def updates(self, before: list[torch.Tensor], n_layers: int) -> torch.Tensor:
        """Per-layer norm of the change since ``snapshot()`` (0 for a layer without parameters)."""
        with torch.no_grad():
            diffs = torch._foreach_sub(self.views(self.params), before)
            return self._per_layer(list(diffs), n_layers)
