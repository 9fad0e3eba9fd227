"""A session driven by a training loop it does not own: an optimizer given late, steps taken with a
closure, gradient accumulation, gradients read when the loop says, passes that skip the model's forward."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat

from test_extraction import all_hooks, batches, index, mlp, row


def _norm(grads):
    return torch.cat([g.flatten() for g in grads]).norm().item()


def test_an_optimizer_set_after_start_counts_the_steps_and_a_replaced_one_no_longer_does():
    model = mlp()
    first = torch.optim.SGD(model.parameters(), lr=0.01)
    second = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(6)
    with NeuralDbg(model, every=1) as dbg:
        dbg.set_optimizer(first)
        for x, y in data[:3]:
            first.zero_grad()
            F.cross_entropy(model(x), y).backward()
            first.step()
        assert dbg.step == 3 and dbg.trace.meta["optimizer"] == "SGD"
        dbg.set_optimizer(second)
        for x, y in data[3:]:
            second.zero_grad()
            F.cross_entropy(model(x), y).backward()
            second.step()
            first.step()  # the replaced optimizer's steps are not counted any more
    assert dbg.step == 6
    assert dbg.optimizer is second
    upd = dbg.trace.stats.data[:, index(dbg, "0"), Stat.W_UPDATE_NORM]
    assert not any(math.isnan(u) for u in upd)
    assert dbg.trace.global_column("lr")[-1] == pytest.approx(0.05)
    assert all_hooks(model, first) == 0 and all_hooks(model, second) == 0


def test_set_optimizer_rejects_a_foreign_optimizer_and_keeps_the_old_one():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.01)
    dbg = NeuralDbg(model, opt)
    with pytest.raises(ValueError, match="does not own"):
        dbg.set_optimizer(other)
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        dbg.set_optimizer("sgd")
    assert dbg.optimizer is opt and dbg.trace.meta["optimizer"] == "SGD"
    with pytest.raises(RuntimeError, match="loaded session"):
        NeuralDbg._from_trace(dbg.trace).set_optimizer(opt)


def test_a_step_whose_forward_runs_inside_the_optimizer_closure_is_measured_like_a_plain_one():
    def run(closure_style):
        model = mlp()
        model.eval()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, opt, every=1) as dbg:
            for x, y in batches(3):
                def closure(x=x, y=y):
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    return loss
                if closure_style:
                    opt.step(closure)  # the step pre-hook fires before the forward pass
                else:
                    closure()
                    opt.step()
        return dbg

    plain, closed = run(False), run(True)
    assert closed.step == plain.step == 3
    for col in (Stat.W_UPDATE_NORM, Stat.W_GRAD_NORM, Stat.ACT_DEAD, Stat.GRAD_RMS):
        a = plain.trace.stats.data[:, :, col]
        b = closed.trace.stats.data[:, :, col]
        assert torch.allclose(torch.from_numpy(a), torch.from_numpy(b), equal_nan=True), col


def test_gradient_accumulation_counts_one_step_per_window_and_reads_the_whole_window():
    model = mlp()
    model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(8)
    with NeuralDbg(model, opt, every=1) as dbg:
        for start in (0, 4):
            opt.zero_grad()
            for x, y in data[start:start + 4]:
                (F.cross_entropy(model(x), y) / 4).backward()
            if start == 0:
                window = _norm([model[0].weight.grad, model[0].bias.grad])
                first = torch.autograd.grad(F.cross_entropy(model(data[0][0]), data[0][1]) / 4,
                                            [model[0].weight, model[0].bias])
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # after the read: not seen
            opt.step()
    assert dbg.step == 2
    seen = row(dbg, 0)[index(dbg, "0"), Stat.W_GRAD_NORM]
    assert seen == pytest.approx(window, rel=1e-4)
    assert seen != pytest.approx(_norm(first), rel=1e-2)  # not the first micro-batch's share


def test_read_gradients_takes_the_unscaled_gradient_before_clipping():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batches(1)[0]
    with NeuralDbg(model, opt, every=1) as dbg:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaled = _norm([model[0].weight.grad, model[0].bias.grad])
        scaler.unscale_(opt)
        unscaled = _norm([model[0].weight.grad, model[0].bias.grad])
        dbg.read_gradients()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-4)
        scaler.step(opt)
        scaler.update()
    assert scaled > 1000 * unscaled  # the scaler's factor was there at backward end
    assert row(dbg, 0)[index(dbg, "0"), Stat.W_GRAD_NORM] == pytest.approx(unscaled, rel=1e-4)
    assert dbg.step == 1


class Task(nn.Module):
    """A model that trains through a method of its own, not its forward (as a LightningModule may)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)

    def training_loss(self, batch, through_forward=False):
        x, y = batch
        out = self(x) if through_forward else self.net(x)
        return F.cross_entropy(out, y)


def _dead_mlp(seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        net[2].bias.fill_(-20.0)  # the second ReLU never fires
    return net


def _verdict(dbg, prefix=""):
    return [(h.cause, h.layer if h.layer in ("", "input") else h.layer[len(prefix):], h.step)
            for h in dbg.explain() if h.confidence >= 0.5]


@pytest.mark.parametrize("through_forward", [False, True])
def test_explicit_passes_watch_a_model_trained_through_its_own_method(through_forward):
    data = batches(12)
    plain_net = _dead_mlp(3)
    opt = torch.optim.SGD(plain_net.parameters(), lr=0.05)
    with NeuralDbg(plain_net, opt, every=1) as plain:
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(plain_net(x), y)
            loss.backward()
            opt.step()
            plain.record_loss(loss)

    task = Task(_dead_mlp(3))
    opt = torch.optim.SGD(task.parameters(), lr=0.05)
    with NeuralDbg(task, opt, every=1) as dbg:
        for batch in data:
            dbg.begin_pass(batch, run=lambda m, b=batch: m.training_loss(b))
            loss = task.training_loss(batch, through_forward)
            dbg.end_forward(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.step == 12 and dbg._recorder.passes == 12  # a forward inside the pass is not a second one
    assert not math.isnan(row(dbg, 0)[index(dbg, "net.3"), Stat.ACT_DEAD])
    assert _verdict(plain)[0][:2] == ("dead_units", "3")
    assert _verdict(dbg, "net.") == _verdict(plain)
    assert all_hooks(task, opt) == 0


def test_a_nan_from_the_loss_of_an_explicit_pass_is_located_by_its_replay():
    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))

    def nan_loss(out):
        return torch.sqrt(out - 10.0).mean()  # the root of a negative number: NaN, and a NaN gradient

    data = batches(2)
    plain_net = net()
    opt = torch.optim.SGD(plain_net.parameters(), lr=0.01)
    with NeuralDbg(plain_net, opt, every=1) as plain:
        for x, _ in data:
            opt.zero_grad()
            loss = nan_loss(plain_net(x))
            loss.backward()
            opt.step()
            plain.record_loss(loss)  # (its graph shows the square root)

    task = Task(net())
    opt = torch.optim.SGD(task.parameters(), lr=0.01)
    with NeuralDbg(task, opt, every=1) as dbg:
        for batch in data:
            dbg.begin_pass(batch, run=lambda m, b=batch: nan_loss(m.net(b[0])))
            loss = nan_loss(task.net(batch[0]))
            dbg.end_forward(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    origin = dbg.trace.nonfinite
    assert (origin.step, origin.layer, origin.phase) == (0, "", "loss")
    assert (plain.trace.nonfinite.layer, plain.trace.nonfinite.phase) == ("", "loss")
    assert _verdict(dbg) == _verdict(plain) and _verdict(plain)
    assert _verdict(plain)[0][:2] == ("non_finite", "loss")  # the loss's own square root, not its targets


def test_a_replay_that_cannot_run_is_reported_and_training_goes_on():
    task = Task(nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 1)))
    opt = torch.optim.SGD(task.parameters(), lr=0.01)

    def broken(m):
        raise RuntimeError("needs its trainer")

    with NeuralDbg(task, opt, every=1) as dbg:
        for x, _ in batches(2):
            dbg.begin_pass((x,), run=broken)
            loss = (task.net(x) * float("nan")).sum()
            dbg.end_forward(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert dbg.step == 2
    assert dbg.trace.nonfinite.phase == "unknown" and "RuntimeError" in dbg.trace.nonfinite.detail


def test_explicit_pass_calls_outside_a_watching_session_do_nothing_or_say_why():
    task = Task(nn.Sequential(nn.Linear(6, 4)))
    dbg = NeuralDbg(task)
    dbg.begin_pass(batches(1)[0])  # not started: ignored
    dbg.end_forward(torch.zeros(()))
    dbg.read_gradients()
    assert dbg.step == 0 and all_hooks(task) == 0
    loaded = NeuralDbg._from_trace(dbg.trace)
    for call in (lambda: loaded.begin_pass(()), lambda: loaded.end_forward(None), loaded.read_gradients):
        with pytest.raises(RuntimeError, match="loaded session"):
            call()
