"""The bounded trace, the schedule and the throttle (fake clocks, synthetic feeds)."""
import numpy as np
import pytest

from neuraldbg.layers import Kind, LayerInfo
from neuraldbg.schedule import Schedule, Throttle
from neuraldbg.stats import N_STATS
from neuraldbg.trace import GLOBAL_COLUMNS, BoundedSeries, Trace


def test_series_keeps_recent_rows_at_full_resolution_and_thins_old_ones():
    s = BoundedSeries((2,), capacity=16)
    for step in range(1000):
        s.append(step, [step, -step])
    assert s.n <= 16
    steps = s.steps
    assert steps[-1] == 999 and np.all(np.diff(steps) > 0)
    assert list(steps[-8:]) == list(range(992, 1000))  # newest half: every step
    assert steps[0] < 100  # the start of the run is still represented
    assert np.array_equal(s.data[:, 0], steps.astype(np.float32))


def test_thinning_keeps_a_measurement_taken_on_every_other_row():
    """Column 1 is measured on odd rows only (a statistic of some samples): thinned pairs keep it."""
    s = BoundedSeries((3, 2), capacity=16)
    s.carry = (1,)
    for step in range(1000):
        s.append(step, [[step, step if step % 2 else np.nan]] * 3)
    assert s.n <= 16
    thinned = np.append(np.diff(s.steps) > 1, False)  # the older rows, each kept for two or more
    assert thinned.sum() >= 3 and np.isfinite(s.data[thinned, :, 1]).all()
    # the carried value comes from the row dropped next to the kept one, never from further away
    assert np.all(s.data[thinned, :, 1] - s.data[thinned, :, 0] <= 1)
    plain = BoundedSeries((3, 2), capacity=16)  # without carry: the odd rows are dropped, and their values
    for step in range(1000):
        plain.append(step, [[step, step if step % 2 else np.nan]] * 3)
    assert not np.isfinite(plain.data[np.append(np.diff(plain.steps) > 1, False), :, 1]).any()


def test_a_million_step_run_of_200_layers_stays_under_64_mb():
    layers = [LayerInfo(i, f"block.{i}", "Linear", Kind.LINEAR) for i in range(200)]
    trace = Trace(layers)
    small = trace.nbytes  # a short run pays for a short run's rows
    row = np.ones((200, N_STATS), dtype=np.float32)
    g = np.zeros(len(GLOBAL_COLUMNS), dtype=np.float32)
    # sampled rows: far more than the capacity (the schedule samples a subset of the 1M steps)
    sizes = []
    for step in range(0, 1_000_000, 97):
        trace.add_sample(step, row, g)
        if step % (97 * 1000) == 0:
            sizes.append(trace.nbytes)
    for step in range(0, 1_000_000, 7):
        trace.add_loss(step, 1.0)
    full = trace.nbytes
    assert small < full / 10
    assert sizes[3:] == [sizes[3]] * len(sizes[3:])  # once the buffers are full, no growth at all
    assert full < 64 * 2 ** 20
    assert trace.stats.steps[-1] == (999_999 // 97) * 97 and trace.loss.steps[-1] == (999_999 // 7) * 7


def test_schedule_every_n_and_auto():
    fixed = Schedule(every=4)
    sampled = []
    for step in range(20):
        if fixed.should_sample(step):
            sampled.append(step)
        fixed.step_done(step, fixed.should_sample(step))
    assert sampled == [0, 4, 8, 12, 16]

    t = [0.0]
    auto = Schedule(clock=lambda: t[0], warmup=5, budget=0.02)
    sampled = []
    for step in range(400):
        s = auto.should_sample(step)
        t[0] += 0.011 if s else 0.010  # a sampled step costs 10% more
        auto.step_done(step, s)
        sampled.append(s)
    assert all(sampled[:5])  # warm-up: every step
    gaps = np.diff(np.flatnonzero(sampled[200:]))
    assert gaps.min() >= 5  # 10% extra at a 2% budget: every ~5 steps at most
    assert sum(sampled[100:]) < 80
    with pytest.raises(ValueError):
        Schedule(every=0)


def test_one_slow_plain_step_does_not_pin_the_schedule_to_every_step():
    t = [0.0]
    auto = Schedule(clock=lambda: t[0], warmup=5, budget=0.02)
    sampled, plain_seen = [], 0
    for step in range(300):
        s = auto.should_sample(step)
        if not s:
            plain_seen += 1
        # the first unsampled step is slow (the machine was busy); then a sampled step costs 10% more
        t[0] += 0.011 if s else (0.050 if plain_seen == 1 else 0.010)
        auto.step_done(step, s)
        sampled.append(s)
    assert sum(sampled[150:]) < 50  # every ~7 steps, not every step


def test_throttle_with_a_fake_clock():
    now = [0.0]
    th = Throttle(0.25, clock=lambda: now[0])
    fired = []
    for i in range(100):
        now[0] = i * 0.01
        fired.append(th.ready())
    assert sum(fired) == 4  # t = 0, 0.25, 0.5, 0.75
    assert th.ready(force=True)


def test_a_burst_samples_the_next_steps_at_most_once_in_a_while():
    t = [0.0]
    auto = Schedule(clock=lambda: t[0], warmup=5, budget=0.02)
    sampled = []
    for step in range(1000):
        if step in (500, 700, 950):  # e.g. the learning rate rose; 700 is too soon after 500
            assert auto.burst(step, 4) == (step != 700)
        s = auto.should_sample(step)
        t[0] += 0.011 if s else 0.010  # a sampled step costs 10% more: every ~5 steps at most
        auto.step_done(step, s)
        sampled.append(s)
    assert all(sampled[500:504]) and all(sampled[950:954])
    assert not all(sampled[700:704])
    fixed = Schedule(every=50)
    assert not fixed.burst(20)  # an interval the user fixed is kept


def test_bursts_are_paid_from_a_budget_of_their_own():
    """A burst costs what its sampled steps add; bursts save up the budget's share of plain steps' time
    between them (the first is free), so frequent spikes cannot keep a costly model densely sampled."""
    t = [0.0]
    auto = Schedule(clock=lambda: t[0], warmup=5, budget=0.02)
    granted = {}
    for step in range(2000):
        if step in (300, 500, 750):
            granted[step] = auto.burst(step, 4, gap=100)
        s = auto.should_sample(step)
        t[0] += 0.03 if s else 0.01  # a sampled step costs 3x a plain one: a burst of 4 adds 0.08 s
        auto.step_done(step, s)
    # 0.08 s at 2% of 10 ms per plain step: 400 plain steps between two bursts
    assert granted == {300: True, 500: False, 750: True}
