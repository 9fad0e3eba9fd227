"""A model driven by its parts: the loop calls its children one by one and never the model's own forward (a
container with no forward, SimSiam's encoder, projector and predictor, a GAN's two networks). Each step's
pass begins at the first child called and is read as if the model's forward had run: the same verdicts as
the same net driven through its forward."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from zoo import teacher_classes

CONFIDENT = 0.5


class Container(nn.Module):
    """A body and a head, and no forward of its own."""

    def __init__(self, mid: nn.Module | None = None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.mid = mid if mid is not None else nn.Identity()
        self.head = nn.Linear(64, 4)


class Whole(Container):
    def forward(self, x):
        return self.head(self.mid(self.body(x)))


def _run(model, lr: float, parts: bool, steps: int = 300, seed: int = 0, prepare=None):
    if prepare is not None:
        prepare(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    data = teacher_classes(16, 4, seed=seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            out = model.head(model.mid(model.body(x))) if parts else model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            if not torch.isfinite(loss):
                break
    return dbg


def _top(dbg):
    return [(h.cause, h.layer) for h in dbg.explain() if h.confidence >= CONFIDENT][:1]


def _dead(model):
    with torch.no_grad():
        model.body[2].bias.fill_(-20.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("lr,prepare,expected", [
    (1e-6, None, [("learning_rate_too_low", "")]),
    (0.05, _dead, [("dead_units", "body.3")]),
    (0.05, None, []),
])
def test_a_container_driven_by_its_parts_reads_as_the_same_net_driven_whole(seed, lr, prepare, expected):
    parts = _run(Container(seed=seed), lr, parts=True, seed=seed, prepare=prepare)
    whole = _run(Whole(seed=seed), lr, parts=False, seed=seed, prepare=prepare)
    assert _top(parts) == _top(whole) == expected, parts.report()
    assert parts.trace.unobserved() == whole.trace.unobserved() == {"mid": "returns its input unchanged"}


def test_a_model_driven_by_its_parts_has_its_steps_sampled_and_its_losses_stamped_with_them():
    dbg = _run(Container(), 0.05, parts=True, steps=40)
    assert [int(s) for s in dbg.trace.loss.steps] == list(range(40))
    assert [int(s) for s in dbg.trace.stats.steps[:3]] == [0, 1, 2]


class Listed(nn.Module):
    """Blocks kept in an nn.ModuleList and a head, no forward: the loop calls each block, never the list."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16 if i == 0 else 64, 64), nn.ReLU()) for i in range(3)])
        self.head = nn.Linear(64, 4)

    def score(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ListedWhole(Listed):
    def forward(self, x):
        return self.score(x)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("lr,prepare,expected", [
    (1e-6, None, [("learning_rate_too_low", "")]),
    (0.05, lambda m: m.blocks[1][0].bias.data.fill_(-20.0), [("dead_units", "blocks.1.1")]),
    (0.05, None, []),
])
def test_blocks_in_a_module_list_called_one_by_one_read_as_the_net_driven_whole(seed, lr, prepare, expected):
    """The parts of a model with no forward are the modules it calls: an nn.ModuleList is never called, its
    blocks are. Each step is a pass, its loss stamped with its step."""
    def run(model):
        if prepare is not None:
            prepare(model)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        data = teacher_classes(16, 4, seed=seed)
        with NeuralDbg(model, optimizer=opt) as dbg:
            for step in range(300):
                x, y = data(step)
                opt.zero_grad()
                loss = F.cross_entropy(model.score(x) if type(model) is Listed else model(x), y)
                loss.backward()
                opt.step()
                dbg.record_loss(loss)
        return dbg
    parts, whole = run(Listed(seed)), run(ListedWhole(seed))
    assert _top(parts) == _top(whole) == expected, parts.report()
    assert [int(s) for s in parts.trace.loss.steps] == list(range(300))


class _Sqrt(nn.Module):
    """sqrt(k x - 0.5): NaN once its input goes below 0.5 / k."""

    def __init__(self):
        super().__init__()
        self.k = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return torch.sqrt(x * self.k - 0.5)


def test_nan_born_in_a_part_is_found_in_that_part():
    def prepare(model):
        model.body[1] = nn.Sigmoid()
        with torch.no_grad():
            model.body[0].bias.fill_(5.0)
    parts = _run(Container(mid=_Sqrt()), 0.5, parts=True, prepare=prepare)
    whole = _run(Whole(mid=_Sqrt()), 0.5, parts=False, prepare=prepare)
    origin = parts.trace.nonfinite
    assert origin is not None and (origin.layer, origin.phase, origin.op) == ("mid", "forward", "torch.sqrt")
    assert (origin.step, origin.layer) == (whole.trace.nonfinite.step, whole.trace.nonfinite.layer)
    top = parts.explain()[0]
    assert (top.cause, top.layer) == ("non_finite", "mid")


class Skipped(Container):
    """A forward the loop never calls."""

    def forward(self, x):
        raise AssertionError("not called")


def test_a_model_whose_own_forward_the_loop_skips_is_read_from_its_second_step():
    dbg = _run(Skipped(), 0.05, parts=True, prepare=_dead)
    assert _top(dbg) == [("dead_units", "body.3")], dbg.report()
    assert "its forward never ran" not in dbg.trace.unobserved().values()
    assert "steps_unreached" not in dbg.trace.meta


class _Shifted(nn.Module):
    """Its forward applies a functional ReLU between its two children, on inputs shifted far below 0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(16, 64)
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(F.relu(self.body(x) - 30.0))


def test_the_childrens_hooks_do_nothing_inside_the_models_own_forward():
    """Children called on their own at first, then the model's forward: what its forward does between them
    (a functional ReLU, all of whose units are dead) is read as in a model never driven by its parts."""
    def run(parts_first: bool):
        model = _Shifted()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = teacher_classes(16, 4)
        with NeuralDbg(model, optimizer=opt) as dbg:
            for step in range(200):
                x, y = data(step)
                opt.zero_grad()
                out = model.head(F.relu(model.body(x) - 30.0)) if parts_first and step < 2 else model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                opt.step()
                dbg.record_loss(loss)
        return dbg
    mixed, whole = run(True), run(False)
    top = mixed.explain()[0]
    assert (top.cause, top.layer) == (whole.explain()[0].cause, whole.explain()[0].layer) == ("dead_units", "body")
    assert [l.name for l in mixed.trace.layers] == [l.name for l in whole.trace.layers]  # one ReLU site, once
    assert mixed.trace.meta.get("passes_per_step", 1.0) <= 1.0


class _LogWhen(nn.Module):
    """log(x) once switched on: NaN for its negative inputs."""

    on = False

    def forward(self, x):
        return torch.log(x) if _LogWhen.on else x


def _gan(width: int = 64, log: bool = False, dead: bool = False):
    """A GAN held in one module with no forward: a generator (with a log to switch on after its first layer,
    or that layer's units dead) and a discriminator, each with its own optimizer."""
    torch.manual_seed(0)
    gan = nn.Module()
    gan.G = nn.Sequential(nn.Linear(8, width), *([_LogWhen()] if log else []), nn.ReLU(), nn.Linear(width, 2))
    if dead:
        with torch.no_grad():
            gan.G[0].bias.fill_(-20.0)
    gan.D = nn.Sequential(nn.Linear(2, width), nn.LeakyReLU(0.2), nn.Linear(width, 1))
    opt_g = torch.optim.Adam(gan.G.parameters(), 1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(gan.D.parameters(), 1e-3, betas=(0.5, 0.999))
    return gan, opt_g, opt_d


def _train_gan(gan, opt_g, opt_d, watched, steps: int, nan_at: int | None = None):
    """The usual loop: the discriminator's step on real and detached fake samples, then the generator's."""
    g = torch.Generator().manual_seed(0)
    real, fake_t = torch.ones(64, 1), torch.zeros(64, 1)
    try:
        with NeuralDbg(gan, optimizer=watched) as dbg:
            for step in range(steps):
                _LogWhen.on = step == nan_at
                fake = gan.G(torch.randn(64, 8, generator=g))
                data = torch.randn(64, 2, generator=g) * 0.1 + torch.tensor([0.5, -0.4])
                opt_d.zero_grad()
                (F.binary_cross_entropy_with_logits(gan.D(data), real)
                 + F.binary_cross_entropy_with_logits(gan.D(fake.detach()), fake_t)).backward()
                opt_d.step()
                opt_g.zero_grad()
                loss = F.binary_cross_entropy_with_logits(gan.D(fake), real)
                loss.backward()
                opt_g.step()
                dbg.record_loss(loss)
                if not torch.isfinite(loss):
                    break
    finally:
        _LogWhen.on = False
    return dbg


@pytest.mark.parametrize("dead", [False, True])
def test_a_gan_held_in_one_container_is_watched_in_both_networks(dead):
    """The generator's loss reads the discriminator's output, whose weights the other optimizer moves: a
    game's loss, whose flat stretches are no plateau; a fault of the generator itself is still named."""
    gan, opt_g, opt_d = _gan(dead=dead)
    dbg = _train_gan(gan, opt_g, opt_d, opt_g, steps=60)
    assert dbg.trace.unobserved() == {}
    assert dbg.step == 60 and "steps_unreached" not in dbg.trace.meta
    # the discriminator's weights, stepped by the other optimizer, are not "left out of the optimizer"; the
    # generator's gradients, cleared before its own backward pass, are not "carried over"; a backward pass
    # that reaches the generator is no ".detach()" to remove
    assert not [h for h in dbg.explain() if h.layer.startswith("D") or "zero_grad" in h.suggestion
                or ".detach()" in h.suggestion], dbg.report()
    checked, carried = dbg.trace.meta["gradients_carried"]
    assert checked >= 50 and carried == 0
    confident = [(h.cause, h.layer) for h in dbg.explain() if h.confidence >= CONFIDENT]
    assert confident[:1] == ([("dead_units", "G.1")] if dead else []), dbg.report()


@pytest.mark.parametrize("watched", ["G", "D"])
def test_nan_born_in_a_gans_generator_is_found_there_not_in_the_discriminators_input(watched):
    """The discriminator's pass on the generator's output goes on with the computation the generator began:
    its input is no batch of data, and a pass after the discriminator's own step is no skipped step."""
    gan, opt_g, opt_d = _gan(width=32, log=True)
    dbg = _train_gan(gan, opt_g, opt_d, {"G": opt_g, "D": opt_d}[watched], steps=12, nan_at=8)
    origin = dbg.trace.nonfinite
    assert origin is not None and (origin.step, origin.layer, origin.op) == (8, "G.1", "torch.log"), origin
    assert dbg.trace.skipped.n == 0
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("non_finite", "G.1")


def test_a_child_that_raises_leaves_nothing_behind_in_the_next_pass():
    """A batch whose child call fails, caught by the loop: the next pass is its own, and a NaN in its input
    is the input's (not the first child's output, as in a pass begun with the failed batch's input)."""
    model = Container()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = teacher_classes(16, 4, nan_input_at=6)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(8):
            x, y = data(step)
            opt.zero_grad()
            try:
                h = model.mid(model.body(x))
                out = model.head(h[:, :8] if step == 5 else h)  # a shape error at step 5
            except RuntimeError:
                continue
            loss = F.cross_entropy(out, y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    origin = dbg.trace.nonfinite
    assert origin is not None and (origin.step, origin.layer) == (5, "input"), origin


def test_children_evaluated_in_eval_mode_with_gradients_on_are_not_held():
    import gc
    import weakref
    model = Container()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = teacher_classes(16, 4)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(5):
            x, y = data(step)
            opt.zero_grad()
            F.cross_entropy(model.head(model.body(x)), y).backward()
            opt.step()
        model.eval()  # an evaluation that forgets torch.no_grad()
        outs = [weakref.ref(model.head(model.body(data(100 + i)[0]))) for i in range(5)]
        model.train()
        gc.collect()
        assert all(o() is None for o in outs)
        for step in range(5, 40):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model.head(model.body(x)), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.step == 40 and [int(s) for s in dbg.trace.loss.steps] == list(range(5, 40))


def test_a_model_whose_first_layer_is_frozen_before_watching_starts_is_watched():
    model = Container()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.05)
    dbg = NeuralDbg(model, optimizer=opt)
    model.body.requires_grad_(False)  # fine-tuning the head only, decided after the session was made
    data = teacher_classes(16, 4)
    with dbg:
        for step in range(10):
            x, y = data(step)
            opt.zero_grad()
            F.cross_entropy(model.head(model.body(x)), y).backward()
            opt.step()
    assert dbg.step == 10


def test_an_optimizer_made_in_the_loop_of_a_model_whose_forward_is_skipped_counts_every_step():
    model = Skipped()
    data = teacher_classes(16, 4)
    with NeuralDbg(model) as dbg:
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(20):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model.head(model.body(x)), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.step == 20 and [int(s) for s in dbg.trace.loss.steps] == list(range(20))
