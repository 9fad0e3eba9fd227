"""Per-layer statistics: what is measured, and how, on the tensor's own device.

Every function here returns a small 1-D float32 tensor on the input's device and never
synchronises with the host; the recorder stacks these and moves them to the host once
per sampled step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from enum import IntEnum

import torch


class Stat(IntEnum):
    """Columns of a trace row, one row per watched layer and sampled step. NaN = not measured."""

    ACT_MEAN = 0        # mean of the layer's output
    ACT_STD = 1         # standard deviation of the output
    ACT_ABSMAX = 2      # largest |output|
    ACT_NONFINITE = 3   # 1.0 when the output holds any NaN or Inf, else 0.0
    ACT_DEAD = 4        # fraction of units (channels for convolutions) never positive over the batch
                        # (measured on ReLU-family, smooth-activation and custom modules)
    ACT_SATURATED = 5   # fraction of outputs within SATURATION_MARGIN of a bound (bounded activations only)
    GRAD_RMS = 6        # root-mean-square of d(loss)/d(output)
    GRAD_NONFINITE = 7  # 1.0 when the output gradient holds any NaN or Inf, else 0.0
    W_NORM = 8          # L2 norm of the layer's own parameters        } exact up to PARAM_SAMPLE
    W_GRAD_NORM = 9     # L2 norm of their gradients (NaN when frozen)  } elements per tensor,
    W_UPDATE_NORM = 10  # L2 norm of the optimizer step's change        } estimated beyond
    ACT_RANGE = 11      # largest |output| over the largest finite value of the output's dtype (float16: 65504)
    ATTN_LOGIT_MAX = 12  # attention computations only: the largest attention logit (scaled q . k, masks applied)
    ATTN_ENTROPY = 13   # attention computations only: mean entropy of a query's attention over log(its keys)
    IN_RMS = 14         # weight layers only: root-mean-square of the input it read (its first argument)
    ACT_FIRING = 15     # fraction of outputs > 0, where dead units are counted: a unit's share of the inputs it
                        # fires for, averaged; it falls smoothly where the dead share jumps (a whole layer
                        # silenced at once: every unit dies within a few steps of the others)


N_STATS = len(Stat)
FORWARD_STATS = (Stat.ACT_MEAN, Stat.ACT_STD, Stat.ACT_ABSMAX, Stat.ACT_NONFINITE, Stat.ACT_DEAD,
                 Stat.ACT_SATURATED, Stat.ACT_FIRING)
GRAD_STATS = (Stat.GRAD_RMS, Stat.GRAD_NONFINITE)
PARAM_STATS = (Stat.W_NORM, Stat.W_GRAD_NORM, Stat.W_UPDATE_NORM)
ATTENTION_STATS = (Stat.ATTN_LOGIT_MAX, Stat.ATTN_ENTROPY)


def dtype_max(dtype: torch.dtype) -> float:
    """The largest finite value of a floating dtype (NaN for others)."""
    return float(torch.finfo(dtype).max) if dtype.is_floating_point else float("nan")

# A bounded unit counts as saturated when its output lies within this fraction of the
# output range from a bound (tanh: |y| > 0.99; sigmoid: y < 0.005 or y > 0.995).
SATURATION_MARGIN = 0.005



def _as_float(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# Outputs up to this many elements are stashed during the pass and their statistics computed
# together at step end, stacked by shape (a few kernels for many small layers); larger ones
# are reduced at once, where the kernels' fixed cost is negligible.
BATCH_NUMEL = 1 << 16


def _nan_like(x: torch.Tensor, g: int) -> torch.Tensor:
    return x.new_full((g,), float("nan"))


def _per_unit(x: torch.Tensor, unit_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a batch (G, *shape): per-unit max and min over every dimension but ``unit_dim`` of a sample."""
    dims = tuple(d + 1 for d in range(x.dim() - 1) if d != unit_dim)
    return x.amax(dim=dims), x.amin(dim=dims)


def forward_stats_batch(x: torch.Tensor, unit_dim: int | None,
                        bounds: tuple[float, float] | None, dead: bool = True) -> torch.Tensor:
    """Rows [mean, std, absmax, nonfinite, frac_dead_units, frac_saturated, frac_firing] for a stack of G
    same-shaped layer outputs ``x`` (G, *shape): a (G, 7) float32 tensor.

    ``nonfinite`` is 1.0 when an output holds any NaN/Inf (read off its mean: no extra pass).
    ``frac_dead_units`` and ``frac_firing`` (only when ``dead``): units never positive over the batch, and
    outputs positive.
    """
    x = _as_float(x)
    g = x.shape[0]
    flat = x.reshape(g, -1)
    n = flat.shape[1]
    if n == 0:
        return torch.full((g, 7), float("nan"), device=x.device)
    mean = flat.mean(dim=1)
    std = (torch.linalg.vector_norm(flat - mean[:, None], dim=1) / ((n - 1) ** 0.5) if n > 1
           else torch.zeros_like(mean))
    if unit_dim is not None:
        mx, mn = _per_unit(x, unit_dim)
        absmax = torch.maximum(mx.amax(dim=1), -mn.amin(dim=1))
        dead_frac = (mx <= 0).float().mean(dim=1) if dead else _nan_like(mean, g)
        firing = torch.count_nonzero(flat > 0, dim=1).to(mean.dtype) / n if dead else _nan_like(mean, g)
    else:
        absmax = torch.maximum(flat.amax(dim=1), -flat.amin(dim=1))  # an inf-norm kernel is far slower on a CPU
        dead_frac = firing = _nan_like(mean, g)
    nonfinite = (~torch.isfinite(mean)).float()
    if bounds is not None:
        lo, hi = bounds
        centre, half = (hi + lo) / 2, (hi - lo) / 2
        near = (flat - centre).abs() >= half - SATURATION_MARGIN * (hi - lo)
        saturated = near.float().mean(dim=1)
    else:
        saturated = _nan_like(mean, g)
    return torch.stack([mean, std, absmax, nonfinite, dead_frac, saturated, firing], dim=1).float()


def grad_stats_batch(gr: torch.Tensor, unit_dim: int | None = None) -> torch.Tensor:
    """Rows [rms, nonfinite] for a stack of G same-shaped output gradients (G, *shape): a (G, 2)
    float32 tensor. ``nonfinite`` is 1.0 on any NaN/Inf (read off the norm: no extra pass).
    ``unit_dim`` is accepted for symmetry with ``forward_stats_batch``; gradients are reduced whole."""
    gr = _as_float(gr)
    g = gr.shape[0]
    flat = gr.reshape(g, -1)
    n = flat.shape[1]
    if n == 0:
        return torch.full((g, 2), float("nan"), device=gr.device)
    norm = torch.linalg.vector_norm(flat, dim=1)
    rms = norm / (n ** 0.5)
    nonfinite = (~torch.isfinite(norm)).float()
    return torch.stack([rms, nonfinite], dim=1).float()


def forward_stats(x: torch.Tensor, unit_dim: int | None,
                  bounds: tuple[float, float] | None, dead: bool = True) -> torch.Tensor:
    """``forward_stats_batch`` for one output: a (7,) tensor."""
    return forward_stats_batch(x.unsqueeze(0), unit_dim, bounds, dead)[0]


def input_stats(x: torch.Tensor) -> torch.Tensor:
    """A batch's mean, std, largest magnitude and non-finite share (``forward_stats``' first four), and how
    far its samples lie apart (the largest range of a feature over the batch: 0 when every sample is the
    same; NaN for a batch of one): a (5,) tensor. The range needs memory of one sample's size, no more."""
    x = x.detach()
    first = forward_stats(x, None, None)[:4]
    if x.dim() < 1 or x.shape[0] < 2 or not x[0].numel():
        return torch.cat([first, first.new_full((1,), float("nan"))])
    flat = x.reshape(x.shape[0], -1)
    spread = (flat.amax(dim=0).float() - flat.amin(dim=0).float()).amax().reshape(1).to(first.device)
    return torch.cat([first, spread])


def grad_stats(g: torch.Tensor, unit_dim: int | None = None) -> torch.Tensor:
    """``grad_stats_batch`` for one gradient: a (2,) tensor."""
    return grad_stats_batch(g.unsqueeze(0), unit_dim)[0]


def norms(tensors: list[torch.Tensor], ord: float = 2.0, uniform: bool = False) -> torch.Tensor:
    """``ord``-norm of each tensor, as one 1-D float32 tensor (one fused kernel where available).
    ``uniform``: the tensors are known to share one dtype and device."""
    if not tensors:
        return torch.zeros(0)
    out: Sequence[torch.Tensor]
    try:
        out = torch._foreach_norm(tensors, ord)
    except (RuntimeError, TypeError):  # mixed devices or dtypes
        out = [torch.linalg.vector_norm(t.detach().float(), ord) for t in tensors]
    if uniform and out[0].dtype == torch.float32:
        return torch.stack(out)
    return torch.stack([o.float().to(out[0].device) for o in out])


def max_abs(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest |value| over ``tensors`` (NaN or Inf when any holds one), as one 0-d tensor."""
    try:  # small tensors: one concatenation and one reduction is the cheapest way
        return torch.cat([t.detach().reshape(-1).float() for t in tensors]).abs().amax()
    except RuntimeError:  # tensors on several devices
        return norms(tensors, float("inf")).amax()


try:  # flattens and concatenates in one call
    _flatten = torch._C._nn.flatten_dense_tensors
except AttributeError:  # pragma: no cover - an older torch
    def _flatten(tensors):
        return torch.cat([t.reshape(-1) for t in tensors])


def finite_norm(tensors: list[torch.Tensor]) -> tuple[bool, float]:
    """Whether every value of ``tensors`` is finite, and their L2 norm together (for spikes): one
    concatenation and one sum of squares, read back to the host in one transfer. The sum is finite
    exactly when every value is, unless its float32 squares overflow: only then are the values
    themselves checked."""
    try:
        flat = _flatten(tensors)
        if flat.dtype is not torch.float32 and flat.dtype is not torch.float64:
            flat = flat.float()  # half precision: its squares would overflow
        square = float(flat.dot(flat))
    except (RuntimeError, TypeError):  # several devices or dtypes, sparse tensors: one by one
        return _finite_norm_each(tensors)
    if math.isfinite(square):
        return True, math.sqrt(square)
    return bool(torch.isfinite(flat).all()), math.inf


def _finite_norm_each(tensors: list[torch.Tensor]) -> tuple[bool, float]:
    dense = [t.detach() for t in tensors if t.layout == torch.strided]
    per = [torch.linalg.vector_norm(t.float()) for t in dense]
    values = [float(v) for v in per]
    total = math.hypot(*values)
    if math.isfinite(total):
        return True, total
    return all(bool(torch.isfinite(t).all()) for t, v in zip(dense, values) if not math.isfinite(v)), math.inf


# Parameter statistics read at most this many elements per tensor (an evenly strided subset,
# scaled up): exact for small tensors, and a full pass over a large model's weights is avoided.
PARAM_SAMPLE = 65536
