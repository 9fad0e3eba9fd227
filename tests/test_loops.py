"""An operation called in a loop of the forward, each call reading what the one before made (a recurrence
written by hand with raw parameters): no module hook sees its steps, the functional sites do, and the gradient
along them tells whether it vanishes through the loop."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import Cause, GradState, NeuralDbg, Stat
from neuraldbg.analysis import _loops


class HandRNN(nn.Module):
    """A plain RNN written by hand: its parameters are the model's own, applied by hand at each time step."""

    def __init__(self, hidden: int = 64, recurrent_std: float = 1.0):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(8, hidden) / math.sqrt(8))
        self.w_state = nn.Parameter(torch.randn(hidden, hidden) * recurrent_std / math.sqrt(hidden))
        self.b = nn.Parameter(torch.zeros(hidden))
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.w_state.shape[0])
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ self.w_in + h @ self.w_state + self.b)
        return self.out(h)


def _first_step_task(n: int = 2400, steps_in_time: int = 16):
    """The label is written in the first time step only; noise follows."""
    g = torch.Generator().manual_seed(1234)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.5 * torch.randn(n, steps_in_time, 8, generator=g)
    x[:, 0, :] = 0
    x[torch.arange(n), 0, y] = 2.0
    return x, y


def _train(model: nn.Module, seed: int, steps: int = 300, lengths: tuple[int, int] = (16, 16),
           opt: torch.optim.Optimizer | None = None, data=None, lr: float = 2e-3, before=None) -> NeuralDbg:
    """``lengths``: each batch's sequences cut to a length drawn in that range (a loop that runs for as many
    steps as its batch has); ``data``: (x, y), the first-step task by default; ``before(step)``: called before
    each step."""
    x, y = data if data is not None else _first_step_task()
    opt = opt or torch.optim.Adam(model.parameters(), lr)
    gen = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            if before is not None:
                before(step)
            j = torch.randint(0, len(x), (64,), generator=gen)
            t = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen)) if x.dim() == 3 else None
            opt.zero_grad()
            loss = F.cross_entropy(model(x[j, :t]), y[j])
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gradient_that_vanishes_along_a_recurrence_written_by_hand(seed, tmp_path):
    torch.manual_seed(seed)
    dbg = _train(HandRNN(recurrent_std=0.1), seed)
    follows = {l.name: l.extra.get("follows") for l in dbg.trace.layers}
    assert follows["(model):tanh#2"] == "(model):tanh" and follows["(model):tanh#16"] == "(model):tanh#15"
    top = dbg.explain()[0]
    # placed at the loop's owner: the model's own forward
    assert top.cause == Cause.VANISHING_GRADIENTS and top.layer == "" and top.confidence >= 0.5
    assert top.step <= 50
    assert "16 times in a loop" in " ".join(top.chain) and "orthogonal" in top.suggestion
    # the grid shows it along the loop: the first calls vanishing, the last ones healthy
    grid = dbg.health()
    assert grid["(model):tanh"].grad == GradState.VANISHING and grid["(model):tanh#16"].grad == GradState.HEALTHY
    # the loop is kept in a saved trace
    dbg.save(tmp_path / "run.ndbg")
    again = NeuralDbg.load(tmp_path / "run.ndbg").explain()[0]
    assert (again.cause, again.layer) == (top.cause, top.layer)


def test_a_loop_whose_length_changes_from_batch_to_batch():
    """Batches of 8 to 16 steps: each pass's loop is read over the calls that ran in it."""
    torch.manual_seed(0)
    dbg = _train(HandRNN(recurrent_std=0.1), 0, lengths=(8, 16))
    top = dbg.explain()[0]
    assert top.cause == Cause.VANISHING_GRADIENTS and top.confidence >= 0.5 and "in a loop" in top.chain[0]
    # every pass whose gradients were sampled is read, not only those as long as the longest
    read = np.isfinite(dbg.trace.stats.data[:, :, int(Stat.GRAD_RMS)]).any(axis=1).sum()
    assert len(_loops(dbg.trace)["(model):tanh"]) >= read - 1


class StackedByHand(nn.Module):
    """Two recurrent layers written by hand, both stepped in one loop (time-major): tanh twice a step."""

    def __init__(self, hidden: int = 64, recurrent_std: float = 0.1):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(8, hidden) / math.sqrt(8))
        self.w2 = nn.Parameter(torch.randn(hidden, hidden) / math.sqrt(hidden))
        self.u1, self.u2 = (nn.Parameter(torch.randn(hidden, hidden) * recurrent_std / math.sqrt(hidden))
                            for _ in range(2))
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        a = b = x.new_zeros(len(x), self.u1.shape[0])
        for t in range(x.shape[1]):
            a = torch.tanh(x[:, t] @ self.w1 + a @ self.u1)
            b = torch.tanh(a @ self.w2 + b @ self.u2)
        return self.out(b)


class GatedByHand(HandRNN):
    """The hand RNN, its output scaled by a context gate computed before the loop: one more tanh call, apart."""

    def __init__(self):
        super().__init__(recurrent_std=0.1)
        self.g = nn.Parameter(torch.randn(8, 64) / math.sqrt(8))

    def forward(self, x):
        gate = torch.tanh(x.mean(1) @ self.g)
        return super().forward(x) * (1 + gate.mean(1, keepdim=True))


def test_two_recurrences_stepped_in_one_loop_are_two_loops_and_one_hypothesis():
    torch.manual_seed(0)
    dbg = _train(StackedByHand(), 0)
    follows = {l.name: l.extra.get("follows") for l in dbg.trace.layers}
    assert follows["(model):tanh#3"] == "(model):tanh" and follows["(model):tanh#4"] == "(model):tanh#2"
    found = [h for h in dbg.explain() if h.confidence >= 0.5]
    assert [h.cause for h in found] == [Cause.VANISHING_GRADIENTS]
    assert "1 more loop of the same forward" in found[0].chain[0]


def test_a_call_of_the_same_operation_before_the_loop_does_not_hide_it():
    torch.manual_seed(0)
    dbg = _train(GatedByHand(), 0)
    follows = {l.name: l.extra.get("follows") for l in dbg.trace.layers}
    assert "(model):tanh" not in follows.values() and follows["(model):tanh#3"] == "(model):tanh#2"
    top = dbg.explain()[0]
    assert top.cause == Cause.VANISHING_GRADIENTS and "16 times in a loop" in top.chain[0]


def test_a_loop_frozen_at_first_is_found_once_it_trains():
    """The recurrence's parameters frozen for the first passes: no autograd graph to read the loop from, then
    one."""
    torch.manual_seed(0)
    model = HandRNN(recurrent_std=0.1)
    hand = [model.w_in, model.w_state, model.b]
    for p in hand:
        p.requires_grad_(False)

    def unfreeze(step: int) -> None:
        if step == 30:
            for p in hand:
                p.requires_grad_(True)

    dbg = _train(model, 0, steps=120, lengths=(20, 20), data=_first_step_task(steps_in_time=20), before=unfreeze)
    follows = {l.name: l.extra.get("follows") for l in dbg.trace.layers}
    assert follows["(model):tanh#20"] == "(model):tanh#19" and follows["(model):tanh#2"] == "(model):tanh"


class HandGRU(nn.Module):
    """A GRU written by hand: two gates a step, each a sigmoid, and a zero initial state."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.wz, self.wr, self.wh = (nn.Parameter(torch.randn(8 + hidden, hidden) / math.sqrt(8 + hidden))
                                     for _ in range(3))
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        h = x.new_zeros(len(x), self.hidden)
        for t in range(x.shape[1]):
            xh = torch.cat([x[:, t], h], 1)
            z, r = torch.sigmoid(xh @ self.wz), torch.sigmoid(xh @ self.wr)
            h = (1 - z) * h + z * torch.tanh(torch.cat([x[:, t], r * h], 1) @ self.wh)
        return self.out(h)


def test_a_gated_loop_reads_each_gate_along_its_own_calls():
    """The update and reset gates are the same operation, called twice a step: each gate's call follows its
    own call a step before (a period of two), not the other gate's. The first reset gate acts on the zero
    initial state and gets no gradient at all, by construction: that is no gradient vanishing. At a rate
    far too low, the rate is named."""
    torch.manual_seed(0)
    model = HandGRU()
    dbg = _train(model, 0, opt=torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    follows = {l.name: l.extra.get("follows") for l in dbg.trace.layers}
    assert follows["(model):sigmoid#3"] == "(model):sigmoid" and follows["(model):sigmoid#4"] == "(model):sigmoid#2"
    assert follows["(model):tanh#2"] == "(model):tanh"
    top = dbg.explain()[0]
    assert top.cause == Cause.LEARNING_RATE_TOO_LOW, [(h.cause, h.confidence) for h in dbg.explain()]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_recurrence_initialised_orthogonally_is_healthy(seed):
    torch.manual_seed(seed)
    model = HandRNN()
    nn.init.orthogonal_(model.w_state)
    dbg = _train(model, seed)
    assert float(dbg.trace.loss.data[-20:].mean()) < 0.1  # it learns the task
    assert not [h for h in dbg.explain() if h.confidence >= 0.5]
    assert all(h.grad == GradState.HEALTHY for h in dbg.health().values())
    # the calls of its loop warned of alike (tanh saturating as it learns) are one warning, naming the others
    alike = [(w.signal, w.failure) for w in dbg.warnings() if w.layer.startswith("(model):tanh")]
    assert len(alike) == len(set(alike))


class TwoBranches(nn.Module):
    """tanh called twice side by side, on two branches of the same input: no loop."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.a(x)) + torch.tanh(self.b(x)))


def test_calls_side_by_side_are_no_loop():
    torch.manual_seed(0)
    model = TwoBranches()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    sites = [l for l in dbg.trace.layers if l.is_site]
    assert len(sites) == 2 and not [l for l in sites if l.extra.get("follows")]


class HandStack(nn.Module):
    """Twelve layers kept in a ParameterList and applied in a ``for`` by hand: no module for any of them."""

    def __init__(self, act: str, depth: int = 12, hidden: int = 64):
        super().__init__()
        dims = [16] + [hidden] * depth
        gain = 2.0 if act == "relu" else 1.0
        self.act = act
        self.ws = nn.ParameterList([nn.Parameter(torch.randn(a, b) * math.sqrt(gain / a))
                                    for a, b in zip(dims, dims[1:])])
        self.bs = nn.ParameterList([nn.Parameter(torch.zeros(b)) for b in dims[1:]])
        self.out = nn.Linear(hidden, 4)

    def forward(self, x):
        for w, b in zip(self.ws, self.bs):
            x = torch.sigmoid(x @ w + b) if self.act == "sigmoid" else F.relu(x @ w + b)
        return self.out(x)


def _train_stack(act: str, seed: int) -> NeuralDbg:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2000, 16, generator=g), torch.randn(16, 4, generator=g)
    y = (x @ w).argmax(1)
    torch.manual_seed(seed)
    return _train(HandStack(act), seed, data=(x, y), lr=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_layers_stacked_in_a_loop_by_hand(seed):
    """A sigmoid stack applied in a loop: the gradient fades along it (named); its ReLU twin at He init learns."""
    top = _train_stack("sigmoid", seed).explain()[0]
    assert top.cause == Cause.VANISHING_GRADIENTS and top.confidence >= 0.5 and "12 times in a loop" in top.chain[0]
    relu = _train_stack("relu", seed)
    assert float(relu.trace.loss.data[-20:].mean()) < 0.3
    assert not [h for h in relu.explain() if h.confidence >= 0.5]
