"""A weight decay strong enough to hold the weights near zero: the loss sits at chance from its first steps,
while the weights only pass the collapse threshold later. The decay pulls from the first step, so the collapse
accounts for the plateau seen before it; the fix names the optimizer's own weight_decay and its value. A
decay of the usual size stays quiet."""
from __future__ import annotations

import pytest
import torch
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
