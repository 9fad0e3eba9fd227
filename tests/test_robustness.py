"""The monitor never breaks the run it watches: odd model shapes, failures mid-step, hostile files."""
import collections
import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from neuraldbg import NeuralDbg, Stat


def n_hooks(model, opt=None):
    n = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())
    if opt is not None:
        n += len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)
    return n


class Boom(Exception):
    pass


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise Boom("backward failed")


@pytest.mark.parametrize("where", ["forward", "backward", "optimizer", "user"])
def test_an_exception_anywhere_in_the_step_leaves_no_hooks_and_keeps_the_partial_run(where):
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)

        def forward(self, x, fail=False):
            h = torch.relu(self.a(x))
            if fail and where == "forward":
                raise Boom("forward failed")
            if fail and where == "backward":
                h = FailingBackward.apply(h)
            return self.b(h)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if where == "optimizer":
        def bad_step(*a, **k):
            raise Boom("optimizer failed")
    before = n_hooks(model, opt)
    with pytest.raises(Boom):
        with NeuralDbg(model, optimizer=opt, every=1) as dbg:
            for step in range(6):
                fail = step == 4
                opt.zero_grad()
                loss = model(torch.randn(5, 4), fail=fail).pow(2).mean()
                loss.backward()
                if fail and where == "optimizer":
                    bad_step()
                if fail and where == "user":
                    raise Boom("user code failed")
                opt.step()
                dbg.record_loss(loss)
    assert n_hooks(model, opt) == before
    assert dbg.step == 4 and list(dbg.trace.stats.steps) == [0, 1, 2, 3]
    assert list(dbg.trace.loss.steps) == [0, 1, 2, 3]
    # the model still trains normally afterwards
    model(torch.randn(5, 4)).sum().backward()


def test_inplace_ops_namedtuples_none_outputs_repeated_and_shared_modules():
    torch.manual_seed(0)
    Out = collections.namedtuple("Out", "logits aux")

    class Side(nn.Module):
        def forward(self, x):
            return None  # a module used for its side effect only

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 8)
            self.act = nn.ReLU(inplace=True)
            self.twice = nn.Linear(8, 8)
            self.side = Side()
            self.head = nn.Linear(8, 3)
            self.tied = nn.Linear(8, 3)
            self.tied.weight = self.head.weight  # a parameter shared by two modules

        def forward(self, x):
            h = self.act(self.a(x))
            h = self.twice(self.twice(h))  # called twice per forward
            h += 1.0  # in-place on an intermediate
            self.side(h)
            return Out(self.head(h), self.tied(h))

    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref = Net()
    ref.load_state_dict(model.state_dict())
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    x = torch.randn(6, 4)
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for _ in range(3):
            for m, o in ((model, opt), (ref, ref_opt)):
                o.zero_grad()
                out = m(x)
                (out.logits.pow(2).mean() + out.aux.abs().mean()).backward()
                if m is model:  # weight norms are read before the step's update
                    w_head = torch.cat([m.head.weight.flatten(), m.head.bias.flatten()]).norm().item()
                    b_tied = m.tied.bias.norm().item()
                o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)  # identical training
    r = dbg.trace.stats.data[-1]
    a = dbg.trace.layer("a").index
    # the Linear's output was measured before the in-place ReLU changed it: it has negative values
    assert r[a, Stat.ACT_MEAN] < r[dbg.trace.layer("act").index, Stat.ACT_MEAN]
    assert not math.isnan(r[dbg.trace.layer("twice").index, Stat.GRAD_RMS])
    assert math.isnan(r[dbg.trace.layer("side").index, Stat.ACT_MEAN])
    head, tied = dbg.trace.layer("head").index, dbg.trace.layer("tied").index
    assert r[head, Stat.W_NORM] == pytest.approx(w_head, rel=1e-5)
    assert r[tied, Stat.W_NORM] == pytest.approx(b_tied, rel=1e-5)  # the shared weight is counted once


def test_the_same_loop_watched_many_times_leaks_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = n_hooks(model, opt)
    import gc
    import weakref
    refs = []
    for _ in range(100):
        with NeuralDbg(model, optimizer=opt) as dbg:
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        refs.append(weakref.ref(dbg._recorder))
        del dbg
    gc.collect()
    assert n_hooks(model, opt) == before
    assert sum(r() is not None for r in refs) <= 1  # sessions are freed once dropped
    assert not hasattr(model, "_neuraldbg_watcher")


def _valid_file(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(5):
            opt.zero_grad()
            loss = F.cross_entropy(model(torch.randn(4, 3)), torch.tensor([0, 1, 0, 1]))
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    path = tmp_path / "ok.ndbg"
    dbg.save(path)
    return path.read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_trace_files_load_or_raise_value_error(tmp_path, data):
    good = _valid_file(tmp_path) if not hasattr(test_fuzzed_trace_files_load_or_raise_value_error, "good") else \
        test_fuzzed_trace_files_load_or_raise_value_error.good
    test_fuzzed_trace_files_load_or_raise_value_error.good = good
    blob = bytearray(good)
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "header"]))
        if kind == "flip" and blob:
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            blob = blob[:data.draw(st.integers(0, len(blob)))]
        elif kind == "insert":
            i = data.draw(st.integers(0, len(blob)))
            blob[i:i] = data.draw(st.binary(max_size=16))
        elif kind == "header" and len(blob) >= 20:
            blob[12:20] = struct.pack("<Q", data.draw(st.integers(0, 2 ** 64 - 1)))
    path = tmp_path / "fuzzed.ndbg"
    path.write_bytes(bytes(blob))
    try:
        loaded = NeuralDbg.load(path)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    # whatever loads is a usable session
    assert loaded.trace.stats.data.ndim == 3
    assert np.asarray(loaded.trace.loss.data).ndim == 1


def test_an_optimizer_subclass_calling_its_parents_step_counts_one_step():
    """A subclass whose ``step`` clips and calls ``super().step()``: once the parent class has been
    instantiated, torch hooks both methods, so the step hooks run twice per step. One step is one step."""
    class ClippedSGD(torch.optim.SGD):
        def step(self, closure=None):
            torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 1.0)
            return super().step(closure)

    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)  # the parent, hooked first
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = ClippedSGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(12):
            loss = model(torch.randn(16, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.step == 12
    assert dbg.trace.meta.get("steps_unreached", 0) == 0


def test_a_step_an_exception_interrupted_leaves_the_next_steps_counted():
    """An exception inside ``optimizer.step`` (caught by the loop) leaves that step unfinished: the steps after
    it still count, one each, and none reads as a step without a backward pass."""
    class FlakySGD(torch.optim.SGD):
        fail_at = 3

        def step(self, closure=None):
            self.fail_at -= 1
            if self.fail_at == 0:
                raise RuntimeError("flaky")
            return super().step(closure)

    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = FlakySGD(model.parameters(), lr=0.1)
    done = 0
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(10):
            loss = model(torch.randn(16, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            try:
                opt.step()
                done += 1
            except RuntimeError:
                pass
    assert done == 9 and dbg.step == 9
    assert dbg.trace.meta.get("steps_unreached", 0) == 0
