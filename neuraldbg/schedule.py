"""When to do expensive work: the sampling schedule and the throttle, both with a replaceable clock."""
from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

Clock = Callable[[], float]


class Schedule:
    """Decides which steps get full per-layer statistics.

    ``every=N`` samples steps 0, N, 2N, ... . ``every=None`` (auto) samples every step during a
    warm-up (so faults present from step 0 are seen at full resolution), then picks the interval
    from the measured cost of a sampled step so that monitoring stays within ``budget`` of the
    training time, never sparser than ``max_every`` nor than a quarter of the steps run so far.
    Both costs are medians of the last few steps of their kind, and an unsampled step is kept every
    ``remeasure`` steps even when sampling looks free, so one slow plain step (a noisy machine)
    cannot pin the schedule to sampling every step.
    """

    def __init__(self, every: int | None = None, *, warmup: int = 16, budget: float = 0.015,
                 max_every: int = 100, remeasure: int = 8, clock: Clock = time.perf_counter):
        if every is not None and int(every) < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.every = None if every is None else int(every)
        self.warmup = warmup
        self.budget = budget
        self.max_every = max_every
        self.remeasure = remeasure
        self.clock = clock
        self.interval: int = 1 if self.every is None else self.every
        self._next = 0
        self._plain: deque[float] = deque(maxlen=5)    # wall times of the last unsampled steps
        self._sampled: deque[float] = deque(maxlen=5)  # ... and of the last sampled ones
        self._in_a_row = 0                             # sampled steps since the last unsampled one
        self._burst_until = 0                          # steps before this one are all sampled
        self._last_burst: dict[str, int] = {}  # per reason, the step its last burst started
        # per reason, seconds its bursts may cost (absent: its first is free)
        self._credit: dict[str, float] = {}
        self._t_last: float | None = None

    def resume(self) -> None:
        """Forget the time of the last step (watching resumes after a pause)."""
        self._t_last = None

    def should_sample(self, step: int) -> bool:
        return step >= self._next or step < self._burst_until

    burst_steps = 8  # steps a burst samples

    def burst(self, step: int, n: int | None = None, gap: int = 400, reason: str = "change") -> bool:
        """Sample steps ``step`` .. ``step + n - 1`` (something changed: a new learning rate, a spike; or
        a signal entered its warning band: ``reason`` "band"), unless the user fixed the interval, the last
        burst for the same reason started less than ``gap`` steps ago (a schedule with frequent restarts
        must not keep the sampling dense), or bursts have used up their budget: the same share ``budget``
        of the plain steps' time as regular sampling, saved up between bursts (the first is free).
        Returns whether it did."""
        if self.every is not None or step < self._last_burst.get(reason, -(1 << 62)) + gap:
            return False
        n = self.burst_steps if n is None else n
        cost = n * self._extra()
        credit = self._credit.get(reason)
        if credit is not None and credit < cost:
            return False
        self._credit[reason] = (credit if credit is not None else cost) - cost
        self._last_burst[reason] = step
        self._burst_until = max(self._burst_until, step + n)
        return True

    def _extra(self) -> float:
        """What sampling adds to a step, in seconds (0 until both kinds of step were measured)."""
        if not self._plain or not self._sampled:
            return 0.0
        return max(_median(self._sampled) - _median(self._plain), 0.0)

    def step_done(self, step: int, sampled: bool) -> None:
        """Called once per completed step; updates the timing model and the next sampled step."""
        now = self.clock()
        if self._t_last is not None:
            (self._sampled if sampled else self._plain).append(now - self._t_last)
            if not sampled and self._credit:  # bursts save up their share of plain steps' time
                cap = self.burst_steps * self._extra()
                for reason, credit in self._credit.items():
                    self._credit[reason] = min(credit + self.budget * (now - self._t_last), cap)
        self._t_last = now
        if not sampled:
            self._in_a_row = 0
            return
        self._in_a_row += 1
        if self.every is None:
            self.interval = self._auto_interval(step)
            if self.interval == 1 and step + 1 >= self.warmup and self._in_a_row >= self.remeasure:
                self.interval = 2  # one unsampled step, to measure what a plain step costs now
        self._next = step + self.interval

    def _auto_interval(self, step: int) -> int:
        if step + 1 < self.warmup:
            return 1
        if not self._plain or not self._sampled:
            return 2  # no unsampled step measured yet: sample every other step to measure one
        plain = _median(self._plain)
        extra = max(_median(self._sampled) - plain, 0.0)
        k = math.ceil(extra / max(self.budget * plain, 1e-9))
        # never sparser than a quarter of the run so far: short runs stay well sampled
        return int(min(max(k, 1), self.max_every, max(1, (step + 1) // 4)))


class Throttle:
    """At most one ``ready()`` per ``interval`` seconds of the given clock (a cheap check first)."""

    def __init__(self, interval: float = 0.25, clock: Clock = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._last = -math.inf

    def ready(self, force: bool = False) -> bool:
        now = self.clock()
        if force or now - self._last >= self.interval:
            self._last = now
            return True
        return False


class SpikeWatch:
    """A value far above its recent level: a spike between two sampled steps, caught from a number
    already at hand every step (no extra work on the device): ``factor`` times the median of the last
    ``window`` values."""

    def __init__(self, factor: float, window: int = 16):
        self.factor = float(factor)
        self._hist: deque[float] = deque(maxlen=max(int(window), 4))

    def __call__(self, value: float) -> bool:
        if value != value:
            return False
        hist = self._hist
        # the median is at least the smallest value: most steps are settled by that alone
        spike = (len(hist) == hist.maxlen and value > self.factor * min(hist)
                 and value > self.factor * _median(hist) > 0)
        hist.append(value)
        return spike


class LossTurn:
    """The loss turning back up: its smoothed level (an exponential average over ~``span`` steps, so one noisy
    batch does not move it) has given back ``share`` of what it had come down from its first value, once that
    is at least ``gain`` of the first value (a loss that hardly came down has nothing to give back but noise).
    Fires once per turn, not in the first ``warmup`` values; armed again once the level is back near its best.
    A number at hand every step on the host (no extra work on the device)."""

    def __init__(self, share: float = 0.5, span: int = 20, warmup: int = 16, gain: float = 0.1):
        self.share = share
        self.gain = gain
        self.alpha = 2.0 / (span + 1)
        self.warmup = warmup
        self._n = 0
        self._level = self._start = math.nan
        self._best = math.inf
        self._armed = True

    def __call__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        self._n += 1
        if self._n == 1:
            self._level = self._start = value
        else:
            self._level += self.alpha * (value - self._level)
        level = self._level
        self._best = min(self._best, level)
        gained = self._start - self._best
        if gained <= self.gain * abs(self._start) or self._n <= self.warmup:
            return False
        back = (level - self._best) / gained
        if not self._armed:
            self._armed = back < self.share / 4
            return False
        if back >= self.share:
            self._armed = False
            return True
        return False


def _median(values) -> float:
    """``statistics.median``, without its checks (every step)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
