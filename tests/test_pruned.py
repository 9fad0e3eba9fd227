"""Layers a pruning mask (torch.nn.utils.prune) holds at 0: named with the mask in their fix, not an init."""
import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from neuraldbg import NeuralDbg
from zoo import Run, teacher_classes
from zoo import train as train_run


def train(amount, seed, steps=200):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    prune.global_unstructured([(model[i], "weight") for i in (0, 2, 4)], pruning_method=prune.L1Unstructured,
                              amount=amount)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train_run(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_global_prune_that_takes_whole_layers_says_so_in_its_fix(seed, tmp_path):
    dbg = train(0.99, seed)
    top = dbg.explain()[0]
    assert str(top.cause) == "bad_initialization" and top.confidence >= 0.5
    assert "prune a smaller share" in top.suggestion and "nn.init.zeros_" not in top.suggestion
    assert any("pruning mask" in line for line in top.chain)
    dbg.save(tmp_path / "run.ndbg")  # the masks' share is kept in the file
    assert NeuralDbg.load(tmp_path / "run.ndbg").explain()[0].suggestion == top.suggestion
    assert not [h for h in train(0.1, seed).explain() if h.confidence >= 0.5]
