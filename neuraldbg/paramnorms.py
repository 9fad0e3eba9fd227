"""Extraction: per-layer norms of the parameters, of their gradients and of an optimizer step's
updates, on sampled steps.

Every parameter belongs to one layer (its first owner); a layer's norm is the square root of the
sum of its parameters' squared norms. A parameter of up to ``PARAM_SAMPLE`` elements is read whole;
a larger one through an evenly strided subset, its square scaled up to the whole. The layout (who
owns what, which parameters are subsampled, by how much) is worked out once: the parameters (their
subsets) are grouped by shape, dtype and device, and a sampled step reduces each group at once, its
tensors stacked into one (a copy, in one kernel: on a CPU far cheaper than a kernel per tensor, and
on an accelerator one launch), their squared norms taken along the stack. A model of repeated blocks
has a handful of groups however deep it is. Per-layer sums follow on the device (``index_add_``).
"""
from __future__ import annotations

import torch

from .stats import PARAM_SAMPLE, norms


NARROW_DTYPES = (torch.float16, torch.bfloat16)


class _Group:
    """Parameters of one shape, dtype and device (positions ``pos``), reduced together."""

    def __init__(self, pos: list[int], owner: torch.Tensor, scale: torch.Tensor):
        self.pos = pos
        self._host = {"owner": owner[pos], "scale": scale[pos]}
        self._on_device: dict = {}

    def on(self, name: str, device) -> torch.Tensor:
        hit = self._on_device.get((name, device))
        if hit is None:
            hit = self._on_device[(name, device)] = self._host[name].to(device)
        return hit

    def copy(self, views: list[torch.Tensor]) -> torch.Tensor:
        """The tensors stacked into one (G, ...) tensor: a copy, also of a single one."""
        return torch.stack(views)

    def squares(self, stacked: torch.Tensor) -> torch.Tensor:
        """The scaled squared norm of each tensor of a (G, ...) stack, in float32."""
        flat = stacked.reshape(stacked.shape[0], -1)
        wide = flat.dtype in (torch.float32, torch.float64)  # half precision: reduced in float32 (no overflow)
        sq = torch.linalg.vector_norm(flat, dim=1, dtype=None if wide else torch.float32).float() ** 2
        return sq * self.on("scale", sq.device)


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
        self.scale = torch.tensor([p.numel() / r if r else 1.0 for p, r in zip(params, read)], dtype=torch.float32)
        by_kind: dict[tuple, list[int]] = {}
        for i, (p, s) in enumerate(zip(params, self._stride)):
            shape = tuple(p.shape) if s is None else (read[i],)
            by_kind.setdefault((shape, p.dtype, p.device, p.layout), []).append(i)
        self._groups = [_Group(pos, self.owner, self.scale) for pos in by_kind.values()]
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
            out.index_add_(0, owner.to(device), sq.to(device))
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
        parts = []
        for g in self._groups:
            sq = g.squares(torch.stack(self._views(tensors, g.pos)))
            parts.append((g.on("owner", sq.device), sq))
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

    def snapshot(self) -> list[torch.Tensor]:
        """A copy of the (subsampled) parameters, to measure the step that follows: one tensor per group."""
        with torch.no_grad():
            return [g.copy(self._views(self.params, g.pos)) for g in self._groups]

    def distance(self, before: list[torch.Tensor], n_layers: int) -> torch.Tensor:
        """Per-layer norm of the change since a ``snapshot()`` taken any number of steps ago (0 for a layer
        without parameters)."""
        return self._changes(before, n_layers, count=False)

    def updates(self, before: list[torch.Tensor], n_layers: int) -> torch.Tensor:
        """Per-layer norm of the change since ``snapshot()`` (0 for a layer without parameters). For
        parameters stored in 16 bits, ``unchanged`` is then the number of their (read) entries the step left
        exactly as they were, and ``narrow_read`` how many were read (an update below half a unit in the last
        place of a weight rounds away)."""
        return self._changes(before, n_layers, count=True)

    def _changes(self, before: list[torch.Tensor], n_layers: int, count: bool) -> torch.Tensor:
        with torch.no_grad():
            parts = []
            unchanged = []
            narrow = 0
            for g, prev in zip(self._groups, before):
                diff = torch.stack(self._views(self.params, g.pos)).sub_(prev)
                if count and diff.dtype in NARROW_DTYPES:
                    unchanged.append((diff == 0).sum())
                    narrow += diff.numel()
                sq = g.squares(diff)
                parts.append((g.on("owner", sq.device), sq))
            if count:
                self.narrow_read = narrow
                self.unchanged = torch.stack(unchanged).sum() if unchanged else None
            return self._per_layer(parts, n_layers)

    unchanged: torch.Tensor | None = None
    narrow_read = 0
