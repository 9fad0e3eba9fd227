"""An attention model over tokens with no positional information reads them as a set: its prediction for a
sample is the same for any order of its tokens. A replay of one sample with its middle tokens reversed says
so (a fact of the model, once a run); whether it harms depends on the task, which only the loss can say,
so it is a lead with its fix (add the positions), never a verdict of its own on a loss that does not fail."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import order
from zoo import Run, train

VOCAB, LENGTH, WIDTH = 10, 12, 32


class Classifier(nn.Module):
    """Token embeddings, optionally with learned positions, a Transformer encoder (optionally causal), and
    a head on the mean of its outputs."""

    def __init__(self, positions: bool, causal: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(LENGTH, WIDTH) if positions else None
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, 2, 64, dropout=0.0, batch_first=True), 2,
                                         enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 2)
        self.causal = causal

    def forward(self, x, position_ids=None, attention_mask=None):
        h = self.tok(x)
        if self.pos is not None:
            h = h + self.pos(torch.arange(x.shape[1]) if position_ids is None else position_ids)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        padding = None if attention_mask is None else ~attention_mask
        return self.head(self.enc(h, mask=mask, src_key_padding_mask=padding, is_causal=self.causal).mean(dim=1))


def _ids(n: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("positions, causal, sees", [(False, False, False), (True, False, True), (False, True, True)],
                         ids=["no_positions", "learned_positions", "causal_mask"])
def test_a_replay_with_the_middle_tokens_reversed_says_whether_the_model_sees_their_order(positions, causal, sees):
    ids = _ids()
    assert order.sees_order(Classifier(positions, causal), ids, (ids,), {}) is sees


def test_arguments_with_a_row_per_position_are_reordered_only_when_they_are_masks():
    """A padding mask moves with its tokens; position ids reordered with them would carry the order along,
    so the replay is not made."""
    ids = _ids()
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, -2:] = False  # two positions of padding at the end
    model = Classifier(positions=False)
    assert order.sees_order(model, ids, (ids,), {"attention_mask": mask}) is False
    positions = torch.arange(LENGTH).expand(len(ids), LENGTH)
    assert order.sees_order(Classifier(positions=True), ids, (ids,), {"position_ids": positions}) is None
    same = torch.full((len(ids), LENGTH), 4)  # no sample whose middle, reversed, is another sequence
    assert order.sees_order(model, same, (same,), {}) is None


def _order_task(seed: int = 0):
    """Whether a sample's first 3 comes before its first 7: the order decides."""
    def data(step: int):
        x = torch.randint(1, VOCAB, (64, LENGTH), generator=torch.Generator().manual_seed(seed * 1000 + step))
        at = torch.arange(LENGTH)
        first3 = torch.where(x == 3, at, LENGTH).amin(dim=1)
        first7 = torch.where(x == 7, at, LENGTH).amin(dim=1)
        return x, (first3 < first7).long()
    return data


def _run(positions: bool, seed: int = 0):
    model = Classifier(positions, seed=seed)
    return train(Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _order_task(seed), loss=F.cross_entropy,
                     steps=200))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_transformer_without_positions_is_a_lead_with_the_positions_fix(seed):
    """On a task the order decides it stops short (about 80% right where the same model with positions
    learns it all); the loss alone cannot say how far it could fall, so it is a lead below the verdict's
    bar, named with its fix, and the same model with positions says nothing of it."""
    dbg = _run(positions=False, seed=seed)
    assert dbg.trace.meta["order_blind"]["positions"] == LENGTH
    lead = next(h for h in dbg.explain() if "add the positions to the token embeddings" in h.suggestion)
    assert lead.cause == "loss_plateau" and lead.confidence < 0.5
    assert any("reads the tokens as a set" in line for line in lead.chain)
    fixed = _run(positions=True, seed=seed)
    assert "order_blind" not in fixed.trace.meta
    assert not [h for h in fixed.explain() if "add the positions" in h.suggestion]


def test_attention_run_across_the_batch_keeps_the_order_blindness_in_its_chain():
    """``nn.MultiheadAttention`` left at batch_first=False and fed (batch, positions, width): it mixes the
    batch's samples, so one sample replayed alone reads its tokens as a set. That is the layout's doing, in
    its chain, not a second verdict asking for positions the model has."""
    class Across(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(LENGTH, WIDTH)
            self.attn = nn.MultiheadAttention(WIDTH, 2)
            self.head = nn.Linear(WIDTH, 2)

        def forward(self, x):
            h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
            return self.head((h + self.attn(h, h, h, need_weights=False)[0]).mean(dim=1))
    model = Across()
    dbg = train(Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _order_task(), loss=F.cross_entropy,
                    steps=150))
    hyps = dbg.explain()
    assert hyps[0].cause == "data" and hyps[0].layer == "attn", dbg.report()
    assert not [h for h in hyps if "add the positions" in h.suggestion]


def test_positions_that_start_at_zero_are_read_again_once_learned():
    """A position embedding initialised to zeros (a ViT or BERT style parameter) sees no order at the first
    step; it learns positions within the first steps, and the later reading drops the early one."""
    class ZeroPositions(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Parameter(torch.zeros(1, LENGTH, WIDTH))
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, 2, 64, dropout=0.0, batch_first=True),
                                             2, enable_nested_tensor=False)
            self.head = nn.Linear(WIDTH, 2)

        def forward(self, x):
            return self.head(self.enc(self.tok(x) + self.pos).mean(dim=1))
    model, ids = ZeroPositions(), _ids()
    assert order.sees_order(model, ids, (ids,), {}) is False  # as initialised
    dbg = train(Run(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _order_task(), loss=F.cross_entropy,
                    steps=150))
    assert "order_blind" not in dbg.trace.meta
    assert not [h for h in dbg.explain() if "add the positions" in h.suggestion]


def test_an_order_blind_model_on_a_task_that_needs_the_order_is_a_lead():
    """A pointer task (the class of the token the first one points at) needs the positions: without them
    the model is 50% right and its loss stops short. The loss alone cannot tell this from a task of counting
    tokens, which an order-blind model learns: a lead with its fix, never a verdict; the same model with
    positions learns it, and says nothing of the order."""
    class Pointer(nn.Module):
        def __init__(self, positions: bool):
            super().__init__()
            torch.manual_seed(0)
            self.tok, self.head = nn.Embedding(8, WIDTH), nn.Linear(WIDTH, 4)
            self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
            self.pos = nn.Embedding(6, WIDTH) if positions else None

        def forward(self, x):
            h = self.tok(x) + (self.pos(torch.arange(x.shape[1])) if self.pos is not None else 0)
            return self.head(self.attn(h, h, h, need_weights=False)[0][:, 0])

    def data(step: int):
        g = torch.Generator().manual_seed(step)
        x = torch.randint(0, 8, (64, 6), generator=g)
        x[:, 0] = torch.randint(1, 6, (64,), generator=g)
        return x, x.gather(1, x[:, :1]).squeeze(1) % 4
    runs = {}
    for positions in (False, True):
        model = Pointer(positions)
        runs[positions] = train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), data, steps=200))
    lead = next(h for h in runs[False].explain() if "add the positions to the token embeddings" in h.suggestion)
    assert lead.cause == "loss_plateau" and lead.confidence < 0.5
    assert not [h for h in runs[True].explain() if h.confidence >= 0.5 or "add the positions" in h.suggestion]


def test_an_order_blind_model_that_counts_its_tokens_gets_no_verdict_from_it():
    """Attention with no positions, read at the first token, on a task of counting tokens (the order does not
    matter): the model learns it, and the order blindness stays a lead, with no verdict of its own."""
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.tok, self.qkv, self.head = nn.Embedding(20, 16), nn.Linear(16, 48), nn.Linear(16, 2)

        def forward(self, x):
            q, k, v = self.qkv(self.tok(x)).chunk(3, dim=-1)
            return self.head(F.scaled_dot_product_attention(q, k, v)[:, 0])

    def data(step: int):
        x = torch.randint(0, 20, (32, 12), generator=torch.Generator().manual_seed(step))
        return x, ((x < 10).sum(dim=1) > 6).long()
    model = Counter()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), data, steps=150))
    assert dbg.trace.meta.get("order_blind")
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
