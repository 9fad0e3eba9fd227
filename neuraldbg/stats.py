"""Per-layer statistics: what is measured, and how, on the tensor's own device.

Every function here returns a small 1-D float32 tensor on the input's device and never
synchronises with the host; the recorder stacks these and moves them to the host once
per sampled step.
"""
from __future__ import annotations

from enum import IntEnum

import torch


class Stat(IntEnum):
    """Columns of a trace row, one row per watched layer and sampled step. NaN = not measured."""

    ACT_MEAN = 0        # mean of the layer's output
    ACT_STD = 1         # standard deviation of the output
    ACT_ABSMAX = 2      # largest |output|
    ACT_NONFINITE = 3   # fraction of output elements that are NaN or Inf
    ACT_DEAD = 4        # fraction of units (channels for convolutions) never positive over the batch
    ACT_SATURATED = 5   # fraction of outputs within SATURATION_MARGIN of a bound (bounded activations only)
    GRAD_RMS = 6        # root-mean-square of d(loss)/d(output)
    GRAD_ABSMAX = 7     # largest |d(loss)/d(output)|
    GRAD_NONFINITE = 8  # fraction of output-gradient elements that are NaN or Inf
    GRAD_DEAD = 9       # fraction of units whose output gradient is zero for every sample
    W_NORM = 10         # L2 norm of the layer's own parameters
    W_GRAD_NORM = 11    # L2 norm of their gradients (NaN when frozen)
    W_UPDATE_NORM = 12  # L2 norm of the change made by the optimizer step


N_STATS = len(Stat)
FORWARD_STATS = (Stat.ACT_MEAN, Stat.ACT_STD, Stat.ACT_ABSMAX, Stat.ACT_NONFINITE, Stat.ACT_DEAD,
                 Stat.ACT_SATURATED)
GRAD_STATS = (Stat.GRAD_RMS, Stat.GRAD_ABSMAX, Stat.GRAD_NONFINITE, Stat.GRAD_DEAD)
PARAM_STATS = (Stat.W_NORM, Stat.W_GRAD_NORM, Stat.W_UPDATE_NORM)

# A bounded unit counts as saturated when its output lies within this fraction of the
# output range from a bound (tanh: |y| > 0.99; sigmoid: y < 0.005 or y > 0.995).
SATURATION_MARGIN = 0.005

_INF = float("inf")


def _as_float(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _other_dims(x: torch.Tensor, unit_dim: int) -> tuple[int, ...]:
    return tuple(d for d in range(x.dim()) if d != unit_dim)


def forward_stats(x: torch.Tensor, unit_dim: int | None,
                  bounds: tuple[float, float] | None) -> torch.Tensor:
    """[mean, std, absmax, frac_nonfinite, frac_dead_units, frac_saturated] of a layer output."""
    x = _as_float(x)
    n = max(x.numel(), 1)
    if x.numel() > 1:
        std, mean = torch.std_mean(x)
    else:
        mean, std = x.mean(), x.new_zeros(())
    absmax = torch.linalg.vector_norm(x, ord=_INF) if x.numel() else x.new_zeros(())
    nonfinite = 1.0 - torch.isfinite(x).sum() / n
    if unit_dim is not None and x.numel():
        never_positive = x.amax(dim=_other_dims(x, unit_dim)) <= 0
        dead = never_positive.float().mean()
    else:
        dead = x.new_full((), float("nan"))
    if bounds is not None:
        lo, hi = bounds
        margin = SATURATION_MARGIN * (hi - lo)
        saturated = ((x <= lo + margin) | (x >= hi - margin)).sum() / n
    else:
        saturated = x.new_full((), float("nan"))
    return torch.stack([mean, std, absmax, nonfinite, dead, saturated]).float()


def grad_stats(g: torch.Tensor, unit_dim: int | None) -> torch.Tensor:
    """[rms, absmax, frac_nonfinite, frac_units_with_zero_gradient] of d(loss)/d(output)."""
    g = _as_float(g)
    n = max(g.numel(), 1)
    rms = torch.linalg.vector_norm(g) / (n ** 0.5)
    absmax = torch.linalg.vector_norm(g, ord=_INF) if g.numel() else g.new_zeros(())
    nonfinite = 1.0 - torch.isfinite(g).sum() / n
    if unit_dim is not None and g.numel():
        dead = (g.abs().amax(dim=_other_dims(g, unit_dim)) == 0).float().mean()
    else:
        dead = g.new_full((), float("nan"))
    return torch.stack([rms, absmax, nonfinite, dead]).float()


def norms(tensors: list[torch.Tensor], ord: float = 2.0) -> torch.Tensor:
    """``ord``-norm of each tensor, as one 1-D float32 tensor (one fused kernel where available)."""
    if not tensors:
        return torch.zeros(0)
    try:
        out = torch._foreach_norm(tensors, ord)
    except (RuntimeError, TypeError):  # mixed devices or dtypes
        out = [torch.linalg.vector_norm(t.detach().float(), ord) for t in tensors]
    return torch.stack([o.float().to(out[0].device) for o in out])


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One boolean tensor: no NaN/Inf in any of ``tensors`` (max-norms, so large values cannot overflow)."""
    if not tensors:
        return torch.ones((), dtype=torch.bool)
    return torch.isfinite(norms(tensors, float("inf"))).all()


def per_layer_norms(tensors: list[torch.Tensor], owner: torch.Tensor, n_layers: int) -> torch.Tensor:
    """Combine per-tensor L2 norms into per-layer norms: sqrt of the summed squares per owner index."""
    sq = norms(tensors) ** 2
    out = torch.zeros(n_layers, dtype=torch.float32, device=sq.device)
    out.index_add_(0, owner.to(sq.device), sq)
    return out.sqrt()
