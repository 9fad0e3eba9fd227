"""A language model whose labels keep the padding (``labels=input_ids`` with right-padded batches, not -100
where ``attention_mask`` is 0): most of what the loss reads is padding after padding, easy to predict, so the
loss falls while the real tokens get a small share of every update. The positions the loss reads are those
whose output gradient is not zero; read against the mask on sampled steps. The same model with the padding
ignored stays quiet."""
from __future__ import annotations

import pytest
import torch
import transformers

from neuraldbg import NeuralDbg

transformers.logging.set_verbosity_error()
V, T, PAD = 21, 24, 20


def _batch(g: torch.Generator, n: int = 32):
    """Arithmetic sequences mod 20 of 4-8 tokens, right-padded to 24 (~75% padding)."""
    stride = torch.randint(1, 4, (n, 1), generator=g)
    x = (torch.randint(0, 20, (n, 1), generator=g) + stride * torch.arange(T)) % 20
    mask = torch.arange(T)[None] < torch.randint(4, 9, (n, 1), generator=g)
    return x.masked_fill(~mask, PAD), mask.long()


def _run(ignored: bool, seed: int, steps: int = 120) -> NeuralDbg:
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=2,
                                                                 n_head=2, pad_token_id=PAD))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            x, mask = _batch(g)
            labels = x.masked_fill(mask == 0, -100) if ignored else x
            opt.zero_grad()
            loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_labels_that_keep_the_padding_are_the_datas(seed):
    dbg = _run(ignored=False, seed=seed)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0) and top.confidence >= 0.5
    assert "are padding" in top.chain[0] and "-100" in top.suggestion
    share = sorted(r[1] for r in dbg.trace.meta["padding_counted"])
    assert 0.6 < share[len(share) // 2] < 0.9  # ~75% of the positions, the last real one's target (a pad) aside


def test_labels_with_the_padding_ignored_are_quiet():
    dbg = _run(ignored=True, seed=0)
    assert all(r[1] == 0 for r in dbg.trace.meta["padding_counted"])
    assert not [h for h in dbg.explain() if h.confidence >= 0.5]
