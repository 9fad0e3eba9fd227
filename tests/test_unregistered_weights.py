"""Weights the forward pass uses that are not the model's parameters: sub-modules held in a plain Python list
(not an ``nn.ModuleList``) or a tensor made with ``requires_grad=True`` (not an ``nn.Parameter``). No module
hook sees them and ``model.parameters()`` does not list them, so the optimizer made from it never steps
them; the autograd graph of the forward pass does hold them. Named when they never change while the loss
fails; weights something does step (an optimizer given them, another one), the input itself and a model
outside the watched one that computes its input are not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


class Blocks(nn.Module):
    """Three hidden blocks and a head; ``registered=False`` keeps the blocks in a Python list."""

    def __init__(self, registered: bool, seed: int = 0, width: int = 64):
        super().__init__()
        torch.manual_seed(seed)
        blocks = [nn.Sequential(nn.Linear(16 if i == 0 else width, width), nn.ReLU()) for i in range(3)]
        self.blocks = nn.ModuleList(blocks) if registered else blocks
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _train(model, opt, steps: int = 300, seed: int = 0, make_input=None):
    data = teacher_classes(16, 4, seed=seed)

    def batch(step: int):
        x, y = data(step)
        return (x if make_input is None else make_input(x)), y
    dbg = train(Run(model, opt, batch, steps=steps))
    return dbg, dbg.trace.loss.data


def _confident(dbg):
    return [h for h in dbg.explain() if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("seed, width", [(0, 64), (1, 64), (0, 128)])
def test_blocks_in_a_python_list_are_named_in_the_model(seed, width):
    model = Blocks(registered=False, seed=seed, width=width)
    dbg, losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), seed=seed)
    top = _confident(dbg)[0]
    assert top.cause == "loss_plateau" and top.layer == ""
    assert top.step <= 10  # a fact of the code from the first step, not of the loss's onset
    assert "nn.ModuleList" in top.suggestion and "learning rate" not in top.suggestion
    info = dbg.trace.meta["unregistered"]
    assert info["tensors"] == 6 and info["numel"] == 16 * width + width * width * 2 + 3 * width
    assert "not the model's parameters" in " ".join(top.chain)
    # nothing in the learning rate's family stands beside it (the updates are not what is wrong), nor a scale
    # read across the layers the hooks do not see
    assert all(h.cause not in ("learning_rate_too_low", "learning_rate_too_high", "bad_initialization")
               for h in _confident(dbg))


def test_the_same_blocks_registered_train_quietly():
    model = Blocks(registered=True)
    dbg, losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    assert "unregistered" not in dbg.trace.meta
    assert _confident(dbg) == []
    assert losses[-1] < 0.5 * losses[0]


class RawWeight(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 64)
        self.w = (torch.randn(64, 64) / 8).requires_grad_()  # not an nn.Parameter
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(F.relu(F.relu(self.inp(x)) @ self.w))


def test_a_raw_tensor_the_optimizer_is_given_is_stepped_and_not_named():
    model = RawWeight()
    opt = torch.optim.Adam(list(model.parameters()) + [model.w], lr=1e-3)
    dbg, _ = _train(model, opt)
    assert "unregistered" not in dbg.trace.meta
    assert _confident(dbg) == []


def test_a_raw_tensor_another_optimizer_steps_ends_the_watch():
    model = RawWeight()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    other = torch.optim.SGD([model.w], lr=1e-2)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            x, y = data(step)
            opt.zero_grad()
            other.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            other.step()
            dbg.record_loss(loss)
    assert "unregistered" not in dbg.trace.meta
    assert all(h.cause != "loss_plateau" for h in dbg.explain())


def test_a_raw_tensor_left_alone_is_counted_whatever_the_loss_does():
    """The hidden weights stay random features; the loss still falls through the layers that learn, so the
    fact is read but is no confident verdict on its own."""
    model = RawWeight()
    dbg, _ = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    info = dbg.trace.meta["unregistered"]
    assert info["tensors"] == 1 and info["shapes"] == [[64, 64]] and info["still"] >= 3


class HeadInForward(nn.Module):
    """The head is made again at every pass (inside ``forward``, registered as ``self.head`` there), or once,
    in ``__init__``, with ``once=True``."""

    def __init__(self, once: bool, seed: int = 0, width: int = 64):
        super().__init__()
        torch.manual_seed(seed)
        self.width, self.once = width, once
        self.body = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        if once:
            self.head = nn.Linear(width, 4)

    def forward(self, x):
        if not self.once:
            self.head = nn.Linear(self.width, 4)
        return self.head(self.body(x))


@pytest.mark.parametrize("seed, width", [(0, 64), (1, 32)])
def test_a_layer_made_inside_forward_is_named_with_its_fix(seed, width):
    """A new random head at every pass, which the optimizer (made from the body's parameters) never holds: the
    body cannot learn toward a head that changes, and the loss stays at chance."""
    model = HeadInForward(once=False, seed=seed, width=width)
    dbg, losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), seed=seed)
    info = dbg.trace.meta["unregistered"]
    assert info["renewed"] and info["parameters"] == 2 and info["shapes"][0] == [4, width]
    top = _confident(dbg)[0]
    assert top.cause == "loss_plateau" and top.layer == "" and top.step <= 10
    assert "__init__" in top.suggestion and "learning rate" not in top.suggestion
    assert "new weights at every pass" in " ".join(top.chain)
    assert all(h.cause not in ("learning_rate_too_low", "learning_rate_too_high") for h in _confident(dbg))


def test_the_head_made_once_trains_quietly():
    model = HeadInForward(once=True)
    dbg, losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    assert "unregistered" not in dbg.trace.meta
    assert _confident(dbg) == [] and losses[-1] < 0.5 * losses[0]


def test_a_fresh_leaf_each_pass_is_a_temporary_not_a_layer():
    """A tensor made with ``requires_grad=True`` at every pass (an initial state nobody optimizes) is freed like
    a layer made in forward, but it is no layer's weight (no ``nn.Parameter``): a temporary, left out, whatever
    the loss does."""
    class FreshState(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.inp, self.head = nn.Linear(16, 64), nn.Linear(64, 4)

        def forward(self, x):
            h0 = torch.zeros(x.shape[0], 64, requires_grad=True)
            return self.head(F.relu(self.inp(x) + h0))
    model = FreshState()
    dbg, losses = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    assert "unregistered" not in dbg.trace.meta
    assert _confident(dbg) == [] and losses[-1] < 0.5 * losses[0]
    slow = FreshState()  # at a learning rate far too low, the verdict is the learning rate's, not a layer's
    dbg, _ = _train(slow, torch.optim.Adam(slow.parameters(), lr=1e-7))
    assert "unregistered" not in dbg.trace.meta and _confident(dbg)[0].cause == "learning_rate_too_low"


def test_an_input_that_requires_grad_is_not_a_weight():
    model = Blocks(registered=True)
    dbg, _ = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3),
                    make_input=lambda x: x.clone().requires_grad_())
    assert "unregistered" not in dbg.trace.meta


def test_a_model_outside_that_computes_the_input_is_not_walked_into():
    """A frozen encoder run without ``no_grad`` before the watched model: its weights are in the graph behind
    the input, never stepped, and none of the watched model's own."""
    torch.manual_seed(0)
    encoder = nn.Linear(16, 16)
    model = Blocks(registered=True)
    dbg, _ = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), make_input=encoder)
    assert "unregistered" not in dbg.trace.meta
    assert _confident(dbg) == []


def test_the_reading_survives_a_save_and_load(tmp_path):
    model = Blocks(registered=False)
    dbg, _ = _train(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    dbg.save(tmp_path / "run.ndbg")
    loaded = NeuralDbg.load(tmp_path / "run.ndbg")
    before, after = _confident(dbg)[0], _confident(loaded)[0]
    assert (after.cause, after.layer, after.suggestion) == (before.cause, before.layer, before.suggestion)


# -- a forward that is one linear map ------------------------------------------------------------------------------

def _circles(step: int, batch: int = 64):
    """Two classes no linear boundary separates: inside or outside a circle."""
    x = torch.randn(batch, 2, generator=torch.Generator().manual_seed(step)) * 1.5
    return x, ((x ** 2).sum(1) < 2.0).long()


def _circle_run(model, steps: int = 400):
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _circles, steps=steps))


class Functional(nn.Module):
    def __init__(self, act):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(2, 64), nn.Linear(64, 64), nn.Linear(64, 2)
        self.act = act

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_layers_with_no_activation_between_them_are_named_in_the_plateau(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 64, bias=False), nn.Linear(64, 64, bias=False), nn.Linear(64, 64),
                          nn.Linear(64, 2))  # (a layer without a bias is a product with its weight alone)
    dbg = _circle_run(model)
    assert dbg.trace.meta["linear_maps"] == 4
    top = _confident(dbg)[0]
    assert top.cause == "loss_plateau" and top.layer == ""
    assert top.suggestion.startswith("add a nonlinearity") and "one linear map" in " ".join(top.chain)


@pytest.mark.parametrize("model", [
    lambda: nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)),
    lambda: Functional(F.relu),
    lambda: Functional(torch.sin),       # any op that is not affine, not only the usual activations
    lambda: Functional(lambda h: h * h),  # a product of two computed tensors is not affine; h * w is
    lambda: Functional(lambda h: h * (h > 0)),  # a ReLU written as a mask
], ids=["modules", "functional", "sin", "square", "mask"])
def test_a_nonlinearity_anywhere_leaves_the_reading_out(model):
    dbg = _circle_run(model(), steps=200)
    assert "linear_maps" not in dbg.trace.meta
    assert all("nonlinearity" not in h.suggestion for h in dbg.explain())


def test_one_linear_layer_is_a_linear_model_by_design():
    torch.manual_seed(0)
    dbg = _circle_run(nn.Sequential(nn.Linear(2, 2)), steps=200)
    assert "linear_maps" not in dbg.trace.meta
    assert all("nonlinearity" not in h.suggestion for h in dbg.explain())
