"""Targets that hold one class (a label column read as one value, a mapping that sends every label to 0): the
loss falls to ~0 with a constant output and looks like a run that trains. The classes read off the output's
gradient say every target is the same one: `data` from the first batch read. A contrastive loss whose
positive is always class 0 (MoCo's labels are zeros) keeps its loss far from zero and stays quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, train

CONFIDENT = 0.5


def _inputs(step: int, seed: int) -> torch.Tensor:
    return torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))


def _mlp(outputs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, outputs))


def _run(model, data, loss, steps=200):
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=loss, steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_class_indices_all_zero_are_named(seed):
    top = _run(_mlp(4, seed), lambda s: (_inputs(s, seed), torch.zeros(64, dtype=torch.long)),
               F.cross_entropy).explain()[0]
    assert (top.cause, top.layer) == ("data", "input") and top.step <= 5 and top.confidence >= CONFIDENT
    assert "labels" in top.suggestion
    assert any("class 0" in line for line in top.chain)


def test_binary_targets_all_zero_are_named():
    top = _run(_mlp(1, 0), lambda s: (_inputs(s, 0), torch.zeros(64)),
               lambda out, y: F.binary_cross_entropy_with_logits(out.squeeze(1), y)).explain()[0]
    assert (top.cause, top.layer) == ("data", "input") and top.confidence >= CONFIDENT


def test_classes_of_a_real_task_stay_quiet():
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(3))
    hyps = _run(_mlp(4, 0), lambda s: (_inputs(s, 0), (_inputs(s, 0) @ w).argmax(1)), F.cross_entropy).explain()
    assert not [h for h in hyps if h.confidence >= CONFIDENT]


class _Contrastive(nn.Module):
    """Two noisy views of each sample; each row's logits are its positive (class 0) and the other samples'
    keys, divided by a temperature, as MoCo returns them."""

    def __init__(self, noise: float, temperature: float) -> None:
        super().__init__()
        self.noise, self.temperature = noise, temperature
        self.enc = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        q = F.normalize(self.enc(x + self.noise * torch.randn_like(x)), dim=1)
        k = F.normalize(self.enc(x + self.noise * torch.randn_like(x)), dim=1).detach()
        sim = q @ k.T
        n = len(x)
        neg = sim.masked_select(~torch.eye(n, dtype=torch.bool)).view(n, n - 1)
        return torch.cat([sim.diagonal()[:, None], neg], 1) / self.temperature


@pytest.mark.parametrize("noise, temperature", [(0.5, 0.1), (0.05, 0.07)], ids=["hard", "easy"])
def test_a_contrastive_loss_with_its_positive_at_class_0_stays_quiet(noise, temperature):
    """Its loss falls far on an easy task too (two views that barely differ): its logits are similarities,
    with no offset that could fit one class alone."""
    torch.manual_seed(0)
    dbg = _run(_Contrastive(noise, temperature), lambda s: (_inputs(s, 0), torch.zeros(64, dtype=torch.long)),
               F.cross_entropy, steps=300)
    assert dbg.trace.meta.get("batch_classes"), "the classes are read (all 0), so the test says something"
    assert not [h for h in dbg.explain() if h.cause == "data"]
