"""A weight decay strong enough to hold the weights near zero: the loss sits at chance from its first steps,
while the weights only pass the collapse threshold later. The decay pulls from the first step, so the collapse
accounts for the plateau seen before it; the fix names the optimizer's own weight_decay and its value. A
decay of the usual size stays quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int, width: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))


def _run(make, seed: int = 0, steps: int = 300, width: int = 64):
    model = _mlp(seed, width)
    return train(Run(model, make(model.parameters()), teacher_classes(16, 4, seed=seed), steps=steps))


@pytest.mark.parametrize("seed, steps, width", [(0, 300, 64), (1, 300, 128), (2, 600, 64)])
def test_adams_l2_weight_decay_holding_the_weights_down_is_named(seed, steps, width):
    dbg = _run(lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1.0), seed, steps, width)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower Adam's weight_decay from 1 to")
    assert any("shrink toward zero" in line for line in top.chain)
    assert "learning rate from" not in top.suggestion


def test_adamws_decay_is_named_with_its_value():
    top = _run(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=100.0)).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower AdamW's weight_decay from 100 to")


@pytest.mark.parametrize("make", [lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4),
                                  lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05),
                                  lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4)],
                         ids=["adam", "adamw", "sgd"])
def test_a_usual_weight_decay_stays_quiet(make):
    assert not [h for h in _run(make).explain() if h.confidence >= CONFIDENT]


def test_the_shrink_is_dated_from_where_it_began():
    dbg = _run(lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1.0))
    ev = next(e for e in dbg.analysis().events if e.signal.value == "weights" and e.after.value == "collapsing")
    assert ev.values["shrinking_since"] < 50 < ev.step


def test_a_collapse_behind_units_dead_from_the_start_is_theirs():
    """Units dead from the start pass no gradient back: Adam's L2 term alone, at a usual 1e-4, then walks the
    weights before them to zero. The collapse is in the dead units' chain, and no fix lowers that decay."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 64), nn.ReLU()]
    for _ in range(5):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(64, 4))
    with torch.no_grad():
        model[10].bias.fill_(-10.0)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4),
                    teacher_classes(16, 4), steps=300))
    hyps = dbg.explain()
    assert hyps[0].cause == "dead_units" and hyps[0].confidence >= CONFIDENT
    assert not [h for h in hyps if "weight_decay" in h.suggestion and h.confidence >= CONFIDENT]


def _penalised(lam: float, make, seed: int = 0, steps: int = 300):
    model = _mlp(seed)

    def loss(out, y):
        return F.cross_entropy(out, y) + lam * sum(p.pow(2).sum() for p in model.parameters())
    return train(Run(model, make(model.parameters()), teacher_classes(16, 4, seed=seed), loss=loss, steps=steps))


@pytest.mark.parametrize("lam, make, seed, steps", [
    (10.0, lambda p: torch.optim.Adam(p, lr=1e-3), 0, 300),
    (10.0, lambda p: torch.optim.Adam(p, lr=1e-3), 1, 600),
    (1.0, lambda p: torch.optim.SGD(p, lr=0.05), 0, 300),
], ids=["adam", "adam_long", "sgd"])
def test_a_weight_penalty_in_the_loss_holding_the_weights_down_is_named(lam, make, seed, steps):
    """The loss falls from hundreds to chance as the penalty shrinks the weights: progress on the loss as a
    whole, while its classification term, read off the output's gradient, stays at chance."""
    dbg = _penalised(lam, make, seed, steps)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower the weight penalty added to the loss")
    assert any("classification term" in line for line in top.chain)
    assert "learning rate from" not in top.suggestion


def test_a_small_weight_penalty_and_a_plain_loss_stay_quiet():
    dbg = _penalised(1e-4, lambda p: torch.optim.Adam(p, lr=1e-3))
    assert dbg.trace.meta.get("class_term")   # read, as the loss adds a term
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
    plain = _run(lambda p: torch.optim.Adam(p, lr=1e-3))
    assert "class_term" not in plain.trace.meta


def test_an_auxiliary_loss_beside_a_classification_that_learns_stays_quiet():
    model = _mlp(0)

    def loss(out, y):  # a second term on the same output: a small penalty on its scale
        return F.cross_entropy(out, y) + 0.01 * out.pow(2).mean()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(16, 4), loss=loss,
                    steps=300))
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
