"""When to do expensive work: the sampling schedule and the throttle, both with a replaceable clock."""
from __future__ import annotations

import math
import time
from typing import Callable

Clock = Callable[[], float]


class Schedule:
    """Decides which steps get full per-layer statistics.

    ``every=N`` samples steps 0, N, 2N, ... . ``every=None`` (auto) samples every step during a
    warm-up (so faults present from step 0 are seen at full resolution), then picks the interval
    from the measured cost of a sampled step so that monitoring stays within ``budget`` of the
    training time, never sparser than ``max_every`` nor than a quarter of the steps run so far.
    """

    def __init__(self, every: int | None = None, *, warmup: int = 16, budget: float = 0.02,
                 max_every: int = 100, clock: Clock = time.perf_counter):
        if every is not None and int(every) < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}")
        self.every = None if every is None else int(every)
        self.warmup = warmup
        self.budget = budget
        self.max_every = max_every
        self.clock = clock
        self.interval = 1 if every is None else self.every
        self._next = 0
        self._plain = None    # EMA of the wall time of an unsampled step
        self._sampled = None  # EMA of the wall time of a sampled step
        self._t_last = None

    def resume(self) -> None:
        """Forget the time of the last step (watching resumes after a pause)."""
        self._t_last = None

    def should_sample(self, step: int) -> bool:
        return step >= self._next

    def step_done(self, step: int, sampled: bool) -> None:
        """Called once per completed step; updates the timing model and the next sampled step."""
        now = self.clock()
        if self._t_last is not None:
            dt = now - self._t_last
            if sampled:
                self._sampled = dt if self._sampled is None else 0.7 * self._sampled + 0.3 * dt
            else:
                self._plain = dt if self._plain is None else 0.7 * self._plain + 0.3 * dt
        self._t_last = now
        if not sampled:
            return
        if self.every is None:
            self.interval = self._auto_interval(step)
        self._next = step + self.interval

    def _auto_interval(self, step: int) -> int:
        if step + 1 < self.warmup:
            return 1
        if self._plain is None or self._sampled is None:
            return 2  # no unsampled step measured yet: sample every other step to measure one
        extra = max(self._sampled - self._plain, 0.0)
        k = math.ceil(extra / max(self.budget * self._plain, 1e-9))
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
