"""Finding where NaN/Inf was first produced, by replaying the offending pass on a copy of the model.

The recorder checks finiteness cheaply every step (model output, output gradient, parameter
gradients). Only when that check trips does it pay for the precise answer: the pass is
re-run on a deep copy of the model, with the same inputs, the same random state, the same
autocast state and the same gradient arriving at the output, with a hook on every module and
every operation checked (``functional.NonFiniteWatch``): the first operation whose finite
inputs give NaN/Inf is named with its module ("torch.log in `2`"). The user's model, optimizer
and random state are left untouched.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from typing import Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .functional import ModuleTracker, NonFiniteWatch
from .layers import Kind, classify, own_parameters, parametrizing_modules
from .trace import NonFiniteOrigin


def float_tensors(obj) -> list[torch.Tensor]:
    """The floating-point tensors in a nested output (tuples, lists, dicts, namedtuples, PackedSequence)."""
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, nn.utils.rnn.PackedSequence):
        return [obj.data] if obj.data.is_floating_point() else []
    leaves, _ = tree_flatten(obj)
    out = []
    for leaf in leaves:
        if isinstance(leaf, nn.utils.rnn.PackedSequence):
            leaf = leaf.data
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            out.append(leaf)
    return out


def _nonfinite(t: torch.Tensor) -> bool:
    return not bool(torch.isfinite(t.detach()).all())


def _own_params_nonfinite(module: nn.Module) -> bool:
    return any(_nonfinite(p) for p in own_parameters(module))


HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def copy_without_hooks(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` that carries none of its hooks (they may reference live graphs)."""
    stash = []
    for sub in module.modules():
        for attr in HOOK_DICTS:
            d = sub.__dict__.get(attr)
            if d:
                stash.append((sub, attr, d))
                sub.__dict__[attr] = type(d)()
    try:
        return copy.deepcopy(module)
    finally:
        for sub, attr, d in stash:
            sub.__dict__[attr] = d


def _innermost_last(fired: list[tuple[str, int]]) -> str:
    """The module that last passed on a finite gradient; among modules sharing that output tensor
    (a container and its last child), the innermost, whose hook fired first."""
    last_id = fired[-1][1]
    i = len(fired) - 1
    while i > 0 and fired[i - 1][1] == last_id:
        i -= 1
    return fired[i][0]


def autocast_state() -> list[tuple[str, torch.dtype]]:
    """The devices autocast is on for now, with its dtype (to replay a pass as it ran)."""
    any_on = getattr(torch._C, "_is_any_autocast_enabled", None)
    if any_on is not None and not any_on():
        return []  # the usual case, every pass: one call
    out = []
    for dev in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(dev):
                out.append((dev, torch.get_autocast_dtype(dev)))
        except (TypeError, RuntimeError, AttributeError):  # an older torch without per-device queries
            pass
    return out


def _autocast(state) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for dev, dtype in state or ():
        stack.enter_context(torch.autocast(dev, dtype=dtype))
    return stack


def _standard_leaves(replica: nn.Module) -> dict[str, Kind]:
    """Leaf modules of torch.nn whose one operation is their computation: their name says it all."""
    out: dict[str, Kind] = {}
    for name, m in replica.named_modules():
        kind = classify(m)
        if not any(True for _ in m.children()) and kind not in (Kind.OTHER, Kind.ATTENTION):
            out[name] = kind
    return out


def reach(outputs: list[torch.Tensor]) -> tuple[float, ...]:
    """The largest magnitude of the first output, and its largest spread within a row: over its classes'
    dimension, 1 for a batch's (N, C, ...) and the last for a sequence's (N, T, C); of the two, the smaller
    (a softmax takes one of them), so that a spread is never read larger than it is."""
    t = next((o.detach() for o in outputs if o.numel() and o.is_floating_point()), None)
    if t is None or not bool(torch.isfinite(t).all()):
        return ()
    t = t.float()
    if t.dim() == 0:
        return float(t.abs()), 0.0
    spread = min(float((t.amax(d) - t.amin(d)).max()) for d in {min(1, t.dim() - 1), t.dim() - 1})
    return float(t.abs().max()), spread


def rows(outputs: list[torch.Tensor], grads: list) -> tuple[float, ...]:
    """For the first output and its gradient: the share of its rows (dimension 0) whose gradient holds
    NaN/Inf, the share of the other rows whose spread (over the dimension ``reach`` takes) the least of
    those rows' reaches (where a softmax rounds to 0 it does so first), and whether
    those rows lie past every other one toward a sigmoid's rounding (1.0, else 0.0): by their largest
    output (to 1), their lowest (to 0), or either, against each one's threshold in the output's dtype (which
    of them a loss takes the log of, the path does not keep). () when not known."""
    pair = next(((o.detach(), g.detach()) for o, g in zip(outputs, grads)
                 if g is not None and o.shape == g.shape and o.dim() >= 2 and o.is_floating_point()), None)
    if pair is None or not bool(torch.isfinite(pair[0]).all()):
        return ()
    info = torch.finfo(pair[0].dtype)
    t, g = pair[0].float(), pair[1]
    bad = ~torch.isfinite(g).reshape(g.shape[0], -1).all(dim=1)
    if not bool(bad.any()):
        return ()
    spreads = [(t.amax(d) - t.amin(d)).reshape(t.shape[0], -1).amax(dim=1) for d in {1, t.dim() - 1}]
    spread = min(spreads, key=lambda s: float(s.max()))
    if bool(bad.all()):
        return 1.0, 1.0, 1.0
    widest = float((spread[~bad] <= spread[bad].min()).float().mean())
    high, low = t.reshape(t.shape[0], -1).amax(dim=1), -t.reshape(t.shape[0], -1).amin(dim=1)
    either = torch.maximum(high / math.log(2.0 / info.eps), low / -math.log(info.smallest_normal * info.eps))
    past = any(float(v[bad].min()) >= float(v[~bad].max()) for v in (high, low, either))
    return float(bad.float().mean()), float(widest), float(past)


def _dtype(outputs: list[torch.Tensor]) -> str:
    return str(outputs[0].dtype).replace("torch.", "") if outputs else ""


def locate(module: nn.Module, args, kwargs, rng_state: torch.Tensor | None, out_grads: list | None,
           step: int, run: Callable[[nn.Module], object] | None = None,
           autocast: list | None = None) -> NonFiniteOrigin:
    """Replay one pass of ``module`` and return where NaN/Inf first appears. ``run(copy)`` replays a
    pass that is not the module's own forward (a training step computing its loss); by default the
    copy is called with ``args`` and ``kwargs``. ``autocast``: the autocast state the pass ran under."""
    for t in float_tensors((args, kwargs)):
        if _nonfinite(t):
            return NonFiniteOrigin(step, "input", "input", "the input batch contains NaN/Inf")
    try:
        replica = copy_without_hooks(module)
    except Exception as exc:  # noqa: BLE001 - a module that cannot be copied: say so rather than guess
        return NonFiniteOrigin(step, "", "unknown", f"could not replay the pass ({type(exc).__name__})")
    for p in replica.parameters():
        p.grad = None  # the copy starts from clean gradients, so only this pass's values are seen

    found: list[NonFiniteOrigin] = []
    ran: list[tuple[str, nn.Module]] = []  # modules in the order their forward completed
    fired: list[tuple[str, int]] = []  # (module, id of its output gradient), in backward order

    # (the modules computing a parametrized module's weight are part of it: what they make is its own)
    inside = parametrizing_modules(replica)
    tracker = ModuleTracker({id(m): n for n, m in replica.named_modules() if id(m) not in inside})
    watch = NonFiniteWatch(tracker, _standard_leaves(replica))

    def forward_hook(name, mod):
        def hook(_m, _inputs, output):
            if found:
                return
            ran.append((name, mod))
            outs = float_tensors(output)
            bad = any(_nonfinite(t) for t in outs)
            if not bad:
                watch.absorbed(name)
            inside = watch.first if bad else None
            if inside is not None:  # an operation (in it, or before it) made the first NaN/Inf its output carries
                owner, rel, label, dtype = inside
                owner_mod = dict(replica.named_modules()).get(owner)
                weights = owner_mod is not None and _own_params_nonfinite(owner_mod)
                found.append(NonFiniteOrigin(
                    step, owner, "weights" if weights else "forward",
                    "its parameters are already NaN/Inf (made so by an earlier update)" if weights else
                    (f"{label} is the first operation to turn finite values into NaN/Inf" if label else
                     "its forward output is the first to contain NaN/Inf"),
                    op=label, relation=rel.value if label else "", dtype=dtype))
                return
            if any(_nonfinite(t) for t in outs):
                phase = "weights" if _own_params_nonfinite(mod) else "forward"
                detail = ("its parameters are already NaN/Inf (made so by an earlier update)"
                          if phase == "weights" else "its forward output is the first to contain NaN/Inf")
                dtype = next((str(t.dtype).replace("torch.", "") for t in outs if _nonfinite(t)), "")
                found.append(NonFiniteOrigin(step, name, phase, detail, dtype=dtype))
                return
            for t in outs:
                if t.requires_grad:
                    t.register_hook(grad_hook(name))
        return hook

    def grad_hook(name):
        def hook(g):
            if found or g is None:
                return
            if _nonfinite(g):
                if fired:
                    found.append(NonFiniteOrigin(step, _innermost_last(fired), "backward",
                                                 "its backward pass turns a finite gradient into NaN/Inf"))
                else:
                    found.append(NonFiniteOrigin(step, "", "loss",
                                                 "the gradient arriving from the loss is already NaN/Inf"))
            else:
                fired.append((name, id(g)))
        return hook

    for name, sub in replica.named_modules():
        if id(sub) not in inside:
            sub.register_forward_hook(forward_hook(name, sub))

    devices = sorted({t.device.index for t in float_tensors((args, kwargs)) if t.device.type == "cuda"}
                     - {None})
    with torch.random.fork_rng(devices=devices, enabled=rng_state is not None):
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        with torch.enable_grad():
            try:
                with _autocast(autocast), tracker, watch:
                    output = run(replica) if run is not None else replica(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a pass that cannot run outside its loop: say so, do not stop it
                if found:
                    return found[0]
                return NonFiniteOrigin(step, "", "unknown", f"could not replay the pass ({type(exc).__name__})")
            if found:
                return found[0]
            outside = watch.first if any(_nonfinite(t) for t in float_tensors(output)) else None
            if outside is not None:  # in the model's own forward, after its last module
                owner, rel, label, dtype = outside
                if run is not None and not owner:  # a replayed training step: outside every module is its loss
                    return NonFiniteOrigin(step, "", "loss", f"{label} in the loss is the first operation to turn "
                                           "finite values into NaN/Inf (look at the targets and the loss function)",
                                           op=label, relation=rel.value, dtype=dtype)
                return NonFiniteOrigin(step, owner, "forward", f"{label} is the first operation to turn finite values "
                                       "into NaN/Inf", op=label, relation=rel.value, dtype=dtype)
            outs = [t for t in float_tensors(output) if t.requires_grad]
            grads = list(out_grads or [])
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
            # a replay of several calls (``run.final``): the outputs the loss reads are those no call took
            final = getattr(run, "final", None)
            if final is not None and len(final) == len(outs):
                grads = [g for g, f in zip(grads, final) if f]
                outs = [o for o, f in zip(outs, final) if f]
            if any(g is not None and _nonfinite(g) for g in grads):
                return NonFiniteOrigin(step, "", "loss", "the model output is finite; the loss or its gradient is not"
                                       " (look at the targets and the loss function)", dtype=_dtype(outs),
                                       reach=reach(outs), rows=rows(outs, grads))
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
                if found and found[0].phase == "loss":
                    return dataclasses.replace(found[0], dtype=_dtype(outs), reach=reach(outs), rows=rows(outs, grads))
    if found:
        return found[0]
    for name, mod in reversed(ran):  # backward order: a parameter gradient that overflowed
        if any(p.grad is not None and _nonfinite(p.grad) for p in own_parameters(mod)):
            return NonFiniteOrigin(step, name, "backward", "its parameter gradient overflows to NaN/Inf")
    return NonFiniteOrigin(step, "", "unknown", "NaN/Inf seen but not reproduced by a replay of the pass")
