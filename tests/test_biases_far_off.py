"""Biases that start far off zero: the layers' outputs sit at an offset larger than their spread, and the
scale a layer passes on, read against its input's, looks amplified though its weights are at their default
spread. Named ``bad_initialization`` with the biases in the chain and the fix, never "weights too large"."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


class Leaky(nn.Module):
    def __init__(self, bias: float | None, seed: int = 0, depth: int = 4):
        super().__init__()
        torch.manual_seed(seed)
        self.hidden = nn.ModuleList(nn.Linear(20 if i == 0 else 64, 64) for i in range(depth))
        self.out = nn.Linear(64, 4)
        if bias is not None:
            for layer in self.hidden:
                nn.init.constant_(layer.bias, bias)

    def forward(self, x):
        for layer in self.hidden:
            x = F.leaky_relu(layer(x), 0.01)
        return self.out(x)


def _run(model, steps: int = 300, seed: int = 0):
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(20, 4, seed=seed),
                     steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_biases_far_below_zero_in_several_layers_are_named_as_biases(seed):
    dbg = _run(Leaky(-3.0, seed), seed=seed)
    top = dbg.explain()[0]
    assert top.cause == "bad_initialization" and top.confidence >= CONFIDENT
    assert "biases far off zero" in top.suggestion and "too large" not in top.suggestion
    assert "the biases of" in top.chain[0]


def test_the_same_model_at_its_default_init_is_quiet():
    dbg = _run(Leaky(None))
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
