"""A weight decay strong enough to hold the weights near zero: the loss sits at chance from its first steps,
while the weights only pass the collapse threshold later. The decay pulls from the first step, so the collapse
accounts for the plateau seen before it; the fix names the optimizer's own weight_decay and its value. A
decay of the usual size stays quiet."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import losspath
from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int, width: int = 64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))


def _run(make, seed: int = 0, steps: int = 300, width: int = 64):
    model = _mlp(seed, width)
    return train(Run(model, make(model.parameters()), teacher_classes(16, 4, seed=seed), steps=steps))


def _held_down(dbg, fix: str, because: str) -> None:
    """The verdict: weights held down, named with ``fix``, a line of the chain saying ``because``, and no
    learning rate to change."""
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith(fix)
    assert any(because in line for line in top.chain)
    assert "learning rate from" not in top.suggestion


@pytest.mark.parametrize("seed, steps, width", [(0, 300, 64), (1, 300, 128), (2, 600, 64)])
def test_adams_l2_weight_decay_holding_the_weights_down_is_named(seed, steps, width):
    dbg = _run(lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1.0), seed, steps, width)
    _held_down(dbg, "lower Adam's weight_decay from 1 to", "shrink toward zero")


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
    _held_down(_penalised(lam, make, seed, steps), "lower the weight penalty added to the loss", "classification term")


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


def _random_labels(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)


@pytest.mark.parametrize("lam", [0.0, 0.01])
def test_labels_that_carry_nothing_read_the_same_plateau_with_a_small_penalty(lam):
    """Random labels: the plain loss's plateau; with a penalty that holds a quarter of the loss at the start,
    the loss as a whole comes down a little with it, and its classification term's plateau says the same,
    with the same fix (the penalty held too little of the loss to be the reason)."""
    model = _mlp(0)

    def loss(out, y):
        return F.cross_entropy(out, y) + lam * sum(p.pow(2).sum() for p in model.parameters())
    top = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _random_labels, loss=loss,
                    steps=300)).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("check that the model can learn at all")


def test_a_classification_term_that_comes_down_after_its_last_sample_is_no_plateau():
    """Labels that carry nothing until step 222, then the teacher's: the loss learns at the end, after the
    classification term's last sample; the loss as a whole, below the term's level, says it came down."""
    teach = teacher_classes(16, 4)

    def data(step: int):
        x, y = teach(step)
        if step < 222:
            y = torch.randint(0, 4, y.shape, generator=torch.Generator().manual_seed(step))
        return x, y
    model = _mlp(0)

    def loss(out, y):
        return F.cross_entropy(out, y) + 1e-5 * sum(p.pow(2).sum() for p in model.parameters())
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=loss, steps=290))
    assert not [e for e in dbg.analysis().events if e.values.get("term")]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_penalty_shrinking_a_fitted_models_weights_is_no_plateau(seed):
    """A classifier fitted first (its weights then doubled, as a long fit leaves them), trained on under a heavy
    weight penalty: the loss as a whole falls with the penalty, and its classification term stays where the fit
    left it, far below chance. That term is learned, not stuck."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(10 + seed)
    centres = torch.randn(5, 20, generator=g) * 0.8

    def data(step: int):
        y = torch.randint(0, 5, (64,), generator=g)
        return centres[y] + torch.randn(64, 20, generator=g), y
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(300):
        x, y = data(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)

    def loss(out, y):
        return F.cross_entropy(out, y) + 0.03 * sum(p.pow(2).sum() for p in model.parameters())
    dbg = train(Run(model, opt, data, loss=loss, steps=300))
    terms = [t for _, t in dbg.trace.meta["class_term"]]
    assert max(terms) < 0.5 * math.log(5)   # read, and far below chance throughout
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("path, expected", [
    (["Add", "NllLoss", "LogSoftmax", "Addmm"], True),
    (["Sum", "Stack", "NllLoss", "LogSoftmax", "Addmm"], True),    # torch.stack([ce, penalty]).sum()
    (["Sub", "NllLoss", "LogSoftmax", "Addmm"], True),
    (["NllLoss", "LogSoftmax", "Add"], False),                      # the output's own node: a residual sum
    (["Div", "NllLoss", "LogSoftmax", "Addmm"], False),
])
def test_terms_added_to_the_loss_are_read_from_its_path(path, expected):
    assert losspath.added_terms([path]) is expected


def test_sgds_momentum_counts_in_what_its_decay_pulls():
    """SGD at lr 0.01 with momentum 0.9 and weight_decay=0.5: the decay joins the gradient, and momentum sums
    ~10 of them, so it pulls ten times lr x weight_decay a step; that accounts for the collapse, and the fix
    names it rather than a penalty in the loss."""
    top = _run(lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=0.5)).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower SGD's weight_decay from 0.5 to")
