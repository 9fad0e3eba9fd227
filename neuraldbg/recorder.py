"""Extraction: hooks on the model and optimizer that turn a training loop into trace rows.

Costs, by design:
- every step: a forward pre/post hook on the model itself, one gradient hook on its output,
  a finiteness check of the output, its gradient and the parameter gradients (one fused norm),
  and the optimizer step hooks;
- sampled steps only (see ``Schedule``): a hook on every watched layer, each computing a few
  statistics on the tensor's device; all of them reach the host in one transfer at step end.
In eager mode the per-layer hooks exist only during the forward pass of a sampled step. For a
``torch.compile``d model they stay registered, excluded from compilation (no recompiles), and
return at once on unsampled steps.
"""
from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
import torch
from torch import nn

from . import nanhunt
from .layers import Kind, LayerInfo, describe, watched_modules
from .schedule import Schedule, Throttle
from .stats import (BATCH_NUMEL, FORWARD_STATS, GRAD_STATS, N_STATS, PARAM_STATS, all_finite, forward_stats,
                    forward_stats_batch, grad_stats, grad_stats_batch, param_view, per_layer_norms)
from .trace import GLOBAL_COLUMNS, Trace

_ACT_COLS = [int(s) for s in FORWARD_STATS]
_GRAD_COLS = [int(s) for s in GRAD_STATS]
_PARAM_COLS = [int(s) for s in PARAM_STATS]
# "Units never positive" is measured where a zero output means a unit that stopped learning.
_DEAD_KINDS = (Kind.RELU, Kind.SMOOTH, Kind.OTHER)


def _queue_backward_callback(fn: Callable[[], None]) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _disable_under_compile(fn):
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(fn) if disable is not None else fn


class _StepRecord:
    """What one sampled step has gathered so far (device tensors, not yet on the host)."""

    __slots__ = ("fwd", "grad", "fwd_small", "grad_small", "params", "input", "prev_params", "forward_done")

    def __init__(self, n_layers: int):
        self.fwd: list = [None] * n_layers    # per layer: its stats row, or True once stashed below
        self.grad: list = [None] * n_layers
        self.fwd_small: dict[tuple, list] = {}   # batching key -> [(layer index, tensor copy)]
        self.grad_small: dict[tuple, list] = {}
        self.params: torch.Tensor | None = None      # (3, n_layers): weight, grad, update norms
        self.input: torch.Tensor | None = None
        self.prev_params: list[torch.Tensor] | None = None
        self.forward_done = False


class Recorder:
    """Attaches to a model (and optionally its optimizer) and fills a ``Trace``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 every: int | None = None, capacity: int = 2048, schedule: Schedule | None = None,
                 on_step: Callable[[], None] | None = None, throttle: Throttle | None = None,
                 after_step: Callable[[], None] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"NeuralDbg watches a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.inner: nn.Module = getattr(model, "_orig_mod", model)  # torch.compile wrapper -> original
        self.compiled = self.inner is not model
        self.optimizer = optimizer
        self.schedule = schedule or Schedule(every)
        self.on_step = on_step
        self.after_step = after_step
        self.throttle = throttle or Throttle()

        mods = watched_modules(self.inner)
        self.modules = [m for _, m in mods]
        self.layers: list[LayerInfo] = [describe(i, name, m) for i, (name, m) in enumerate(mods)]
        index_of = {id(m): i for i, m in enumerate(self.modules)}
        owner_of: dict[int, int] = {}
        for name, m in self.inner.named_modules():
            for p in m.parameters(recurse=False):
                if id(p) in owner_of:
                    continue  # shared parameter: counted once, at its first owner
                # a parameter of an unwatched container belongs to the model as a whole: skip
                if id(m) in index_of:
                    owner_of[id(p)] = index_of[id(m)]
        all_params = {id(p): p for p in self.inner.parameters()}
        self._params = [all_params[k] for k in owner_of]
        self._owner = torch.tensor([owner_of[id(p)] for p in self._params], dtype=torch.long)
        self._owner_list = self._owner.tolist()
        # per layer, its smallest trainable parameter: NaN/Inf flowing back through a layer reaches
        # it, so checking these few small gradients every step is enough to notice a bad backward
        smallest: dict[int, nn.Parameter] = {}
        for p, o in zip(self._params, self._owner_list):
            if p.requires_grad and (o not in smallest or p.numel() < smallest[o].numel()):
                smallest[o] = p
        self._sentinels = list(smallest.values())
        if optimizer is not None:
            self._check_optimizer(optimizer)

        self.trace = Trace(self.layers, capacity=capacity)
        self.trace.meta.update(model=type(self.inner).__name__, compiled=self.compiled,
                               optimizer=type(optimizer).__name__ if optimizer is not None else None)
        self.step = 0                 # completed steps
        self.passes = 0               # completed backward passes through the model
        self._rec: _StepRecord | None = None
        self._sample_now = self.schedule.should_sample(0)
        self._handles: list = []
        self._layer_handles: list = []
        self._opt_handles: list = []
        self._explicit = False        # a pass begun by ``begin_pass``, its forward part not yet ended
        self._replay_run: Callable | None = None  # how to replay the latest pass (None: the model's forward)
        self._next_order = 0
        self._pass_step = 0           # the step the latest forward pass belongs to
        self._seen_lr = self._lr(sync=False)  # the learning rate of the latest step, to see it rise
        self._pending_losses: list = []
        self._out_grads: list = []
        self._out_leaves: list = []
        self._last_inputs = None
        self._rng_state = None
        self._backward_queued = False
        self._replaying = False
        self.attached = False
        self._no_params = np.array([i for i, l in enumerate(self.layers) if l.n_params == 0], dtype=np.int64)
        self._fwd_hooks = [self._make_forward_hook(i, l) for i, l in enumerate(self.layers)]

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
            self._handles.append(self.model.register_forward_hook(self._on_forward_end, with_kwargs=True))
            self._hook_optimizer()
            if self.compiled:  # permanent, excluded from the graph: no recompiles
                for m, h in zip(self.modules, self._fwd_hooks):
                    self._handles.append(m.register_forward_hook(_disable_under_compile(h)))
        except BaseException:
            self.detach()
            raise
        self.attached = True

    def detach(self) -> None:
        """Remove every hook; safe to call more than once, from any exit path."""
        for h in self._layer_handles + self._handles + self._opt_handles:
            h.remove()
        self._layer_handles.clear()
        self._handles.clear()
        self._opt_handles.clear()
        self._rec = None
        self._explicit = False
        self._replay_run = None
        if getattr(self.model, "_neuraldbg_watcher", None) is not None:
            try:
                del self.model._neuraldbg_watcher
            except AttributeError:
                pass
        self.flush_losses()
        self.attached = False

    # -- optimizer ---------------------------------------------------------------------------------
    def _check_optimizer(self, optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if owned and not any(id(p) in owned for p in self.inner.parameters()):
            raise ValueError("the optimizer does not own any parameter of the model")

    def _hook_optimizer(self) -> None:
        if self.optimizer is not None:
            self._opt_handles.append(self.optimizer.register_step_pre_hook(self._on_optimizer_pre))
            self._opt_handles.append(self.optimizer.register_step_post_hook(self._on_optimizer_post))

    def set_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count steps by ``optimizer`` from now on, in place of any optimizer given before (one that a
        training framework creates only once training begins)."""
        self._check_optimizer(optimizer)
        for h in self._opt_handles:
            h.remove()
        self._opt_handles.clear()
        self.optimizer = optimizer
        self.trace.meta["optimizer"] = type(optimizer).__name__
        self._seen_lr = self._lr(sync=False)
        if self.attached:
            self._hook_optimizer()

    # -- loss --------------------------------------------------------------------------------------
    def record_loss(self, loss) -> None:
        if isinstance(loss, torch.Tensor):
            value = loss.detach()
            value = value.float().mean() if value.numel() != 1 else value.reshape(()).float()
            if value.device.type == "cpu":
                value = float(value)
        else:
            value = float(loss)
        self._pending_losses.append((self._pass_step, value))
        if len(self._pending_losses) >= 256:
            self.flush_losses()

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
        self._close_layer_hooks()  # a pass begun and never ended (a skipped step)
        self._explicit = True
        self._start_pass(args, kwargs or {}, run)

    def end_forward(self, outputs) -> None:
        """The forward part of a pass begun by ``begin_pass`` is over; ``outputs`` go to the backward."""
        if not self._explicit:
            return
        self._explicit = False
        self._end_forward(outputs)

    def _on_forward_start(self, module, args, kwargs):
        if self._explicit or self._replaying or not torch.is_grad_enabled():
            return None  # evaluation passes under no_grad are neither steps nor statistics
        self._start_pass(args, kwargs, None)
        return None

    def _start_pass(self, args, kwargs, run: Callable | None) -> None:
        self._replay_run = run
        if self._pass_step != self.step:  # the first forward pass of a step (not a second, accumulated one)
            self._watch_lr()
        self._pass_step = self.step
        self._last_inputs = (args, kwargs)
        if self.trace.nonfinite is None:
            self._rng_state = torch.get_rng_state()
        if self._sample_now and (self._rec is None or not self._rec.forward_done):
            if self._rec is None:
                self._rec = _StepRecord(len(self.layers))
            x = nanhunt.float_tensors((args, kwargs))
            if x:
                self._rec.input = forward_stats(x[0], None, None)[:4]
            if not self.compiled:
                for m, h in zip(self.modules, self._fwd_hooks):
                    self._layer_handles.append(m.register_forward_hook(h))

    def _on_forward_end(self, module, args, kwargs, output):
        if self._explicit or self._replaying or not torch.is_grad_enabled():
            return None
        self._end_forward(output)
        return None

    def _close_layer_hooks(self) -> None:
        for h in self._layer_handles:
            h.remove()
        self._layer_handles.clear()

    def _end_forward(self, output) -> None:
        self._close_layer_hooks()
        if self._rec is not None:
            self._rec.forward_done = True
        # NaN/Inf in the output shows up in the gradient arriving at it: checked at backward end
        self._out_leaves = [t for t in nanhunt.float_tensors(output) if t.requires_grad]
        self._out_grads = [None] * len(self._out_leaves)
        self._backward_queued = False
        for i, t in enumerate(self._out_leaves):
            t.register_hook(self._make_output_grad_hook(i))

    def _make_forward_hook(self, idx: int, layer: LayerInfo):
        def hook(module, args, output):
            rec = self._rec
            if rec is None or rec.forward_done or rec.fwd[idx] is not None or self._replaying:
                return None
            outs = nanhunt.float_tensors(output)
            if not outs:
                return None
            t = outs[0]
            if layer.order is None:
                layer.order = self._next_order
                self._next_order += 1
            unit_dim = layer.unit_dim(t.dim())
            dead = layer.kind in _DEAD_KINDS
            if t.numel() <= BATCH_NUMEL:  # a copy: later in-place ops must not change what we measure
                key = (tuple(t.shape), t.dtype, t.device, unit_dim, layer.bounds, dead)
                rec.fwd_small.setdefault(key, []).append((idx, t.detach().clone()))
                rec.fwd[idx] = True
            else:
                rec.fwd[idx] = forward_stats(t, unit_dim, layer.bounds, dead=dead)
            if t.requires_grad:
                t.register_hook(self._make_grad_hook(idx, unit_dim, rec))
            return None
        return hook

    def _make_grad_hook(self, idx: int, unit_dim: int | None, rec: _StepRecord):
        def hook(g):
            if g is not None and rec.grad[idx] is None:
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
            if not self._backward_queued:
                self._backward_queued = True
                _queue_backward_callback(self._on_backward_end)
            return None
        return hook

    # -- backward / optimizer -----------------------------------------------------------------------
    def _param_norms(self, tensors: list[torch.Tensor], owners: list[int]) -> torch.Tensor:
        """Per-layer L2 norms of (strided subsets of) ``tensors``; NaN for layers with none."""
        n = len(self.layers)
        if not tensors:
            return torch.full((n,), float("nan"))
        views = [param_view(t) for t in tensors]
        scale = torch.tensor([f for _, f in views], dtype=torch.float32)
        out = per_layer_norms([v for v, _ in views], torch.tensor(owners, dtype=torch.long), n, scale)
        present = torch.zeros(n, dtype=torch.bool)
        present[owners] = True
        return torch.where(present.to(out.device), out, torch.full_like(out, float("nan")))

    def _on_backward_end(self) -> None:
        if not self.attached:
            return
        self.passes += 1
        if self.trace.nonfinite is None:
            self._check_finite([p.grad for p in self._sentinels if p.grad is not None and not p.grad.is_sparse])
        if self._rec is not None:
            self._read_param_grads(self._rec)
        if self.optimizer is None:
            self._finish_step()

    def read_gradients(self) -> None:
        """Measure the parameter gradients as they are now, for the step in progress."""
        if self.attached and self._rec is not None:
            self._read_param_grads(self._rec)

    def _read_param_grads(self, rec: _StepRecord) -> None:
        """Per-layer weight and gradient norms of a sampled step. Every read replaces the last one, so
        under gradient accumulation the step keeps the gradient of its whole window."""
        if not self._params:
            return
        w = self._param_norms(self._params, self._owner_list) if rec.params is None else rec.params[0]
        with_grad = [(p.grad, o) for p, o in zip(self._params, self._owner_list)
                     if p.grad is not None and not p.grad.is_sparse]
        gn = self._param_norms([g for g, _ in with_grad], [o for _, o in with_grad])
        upd = torch.full_like(w, float("nan")) if rec.params is None else rec.params[2]
        rec.params = torch.stack([w, gn.to(w.device), upd])

    def _check_finite(self, grads: list[torch.Tensor]) -> None:
        """The every-step check: one boolean read back to the host (the only per-step sync)."""
        checked = grads + [g for g in self._out_grads if g is not None]
        if checked and not bool(all_finite(checked)):
            args, kwargs = self._last_inputs if self._last_inputs is not None else ((), {})
            self._replaying = True
            try:
                self.trace.nonfinite = nanhunt.locate(self.inner, args, kwargs, self._rng_state,
                                                      list(self._out_grads), self._pass_step, run=self._replay_run)
            finally:
                self._replaying = False
            self._last_inputs = None

    def _on_optimizer_pre(self, optimizer, args, kwargs):
        if self._rec is None and self._sample_now:  # the step's forward runs inside optimizer.step (a closure)
            self._rec = _StepRecord(len(self.layers))
        rec = self._rec
        if rec is not None and self._params:
            views = [param_view(p)[0] for p in self._params]
            rec.prev_params = torch._foreach_mul(views, 1.0)  # one fused copy
        return None

    def _on_optimizer_post(self, optimizer, args, kwargs):
        rec = self._rec
        if rec is not None and rec.prev_params is not None:
            views = [param_view(p) for p in self._params]
            diffs = torch._foreach_sub([v for v, _ in views], rec.prev_params)
            scale = torch.tensor([f for _, f in views], dtype=torch.float32)
            upd = per_layer_norms(diffs, self._owner, len(self.layers), scale)
            if rec.params is None:
                nan = torch.full_like(upd, float("nan"))
                rec.params = torch.stack([self._param_norms(self._params, self._owner_list).to(upd.device), nan, nan])
            rec.params[2] = upd.to(rec.params.device)
            rec.prev_params = None
        self._finish_step()

    # -- step end ----------------------------------------------------------------------------------
    def _finish_step(self) -> None:
        rec, self._rec = self._rec, None
        self._close_layer_hooks()
        if rec is not None:
            self._flush(rec)
        self.schedule.step_done(self.step, sampled=rec is not None)
        self.step += 1
        self._sample_now = self.schedule.should_sample(self.step)
        self._out_grads = []
        self._out_leaves = []
        if self.after_step is not None:
            self.after_step()
        if self.on_step is not None and self.throttle.ready():
            self.on_step()

    def _flush(self, rec: _StepRecord) -> None:
        """Move one sampled step's statistics to the host in a single transfer."""
        fwd_idx, fwd_parts = self._rows(rec.fwd, rec.fwd_small,
                                        lambda x, key: forward_stats_batch(x, key[3], key[4], key[5]))
        grad_idx, grad_parts = self._rows(rec.grad, rec.grad_small, lambda x, key: grad_stats_batch(x, key[3]))
        parts = fwd_parts + grad_parts
        if rec.params is not None:
            parts.append(rec.params.reshape(-1))
        if rec.input is not None:
            parts.append(rec.input)
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
            if rec.params is not None:
                n = len(self.layers)
                row[:, _PARAM_COLS] = flat[k:k + 3 * n].reshape(3, n).T
                k += 3 * n
            if rec.input is not None:
                g[1:5] = flat[k:k + 4]
        row[np.ix_(self._no_params, _PARAM_COLS)] = np.nan
        g[0] = self._lr()
        self.trace.add_sample(self.step, row, g)
        self.flush_losses()

    @staticmethod
    def _rows(single: list, small: dict, batch_fn) -> tuple[list[int], list[torch.Tensor]]:
        """Layer indices and their stats rows: reduced-at-once ones, then stacked same-shape groups."""
        idx = [i for i, v in enumerate(single) if isinstance(v, torch.Tensor)]
        parts = [single[i].reshape(1, -1) for i in idx]
        for key, items in small.items():
            idx.extend(i for i, _ in items)
            parts.append(batch_fn(torch.stack([t for _, t in items]), key))
        return idx, parts

    def _watch_lr(self) -> None:
        """A learning rate that rises (x2 or more, e.g. a schedule) starts a burst of sampled steps: what
        a new learning rate does shows in its first steps."""
        lr, seen = self._lr(sync=False), self._seen_lr
        self._seen_lr = lr
        if lr > 0 and seen > 0 and lr >= 2 * seen and self.schedule.burst(self.step):
            self._sample_now = True

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
