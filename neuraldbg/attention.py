"""Extraction: what an attention computation does, from its logits, on sampled steps.

Two numbers per attention computation, both on the tensors' own device (no host sync):
- the largest attention logit (query . key, scaled, masks applied): logits that grow without
  bound push the softmax toward one-hot and, in half precision, out of range;
- the mean attention entropy of a query's distribution over the keys it may attend, relative to
  its largest possible value, log(keys): 1 is uniform attention, 0 attention on one key.

Three ways attention is written are read: ``F.scaled_dot_product_attention`` (the logits are
recomputed from its query and key), ``F.multi_head_attention_forward`` (what
``nn.MultiheadAttention`` runs, whatever its fast path or ``need_weights``: query and key are
projected again from its arguments) and a softmax over ``q @ k^T`` written by hand (its input is
the logits). Only a slice of a large batch is read: at most ``ATTENTION_BATCH`` sequences and
``ATTENTION_QUERIES`` queries per sequence, evenly spaced, with every key.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

# at most this many sequences (leading batch entries) and queries per sequence are read
ATTENTION_BATCH = 4
ATTENTION_QUERIES = 64

_NEG_INF = float("-inf")


def _query_index(n: int, device) -> torch.Tensor:
    step = max(1, -(-n // ATTENTION_QUERIES))
    return torch.arange(0, n, step, device=device)


def attention_stats(logits: torch.Tensor) -> torch.Tensor:
    """[largest logit, mean entropy / log(keys)] of ``logits`` (..., queries, keys), where a masked key
    is -inf; queries with fewer than two keys to choose from are left out. A (2,) float32 tensor."""
    z = logits.detach().float()
    allowed = z > _NEG_INF
    n = allowed.sum(dim=-1)
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    h = -(p * torch.where(allowed, logp, torch.zeros_like(logp))).sum(dim=-1)
    rows = n >= 2
    rel = torch.where(rows, h / torch.log(n.clamp_min(2).float()), torch.zeros_like(h))
    entropy = rel.sum() / rows.sum().clamp_min(1)
    entropy = torch.where(rows.any(), entropy, torch.full_like(entropy, float("nan")))
    top = torch.where(allowed, z, torch.full_like(z, _NEG_INF)).amax() if z.numel() else z.new_tensor(float("nan"))
    return torch.stack([top, entropy]).float()


def _slice(t: torch.Tensor, lead: int, queries: torch.Tensor | None) -> torch.Tensor:
    """The first ``lead`` entries of dim 0 and the given queries (dim -2) of a (..., L, S) tensor."""
    t = t[:lead] if t.dim() > 2 and t.shape[0] > lead else t
    return t.index_select(-2, queries) if queries is not None and t.shape[-2] > 1 else t


def _additive(mask: torch.Tensor | None, allow_true: bool) -> torch.Tensor | None:
    """A boolean mask (True = may attend when ``allow_true``, else True = may not) or an additive
    float mask, as an additive float mask."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        keep = mask if allow_true else ~mask
        return torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, _NEG_INF)
    return mask.detach().float()


def sdpa_logits(query, key, value=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                enable_gqa=False) -> torch.Tensor:
    """The logits ``F.scaled_dot_product_attention`` computes, for a slice of its queries."""
    q, k = query.detach(), key.detach()
    lead = ATTENTION_BATCH
    qi = _query_index(q.shape[-2], q.device)
    q, k = _slice(q, lead, qi), (k[:lead] if k.dim() > 2 else k)
    if enable_gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    z = (q.float() @ k.float().transpose(-2, -1)) * s
    if is_causal:
        keys = torch.arange(z.shape[-1], device=z.device)
        z = z.masked_fill(keys[None, :] > qi[:, None], _NEG_INF)
    if attn_mask is not None:
        m = attn_mask.expand(*query.shape[:-1], key.shape[-2]) if attn_mask.dim() < query.dim() else attn_mask
        z = z + _additive(_slice(m, lead, qi), allow_true=True)
    return z


_MHA = inspect.signature(F.multi_head_attention_forward)


def mha_logits(*args, **kwargs) -> torch.Tensor:
    """The logits ``F.multi_head_attention_forward`` computes, from its own arguments, for a slice of
    its batch and queries: (sequences, heads, queries, keys)."""
    a = _MHA.bind(*args, **kwargs).arguments
    get = a.get
    query, key = a["query"].detach(), a["key"].detach()
    if query.dim() == 2:  # unbatched (L, E)
        query, key = query.unsqueeze(1), key.unsqueeze(1)
    heads, e = int(a["num_heads"]), query.shape[-1]
    hd = e // heads
    n = min(query.shape[1], ATTENTION_BATCH)
    qi = _query_index(query.shape[0], query.device)
    if get("use_separate_proj_weight", False):
        wq, wk = a["q_proj_weight"], a["k_proj_weight"]
        bias = get("in_proj_bias")
        bq, bk = (None, None) if bias is None else bias.detach().chunk(3)[:2]
    else:
        wq, wk = a["in_proj_weight"].detach().chunk(3)[:2]
        bias = get("in_proj_bias")
        bq, bk = (None, None) if bias is None else bias.detach().chunk(3)[:2]
    q = F.linear(query[qi, :n].float(), wq.detach().float(), None if bq is None else bq.float())
    q = q.reshape(len(qi), n, heads, hd).permute(1, 2, 0, 3)
    static_k = get("static_k")
    extra = 0
    if static_k is not None:
        k = static_k.detach().float().reshape(-1, heads, static_k.shape[-2], hd)[:n]
    else:
        k = F.linear(key[:, :n].float(), wk.detach().float(), None if bk is None else bk.float())
        bias_k = get("bias_k")
        if bias_k is not None:
            k = torch.cat([k, bias_k.detach().float().expand(1, n, e)])
            extra += 1
        k = k.reshape(k.shape[0], n, heads, hd).permute(1, 2, 0, 3)
    if get("add_zero_attn", False):
        k = torch.cat([k, k.new_zeros(n, heads, 1, hd)], dim=2)
        extra += 1
    z = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
    src = k.shape[2] - extra
    mask = get("attn_mask")
    if mask is not None:
        m = mask.reshape(1, 1, *mask.shape) if mask.dim() == 2 else mask.reshape(-1, heads, *mask.shape[-2:])
        add = _additive(m[:n].index_select(-2, qi), allow_true=False)
        if add is not None:
            z[..., :src] = z[..., :src] + add[..., :src]
    pad = get("key_padding_mask")
    if pad is not None:
        if pad.dim() == 1:
            pad = pad.unsqueeze(0)
        p = _additive(pad[:n, :src], allow_true=False)
        if p is not None:
            z[..., :src] = z[..., :src] + p[:, None, None, :]
    return z
