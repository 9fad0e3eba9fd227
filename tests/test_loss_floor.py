"""The least a cross-entropy can reach, read off the gradient it leaves at the logits: the entropy of its
targets (0 for hard ones; near log(classes) under a label smoothing near 1). Its progress is counted down to
that floor, so a model that learns under a strong label smoothing is no plateau, and one that learns nothing
still is. Multi-hot labels given to it read as several targets in a row: a fact of the data and the loss."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5
CLASSES = 4


def _smoothed_entropy(eps: float, k: int = CLASSES) -> float:
    hit, other = 1 - eps + eps / k, eps / k
    return -(hit * math.log(hit) + (k - 1) * other * math.log(other))


def _run(loss, seed: int = 0, shuffled: bool = False, steps: int = 300):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    task = teacher_classes(16, CLASSES, seed=seed)

    def data(step):
        x, y = task(step)
        if shuffled:  # labels drawn at random: nothing of the input predicts them
            y = torch.randint(0, CLASSES, y.shape, generator=torch.Generator().manual_seed(10_000 + step))
        return x, y
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=loss, steps=steps))


def _floors(dbg) -> list[float]:
    return [r[1] for r in dbg.trace.meta.get("loss_floor") or []]


@pytest.mark.parametrize("module", [False, True], ids=["functional", "module"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_that_learns_under_strong_label_smoothing_is_no_plateau(module, seed):
    """label_smoothing=0.9 over 4 classes: the loss can come down only from 1.386 to 1.372, and the model
    that learns its classes does so. Its floor is read to the third decimal; nothing is said."""
    loss = nn.CrossEntropyLoss(label_smoothing=0.9) if module else (
        lambda out, y: F.cross_entropy(out, y, label_smoothing=0.9))
    dbg = _run(loss, seed)
    floors = _floors(dbg)
    assert floors and all(abs(f - _smoothed_entropy(0.9)) < 1e-3 for f in floors)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_random_labels_under_label_smoothing_are_still_a_plateau():
    """The same loss on labels nothing predicts stays at the uniform prediction's loss: a plateau."""
    top = _run(lambda out, y: F.cross_entropy(out, y, label_smoothing=0.9), shuffled=True).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT


def test_targets_all_but_uniform_get_a_fix_on_the_targets():
    """label_smoothing=0.99: the targets leave the loss ~1e-4 of room; the plateau's fix names them first."""
    top = _run(lambda out, y: F.cross_entropy(out, y, label_smoothing=0.99)).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("make the targets less uniform")


def test_smoothed_soft_targets_are_read_and_a_sum_or_a_term_on_the_output_is_not():
    """Soft targets of a smoothed shape (0.55 on the class, the rest alike): their entropy. A cross-entropy
    summed over the rows reads as hard targets under a scale (floor 0); one with a penalty on the output
    added is not read."""
    soft = torch.tensor([0.55, 0.15, 0.15, 0.15])
    dbg = _run(lambda out, y: F.cross_entropy(out, soft[(torch.arange(CLASSES)[None] - y[:, None]) % CLASSES]),
               steps=60)
    expected = float(-(soft * soft.log()).sum())
    assert _floors(dbg) and all(abs(f - expected) < 1e-3 for f in _floors(dbg))
    assert max(_floors(_run(lambda out, y: F.cross_entropy(out, y, reduction="sum"), steps=60))) < 1e-4
    assert not _floors(_run(lambda out, y: F.cross_entropy(out, y) + 0.1 * out.pow(2).mean(), steps=60))


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.1])
def test_hard_targets_read_a_floor_of_zero_under_any_scale_of_the_loss(scale):
    """A loss scaled by c leaves (1 - c) p + c e_y where the targets were: hard targets, not soft ones."""
    floors = _floors(_run(lambda out, y: scale * F.cross_entropy(out, y), steps=60))
    assert floors and max(floors) < 1e-4


def _multi_label(loss, seed: int = 0, steps: int = 200):
    """Five labels per sample, each set where a fixed linear teacher's score passes 0.5 (about two a row)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 5, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def data(step):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, (x @ w > 0.5).float()
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=loss, steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cross_entropy_given_several_labels_a_row_is_named(seed):
    """Multi-hot targets under F.cross_entropy: a softmax cannot predict labels that hold together. Read off
    the gradient (about two targets a row), named as the targets' fact with the binary loss as its fix; the
    same task under binary_cross_entropy_with_logits is quiet."""
    dbg = _multi_label(F.cross_entropy, seed)
    rows = dbg.trace.meta["target_count"]
    assert rows and all(1.5 < r[1] < 3.0 and 0 < r[2] < 1 for r in rows)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("for several labels per sample, train with F.binary_cross_entropy_with_logits")
    right = _multi_label(F.binary_cross_entropy_with_logits, seed)
    assert "target_count" not in right.trace.meta
    assert not [h for h in right.explain() if h.confidence >= CONFIDENT]


def _softmax_bce(out, y):
    return F.binary_cross_entropy(F.softmax(out, dim=1), y)


def _softmax_bce_summed(out, y):
    return F.binary_cross_entropy(torch.softmax(out, dim=1), y, reduction="sum")


@pytest.mark.parametrize("loss", [_softmax_bce, _softmax_bce_summed], ids=["mean", "sum"])
def test_a_binary_cross_entropy_of_a_softmax_given_several_labels_a_row_is_named(loss):
    """Multi-hot targets under a binary cross-entropy of a softmax's outputs: each row's probabilities sum
    to 1, so its two labels cannot both be near 1. Read off the gradient at the logits through the softmax
    (about two targets a row), named as the targets' fact, the fix on the softmax; a sigmoid in its place is
    quiet."""
    dbg = _multi_label(loss)
    rows = dbg.trace.meta["target_count"]
    assert rows and all(1.5 < r[1] < 3.0 and 0 < r[2] < 1 for r in rows)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.confidence >= CONFIDENT, dbg.report()
    assert "remove the softmax" in top.suggestion and "a softmax over each row" in top.chain[0]
    right = _multi_label(lambda out, y: F.binary_cross_entropy(torch.sigmoid(out), y))
    assert "target_count" not in right.trace.meta
    assert not [h for h in right.explain() if h.confidence >= CONFIDENT]


def test_a_model_ending_in_a_softmax_under_a_binary_cross_entropy_is_read_too():
    """The softmax as the model's last module: the gradient at its output reads the targets directly. One
    label a row (one-hot targets, which a softmax can reach) reads as no count at all."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 5, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5), nn.Softmax(dim=1))

    def data(step, one=False):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        return x, F.one_hot((x @ w).argmax(1), 5).float() if one else (x @ w > 0.5).float()
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=F.binary_cross_entropy,
                    steps=120))
    assert dbg.trace.meta["target_count"] and dbg.explain()[0].cause == "data"
    one = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), lambda step: data(step, one=True),
                    loss=F.binary_cross_entropy, steps=120))
    assert "target_count" not in one.trace.meta
    assert not [h for h in one.explain() if h.cause == "data"]


def test_rows_of_one_label_among_them_still_read_as_several():
    """A second label on about a third of the rows, one on the rest: the rows of one label read as hard
    targets, unscaled, and the count is still read."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 5))
    w = torch.randn(16, 5, generator=torch.Generator().manual_seed(0))

    def data(step):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        y = F.one_hot((x @ w).argmax(1), 5).float()
        y[x[:, 0] > 0.5, 4] = 1.0
        return x, y
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=F.cross_entropy, steps=150))
    rows = dbg.trace.meta["target_count"]
    assert rows and all(1.0 < r[1] < 1.6 and 0.1 < r[2] < 0.6 for r in rows)
    assert dbg.explain()[0].cause == "data"


def test_targets_of_one_class_or_a_distribution_are_never_read_as_several():
    """Hard labels, smoothed ones and soft ones each sum to 1 in a row: no count is read."""
    for loss in (F.cross_entropy, lambda out, y: F.cross_entropy(out, y, label_smoothing=0.3)):
        assert "target_count" not in _run(loss, steps=60).trace.meta


def test_ignored_rows_and_weights_are_no_multi_hot_labels():
    """An ignore_index (~10% of the rows) under label smoothing: the mean counts the other rows, which read
    as the smoothed targets they are (the floor, no several labels); class weights under smoothing, and a
    smoothed loss divided for gradient accumulation, read as neither (they are not told from a scale)."""
    def ignored(out, y):
        y = y.clone()
        y[::10] = -100
        return F.cross_entropy(out, y, ignore_index=-100, label_smoothing=0.1)
    dbg = _run(ignored, steps=100)
    assert "target_count" not in dbg.trace.meta
    assert _floors(dbg) and all(abs(f - _smoothed_entropy(0.1)) < 1e-3 for f in _floors(dbg))
    weight = torch.linspace(0.9, 1.1, CLASSES)
    for loss in (lambda out, y: F.cross_entropy(out, y, weight=weight, label_smoothing=0.1),
                 lambda out, y: F.cross_entropy(out, y, label_smoothing=0.1) / 8):
        dbg = _run(loss, steps=100)
        assert "target_count" not in dbg.trace.meta and not _floors(dbg)
        assert not [h for h in dbg.explain() if h.cause == "data"]


def test_uniform_targets_leave_no_way_down():
    """label_smoothing=1.0: the targets' entropy is the uniform prediction's loss; a plateau, with the fix on
    the targets."""
    top = _run(lambda out, y: F.cross_entropy(out, y, label_smoothing=1.0)).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("make the targets less uniform: their entropy (1.386) equals")


def test_soft_or_rescaled_targets_of_a_softmax_bce_are_not_counted():
    """The reading holds only where every entry of most rows reads as a 0 or a 1 at the loss's own scale: soft
    targets, or the loss divided (gradient accumulation), read as nothing; multi-hot ones read exactly."""
    from neuraldbg import losspath
    torch.manual_seed(0)
    z = torch.randn(64, 6, requires_grad=True)
    hot = (torch.rand(64, 6) < 0.4).float()
    for t, scale, counted in ((hot, 1.0, True), (torch.rand(64, 6), 1.0, False), (hot, 0.25, False)):
        g, = torch.autograd.grad(_softmax_bce(z, t) * scale, z)
        count, share = losspath.read_bce_targets(g, z, True, g.numel()).tolist()
        if counted:
            assert count == pytest.approx(float(hot.sum(1).mean()), rel=1e-4)
            assert share == pytest.approx(float((hot.sum(1) > 1).float().mean()), rel=1e-4)
        else:
            assert math.isnan(count) and math.isnan(share)
