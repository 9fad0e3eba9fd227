"""An input far below unit scale (images divided by 255 twice, a quantity in other units): the first layer reads
it with weights at their default spread, and its output is made by its biases, so the input barely counts
until those weights grow by as much. The first layer's gain reads large, but its weights are not: named
``data`` at the input with the normalisation fix, never a smaller weight init. With BatchNorm after the
first layer, or an input that is merely small, the model trains and nothing is said."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _cnn(norm: bool) -> nn.Module:
    torch.manual_seed(0)
    bn = (lambda: [nn.BatchNorm2d(16)]) if norm else (lambda: [])
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), *bn(), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), *bn(),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * 144, 4))


def _scaled(data, scale: float):
    def batch(step: int):
        x, y = data(step)
        return x * scale, y
    return batch


def _images(seed: int = 0):
    """Pixels in [0, 1] whose classes are read off the halves of the image."""
    def batch(step: int):
        x = torch.rand(64, 1, 12, 12, generator=torch.Generator().manual_seed(seed * 1000 + step))
        top, left = x[:, 0, :6].mean((1, 2)), x[:, 0, :, :6].mean((1, 2))
        return x, (top > x[:, 0, 6:].mean((1, 2))).long() * 2 + (left > 0.5).long()
    return batch


def _confident(dbg):
    return [h for h in dbg.explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("seed, scale", [(0, 1 / 255), (1, 1 / 255), (0, 0.01)])
def test_an_input_far_below_unit_scale_is_the_datas(seed, scale):
    model = _mlp(seed)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                    _scaled(teacher_classes(20, 4, seed=seed), scale), steps=300))
    top = _confident(dbg)[0]
    assert (top.cause, top.layer, top.step) == ("data", "input", 0)
    assert "normalise the input" in top.suggestion and "default scale" in top.suggestion
    assert "biases" in top.chain[0]
    assert not any(h.cause == "bad_initialization" for h in dbg.explain())


def test_images_divided_by_255_twice_are_named_without_normalisation_layers():
    model = _cnn(norm=False)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _scaled(_images(), 1 / 255), steps=300))
    top = _confident(dbg)[0]
    assert (top.cause, top.layer) == ("data", "input") and "255 only once" in top.suggestion


@pytest.mark.parametrize("norm, scale", [(True, 1 / 255), (False, 1.0), (True, 1.0)])
def test_the_cnn_that_trains_stays_quiet(norm, scale):
    """BatchNorm after the first convolution takes the small scale away: the model trains."""
    model = _cnn(norm)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _scaled(_images(), scale), steps=300))
    assert _confident(dbg) == []


def test_a_merely_small_input_that_trains_stays_quiet():
    model = _mlp(0)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                    _scaled(teacher_classes(20, 4), 0.05), steps=300))
    assert _confident(dbg) == []


class Standardised(nn.Module):
    """Audio-like input of amplitude 0.05, standardised inside the forward before the first convolution: the
    first layer reads a unit-scale signal (no row shows the standardisation)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(1, 16, 5, padding=2)
        self.head = nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32, 4))

    def forward(self, x):
        x = (x - x.mean(dim=-1, keepdim=True)) / (x.std(dim=-1, keepdim=True) + 1e-5)
        return self.head(self.conv(x))


def test_an_input_standardised_inside_the_forward_is_not_called_small():
    data = teacher_classes(32, 4, scale=0.05, shape=(1, 32))
    slow = Standardised()  # a learning rate far too low: the verdict is the learning rate's
    dbg = train(Run(slow, torch.optim.Adam(slow.parameters(), lr=1e-7), data, steps=300))
    assert all(h.cause != "data" for h in _confident(dbg))
    model = Standardised()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, steps=300))
    assert _confident(dbg) == []
