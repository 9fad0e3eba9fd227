"""An attention mask that leaves a query no key (a padding mask of the wrong polarity, a sequence that is all
padding): the softmax of a row of -inf is NaN from the first step. The NaN is named where the softmax runs (in
`nn.MultiheadAttention`, or in the model's own forward where it is written by hand, not in the layer after
it), with the mask's fix; the same models with the mask the right way round stay quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CONFIDENT = 0.5


class Encoder(nn.Module):
    def __init__(self, by_hand: bool, d: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.by_hand = by_hand
        self.emb, self.pos = nn.Embedding(50, d), nn.Embedding(12, d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.q, self.k, self.head = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)

    def forward(self, tokens, pad):
        h = self.emb(tokens) + self.pos.weight[None]
        if self.by_hand:
            scores = self.q(h) @ self.k(h).transpose(1, 2) / h.shape[-1] ** 0.5
            a = F.softmax(scores.masked_fill(pad[:, None, :], float("-inf")), dim=-1) @ h
        else:
            a, _ = self.attn(h, h, h, key_padding_mask=pad)
        return self.head(a[:, 0])


def _batch(step: int, inverted: bool):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(1, 50, (32, 12), generator=g)
    pad = torch.arange(12)[None] >= torch.randint(4, 13, (32,), generator=g)[:, None]  # True: padding
    tokens[pad] = 0
    return tokens, ~pad if inverted else pad, tokens[:, 0] % 4


def _run(by_hand: bool, inverted: bool, seed: int = 0, steps: int = 60) -> NeuralDbg:
    model = Encoder(by_hand, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            tokens, pad, y = _batch(step, inverted)
            opt.zero_grad()
            loss = F.cross_entropy(model(tokens, pad), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("by_hand, layer", [(False, "attn"), (True, "")])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_mask_that_leaves_a_query_no_key_is_named_where_the_softmax_runs(by_hand, layer, seed):
    dbg = _run(by_hand, inverted=True, seed=seed)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("non_finite", layer, 0)
    assert top.confidence >= CONFIDENT
    assert "mask" in top.suggestion and "eps" not in top.suggestion
    if by_hand:
        assert dbg.trace.nonfinite.op == "F.softmax"


@pytest.mark.parametrize("by_hand", [False, True])
def test_the_mask_the_right_way_round_stays_quiet(by_hand):
    dbg = _run(by_hand, inverted=False)
    assert dbg.trace.nonfinite is None
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT and h.cause == "non_finite"]
