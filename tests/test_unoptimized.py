"""Layers that hold a gradient and that no optimizer steps: an optimizer made from part of the model
(``Adam(model[-1].parameters())``), a module added after the optimizer was made, a group whose learning rate
is 0. Only the rest of the model learns. Named at the first layer left out with the optimizer's fix, where a
probe trained on purpose over fixed features that learns, and the whole model trained, stay quiet."""
from __future__ import annotations

import pytest
import torch
from torch import nn

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
