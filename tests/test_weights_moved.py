"""How far the weights went over a run: their distance from where they started, not the sum of their steps.

Plain SGD at a learning rate ~20x too low takes steps that are each far from negligible but mostly noise:
over 300 steps they add up to more than a tenth of the weights' norm while the weights end less than a tenth
away from where they started, and the loss stays at chance. That is a learning rate too low to train in this
many steps. A weight decay that holds the weights at the edge of the collapse threshold flickers across it:
the collapse lasts as long as the weights stay down, not only its first stretch.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo import Run, train

CONFIDENT = 0.5


def _clusters(seed: int, spread: float):
    """Ten Gaussian clusters in 32 dimensions, 2048 samples, read in shuffled batches of 64."""
    g = torch.Generator().manual_seed(1000 + seed)
    means = torch.randn(10, 32, generator=g) * spread * 3 / 32 ** 0.5
    y = torch.randint(0, 10, (2048,), generator=g)
    x = means[y] + torch.randn(2048, 32, generator=g)
    order = torch.Generator().manual_seed(seed)
    perm = torch.randperm(2048, generator=order)

    def data(step: int):
        nonlocal perm
        if step and step % 32 == 0:
            perm = torch.randperm(2048, generator=order)
        idx = perm[(step % 32) * 64:(step % 32 + 1) * 64]
        return x[idx], y[idx]
    return data


def _run(seed: int, make, spread: float = 1.0, steps: int = 300):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    start = {name: p.detach().clone() for name, p in model.named_parameters() if name.endswith("weight")}
    dbg = train(Run(model, make(model.parameters()), _clusters(seed, spread), steps=steps))
    moved = {name[:-len(".weight")]: float((p.detach() - start[name]).norm() / start[name].norm())
             for name, p in model.named_parameters() if name in start}
    return dbg, moved


@pytest.mark.parametrize("seed", [0, 1])
def test_noisy_steps_that_take_the_weights_nowhere_are_a_learning_rate_too_low(seed):
    dbg, moved = _run(seed, lambda p: torch.optim.SGD(p, lr=0.003))
    read = dbg.trace.meta["weights_moved"]
    for name, share in moved.items():  # the distance read (a sampled step before the end) against the truth
        assert read["layers"][name] == pytest.approx(share, rel=0.15)
    assert max(moved.values()) < 0.1  # the run's truth: every layer ends within a tenth of its start
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("learning_rate_too_low", "") and top.confidence >= CONFIDENT, dbg.report()
    assert top.suggestion.startswith("raise the learning rate from 0.003")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_model_at_a_usual_rate_stays_quiet(seed):
    dbg, moved = _run(seed, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    assert max(moved.values()) > 0.1
    assert not dbg.explain().confident, dbg.report()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_weight_decay_that_holds_the_weights_at_the_threshold_is_named(seed):
    """SGD's weight_decay=1.0 (meant 1e-4): the weights fall to ~0.09x their start by step 7, come back over
    the threshold for a few steps, then stay down. The verdict names the decay on every seed."""
    dbg, _ = _run(seed, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1.0), spread=2.0)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT, dbg.report()
    assert top.suggestion.startswith("lower SGD's weight_decay from 1 to"), dbg.report()
    assert not any("NaN" in line for line in top.chain)  # every loss is finite
