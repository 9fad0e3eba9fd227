"""Attention: its statistics against a reference, for nn.MultiheadAttention (whatever its path),
F.scaled_dot_product_attention and a softmax over q @ k^T written by hand; attention_collapse on
Transformers trained with no warm-up, and quiet ones with a warm-up or sharp but stable attention."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.attention import attention_stats, mha_logits, sdpa_logits
from transformers_zoo import HandAttention, train_transformer


def reference(weights: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """Largest logit where a key is attended, and mean entropy / log(keys attended), of (.., q, k) tensors."""
    weights, logits = weights.detach(), logits.detach()
    allowed = weights > 0
    n = allowed.sum(-1).float()
    h = -(weights * torch.log(weights.clamp_min(1e-30))).sum(-1)
    rows = n >= 2
    return float(logits[allowed].max()), float((h[rows] / torch.log(n[rows])).mean())


def test_attention_statistics_of_multihead_attention_against_its_own_weights():
    torch.manual_seed(0)
    for options in ({}, {"add_bias_kv": True}, {"add_zero_attn": True}, {"kdim": 6, "vdim": 6}):
        mha = nn.MultiheadAttention(8, 2, batch_first=True, **options)
        q, k = torch.randn(3, 5, 8), torch.randn(3, 7, options.get("kdim", 8))
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[0, 5:] = True
        mask = torch.zeros(5, 7, dtype=torch.bool)
        mask[0, 3] = True
        captured: dict = {}

        class Spy(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None, captured=captured):
                if func is F.multi_head_attention_forward:
                    captured["z"] = mha_logits(*args, **(kwargs or {}))
                return func(*args, **(kwargs or {}))

        with Spy():
            _, w = mha(q, k, k, key_padding_mask=pad, attn_mask=mask, average_attn_weights=False)
        z = captured["z"]
        torch.testing.assert_close(torch.softmax(z, -1), w)  # the same attention, from the recomputed logits
        top, ent = attention_stats(z).tolist()
        ref_top, ref_ent = reference(w, z)
        assert (top, ent) == pytest.approx((ref_top, ref_ent), rel=1e-5)


def test_attention_statistics_of_scaled_dot_product_attention_with_masks():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 70, 4), torch.randn(2, 3, 9, 4)  # 70 queries: a slice of them is read
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": torch.rand(70, 9) > 0.3}, {"scale": 0.1}):
        z = sdpa_logits(q, k, **kwargs)
        full = (q @ k.transpose(-2, -1)) * kwargs.get("scale", 0.5)
        allowed = torch.ones(70, 9, dtype=torch.bool)
        if kwargs.get("is_causal"):
            allowed = allowed.tril()
        if "attn_mask" in kwargs:
            allowed = allowed & kwargs["attn_mask"]
        full = full.masked_fill(~allowed, float("-inf"))
        rows = torch.arange(0, 70, 2)  # evenly spaced: at most ATTENTION_QUERIES of them
        torch.testing.assert_close(z, full[:, :, rows])
        w = torch.softmax(full[:, :, rows], -1).nan_to_num()
        assert attention_stats(z).tolist() == pytest.approx(reference(w, full[:, :, rows]), rel=1e-5)


class Encoder(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "mha_module":
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        else:
            self.attn = HandAttention(16, 2, sdpa=kind == "sdpa")
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = self.layer(x) if self.kind == "mha_module" else x + self.attn(x)
        return self.head(h.mean(dim=1))


@pytest.mark.parametrize("kind, row", [("mha_module", "layer.self_attn"), ("hand", "attn:softmax"),
                                       ("sdpa", "attn:scaled_dot_product_attention")])
def test_each_way_of_writing_attention_is_measured_on_sampled_steps(kind, row):
    torch.manual_seed(0)
    model = Encoder(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 6, 16)
    with NeuralDbg(model, optimizer=opt, every=2) as dbg:
        for _ in range(4):
            opt.zero_grad()
            F.cross_entropy(model(x), torch.tensor([0, 1, 0, 1])).backward()
            opt.step()
    info = dbg.trace.layer(row)
    data = dbg.trace.stats.data[:, info.index]
    assert list(dbg.trace.stats.steps) == [0, 2] and np.isfinite(data[:, Stat.ATTN_ENTROPY]).all()
    assert info.where() == ({"mha_module": "`layer.self_attn`", "hand": "F.softmax in `attn`",
                             "sdpa": "F.scaled_dot_product_attention in `attn`"}[kind])
    # the reference: the attention weights of the first step's pass, from the model as it started
    torch.manual_seed(0)
    ref = Encoder(kind)
    if kind == "mha_module":
        a = ref.layer.self_attn
        w = a(x, x, x, average_attn_weights=False)[1]
        z = torch.log(w)  # logits up to a per-query shift: compare entropies
    else:
        b, t, d = x.shape
        q, k, _ = ref.attn.qkv(x).reshape(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        z = (q @ k.transpose(-2, -1)) / math.sqrt(d // 2)
        w = torch.softmax(z, -1)
        assert data[0, Stat.ATTN_LOGIT_MAX] == pytest.approx(float(z[:4].max()), rel=1e-5)
    assert data[0, Stat.ATTN_ENTROPY] == pytest.approx(reference(w.detach(), z.detach())[1], rel=1e-4)
    if kind == "mha_module":  # its out_proj runs inside F.multi_head_attention_forward, never as a module
        assert dbg.trace.unobserved()["layer.self_attn.out_proj"] == "its forward never ran"


@pytest.mark.parametrize("kind", ["module", "hand", "sdpa"])
@pytest.mark.parametrize("seed", [0, 1])
def test_no_warmup_collapses_the_attention_of_a_post_ln_transformer_and_a_warmup_keeps_it_quiet(kind, seed):
    """AdamW at 3e-2 from the first step: the attention logits grow, the entropy collapses, the loss stays
    near chance. The same run with a linear warm-up over 100 steps learns, and is quiet."""
    dbg = train_transformer(kind, pre_ln=False, lr=3e-2, warmup=0, seed=seed)
    top = dbg.explain()[0]
    names = {n for n, _ in dbg.model.named_modules()}
    assert str(top.cause) == "attention_collapse" and top.confidence >= 0.5, dbg.report()
    assert top.layer in names and dbg.trace.layer(top.layer if kind == "module" else top.layer + ":" + (
        "softmax" if kind == "hand" else "scaled_dot_product_attention")).index >= 0
    chain = " ".join(top.chain)
    assert "no warm-up" in chain and "attention logit" in chain and "loss" in chain
    assert "warm-up" in top.suggestion and "QK-norm" in top.suggestion
    assert ("1/sqrt(head_dim)" in top.suggestion) == (kind == "hand")
    warm = train_transformer(kind, pre_ln=False, lr=3e-2, warmup=100, seed=seed).explain()
    assert not [h for h in warm if h.confidence >= 0.5], warm


@pytest.mark.parametrize("kind, seed", [("module", 0), ("module", 1), ("hand", 0), ("sdpa", 0)])
def test_sharp_but_stable_attention_stays_quiet(kind, seed):
    """A pre-LN Transformer learns the task with attention on one key per query (its entropy falls low and
    its logits grow while the loss comes down): healthy."""
    dbg = train_transformer(kind, pre_ln=True, lr=1e-2, steps=400, seed=seed)
    entropy = dbg.trace.stats.data[:, :, Stat.ATTN_ENTROPY]
    assert np.nanmin(entropy[-1]) < 0.3  # sharp indeed
    assert float(dbg.trace.loss.data[-20:].mean()) < 0.2 * float(dbg.trace.loss.data[:5].mean())
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()


class _SelfAttention(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.mha = nn.MultiheadAttention(d, 4, batch_first=True)

    def forward(self, x):
        return x + self.mha(x, x, x, need_weights=False)[0]


class _MeanOverTokens(nn.Module):
    def forward(self, x):
        return x.mean(1)


def test_a_gradient_that_vanishes_below_an_attention_is_still_named():
    """Ten sigmoid layers under a self-attention block and a head: the gradient fades through the sigmoids.
    The attention's own projections may keep a low gradient beside a live one by design; the layers of the
    model itself are no projections of one attention, and their collapse is named."""
    from zoo import Run, mlp, teacher_classes, train
    torch.manual_seed(0)
    body = list(mlp([16] + [32] * 10, act=nn.Sigmoid)) + [nn.Sigmoid()]
    model = nn.Sequential(*body, _SelfAttention(32), _MeanOverTokens(), nn.Linear(32, 3))
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.1), teacher_classes(64, 3, shape=(4, 16)),
                    steps=100))
    top = dbg.explain()[0]
    assert top.cause == "vanishing_gradients" and top.confidence >= 0.5, dbg.report()
