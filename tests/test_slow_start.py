"""A loss that sits at its start for a while and then leaves it (a small initialisation's saddle) is a slow
start, not a plateau; a loss that never leaves it is one. Read on a matrix factorisation trained with a
pairwise ranking loss (BPR), whose loss starts at log 2 whatever the model: with negatives drawn from all
items it leaves log 2 after ~100 steps and comes down slowly to the end; with negatives drawn from the
user's own positives there is nothing to rank and it stays there."""
from __future__ import annotations

import math

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg

CONFIDENT = 0.5
USERS, ITEMS = 300, 200


def _interactions():
    g = torch.Generator().manual_seed(1234)
    u, v = torch.randn(USERS, 6, generator=g), torch.randn(ITEMS, 6, generator=g)
    liked = torch.rand(USERS, ITEMS, generator=g) < torch.sigmoid(u @ v.t() / math.sqrt(6) * 2 - 1)
    pairs = liked.nonzero()
    own = [pairs[pairs[:, 0] == i, 1] for i in range(USERS)]
    return pairs, own


class _Factorisation(nn.Module):
    def __init__(self):
        super().__init__()
        self.user, self.item = nn.Embedding(USERS, 32), nn.Embedding(ITEMS, 32)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)

    def forward(self, users, items):
        return (self.user(users) * self.item(items)).sum(-1)


def _bpr(seed: int, negatives: str) -> NeuralDbg:
    pairs, own = _interactions()
    torch.manual_seed(seed)
    model = _Factorisation()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(300):
            pick = pairs[torch.randint(0, len(pairs), (512,), generator=gen)]
            users, liked = pick[:, 0], pick[:, 1]
            if negatives == "own":  # another item the user liked: nothing to rank
                choice = torch.rand(512, generator=gen)
                neg = torch.stack([own[u][int(c * len(own[u]))] for u, c in zip(users.tolist(), choice.tolist())])
            else:
                neg = torch.randint(0, ITEMS, (512,), generator=gen)
            opt.zero_grad()
            loss = -F.logsigmoid(model(users, liked) - model(users, neg)).mean()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_leaves_its_start_late_and_keeps_coming_down_is_no_plateau(seed):
    dbg = _bpr(seed, "all")
    losses = dbg.trace.loss.data
    assert losses[-20:].mean() < 0.95 * losses[:20].mean()  # it did come down, late
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_never_leaves_its_start_is_a_plateau(seed):
    top = _bpr(seed, "own").explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT



def _synthetic(shape, steps: int = 300):
    """A recorded loss alone (one healthy layer beside it): 0.693 with a little batch noise for 100 steps, then
    ``shape`` (its value at each later step)."""
    from test_analysis import make_trace, run
    noise = np.random.default_rng(0).normal(0.0, 0.004, steps)
    trace = make_trace(["Linear"], steps, loss=lambda s: (0.693 if s < 100 else shape(s - 100)) + noise[s])
    return run(trace).hypotheses


def test_a_loss_that_drops_once_then_stays_flat_is_still_a_plateau():
    """A step down of 10%, then flat for 200 steps: it left its level, but does not go on falling."""
    hs = _synthetic(lambda s: 0.62)
    assert hs and hs[0].cause == "loss_plateau" and hs[0].confidence >= CONFIDENT


def test_a_loss_that_leaves_its_level_and_goes_on_falling_is_no_plateau():
    hs = _synthetic(lambda s: 0.693 - 0.11 * s / 200)
    assert not [h for h in hs if h.confidence >= CONFIDENT]
