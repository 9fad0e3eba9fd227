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


class _Seq2Seq(torch.nn.Module):
    """An encoder-decoder given the source's attention_mask by keyword, the source and the target padded to one
    length: the decoder's output has as many rows as the mask, but they are the target's positions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = torch.nn.Embedding(V, 32), torch.nn.Embedding(T, 32)
        self.tf = torch.nn.Transformer(32, 4, 1, 1, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, V)

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        p = torch.arange(T)
        h = self.tf(self.emb(input_ids) + self.pos(p), self.emb(decoder_input_ids) + self.pos(p),
                    tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(T),
                    src_key_padding_mask=attention_mask == 0, tgt_is_causal=True)
        return self.head(h)


def test_a_decoders_output_is_not_read_against_its_encoders_mask():
    """The targets (the source said three times, padded with -100) are no next tokens of the source: its mask
    says nothing of the positions the loss reads."""
    model = _Seq2Seq()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(40):
            n = torch.randint(4, 8, (32, 1), generator=g)
            src = torch.randint(0, 20, (32, T), generator=g)
            mask = (torch.arange(T)[None] < n).long()
            tgt = torch.where(torch.arange(T)[None] < 3 * n, src.gather(1, torch.arange(T)[None] % n), -100)
            dec = torch.cat([torch.full((32, 1), PAD), tgt[:, :-1].clamp(min=0)], 1)
            opt.zero_grad()
            out = model(input_ids=src * mask, attention_mask=mask, decoder_input_ids=dec)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, V), tgt.reshape(-1), ignore_index=-100)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert "padding_counted" not in dbg.trace.meta
    assert not [h for h in dbg.explain() if "padding" in h.suggestion]
