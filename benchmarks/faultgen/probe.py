"""Measurements of a run made without NeuralDbg, to check that a fault does what it says: the loss
curve, dead and saturated units at each site, gradient norms at step 0, attention entropy.

They are taken on a copy of the model (and a forked RNG), so probing changes nothing in the run.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .families import Build

_GELU_DEAD = -3.0        # GELU(x) ~ 0 and its slope ~ 0 below this
_SATURATED = {"tanh": 2.65, "sigmoid": 4.6}   # |pre-activation| beyond which the output is within 1% of a bound


@dataclass
class Snapshot:
    """Per-site statistics of one forward (and backward) pass."""

    dead: dict = field(default_factory=dict)        # site -> fraction of units never active on the batch
    saturated: dict = field(default_factory=dict)   # site -> fraction of outputs within 1% of a bound
    entropy: dict = field(default_factory=dict)     # attention site -> mean entropy / log(keys)
    grad_norm: float = float("nan")                 # total gradient norm
    grad_rel: dict = field(default_factory=dict)    # weight layer -> |grad| / |weight|


@dataclass
class Probe:
    losses: list
    baseline: float
    start: Snapshot
    end: Snapshot
    fresh: float = math.nan   # the trained model's loss on batches it never trained on (eval mode)

    @property
    def nonfinite_step(self) -> int | None:
        return next((i for i, v in enumerate(self.losses) if not math.isfinite(v)), None)

    def median(self, lo: int, hi: int) -> float:
        part = self.losses[max(lo, 0):max(hi, lo + 1)]
        if not part or any(not math.isfinite(v) for v in part):
            return math.inf
        return float(torch.tensor(part).median())

    @property
    def first(self) -> float:
        return self.median(0, max(len(self.losses) // 20, 5))

    def mean(self, part: str) -> float:
        """Mean loss over the first ("head") or the last ("tail") fifth of the run: batch noise moves it
        little."""
        n = max(len(self.losses) // 5, 1)
        values = self.losses[:n] if part == "head" else self.losses[-n:]
        return sum(values) / n if all(math.isfinite(v) for v in values) else math.inf

    @property
    def last(self) -> float:
        n = len(self.losses)
        return self.median(n - max(n // 10, 5), n)


def _units(t: torch.Tensor) -> torch.Tensor:
    """(samples, units): channels of a conv map, the last axis otherwise."""
    if t.dim() == 4:
        return t.transpose(0, 1).reshape(t.shape[1], -1).t()
    return t.reshape(-1, t.shape[-1])


def _entropy(module: nn.Module, x: torch.Tensor) -> float:
    if isinstance(module, nn.MultiheadAttention):
        att = module(x, x, x, need_weights=True, average_attn_weights=False)[1]
    else:
        att = module.scores(x).softmax(dim=-1)
    h = -(att * att.clamp_min(1e-30).log()).sum(-1)
    return float(h.mean() / math.log(att.shape[-1]))


def snapshot(build: Build, batch, backward: bool) -> Snapshot:
    """Statistics of ``build.model`` on ``batch``, taken on a copy."""
    model = copy.deepcopy(build.model)
    sites = build.sites()
    acts = [(s, "relu") for s in sites.relu] + [(s, "squash") for s in sites.squash]
    named = dict(model.named_modules())
    pre: dict[str, torch.Tensor] = {}
    attn_in: dict[str, torch.Tensor] = {}
    handles = []

    def keep_input(name):
        return lambda m, inp, out: pre.__setitem__(name, inp[0].detach())

    def keep_output(name):
        return lambda m, inp, out: pre.__setitem__(name, out.detach())

    for site, _ in acts:
        if site.place == site.pre:   # a functional activation: it consumes this module's output
            handles.append(named[site.place].register_forward_hook(keep_output(site.place)))
        else:
            handles.append(named[site.place].register_forward_hook(keep_input(site.place)))
    for a in sites.attention:
        handles.append(named[a.place].register_forward_hook(
            lambda m, inp, out, name=a.place: attn_in.__setitem__(name, inp[0].detach())))
    snap = Snapshot()
    with torch.random.fork_rng():
        x, y = batch
        with torch.set_grad_enabled(backward):
            out = model(x)
            if backward:
                build.loss(out, y).backward()
        for h in handles:
            h.remove()
        with torch.no_grad():
            for site, group in acts:
                z = _units(pre[site.place].float())
                if group == "relu":
                    limit = _GELU_DEAD if site.act == "gelu" else 0.0
                    snap.dead[site.place] = float((z.amax(0) <= limit).float().mean())
                else:
                    snap.saturated[site.place] = float((z.abs() > _SATURATED[site.act]).float().mean())
            for a in sites.attention:
                snap.entropy[a.place] = _entropy(named[a.place], attn_in[a.place])
    if backward:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        snap.grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        for name in sites.weights:
            w = getattr(named[name], "weight", None)
            if w is not None and w.grad is not None:
                snap.grad_rel[name] = float(w.grad.norm() / w.detach().norm().clamp_min(1e-30))
    return snap
