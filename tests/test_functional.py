"""Functional operations: measured on sampled passes only, attributed to the modules they belong to;
modules that never run or only return their input are not observed; recurrent cells; torch.compile."""
import math

import numpy as np
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as nn_module
from torch.overrides import _get_current_function_mode_stack

from neuraldbg import NeuralDbg, Stat


class FunctionalCNN(nn.Module):
    """The usual style: activations as functions, a dropout at p=0, an identity, a module never called."""

    def __init__(self, modules: bool = False):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(16 * 4 * 4, 32), nn.Linear(32, 3)
        self.drop, self.skip, self.unused = nn.Dropout(0.0), nn.Identity(), nn.Linear(3, 3)
        self.acts = [nn.ReLU(), nn.ReLU(), nn.ReLU()] if modules else [F.relu] * 3
        if modules:
            self.r1, self.r2, self.r3 = self.acts

    def forward(self, x):
        r1, r2, r3 = self.acts
        x = F.max_pool2d(r1(self.conv1(x)), 2)
        x = F.max_pool2d(r2(self.conv2(x)), 2)
        x = self.skip(self.drop(torch.flatten(x, 1)))
        return self.fc2(r3(self.fc1(x)))


def pixels(step, seed=0, batch=32):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(batch, 3, 16, 16, generator=g)
    return x, x.mean(dim=(2, 3)).argmax(dim=1)


def train(model, opt, steps, data=pixels, **options):
    with NeuralDbg(model, optimizer=opt, **options) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_functional_activations_are_rows_of_their_own_named_after_the_module_they_follow():
    torch.manual_seed(0)
    model = FunctionalCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = pixels(0)
    dbg = train(model, opt, 1, every=1)
    sites = {l.name: l for l in dbg.trace.layers if l.is_site}
    assert {n: l.where() for n, l in sites.items()} == {
        "conv1:relu": "F.relu after `conv1`", "conv2:relu": "F.relu after `conv2`", "fc1:relu": "F.relu after `fc1`"}
    order = {l.name: l.order for l in dbg.trace.layers if l.order is not None}
    assert order["conv2"] < order["conv2:relu"] < order["fc1"] < order["fc1:relu"] < order["fc2"]
    # the statistics of the functional ReLU are those of relu(conv2(...)), against a plain computation
    ref = FunctionalCNN()
    torch.manual_seed(0)
    ref = FunctionalCNN()
    h = F.relu(ref.conv2(F.max_pool2d(F.relu(ref.conv1(x)), 2))).detach()
    row = dbg.trace.stats.data[0, sites["conv2:relu"].index]
    assert row[Stat.ACT_MEAN] == pytest.approx(h.mean().item(), abs=1e-6)
    assert row[Stat.ACT_STD] == pytest.approx(h.std().item(), rel=1e-5)
    assert row[Stat.ACT_DEAD] == pytest.approx((h.amax(dim=(0, 2, 3)) <= 0).float().mean().item())
    assert row[Stat.GRAD_RMS] > 0  # its gradient is measured too
    # a dropout at p=0 and an identity return their input; `unused` never runs: none is observed
    assert dbg.trace.unobserved() == {"drop": "returns its input unchanged", "skip": "returns its input unchanged",
                                      "unused": "its forward never ran"}
    assert np.isnan(dbg.trace.stats.data[0, dbg.trace.layer("drop").index, Stat.ACT_STD])
    assert not {"drop", "skip", "unused"} & set(dbg.health())
    assert "not observed" in dbg.report() and "`unused` (its forward never ran)" in dbg.report()


def test_an_activation_module_keeps_its_own_row_and_ops_inside_a_module_belong_to_it():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.gate = nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)

        def forward(self, x):
            h = self.act(self.fc(x))                 # a module: its own row, no functional one
            return torch.tanh(h + self.gate(x))      # on no module's output: inside `block`

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = Block(), nn.Linear(8, 1)

        def forward(self, x):
            return torch.sigmoid(self.head(self.block(x)))  # in the model's forward, on `head`'s output

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        loss = F.binary_cross_entropy(model(torch.randn(16, 8)), torch.rand(16, 1))
        loss.backward()
        opt.step()
    sites = {l.name: (l.where(), l.kind.value, l.bounds) for l in dbg.trace.layers if l.is_site}
    assert sites == {"block:tanh": ("torch.tanh in `block`", "bounded", (-1.0, 1.0)),
                     "head:sigmoid": ("torch.sigmoid after `head`", "bounded", (0.0, 1.0))}


class Probe(nn.Module):
    """Records, during each forward pass, whether a function mode or global module hooks are active."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
        self.seen: list[tuple[int, int]] = []

    def forward(self, x):
        self.seen.append((len(_get_current_function_mode_stack()), len(nn_module._global_forward_hooks)))
        return self.fc2(F.relu(self.fc1(x)))


def test_unsampled_steps_pay_nothing_new():
    torch.manual_seed(0)
    model = Probe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, 6, data=lambda s: (torch.randn(8, 4), torch.randint(0, 2, (8,))), every=3)
    assert model.seen == [(1, 1), (0, 0), (0, 0), (1, 1), (0, 0), (0, 0)]  # steps 0 and 3 are sampled
    assert not _get_current_function_mode_stack() and not nn_module._global_forward_hooks
    assert not nn_module._global_forward_pre_hooks


def test_the_observer_never_outlives_a_forward_that_raises():
    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            F.relu(self.fc(x))
            raise RuntimeError("boom")

    model = Boom()
    with NeuralDbg(model, every=1):
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 4))
        assert not _get_current_function_mode_stack() and not nn_module._global_forward_hooks


@pytest.mark.parametrize("seed", [0, 1])
def test_a_relu_written_as_a_function_gets_the_verdict_of_its_module_twin(seed):
    """The same CNN with nn.ReLU modules and with F.relu: the same cause, the dead layer named after the
    module it follows (never vanishing_gradients for a layer the dead units block)."""
    def run(modules, dead_bias):
        torch.manual_seed(seed)
        model = FunctionalCNN(modules)
        if dead_bias:
            with torch.no_grad():
                model.conv2.bias.fill_(-40.0)  # every unit after conv2 dead from step 0
        opt = (torch.optim.SGD(model.parameters(), lr=0.05) if dead_bias else
               torch.optim.Adam(model.parameters(), lr=5e-2))  # Adam at 5e-2 kills units during training
        return train(model, opt, 60, data=lambda s: pixels(s, seed)).explain()

    dead_fn, dead_mod = run(False, True), run(True, True)
    assert (str(dead_fn[0].cause), dead_fn[0].layer) == ("dead_units", "conv2")
    assert (str(dead_mod[0].cause), dead_mod[0].layer) == ("dead_units", "r2")
    assert "F.relu after `conv2`" in dead_fn[0].chain[0]
    killed_fn, killed_mod = run(False, False), run(True, False)
    assert [str(h.cause) for h in killed_fn if h.confidence >= 0.5] == [
        str(h.cause) for h in killed_mod if h.confidence >= 0.5]
    assert str(killed_fn[0].cause) != "vanishing_gradients"
    fn_chain, mod_chain = " ".join(killed_fn[0].chain), " ".join(killed_mod[0].chain)
    for act, follows in (("r1", "conv1"), ("r2", "conv2"), ("r3", "fc1")):
        assert (f"`{act}`" in mod_chain) == (f"F.relu after `{follows}`" in fn_chain)


@pytest.mark.parametrize("relu, label", [(lambda x: x.clamp(min=0), "x.clamp(min=0)"),
                                         (lambda x: torch.clamp_min(x, 0.0), "x.clamp(min=0)"),
                                         (lambda x: x * (x > 0), "x * (x > 0)"),
                                         (lambda x: (x >= 0).float() * x, "x * (x > 0)"),
                                         (lambda x: torch.where(x > 0, x, 0.0), "torch.where(x > 0, x, 0)"),
                                         (lambda x: x.where(x > 0, 0.0), "torch.where(x > 0, x, 0)"),
                                         (lambda x: x * (x > 0).float().detach(), "x * (x > 0)"),
                                         (lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
                                          "torch.where(x > 0, x, 0)"),
                                         (lambda x: x.masked_fill(x < 0, 0.0), "x.masked_fill(x < 0, 0)"),
                                         (lambda x: x * ~(x <= 0), "x * (x > 0)")],
                         ids=["clamp", "clamp_min", "mask", "float_mask", "where", "where_method", "detached_mask",
                              "where_zeros", "masked_fill", "inverted_mask"])
def test_a_relu_written_as_a_clamp_or_a_mask_is_read_as_one(relu, label):
    """``x.clamp(min=0)`` and ``x * (x > 0)`` are ReLUs: units after conv2 killed by its bias are dead units
    there, not a weight scale read across them."""
    torch.manual_seed(0)
    model = FunctionalCNN()
    model.acts = [relu] * 3
    with torch.no_grad():
        model.conv2.bias.fill_(-40.0)
    dbg = train(model, torch.optim.SGD(model.parameters(), lr=0.05), 60)
    top = dbg.explain()[0]
    assert (str(top.cause), top.layer) == ("dead_units", "conv2") and label in top.chain[0]


@pytest.mark.parametrize("acts", [
    [lambda x: x.clamp(-1, 1), lambda x: x.clamp(0, 1), lambda x: x.detach().clamp(min=0) + x],
    # a threshold other than 0; a mask of another tensor; a mask made of data
    [lambda x: x * (x > 0.5), lambda x: x * (x.detach() > 0), lambda x: x * (torch.ones_like(x) > 0)],
    # the negative part (min(x, 0)), written two ways; a floor of -1 where the sign is negative
    [lambda x: x * ~(x > 0), lambda x: x * (1 - (x > 0).float()), lambda x: torch.where(x > 0, x, torch.tensor(-1.0))],
    [lambda x: x.masked_fill(x > 0, 0.0), lambda x: x * (x < 0), lambda x: x.masked_fill(x < 0, -1.0)]],
    ids=["clamps", "masks", "negative_parts", "negative_fills"])
def test_clamps_and_masks_that_are_no_relu_have_no_row(acts):
    """A clamp into a range or of a tensor that needs no gradient, and a product with a mask that is not the
    tensor's own sign, are no activation."""
    torch.manual_seed(0)
    model = FunctionalCNN()
    model.acts = acts
    dbg = train(model, torch.optim.SGD(model.parameters(), lr=0.05), 4, every=1)
    assert not [l for l in dbg.trace.layers if l.is_site]


class LogFeatures(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.log(self.proj(x))  # negative projections: NaN


class RootSqrt(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.head = nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.sqrt(self.proj(x)))  # in the model's own forward, on `proj`'s output


@pytest.mark.parametrize("model, where", [(lambda: nn.Sequential(nn.Linear(8, 8), LogFeatures(), nn.Linear(8, 3)),
                                           ("1", "torch.log in `1`")),
                                          (RootSqrt, ("proj", "torch.sqrt after `proj`"))])
def test_the_nan_hunt_names_the_functional_operation(model, where):
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    dbg = train(net, opt, 4, data=lambda s: (torch.randn(16, 8), torch.randint(0, 3, (16,))))
    origin = dbg.trace.nonfinite
    assert (origin.layer, origin.where(), origin.phase, origin.step) == (*where, "forward", 0)
    top = dbg.explain()[0]
    assert (str(top.cause), top.layer) == ("non_finite", where[0])
    assert where[1] in top.chain[0] and "torch." in top.suggestion


def test_a_compiled_model_with_functional_ops_records_and_does_not_recompile():
    """Under torch.compile the module statistics are recorded as in eager mode; the functional
    operations inside the compiled graph are not observed (no mode enters the graph), and nothing
    recompiles step after step."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    net = FunctionalCNN()
    model = torch.compile(net, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    graphs = []
    with NeuralDbg(model, optimizer=opt, every=2) as dbg:
        for step in range(16):
            x, y = pixels(step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[3] > 0
    last = dbg.trace.stats.data[-1]
    assert not math.isnan(last[dbg.trace.layer("conv2").index, Stat.ACT_STD])
    assert not any(l.is_site for l in dbg.trace.layers)
    assert not _get_current_function_mode_stack()


class Cell(nn.Module):
    """An LSTM cell written by hand: its gates are functional sigmoids and tanhs."""

    def __init__(self, n_in, hidden):
        super().__init__()
        self.ih, self.hh = nn.Linear(n_in, 4 * hidden), nn.Linear(hidden, 4 * hidden)

    def forward(self, x, state):
        h, c = state
        i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class Recurrent(nn.Module):
    def __init__(self, cell: str, gain: float = 1.0, hidden: int = 32):
        super().__init__()
        self.hidden = hidden
        self.rnn = Cell(4, hidden) if cell == "hand" else nn.LSTM(4, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)
        with torch.no_grad():
            for name, p in self.rnn.named_parameters():
                if "weight" in name:
                    p.mul_(gain)

    def forward(self, x):
        if isinstance(self.rnn, nn.LSTM):
            return self.head(self.rnn(x)[0][:, -1])
        h = c = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):  # the cell runs once per time step
            h, c = self.rnn(x[:, t], (h, c))
        return self.head(h)


def sequences(step, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(32, 12, 4, generator=g)
    return x, (x[:, :, 0].sum(dim=1) > 0).long()


@pytest.mark.parametrize("seed", [0, 1])
def test_recurrent_cells(seed):
    def run(cell, gain):
        torch.manual_seed(seed)
        model = Recurrent(cell, gain)
        return train(model, torch.optim.Adam(model.parameters(), lr=1e-2), 60, data=lambda s: sequences(s, seed))

    for cell in ("lstm", "hand"):  # trained as they come: quiet
        dbg = run(cell, 1.0)
        assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
    hand = run("hand", 1.0)
    gates = [l.where() for l in hand.trace.layers if l.is_site]
    # one row per gate, whatever the sequence length: the cell's repeated calls are the same rows
    assert gates == ["torch.sigmoid in `rnn`"] * 2 + ["torch.tanh in `rnn`", "torch.sigmoid in `rnn`",
                                                      "torch.tanh in `rnn`"]
    # gate weights 30x too large: the sigmoid and tanh gates are pinned, and that is named in the cell
    top = run("hand", 30.0).explain()[0]
    assert str(top.cause) in ("bad_initialization", "saturated_activations") and top.layer.startswith("rnn")
    assert "torch.sigmoid" in " ".join(top.chain) or "torch.tanh" in " ".join(top.chain)
