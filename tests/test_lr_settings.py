"""Learning-rate settings whose fix is not the starting rate: a schedule that keeps raising the rate (a warm-up
written without its cap, an ExponentialLR with gamma > 1), where the fix is the schedule's (a warm-up that
reaches its peak and holds is no such schedule, at any peak); a momentum near one, which multiplies the step;
an adaptive optimizer's eps far above the gradients, which divides it; Adam's betas with beta1 at or above
sqrt(beta2), which unbound its step; a learning rate of zero."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _run(factor, lr: float = 0.05, steps: int = 300, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def schedule(step, opt):
        for group in opt.param_groups:
            group["lr"] = lr * factor(step)
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=steps, before_step=schedule))


@pytest.mark.parametrize("factor", [lambda s: 1 + s, lambda s: 1.05 ** s], ids=["uncapped_warmup", "gamma_above_1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_schedule_still_raising_the_rate_gets_the_schedules_fix(factor, seed):
    hs = _run(factor, seed=seed).explain()
    top = hs[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("stop the schedule raising the learning rate")
    assert any("keeps raising the learning rate" in line for line in top.chain)


def test_a_warmup_that_reaches_a_peak_too_high_and_holds_gets_the_usual_fix():
    hs = _run(lambda s: min(1.0, (s + 1) / 40), lr=3.0).explain()
    top = hs[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower the learning rate")


def test_a_warmup_to_a_usual_peak_stays_quiet():
    hs = _run(lambda s: min(1.0, (s + 1) / 40)).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]


def test_a_momentum_near_one_is_named_in_the_fix_and_a_usual_one_is_not():
    def run(momentum):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05 if momentum > 0.99 else 5.0, momentum=momentum)
        return train(Run(model, opt, teacher_classes(16, 4), steps=300)).explain()[0]
    high = run(0.999)
    assert high.cause == "learning_rate_too_high" and high.confidence >= CONFIDENT
    assert high.suggestion.startswith("lower the momentum from 0.999")
    assert any("momentum is 0.999" in line for line in high.chain)
    usual = run(0.9)
    assert usual.cause == "learning_rate_too_high"
    assert "momentum" not in usual.suggestion


def test_a_learning_rate_of_zero_is_said_so():
    top = _run(lambda s: 0.0).explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert "lr=0" in top.suggestion


def _adam(eps: float, lr: float = 1e-3):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=lr, eps=eps), teacher_classes(16, 4),
                     steps=300)).explain()


def test_an_adam_eps_far_above_the_gradients_is_named_in_place_of_the_learning_rate():
    """eps=1.0 (a TensorFlow setting) divides every update by 1 rather than by the gradient's RMS (~1e-3):
    Adam at 1e-3 barely moves. The fix is eps, not the learning rate."""
    top = _adam(1.0)[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower the optimizer's eps from 1")
    assert "eps is 1" in top.chain[0]


def test_an_adam_eps_that_still_learns_and_the_default_stay_quiet():
    """At lr 1.0 the same eps gives steps of ~gradient: it learns. The default eps is no finding."""
    for eps, lr in ((1.0, 1.0), (1e-8, 1e-3)):
        assert not [h for h in _adam(eps, lr) if h.confidence >= CONFIDENT], (eps, lr)


def _adam_betas(betas: tuple[float, float], steps: int = 600):
    """A 20-64-64-5 MLP on the classes a random tanh network gives, Adam at 3e-3."""
    g = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(20, 32, generator=g) / 20 ** 0.5, torch.randn(32, 5, generator=g) / 32 ** 0.5

    def data(step: int):
        x = torch.randn(64, 20, generator=torch.Generator().manual_seed(step))
        return x, (torch.tanh(x @ w1 * 2) @ w2).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3, betas=betas), data, steps=steps))


def test_adam_betas_with_beta1_above_sqrt_beta2_are_named_in_the_fix():
    """betas=(0.999, 0.9), the two swapped: the first moment averages more steps than the second divides it by,
    so the step loses the bound the learning rate gives it, and the loss blows up hundreds of steps in. It
    read as exploding gradients with a clip, which an Adam step does not feel."""
    dbg = _adam_betas((0.999, 0.9))
    assert dbg.trace.loss.data.max() > 100 * dbg.trace.loss.data[0]  # it blows up
    top = dbg.explain()[0]
    assert top.cause in ("exploding_gradients", "learning_rate_too_high") and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("give the optimizer betas") and "(0.9, 0.999)" in top.suggestion
    assert any("betas are (0.999, 0.9)" in line for line in top.chain)


def test_adam_betas_within_the_bound_are_no_finding():
    """(0.9, 0.9) keeps beta1 below sqrt(beta2): it trains, and nothing is said of the betas."""
    dbg = _adam_betas((0.9, 0.9), steps=300)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]
    assert not [h for h in dbg.explain() if "betas" in h.suggestion]


def test_a_plateau_under_a_schedule_that_cut_the_rate_raises_the_peak_not_the_remnant():
    """A ReduceLROnPlateau given an accuracy in mode "min" cuts the rate at every patience, whatever the loss
    does: the loss stays flat and the rate ends 1e4 times below where it began. The plateau's fix names the
    schedule and the rate it started from, never the remnant it left."""
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(2048, 20, generator=g)
    y_all = (x_all @ torch.randn(20, 4, generator=g) + 0.3 * torch.randn(2048, 4, generator=g)).argmax(1)

    def data(step: int):
        i = (step * 64) % 2048
        return x_all[i:i + 64], y_all[i:i + 64]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", patience=1, factor=0.3)

    def schedule(step, opt):
        if step and step % 20 == 0:
            plateau.step(min(1.0, step / 600))  # an accuracy that keeps rising, read as a loss that does not fall
    top = train(Run(model, opt, data, steps=600, before_step=schedule)).explain()[0]
    assert opt.param_groups[0]["lr"] < 0.05 / 1e4
    assert top.cause in ("loss_plateau", "learning_rate_too_low") and top.confidence >= CONFIDENT
    assert "from 0.05" in top.suggestion and "ReduceLROnPlateau" in top.suggestion


def test_updates_negligible_at_the_peak_raise_the_peak_under_a_decay():
    """A rate too low from the start (1e-6) that a schedule then decays 1e4-fold: the fix raises the rate
    from its peak, not from the remnant, and never asks to keep a rate that was already too low."""
    hs = _run(lambda s: 1e-4 ** (s / 299), lr=1e-6).explain()
    low = [h for h in hs if h.cause == "learning_rate_too_low"]
    assert low and low[0].confidence >= CONFIDENT
    assert low[0].suggestion.startswith("raise the learning rate from 1.00e-06 (its peak")


def _trained(opt_of, loss=None, seed: int = 0, steps: int = 300):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    run = Run(model, opt_of(model.parameters()), teacher_classes(16, 4, seed=seed), steps=steps)
    if loss is not None:
        run.loss = loss
    return train(run).explain()


@pytest.mark.parametrize("opt_of", [lambda p: torch.optim.SGD(p, lr=1e-3), lambda p: torch.optim.Adam(p, lr=1e-5)],
                         ids=["sgd_1e-3", "adam_1e-5"])
@pytest.mark.parametrize("seed", [0, 1])
def test_updates_too_small_to_move_the_weights_over_the_run_are_a_learning_rate_too_low(opt_of, seed):
    """Each update above negligible, all of them together moving no layer by a tenth of its norm while the loss
    stays flat: the learning rate, raised by as much as the weights fell short of moving (not a generic
    plateau)."""
    top = _trained(opt_of, seed=seed)[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("raise the learning rate from")
    assert any("weights moved at most" in line for line in top.chain)


def test_a_loss_divided_by_a_count_under_sgd_is_named_in_the_fix():
    """Under SGD, a loss divided by 1000 before backward divides every step: the fix is the division, not a
    learning rate raised from a usual 0.1. Under Adam, whose steps do not depend on the loss's scale, the same
    division is harmless and the run stays quiet; and the same SGD run without it learns."""
    top = _trained(lambda p: torch.optim.SGD(p, lr=0.1), lambda out, y: nn.functional.cross_entropy(out, y) / 1000)[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("stop dividing the loss before backward (by ~1000")
    for opt_of, loss in ((lambda p: torch.optim.Adam(p, lr=1e-3), lambda out, y: nn.functional.cross_entropy(out, y)
                          / 1000), (lambda p: torch.optim.SGD(p, lr=0.1), None)):
        assert not [h for h in _trained(opt_of, loss) if h.confidence >= CONFIDENT]


def _grouped(body_lr: float, seed: int = 0):
    """Adam with the head in one parameter group (lr 1e-3) and the body in another (``body_lr``)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam([{"params": model[4].parameters(), "lr": 1e-3},
                            {"params": list(model[0].parameters()) + list(model[2].parameters()), "lr": body_lr}])
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=300)).explain()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_parameter_group_whose_rate_leaves_its_layers_still_is_named(seed):
    """The body's group at lr 1e-8 while the head's learns at 1e-3: the body never moves and the loss stays
    flat. Named at the group's first layer, with the group's rate to raise (not a generic plateau); at a rate
    that moves the body (1e-4) nothing is said of it."""
    top = _grouped(1e-8, seed)[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT and top.layer == "0"
    assert top.suggestion.startswith("raise the learning rate of the parameter group holding `0`, `2` from 1.00e-08")
    assert not [h for h in _grouped(1e-4, seed) if h.cause == "learning_rate_too_low"]


@pytest.mark.parametrize("first", ["head", "body"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_fix_that_lowers_the_rate_quotes_the_group_that_moved_most(first, seed):
    """Adam with the head's group at lr 1.0 and the body's at 1e-4, in either order: the head's updates are
    the run's largest, so the fix lowers the head's group's rate, whichever group comes first (the recorded
    rate is the first group's)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    head = {"params": model[4].parameters(), "lr": 1.0}
    body = {"params": list(model[0].parameters()) + list(model[2].parameters()), "lr": 1e-4}
    opt = torch.optim.Adam([head, body] if first == "head" else [body, head])
    top = train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=300)).explain()[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT
    assert "lower the learning rate from 1 (`4`'s parameter group) to ~0.1" in top.suggestion
    assert "1.00e-04" not in top.suggestion


class SubclassedAdam(torch.optim.Adam):
    """An optimizer of the user's own that steps as Adam does."""


@pytest.mark.parametrize("steps", [10, 20, 40])
@pytest.mark.parametrize("opt_of", [lambda p: torch.optim.Adam(p, lr=1e-3), lambda p: torch.optim.SGD(p, lr=0.05)],
                         ids=["adam", "sgd"])
def test_a_short_run_that_learns_has_moved_little_and_is_quiet(opt_of, steps):
    """Over its first steps a run's weights have moved little by its nature: no learning rate too low."""
    assert not [h for h in _trained(opt_of, steps=steps) if h.confidence >= CONFIDENT]


def test_a_warmup_under_way_is_no_learning_rate_too_low():
    """A linear warm-up to 1e-3 over 200 steps, read live as it goes: the rate is still rising, so little
    movement so far says nothing of it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
    data = teacher_classes(16, 4)
    seen = []
    from neuraldbg import NeuralDbg
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(150):
            x, y = data(step)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            dbg.record_loss(loss)
            if step in (25, 60, 100, 149):
                seen += [h.cause for h in dbg.explain() if h.confidence >= CONFIDENT]
    assert "learning_rate_too_low" not in seen


def test_the_rate_raised_is_the_one_of_the_layer_that_moved_most():
    """Two groups, both too slow (the body at 1e-6, the head at 1e-5): the rate named is the head's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam([{"params": list(model[0].parameters()) + list(model[2].parameters()), "lr": 1e-6},
                            {"params": model[4].parameters(), "lr": 1e-5}])
    top = train(Run(model, opt, teacher_classes(16, 4), steps=300)).explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("raise the learning rate from 1.00e-05")


@pytest.mark.parametrize("opt_of", [lambda p: torch.optim.SGD(p, lr=1e-3), lambda p: SubclassedAdam(p, lr=1e-5)],
                         ids=["sgd_accumulating", "adam_subclass"])
def test_a_loss_divided_is_said_so_only_when_it_divides_the_step(opt_of):
    """A loss divided by 16 over 16 accumulated backward passes is a mean again at the step; an Adam (a
    subclass of it) steps alike whatever the loss's scale. Neither is told to stop dividing."""
    accumulate = isinstance(opt_of(nn.Linear(1, 1).parameters()), torch.optim.SGD)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt, data = opt_of(model.parameters()), teacher_classes(16, 4, batch=16)
    from neuraldbg import NeuralDbg
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            opt.zero_grad()
            for part in range(16 if accumulate else 1):
                x, y = data(step * 16 + part)
                loss = nn.functional.cross_entropy(model(x), y) / (16 if accumulate else 1000)
                loss.backward()
            opt.step()
            dbg.record_loss(loss)
    hs = dbg.explain()
    assert hs and hs[0].cause == "learning_rate_too_low" and hs[0].confidence >= CONFIDENT
    assert not any("dividing the loss" in h.suggestion or "divided by" in line for h in hs for line in h.chain)


@pytest.mark.parametrize("opt_of", [lambda p: torch.optim.SGD(p, lr=1e-3), lambda p: torch.optim.Adam(p, lr=1e-5)],
                         ids=["sgd_1e-3", "adam_1e-5"])
def test_a_warmup_long_over_does_not_hide_a_rate_too_low(opt_of):
    """A warm-up of 10 steps, then 490 at a rate too low to move the weights: the rate is named."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = opt_of(model.parameters())
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=10)
    top = train(Run(model, opt, teacher_classes(16, 4), steps=500, before_step=lambda s, o: sched.step() if s else None)
                ).explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT


def _scheduled(opt_of, make_schedule, steps: int = 300):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = opt_of(model.parameters())
    sched = make_schedule(opt)
    return train(Run(model, opt, teacher_classes(16, 4), steps=steps,
                     before_step=lambda s, o: sched.step() if s else None)).explain()


_OPTIMIZERS = [lambda p: torch.optim.Adam(p, lr=1e-3), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)]


@pytest.mark.parametrize("opt_of", _OPTIMIZERS, ids=["adam", "sgd"])
@pytest.mark.parametrize("make_schedule", [
    lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1e-3, total_iters=100_000),
    lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / 100_000))], ids=["linear", "lambda"])
def test_a_warmup_longer_than_the_run_is_the_schedules_fix_not_the_base_rates(opt_of, make_schedule):
    """A warm-up planned over 100k steps in a 300-step run: the rate ends hundreds of times below the
    optimizer's, and raising that base would only scale the warm-up's rates alike. The warm-up is named."""
    hs = _scheduled(opt_of, make_schedule)
    top = hs[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("shorten the schedule's warm-up")
    assert not any("raise the learning rate" in h.suggestion or "larger learning rate" in h.suggestion for h in hs)


@pytest.mark.parametrize("opt_of, seed, named", [(_OPTIMIZERS[0], 0, True), (_OPTIMIZERS[0], 1, True),
                                                  (_OPTIMIZERS[1], 0, False)], ids=["adam-0", "adam-1", "sgd-0"])
def test_a_one_cycle_sized_for_far_more_steps_is_named_with_its_size(opt_of, seed, named):
    """A OneCycleLR given total_steps for 1000 epochs in a run of 300 steps: it never leaves its warm-up's
    floor (max_lr / 25), so each update still counts, but the loss comes down far slower than at the rate the
    schedule heads to (Adam's stays near its start). The schedule's size is the fix, not the base rate. Under
    SGD with momentum the loss still halves: a weak signal with the same fix."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = opt_of(model.parameters())
    peak = opt.param_groups[0]["lr"]
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=peak, total_steps=300_000)
    hs = train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=300,
                   before_step=lambda s, o: sched.step() if s else None)).explain()
    top = hs[0]
    assert top.cause == "learning_rate_too_low" and (top.confidence >= CONFIDENT) == named
    assert top.suggestion.startswith("size the one-cycle schedule to the run")
    assert not any("raise the learning rate" in h.suggestion or "larger learning rate" in h.suggestion for h in hs)


@pytest.mark.parametrize("opt_of", _OPTIMIZERS, ids=["adam", "sgd"])
def test_a_one_cycle_sized_to_the_run_stays_quiet(opt_of):
    hs = _scheduled(opt_of, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=o.param_groups[0]["lr"],
                                                                          total_steps=300))
    assert not [h for h in hs if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("opt_of", _OPTIMIZERS, ids=["adam", "sgd"])
def test_a_warmup_over_a_tenth_of_the_run_stays_quiet(opt_of):
    hs = _scheduled(opt_of, lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1e-3, total_iters=30))
    assert not [h for h in hs if h.confidence >= CONFIDENT]


def test_a_schedule_factor_far_below_one_is_the_schedules_fix():
    """A LambdaLR whose lambda returns the rate itself (1e-3) where a multiplier is meant: the rate is the
    base times 1e-3 all run."""
    hs = _scheduled(_OPTIMIZERS[0], lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1e-3))
    top = hs[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("check the schedule: it holds the learning rate at 1.00e-06")


def test_an_initial_lr_restored_without_a_scheduler_is_no_schedule():
    """An optimizer restored from a checkpoint keeps the scheduler's ``initial_lr`` of the run that saved it;
    lowered by hand to 1e-6 with no scheduler now, the rate is what to raise."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    saved = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.CosineAnnealingLR(saved, 100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.load_state_dict(saved.state_dict())
    for group in opt.param_groups:
        group["lr"] = 1e-6
    top = train(Run(model, opt, teacher_classes(16, 4), steps=300)).explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("raise the learning rate from 1.00e-06")


def test_a_one_cycle_schedule_too_high_names_the_rate_at_its_peak():
    """OneCycleLR(max_lr=1.0) under Adam diverges; the rate it ends at is a hundredth of the peak, so the
    rate to lower is the peak, not the end's."""
    hs = _scheduled(_OPTIMIZERS[0], lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=300))
    top = hs[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT
    peak = float(top.suggestion.removeprefix("lower the learning rate from ").split(" ")[0])
    assert peak >= 0.5 and "(its peak," in top.suggestion


def test_a_rate_decayed_to_zero_after_diverging_names_its_peak_and_a_raise_keeps_the_rate():
    """Adam at 1.0, decayed to 0 from step 200 to 250: the fix lowers the peak (the end's 0 is no rate to
    lower). Random labels under a cosine decay get the plateau's fix, whose larger rate is the end's."""
    hs = _scheduled(_OPTIMIZERS[0], lambda o: torch.optim.lr_scheduler.LambdaLR(
        o, lambda s: 1000.0 * max(0.0, min(1.0, (250 - s) / 50))))
    top = hs[0]
    assert top.cause == "learning_rate_too_high"
    assert top.suggestion.startswith("lower the learning rate from 1 (its peak, 0 at the end) to ~0.1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 300, eta_min=1e-5)
    labels = teacher_classes(16, 4)

    def shuffled(step):
        x, y = labels(step)
        return x, y[torch.randperm(len(y), generator=torch.Generator().manual_seed(step))]
    plateau = train(Run(model, opt, shuffled, steps=300, before_step=lambda s, o: sched.step() if s else None))
    for h in plateau.explain():
        assert "(its peak" not in h.suggestion or not h.suggestion.count("larger learning rate")


def test_a_rate_a_schedule_raised_at_once_is_brought_back_to_where_it_was():
    """SGD at 0.05, raised 100x at step 150: the run failed with the raise, so the fix names the rate before
    it (a tenth of the raised rate would still be 10x above it)."""
    hs = _run(lambda s: 1.0 if s < 150 else 100.0, lr=0.05)
    top = hs.explain()[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT and 150 <= top.step <= 160
    assert top.suggestion.startswith("bring the learning rate back toward 0.05, its value before step 15")


def test_a_groups_rate_is_quoted_as_it_is_when_the_first_group_has_its_own_schedule():
    """The recorded peak is the first group's: a body decayed by its own schedule while the head's rate stays
    at 1.0 gets the head's 1 quoted, not the body's peak-to-end ratio applied to it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam([{"params": list(model[0].parameters()) + list(model[2].parameters()), "lr": 1e-3},
                            {"params": model[4].parameters(), "lr": 1.0}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: 0.97 ** s, lambda s: 1.0])
    top = train(Run(model, opt, teacher_classes(16, 4), steps=300, before_step=lambda step, _: step and sched.step())
                ).explain()[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT
    assert "lower the learning rate from 1 (`4`'s parameter group) to ~0.1" in top.suggestion


def test_a_plateau_scheduler_fed_a_rising_metric_gets_its_mode_named():
    """ReduceLROnPlateau(mode='min') stepped every batch with a metric that rises (an accuracy): it cuts the
    rate again and again; the fix names its mode beside a per-batch step size."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", patience=5, factor=0.3)
    top = train(Run(model, opt, teacher_classes(16, 4), steps=300,
                    before_step=lambda step, _: sched.step(float(step)))).explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= CONFIDENT
    assert "ReduceLROnPlateau cuts it as fast when its mode does not match its metric" in top.suggestion
