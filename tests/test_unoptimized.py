"""Layers that hold a gradient and that no optimizer steps: an optimizer made from part of the model
(``Adam(model[-1].parameters())``), a module added after the optimizer was made, a group whose learning rate
is 0. Only the rest of the model learns. Named at the first layer left out with the optimizer's fix, where a
probe trained on purpose over fixed features that learns, and the whole model trained, stay quiet."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg
from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int, width: int = 64) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))


def _run(model, opt, seed: int = 0, steps: int = 300):
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_an_optimizer_made_from_the_last_layer_alone_is_named(seed):
    model = _mlp(seed)
    top = _run(model, torch.optim.Adam(model[-1].parameters(), lr=1e-3), seed).explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "0", 0)
    assert top.confidence >= CONFIDENT
    assert "model.parameters()" in top.suggestion and "learning rate" not in top.suggestion
    assert "`2`" in top.chain[0]


def test_a_group_with_a_learning_rate_of_zero_is_named():
    model = _mlp(0)
    opt = torch.optim.Adam([{"params": model[:3].parameters(), "lr": 0.0}, {"params": model[4].parameters()}],
                           lr=1e-3)
    top = _run(model, opt).explain()[0]
    assert (top.cause, top.layer) == ("loss_plateau", "0")


def test_a_probe_that_learns_over_fixed_features_and_the_whole_model_stay_quiet():
    probe = _mlp(0, width=256)
    hs = _run(probe, torch.optim.Adam(probe[-1].parameters(), lr=1e-2)).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]
    whole = _mlp(0)
    assert not [h for h in _run(whole, torch.optim.Adam(whole.parameters(), lr=1e-3)).explain()
                if h.confidence >= CONFIDENT]


def _groups(model: nn.Module, keep_weights: bool) -> list[dict]:
    """Decay and no-decay groups split by name; the buggy filter keeps the biases only."""
    named = list(model.named_parameters())
    no_decay = [p for n, p in named if n.endswith("bias")]
    if not keep_weights:
        return [{"params": no_decay, "weight_decay": 0.0}]
    return [{"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": 0.01},
            {"params": no_decay, "weight_decay": 0.0}]


@pytest.mark.parametrize("seed", [0, 1])
def test_weights_no_group_holds_while_their_biases_learn_are_named(seed):
    """Each layer moves (its bias is stepped), so only the optimizer's groups tell that its weight never does."""
    model = _mlp(seed)
    top = _run(model, torch.optim.AdamW(_groups(model, keep_weights=False), lr=3e-3), seed).explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "0", 0)
    assert top.confidence >= CONFIDENT
    assert "`0.weight`" in top.chain[0] and "`4.weight`" in top.chain[0] and "bias" not in top.chain[0]
    assert "learning rate" not in top.suggestion and "`2.weight`" in top.suggestion
    fixed = _mlp(seed)
    assert not [h for h in _run(fixed, torch.optim.AdamW(_groups(fixed, keep_weights=True), lr=3e-3), seed).explain()
                if h.confidence >= CONFIDENT]


def test_a_group_added_later_is_read_again():
    """The weights given to the optimizer with ``add_param_group`` after the first steps are no longer left out."""
    model = _mlp(0)
    opt = torch.optim.AdamW(_groups(model, keep_weights=False), lr=3e-3)
    weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]

    def add(step, optimizer):
        if step == 20:
            optimizer.add_param_group({"params": weights, "weight_decay": 0.01})
    dbg = train(Run(model, opt, teacher_classes(16, 4), steps=300, before_step=add))
    assert "left_out" not in dbg._trace.meta
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT and h.cause == "loss_plateau"]


def test_weights_and_biases_split_between_two_optimizers_are_not_left_out():
    """Weights to one optimizer, biases to another (as a Muon and AdamW split does), the session watching one:
    the parameters it leaves out move all the same, stepped by the other."""
    model = _mlp(0)
    named = list(model.named_parameters())
    weights = torch.optim.SGD([p for n, p in named if n.endswith("weight")], lr=0.05, momentum=0.9)
    biases = torch.optim.AdamW([p for n, p in named if n.endswith("bias")], lr=1e-3)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=biases) as dbg:
        for step in range(200):
            x, y = data(step)
            weights.zero_grad()
            biases.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            weights.step()
            biases.step()
            dbg.record_loss(loss)
    assert "left_out" not in dbg.trace.meta
    assert not [h for h in dbg.explain() if h.cause == "loss_plateau"]


def test_an_optimizer_made_again_with_every_parameter_is_read_again():
    """The first optimizer steps the biases only; the one made after it, with as many groups, steps all."""
    model = _mlp(0)
    data = teacher_classes(16, 4)
    opt = torch.optim.AdamW(_groups(model, keep_weights=False), lr=3e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            if step == 20:
                opt = torch.optim.AdamW([{"params": list(model.parameters())}], lr=3e-3)
                dbg.set_optimizer(opt)
            x, y = data(step)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert "left_out" not in dbg.trace.meta


@pytest.mark.parametrize("seed", [0, 1])
def test_a_head_replaced_after_the_optimizer_was_made_is_named_with_the_rest_frozen(seed):
    """Transfer learning: the backbone frozen, the optimizer made from model.parameters(), then the head
    replaced. The new head holds a gradient and no group holds it, while nothing else can move: named at the
    head with the optimizer's fix, not a learning rate to raise. Made after the head was replaced, it learns."""
    def frozen():
        model = _mlp(seed)
        model.requires_grad_(False)
        return model

    model = frozen()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model[4] = nn.Linear(64, 4)
    dbg = _run(model, opt, seed)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "4", 0) and top.confidence >= CONFIDENT, dbg.report()
    assert "after the model is complete" in top.suggestion and "raise the learning rate" not in top.suggestion
    assert "no group of the optimizer holds them" in top.chain[0]

    model = frozen()
    model[4] = nn.Linear(64, 4)
    dbg = _run(model, torch.optim.SGD(model[4].parameters(), lr=0.1, momentum=0.9), seed)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()
