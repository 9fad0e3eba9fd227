"""Extraction for the comparison across ranks: what one rank measures of itself, with no collective.

- every step, from a forward pre-hook on the model: the sum and norm of the batch's tensors, kept on the
  device until the merge, where they become a fingerprint (equal batches give equal fingerprints, and
  the same samples in another order nearly equal ones) and the RMS of its first tensor;
- at merge steps only: a gradient hook on every parameter for the rank's own (local) gradient, before
  the all-reduce averages it, projected on fixed sign patterns (summed over the passes of an
  accumulated step: projections are linear); after the optimizer step, per layer a signed checksum of
  the weights, their norm and the same projections of the gradient after the all-reduce, and a few
  channels of each BatchNorm's running statistics. All of it reaches the host in one transfer (``row``).
"""
from __future__ import annotations

from typing import AbstractSet, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from .layers import LayerInfo, own_named_parameters
from .ranktrace import BN_SLOTS, PHASES, PROJECTIONS, TAIL, RankLayout, bn_channels
from .trace import NonFiniteOrigin

# Elements of each parameter (an evenly strided subset, as ``stats.param_view`` takes) that its checksum
# and gradient projections read: enough to see replicas drift apart, a quarter of the norms' share.
RANK_SAMPLE = 16384

# At most this many tensors of a batch enter its fingerprint.
FINGERPRINT_TENSORS = 4

_SIGNS: dict[torch.device, torch.Tensor] = {}


def _signs(device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random +-1 patterns (the same on every rank), (1 + PROJECTIONS, RANK_SAMPLE): the first
    weighs the checksum's elements, the others the gradient projections."""
    if device not in _SIGNS:
        g = torch.Generator().manual_seed(20240613)
        signs = torch.randint(0, 2, (1 + PROJECTIONS, RANK_SAMPLE), generator=g, dtype=torch.float64) * 2 - 1
        _SIGNS[device] = signs.to(device)
    return _SIGNS[device]


def rank_view(t: torch.Tensor) -> torch.Tensor:
    """At most ``RANK_SAMPLE`` evenly strided elements of ``t`` (a view, no copy)."""
    flat = t.detach().reshape(-1)
    return flat if flat.numel() <= RANK_SAMPLE else flat[::-(-flat.numel() // RANK_SAMPLE)]


def _project(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """(PROJECTIONS,) float64: a strided view of ``t`` projected on the gradient sign patterns."""
    v = rank_view(t).to(torch.float64)
    return (_signs(v.device)[1:, :v.numel()] * v).sum(dim=1).to(dev)


def batch_sums(args, kwargs) -> tuple[torch.Tensor, int] | None:
    """Of the first ``FINGERPRINT_TENSORS`` tensors of a batch, each one's sum and norm (float32), as one
    (2 * tensors,) device tensor, and the element count of the first
    floating-point one (0: none, its RMS unknown). None when the batch holds no tensor. A few device
    operations, no host transfer: ``fingerprints`` combines them on the host."""
    leaves = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor) and t.numel() > 0]
    if not leaves:
        return None
    leaves = leaves[:FINGERPRINT_TENSORS]
    dev = leaves[0].device
    parts, numel = [], 0
    for k, t in enumerate(leaves):
        t = t.detach()
        if t.is_sparse:
            t = t.to_dense()
        if t.is_complex():
            t = torch.view_as_real(t)
        if k == 0 and t.is_floating_point():
            numel = t.numel()
        if not t.is_floating_point():
            t = t.to(torch.float32)  # token ids, masks: small next to the model's own tensors
        parts += [torch.sum(t, dtype=torch.float32).to(dev), torch.linalg.vector_norm(t, dtype=torch.float32).to(dev)]
    return torch.stack(parts), numel


# how each tensor's sum and sum of squares weigh in a fingerprint: by its place, so that a constant
# tensor (a mask of ones) cannot make different batches look the same
_WEIGHTS = np.array([[k + 1.0, (k + 1.5) * np.pi] for k in range(FINGERPRINT_TENSORS)]).reshape(-1)


def fingerprints(sums: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """(n, 2): fingerprint and RMS of the first tensor, from ``batch_sums`` of n batches. Equal batches give
    equal fingerprints, whatever the order of their samples."""
    sums = np.asarray(sums, dtype=np.float64).reshape(len(numel), -1)
    squared = np.zeros((len(sums), len(_WEIGHTS)))
    squared[:, :sums.shape[1]] = sums
    squared[:, 1::2] **= 2
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.where(numel > 0, squared[:, 1] / np.maximum(numel, 1), np.nan) ** 0.5
    return np.stack([squared @ _WEIGHTS, rms], axis=1)


def fingerprint(args, kwargs) -> np.ndarray | None:
    """(fingerprint, RMS) of one batch (see ``fingerprints``); None when it holds no tensor."""
    got = batch_sums(args, kwargs)
    if got is None:
        return None
    return fingerprints(got[0].cpu().numpy()[None], np.array([got[1]]))[0]


class RankProbe:
    """Hooks and per-merge measurements of one rank (see the module docstring)."""

    def __init__(self, model: nn.Module, layers: list[LayerInfo], modules: list[nn.Module],
                 step_of: Callable[[], int], is_merge_step: Callable[[int], bool], hook_on: nn.Module | None = None,
                 unsynced: AbstractSet[str] = frozenset()):
        self.model = model
        self.hook_on = model if hook_on is None else hook_on  # a compiled model's wrapper: hooked outside the graph
        self.layers = layers
        self.step_of = step_of
        self.is_merge_step = is_merge_step
        index = {id(m): i for i, m in enumerate(modules)}
        seen: set[int] = set()
        self.params: list[tuple[str, nn.Parameter, int]] = []
        for name, m in model.named_modules():
            for pname, p in own_named_parameters(m):
                qualified = f"{name}.{pname}" if name else pname
                if id(p) in seen or id(m) not in index or qualified in unsynced:
                    continue
                seen.add(id(p))
                self.params.append((qualified, p, index[id(m)]))
        bn = []
        self._bn_modules: list[tuple[nn.Module, torch.Tensor]] = []
        for i, m in enumerate(modules):
            running = getattr(m, "running_mean", None)
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and isinstance(running, torch.Tensor):
                picks = bn_channels(int(running.numel()))
                bn.append((i, int(running.numel()), picks))
                self._bn_modules.append((m, torch.tensor(picks, dtype=torch.long)))
        self.layout = RankLayout(n_layers=len(layers), bn=tuple(bn))
        self._owner = torch.tensor([o for _, _, o in self.params], dtype=torch.long)
        self._has_params = np.zeros(len(layers), dtype=bool)
        self._has_params[[o for _, _, o in self.params]] = True
        self._batches: list[tuple[int, torch.Tensor, int]] = []   # (step, batch_sums)
        self._fp_step = -1
        self.passes = 0
        self._local: list[tuple[int, torch.Tensor]] = []   # (param index, projections of a local gradient)
        self._grad_handles: list = []
        self._handle: RemovableHandle | None = None
        self.error: str | None = None          # the first measurement that failed (it is skipped, never raised)

    # -- hooks -----------------------------------------------------------------------------------
    def attach(self) -> None:
        if self._handle is None:
            self._handle = self.hook_on.register_forward_pre_hook(self._on_forward, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._drop_grad_hooks()

    def _on_forward(self, module, args, kwargs):
        self.see_pass(args, kwargs)
        return None

    def see_pass(self, args, kwargs) -> None:
        """A training pass starts with this batch (from the model's forward, or ``NeuralDbg.begin_pass``)."""
        if not torch.is_grad_enabled():
            return  # evaluation passes are not training batches
        step = self.step_of()
        if step != self._fp_step:  # the first forward pass of a step: its batch
            self._fp_step = step
            self.passes = 0
            try:
                got = batch_sums(args, kwargs)
            except (RuntimeError, TypeError, ValueError) as exc:  # an input kind it cannot sum: no fingerprint
                got = None
                self._note(exc)
            if got is not None:
                self._batches.append((step, *got))
            if self.is_merge_step(step):
                self._add_grad_hooks()
        self.passes += 1

    def _add_grad_hooks(self) -> None:
        self._drop_grad_hooks()
        self._local = []
        for j, (_, p, _) in enumerate(self.params):
            if p.requires_grad:
                self._grad_handles.append(p.register_hook(self._make_grad_hook(j)))

    def _make_grad_hook(self, j: int):
        def hook(g):
            if g is not None and not g.is_sparse:
                try:
                    self._local.append((j, _project(g.detach(), g.device)))
                except (RuntimeError, TypeError) as exc:
                    self._note(exc)
            return None
        return hook

    def _note(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"

    def _drop_grad_hooks(self) -> None:
        for h in self._grad_handles:
            h.remove()
        self._grad_handles.clear()

    # -- measurements ----------------------------------------------------------------------------
    def drain_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """Steps and (fingerprint, RMS) rows of the batches since the last drain, in one transfer."""
        items, self._batches = self._batches, []
        if not items:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 2))
        dev = items[0][1].device
        width = 2 * FINGERPRINT_TENSORS
        sums = torch.stack([F.pad(v.to(dev), (0, width - len(v))) for _, v, _ in items]).cpu().double().numpy()
        return (np.array([s for s, _, _ in items], dtype=np.int64),
                fingerprints(sums, np.array([n for _, _, n in items], dtype=np.int64)))

    def row(self, nonfinite: NonFiniteOrigin | None) -> np.ndarray:
        """This rank's row after a merge step's optimizer step (see ``RankLayout``); NaN where a measurement
        failed (noted in ``error``), so that the ranks' exchanges stay in step."""
        try:
            return self._row(nonfinite)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            self._note(exc)
            self._drop_grad_hooks()
            self._local = []
            return np.full(self.layout.length, np.nan)

    def _row(self, nonfinite: NonFiniteOrigin | None) -> np.ndarray:
        lay, n = self.layout, len(self.layers)
        parts: list[torch.Tensor] = []
        dev = self.params[0][1].device if self.params else torch.device("cpu")
        owner = self._owner.to(dev)
        if self.params:
            views = [rank_view(p) for _, p, _ in self.params]
            check = torch.stack([(v.to(torch.float64) * _signs(v.device)[0, :v.numel()]).sum().to(dev) for v in views])
            sq = torch.stack([torch.linalg.vector_norm(v, dtype=torch.float64).to(dev) ** 2 for v in views])
            parts += [_per_layer(check, owner, n), _per_layer(sq, owner, n).sqrt()]
            parts.append(self._projections(self._local, owner, n, dev))
            grads = [(j, _project(p.grad.detach(), dev)) for j, (_, p, _) in enumerate(self.params)
                     if p.grad is not None and not p.grad.is_sparse]
            parts.append(self._projections(grads, owner, n, dev))
        else:
            parts.append(torch.full(((2 + 2 * PROJECTIONS) * n,), float("nan"), dtype=torch.float64, device=dev))
        for which in ("running_mean", "running_var"):
            for m, picks in self._bn_modules:
                buf = getattr(m, which)
                vals = torch.full((BN_SLOTS,), float("nan"), dtype=torch.float64, device=dev)
                vals[:len(picks)] = buf.detach()[picks.to(buf.device)].to(device=dev, dtype=torch.float64)
                parts.append(vals)
        host = torch.cat(parts).cpu().numpy() if parts else np.zeros(0)
        row = np.full(lay.length, np.nan)
        row[:len(host)] = host
        for name, _ in RankLayout.BLOCKS:
            lay.block(row, name)[..., ~self._has_params] = np.nan
        if nonfinite is not None:
            names = [l.name for l in self.layers]
            tail = {"nonfinite_step": nonfinite.step,
                    "nonfinite_phase": PHASES.index(nonfinite.phase) if nonfinite.phase in PHASES else len(PHASES) - 1,
                    "nonfinite_layer": names.index(nonfinite.layer) if nonfinite.layer in names else -1}
            for k, v in tail.items():
                row[lay.length - len(TAIL) + TAIL.index(k)] = v
        row[lay.length - len(TAIL) + TAIL.index("passes")] = self.passes
        self._drop_grad_hooks()
        self._local = []
        return row

    @staticmethod
    def _projections(items: list[tuple[int, torch.Tensor]], owner: torch.Tensor, n: int, dev) -> torch.Tensor:
        """(PROJECTIONS * n,): per layer, the summed projections of its parameters' gradients (NaN for a
        layer with none, e.g. no gradient hook fired)."""
        out = torch.full((PROJECTIONS, n), float("nan"), dtype=torch.float64, device=dev)
        if items:
            idx = owner[[j for j, _ in items]].to(dev)
            vals = torch.stack([v.to(dev) for _, v in items], dim=1)            # (PROJECTIONS, k)
            summed = torch.zeros((PROJECTIONS, n), dtype=torch.float64, device=dev).index_add_(1, idx, vals)
            seen = torch.zeros(n, dtype=torch.bool, device=dev)
            seen[idx] = True
            out = torch.where(seen, summed, out)
        return out.reshape(-1)


def _per_layer(values: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=torch.float64, device=values.device)
    out.index_add_(0, owner.to(values.device), values.to(torch.float64))
    return out
