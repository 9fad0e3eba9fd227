"""A batch normalisation whose statistics are taken over a handful of values per channel: BatchNorm1d on
features in batches of 2 rows outputs +-1 in every channel (which of the two samples is larger), and the
model learns little; named at the first such layer, with a fix on the batch or the norm, not on the
learning rate. Larger batches, images (many positions per channel) and a norm on its running statistics
stay quiet."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _bn_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                         nn.ReLU(), nn.Linear(64, 4))


def _run(model: nn.Module, batch: int, adam: bool, seed: int = 0, steps: int = 300):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3) if adam else torch.optim.SGD(model.parameters(), lr=0.1)
    return train(Run(model, opt, teacher_classes(16, 4, batch=batch, seed=seed), steps=steps))


@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adam"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_norm_over_two_values_is_named_with_its_fix(adam, seed):
    dbg = _run(_bn_mlp(seed), 2, adam, seed)
    assert dbg.trace.meta["norm_values"]["1"][-1] == 2
    top = dbg.explain()[0]
    assert top.cause == "data" and top.layer == "1" and top.confidence >= CONFIDENT and top.step == 0
    assert top.suggestion.startswith("give `1` more values per channel")
    assert "learning rate" not in top.suggestion
    assert any("+-1 in every channel" in line and "`4`" in line for line in top.chain)


@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adam"])
def test_usual_batches_and_no_norm_stay_clear_of_it(adam):
    """Batches of 16 with the norms; batches of 2 without them (no norm to name)."""
    for dbg in (_run(_bn_mlp(0), 16, adam), _run(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)), 2,
                                                   adam)):
        assert not [h for h in dbg.explain() if h.cause == "data" and h.confidence >= CONFIDENT]


def test_images_and_running_statistics_are_not_read_as_few_values():
    """BatchNorm2d on 8x8 maps in batches of 2 takes 128 values per channel; a norm put in eval mode uses its
    running statistics and is not read at all."""
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 64, 4))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3 * 64, 4, generator=g)

    def images(step):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(step))
        return x, (x.flatten(1) @ w).argmax(1)
    dbg = train(Run(cnn, torch.optim.Adam(cnn.parameters(), lr=1e-3), images, steps=60))
    assert set(dbg.trace.meta["norm_values"]["1"]) == {128}
    assert not [h for h in dbg.explain() if h.cause == "data"]
    frozen = _bn_mlp(0)
    frozen[1].eval()
    frozen[4].eval()
    assert "norm_values" not in _run(frozen, 2, True, steps=30).trace.meta


def test_the_threshold_reaches_it():
    """``norm_values`` below the values read: the layer is no longer named."""
    dbg = _run(_bn_mlp(0), 2, True)
    assert dbg.explain()[0].cause == "data"
    dbg.reanalyze(norm_values=1)
    assert not [h for h in dbg.explain() if h.cause == "data"]
