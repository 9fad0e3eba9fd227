"""A session given no optimizer (a training cell that makes its own): the first optimizer that steps on the
model's weights is watched from then on, as if it had been given, with every step counted once. An optimizer
that holds none of the model's weights (made for a model since re-created, a cell re-run out of order) is
named: the model's weights never change."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jupyter_cells import ip  # noqa: F401 - a fixture
from neuraldbg import NeuralDbg
from zoo import teacher_classes

CONFIDENT = 0.5


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def _steps(dbg, model, first: list, steps: int, make_opt=None, every: int = 0):
    """Train on a teacher's classes with the optimizer in ``first`` (taken out of it: this loop holds it alone);
    with ``every``, ``make_opt()`` makes a new one every ``every`` steps."""
    data = teacher_classes(16, 4)
    opt = first.pop()
    for step in range(steps):
        if every and step and step % every == 0:
            opt = make_opt()  # (the loop's own name only: rebinding it drops the optimizer before)
        x, y = data(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        dbg.record_loss(loss)
    return dbg


def _loop(model, make_opt, steps: int = 200, given=None):
    with NeuralDbg(model, optimizer=given) as dbg:
        _steps(dbg, model, [make_opt()], steps)
    return dbg


def test_the_optimizer_a_loop_makes_is_watched_as_if_given():
    found = _mlp()
    dbg = _loop(found, lambda: torch.optim.SGD(found.parameters(), lr=1e-6))
    given_model = _mlp()
    opt = torch.optim.SGD(given_model.parameters(), lr=1e-6)
    given = _loop(given_model, lambda: opt, given=opt)
    assert dbg.trace.meta["optimizer"] == "SGD" and dbg.trace.meta.get("optimizer_adopted")
    assert dbg.step == given.step == 200  # every step counted once
    assert list(dbg.trace.loss.steps) == list(given.trace.loss.steps)
    top, ref = dbg.explain()[0], given.explain()[0]
    assert top.cause == ref.cause == "learning_rate_too_low"
    assert "raise the learning rate from 1" in top.suggestion


def test_an_optimizer_of_another_model_is_named():
    model, old = _mlp(), _mlp(seed=1)  # the model re-created after its optimizer was made
    dbg = _loop(model, lambda: torch.optim.Adam(old.parameters(), lr=1e-3))
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT
    assert "model.parameters()" in top.suggestion and "learning rate" not in top.suggestion


def test_a_second_optimizer_of_other_weights_beside_the_models_own_is_no_fault():
    """A GAN's discriminator optimizer steps too: the generator's own optimizer is the one found."""
    model, critic = _mlp(), _mlp(seed=1)
    data = teacher_classes(16, 4)
    with NeuralDbg(model) as dbg:
        opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(200):
            x, y = data(step)
            opt_c.zero_grad()
            F.cross_entropy(critic(x), y).backward()
            opt_c.step()
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.trace.meta["optimizer"] == "Adam"
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_the_magic_watches_an_optimizer_made_in_the_cell(ip):  # noqa: F811 - the fixture
    ip.run_cell("import torch, torch.nn as nn\ntorch.manual_seed(0)\n"
                "model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))\n")
    cell = ("opt = torch.optim.SGD(model.parameters(), lr=1e-6)\n"
            "g = torch.Generator().manual_seed(0); w = torch.randn(16, 4, generator=g)\n"
            "for step in range(200):\n"
            "    x = torch.randn(64, 16, generator=g); y = (x @ w).argmax(1)\n"
            "    opt.zero_grad(); loss = nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()\n")
    ip.run_cell_magic("neuraldbg", "model --no-live", cell)
    dbg = ip.user_ns["_ndbg"]
    assert dbg.trace.meta["optimizer"] == "SGD" and dbg.step == 200
    assert dbg.explain()[0].cause == "learning_rate_too_low"


def test_a_watched_model_no_optimizer_steps_beside_a_loss_that_learns_is_no_fault():
    """A teacher left trainable but in no optimizer, watched while a student learns from it: its weights never
    change and another optimizer steps, but the loss recorded improves: no verdict."""
    teacher, student = _mlp(), _mlp(seed=1)
    data = teacher_classes(16, 4)
    with NeuralDbg(teacher) as dbg:
        opt = torch.optim.Adam(student.parameters(), lr=1e-3)
        for step in range(200):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(student(x) + teacher(x).detach(), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.trace.meta.get("foreign_steps", 0) == 200
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


# -- an optimizer made again inside the loop --------------------------------------------------------------------

def _remade_loop(model, make_opt, steps: int = 300, every: int = 1, given: bool = False):
    """A loop that makes a new optimizer every ``every`` steps (1: at every step, inside the loop)."""
    first = [make_opt()]
    with NeuralDbg(model, optimizer=first[0] if given else None) as dbg:
        _steps(dbg, model, first, steps, make_opt, every)
    return dbg


@pytest.mark.parametrize("given", [False, True], ids=["found", "given"])
def test_an_optimizer_made_at_every_step_is_followed_and_named(given):
    """SGD with momentum made anew at every step: its momentum starts from zero each time, and at a rate set
    for momentum the loss stalls. The session followed the first optimizer alone and saw one step of 300;
    it now follows each replacement."""
    model = _mlp()
    dbg = _remade_loop(model, lambda: torch.optim.SGD(model.parameters(), lr=0.003, momentum=0.9), given=given)
    assert dbg.step == 300 and dbg.trace.stats.n >= 20  # every step counted, sampled as usual
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("loss_plateau", "") and top.confidence >= CONFIDENT
    assert "make the optimizer once" in top.suggestion and "learning rate" not in top.suggestion


def test_an_optimizer_made_at_every_step_beside_a_falling_loss_is_a_weak_signal():
    """At 0.01 the loss still falls (to ~1 where the same loop with one optimizer reaches ~0.1): the fact is
    listed, below the confidence of a verdict (how far the loss could have gone is not known)."""
    model = _mlp()
    dbg = _remade_loop(model, lambda: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    found = [h for h in dbg.explain() if "make the optimizer once" in h.suggestion]
    assert found and found[0].confidence < CONFIDENT


def test_an_optimizer_without_state_made_at_every_step_loses_nothing():
    model = _mlp()
    dbg = _remade_loop(model, lambda: torch.optim.SGD(model.parameters(), lr=0.1))
    assert dbg.step == 300 and dbg.trace.meta["optimizer_remade"][1] is False
    assert all("make the optimizer once" not in h.suggestion for h in dbg.explain())


def test_an_optimizer_made_once_an_epoch_is_followed_quietly():
    model = _mlp()
    dbg = _remade_loop(model, lambda: torch.optim.Adam(model.parameters(), lr=1e-3), every=100)
    assert dbg.step == 300 and dbg.trace.meta["optimizer_remade"][0] == 2
    assert int(dbg.trace.globals.steps[-1]) > 200  # sampled into the last epoch
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_two_optimizers_for_two_parts_of_the_model_are_no_replacement():
    model = _mlp()
    data = teacher_classes(16, 4)
    first = torch.optim.Adam(model[0].parameters(), lr=1e-3)
    second = torch.optim.SGD(model[2].parameters(), lr=0.05)
    with NeuralDbg(model) as dbg:
        for step in range(200):
            x, y = data(step)
            first.zero_grad()
            second.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            first.step()
            second.step()
            dbg.record_loss(loss)
    assert dbg.step == 200 and "optimizer_remade" not in dbg.trace.meta
    assert dbg.trace.meta["optimizer"] == "Adam"


class _Lookahead(torch.optim.Optimizer):
    """A wrapper that holds an inner optimizer over the same weights and steps it inside its own step."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, inner.defaults)

    @torch.no_grad()
    def step(self, closure=None):
        return self.inner.step(closure)


@pytest.mark.parametrize("given", [False, True], ids=["found", "given"])
def test_an_optimizer_stepped_inside_a_wrapper_is_no_replacement(given):
    model = _mlp()
    opt = _Lookahead(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    dbg = _loop(model, lambda: opt, given=opt if given else None)
    assert dbg.step == 200 and "optimizer_remade" not in dbg.trace.meta
    assert dbg.trace.meta["optimizer"] == "_Lookahead"


def test_a_second_optimizer_over_the_same_weights_leaves_the_watched_one_watched():
    """An auxiliary optimizer stepping the same weights now and then (a second loss) replaces nothing: the
    watched one is still held by the loop."""
    model = _mlp()
    main, aux = torch.optim.Adam(model.parameters(), lr=1e-3), torch.optim.SGD(model.parameters(), lr=1e-3)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=main) as dbg:
        for step in range(100):
            x, y = data(step)
            main.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            main.step()
            dbg.record_loss(loss)
            if step % 10 == 9:
                aux.zero_grad()
                model(x).pow(2).mean().backward()
                aux.step()
    assert dbg.step == 100 and dbg.optimizer is main and "optimizer_remade" not in dbg.trace.meta


class _Sam(torch.optim.Optimizer):
    """A wrapper whose step runs the closure (a backward pass) before its inner optimizer's step."""

    def __init__(self, params, inner_cls, **kw):
        super().__init__(params, {})
        self.inner = inner_cls(self.param_groups, **kw)

    def step(self, closure=None):
        with torch.enable_grad():
            closure()
        return self.inner.step()


def test_a_wrapper_that_runs_its_closure_before_its_inner_step_stays_watched():
    model = _mlp()
    opt = _Sam(model.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(50):
            x, y = data(step)

            def closure(x=x, y=y):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                return loss
            loss = closure()
            opt.step(closure)
            dbg.record_loss(loss)
    assert dbg.optimizer is opt and "optimizer_remade" not in dbg.trace.meta


def test_a_session_dropped_while_running_leaves_no_global_hook_and_frees_the_model():
    import gc
    import weakref

    from torch.optim.optimizer import _global_optimizer_pre_hooks
    before = len(_global_optimizer_pre_hooks)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = NeuralDbg(model, optimizer=opt).start()
    x, y = teacher_classes(16, 4)(0)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    alive = weakref.ref(model)
    del model, opt, dbg
    gc.collect()
    other = nn.Linear(2, 2)
    torch.optim.SGD(other.parameters(), lr=0.1).step()  # a hook left behind removes itself when it runs
    assert alive() is None and len(_global_optimizer_pre_hooks) == before


class _EqSGD(torch.optim.SGD):
    def __eq__(self, other):  # (so, no hash)
        return self is other


def test_an_unhashable_optimizer_of_another_model_steps_as_usual():
    model, other = _mlp(), _mlp(seed=1)
    opt, other_opt = torch.optim.SGD(model.parameters(), lr=0.05), _EqSGD(other.parameters(), lr=0.05)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(5):
            x, y = data(step)
            for m, o in ((model, opt), (other, other_opt)):
                o.zero_grad()
                F.cross_entropy(m(x), y).backward()
                o.step()
    assert dbg.step == 5
