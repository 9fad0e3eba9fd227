"""An input batch with no spread at all (zeroed by a mask or a scale, replaced by ones, a blank image): the
samples cannot be told apart, so the model can only learn one output for all of them. Named ``data`` at the
input with a fix in the pipeline, never a normalisation that divides by its zero spread; an input that is
constant while another one carries the signal trains, and stays quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _blanked(value: float, seed: int = 0):
    data = teacher_classes(12, 4, seed=seed)

    def blank(step: int):
        x, y = data(step)
        return torch.full_like(x, value), y
    return blank


@pytest.mark.parametrize("value, seed", [(0.0, 0), (1.0, 1), (0.5, 2)])
def test_an_input_with_no_spread_is_the_datas_with_a_fix_in_the_pipeline(value, seed):
    model = _mlp(seed)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _blanked(value, seed), steps=200))
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("data", "input") and top.confidence >= CONFIDENT
    assert top.step == 0
    assert "x.std() > 0" in top.suggestion and "/ 0" not in top.suggestion
    assert not [h for h in dbg.explain()[1:] if h.confidence >= CONFIDENT]


def test_the_same_model_on_the_real_input_is_quiet():
    model = _mlp()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), teacher_classes(12, 4), steps=200))
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


class TwoInputs(nn.Module):
    """A constant first input (a bias feature, a mask of ones) beside the one that carries the signal."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(12, 32)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(32, 4))

    def forward(self, ones, x):
        return self.head(self.a(ones) + self.b(x))


def test_a_constant_input_beside_one_that_carries_the_signal_trains_quietly():
    data = teacher_classes(12, 4)
    model = TwoInputs()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(torch.ones_like(x), x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert any(e.after == "constant" for e in dbg.analysis().events)  # seen, and not a failure
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def _repeated(seed: int):
    """One sample repeated across the batch (a dataset whose __getitem__ ignores its index): the features
    vary, the samples do not."""
    data = teacher_classes(12, 4, seed=seed)

    def repeat(step: int):
        x, y = data(step)
        return x[:1].expand_as(x).clone(), y
    return repeat


@pytest.mark.parametrize("seed", [0, 1])
def test_every_sample_the_same_is_the_datas_with_a_fix_on_the_index(seed):
    model = _mlp(seed)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _repeated(seed), steps=200))
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0) and top.confidence >= CONFIDENT
    assert "__getitem__" in top.suggestion
    assert not [h for h in dbg.explain()[1:] if h.confidence >= CONFIDENT]


def test_one_sample_repeated_to_overfit_it_trains_quietly():
    """Overfitting one sample on purpose (every batch is that sample, repeated, with its target): the loss
    falls."""
    x, y = _repeated(0)(0)

    def same_target(step: int):
        return x, y[:1].expand_as(y).clone()
    model = _mlp()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), same_target, steps=200))
    assert any(e.after == "constant" for e in dbg.analysis().events)  # seen, and not a failure
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def _offset(seed: int, unit: float, steps: int = 300):
    """Pixels in [0, 1] (class clusters through a sigmoid) normalised with ImageNet's mean and std given in
    ``unit``s: in 0-255 units, the statistics of another scale, the samples differ by ~1% of the offset they
    all share."""
    data = teacher_classes(12, 4, seed=seed)

    def normalised(step: int):
        x, y = data(step)
        return (torch.sigmoid(x) - 0.45 * unit) / (0.22 * unit), y
    model = _mlp(seed)
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), normalised, steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_samples_that_differ_by_a_sliver_of_a_shared_offset_are_the_datas(seed):
    dbg = _offset(seed, unit=255.0)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0) and top.confidence >= CONFIDENT
    assert "differ by at most" in top.chain[0] and "x.std(0)" in top.suggestion
    assert not [h for h in dbg.explain()[1:] if h.confidence >= CONFIDENT]


def test_the_input_normalised_with_statistics_of_its_own_scale_is_quiet():
    dbg = _offset(0, unit=1.0)
    assert not [e for e in dbg.analysis().events if e.after == "constant"]
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
