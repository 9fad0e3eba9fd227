"""Watching one rank of a multi-process run: when to measure, exchange and write, and what to keep.

After every step (the session's step-end callback, never inside a hook), at merge steps only
(``distributed.merge_step``, decided by the global step):

1. this rank's row and batch fingerprints since the last merge (``rankstats.RankProbe``) go into its own
   column of the trace's rank axis (``ranktrace.RankSeries``);
2. over the side channel, one all-reduce agrees on a flag (NaN/Inf or a loss spike on some rank) and on
   the sampling interval, and one gather brings every rank's row and fingerprints to rank 0; both are
   started without waiting, and collected at the next merge step;
3. a raised flag starts a burst of sampled steps on every rank at the same step and writes every
   rank's file (the rank that raised it writes its own at once).

Each rank writes ``run_dir/rank00000.ndbg`` (its rank, five digits): at the first merge, then at most
every ``checkpoint_interval`` seconds of merges, when a flag is raised or an exchange fails, when
watching stops (normally or by an exception), at interpreter exit and on SIGTERM (what a launcher sends
the other ranks when one fails). A rank killed outright leaves its last file.
"""
from __future__ import annotations

import atexit
import math
import os
import signal
import threading
import time
import weakref
from typing import AbstractSet, Any, Callable

import numpy as np

from . import distributed
from .distributed import AgreedSchedule, RankInfo, SideChannel
from .rankstats import RankProbe
from .ranktrace import RankSeries
from .trace import Trace

# A recorded loss this many times the median of the losses before it raises the flag.
SPIKE = 10.0


def rank_file(run_dir: str | os.PathLike, rank: int) -> str:
    return os.path.join(os.fspath(run_dir), f"rank{int(rank):05d}.ndbg")


class RankWatch:
    """The multi-rank side of one session (see the module docstring)."""

    def __init__(self, info: RankInfo, trace: Trace, probe: RankProbe, schedule: AgreedSchedule, *,
                 save: Callable[[str], None], run_dir: str | os.PathLike | None, merge_every: int,
                 merge_timeout: float, checkpoint_interval: float, flush: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic):
        if int(merge_every) < 1:
            raise ValueError(f"merge_every must be a positive integer, got {merge_every!r}")
        self.info = info
        self.trace = trace
        self.probe = probe
        self.schedule = schedule
        self.merge_every = int(merge_every)
        self.merge_timeout = float(merge_timeout)
        self.checkpoint_interval = float(checkpoint_interval)
        self.run_dir = None if run_dir is None else os.fspath(run_dir)
        self._save = save
        self._flush = flush
        self.clock = clock
        self.channel: SideChannel | None = None
        self.series = RankSeries(probe.layout, info.world, info.rank)
        trace.ranks = self.series
        trace.meta.update(rank=info.rank, world_size=info.world, backend=info.backend, merge_every=self.merge_every)
        self._last_write = -math.inf
        self._loss_step = -1
        self._nonfinite_flagged = False
        self.merges = 0                      # merges completed (collected) in this session
        self._prev_sigterm: Any = None   # the SIGTERM handler before this session's
        self._atexit: Callable[[], None] | None = None
        self._started = False                # watched before: a resumed session keeps its file
        self.window = self.merge_every + 1   # fingerprints one packet carries

    @classmethod
    def for_session(cls, dbg, info: RankInfo, *, run_dir, merge_every: int, merge_timeout: float,
                    checkpoint_interval: float, unsynced: AbstractSet[str] = frozenset()) -> "RankWatch":
        """The rank side of a ``NeuralDbg`` session that is about to watch (its recorder exists).
        ``unsynced``: names of parameters each rank keeps its own (left out of the comparison)."""
        rec = dbg._recorder
        every = int(merge_every)
        probe = RankProbe(rec.inner, rec.layers, rec.modules, step_of=lambda: rec.step,
                          is_merge_step=lambda s: distributed.merge_step(s, every), hook_on=rec.model,
                          unsynced=unsynced)
        return cls(info, rec.trace, probe, rec.schedule, save=dbg.save, run_dir=run_dir, merge_every=every,
                   merge_timeout=merge_timeout, checkpoint_interval=checkpoint_interval, flush=rec.flush_losses)

    @property
    def path(self) -> str | None:
        return rank_file(self.run_dir, self.info.rank) if self.run_dir is not None else None

    # -- life cycle ------------------------------------------------------------------------------
    def attach(self) -> None:
        if self.run_dir is not None and not self._started:
            os.makedirs(self.run_dir, exist_ok=True)
            self._clear_stale()
        self._started = True
        self.channel = SideChannel(self.info, self.merge_timeout)  # made by every rank as it starts watching
        self.probe.attach()
        ref = weakref.ref(self)

        def at_exit() -> None:
            watch = ref()
            if watch is not None:
                watch.write()

        self._atexit = at_exit
        atexit.register(at_exit)
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGTERM)
            if prev not in (signal.SIG_IGN, None):
                self._prev_sigterm = prev
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def _clear_stale(self) -> None:
        """A run directory used before: this rank's old file goes (a rank that dies before its first write
        must not pass off an earlier run's trace as its own), and rank 0 removes those of ranks beyond the
        world size."""
        from .merge import rank_files

        if self.run_dir is None:
            return
        for r, path in rank_files(self.run_dir).items():
            if r == self.info.rank or (self.info.rank == 0 and r >= self.info.world):
                try:
                    os.remove(path)
                except OSError:
                    pass

    def detach(self) -> None:
        self.probe.detach()
        if self._atexit is not None:
            atexit.unregister(self._atexit)
            self._atexit = None
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if self.channel is not None:
            self._apply(self.channel.collect(), self.trace.meta.get("step", 0))  # the last merge
            self._note_channel()
            if self.channel.group is not None:
                distributed.destroy(self.channel.group)
                self.channel.group = None
        self._drain_local()
        self.write()

    def _on_sigterm(self, signum, frame) -> None:
        self.write()
        prev = self._prev_sigterm
        if callable(prev):
            prev(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def write(self) -> None:
        """Write this rank's file now (no-op without a run directory); never raises into training."""
        if self.path is None:
            return
        try:
            self._save(self.path)
            self._last_write = self.clock()
        except (OSError, ValueError, RuntimeError) as exc:
            self.trace.meta["write_error"] = str(exc)[:200]

    # -- every step --------------------------------------------------------------------------------
    def step_done(self, step: int) -> None:
        """After the optimizer step of ``step`` (the step just completed)."""
        if not distributed.merge_step(step, self.merge_every):
            return
        self._flush()  # the losses recorded so far, for the spike flag
        if self.channel is not None:
            self._apply(self.channel.collect(), step)  # the previous merge, complete by now
        row = self.probe.row(self.trace.nonfinite)
        steps, batches = self.probe.drain_batches()
        self.series.add_row(step, {self.info.rank: row})
        self.series.add_batches(steps, {self.info.rank: batches})
        flag = self._flag()
        if flag and "flag_written" not in self.trace.meta:  # this rank's own trouble: its file at once
            self.trace.meta["flag_written"] = step
            self.write()
        if self.channel is not None:
            self.channel.post(step, self._packet(row, steps, batches), flag, self.schedule.proposal)
        if self.probe.error is not None:
            self.trace.meta.setdefault("rank_stats_error", self.probe.error)
        if self._note_channel():
            self.write()
        elif self.clock() - self._last_write >= self.checkpoint_interval:
            self.write()

    def _apply(self, ex, step: int) -> None:
        """What a completed merge brought: the agreed interval, a flag raised on some rank (a burst of
        sampled steps on every rank, and every file written), and on rank 0 the other ranks' data."""
        if ex is None:
            return
        self.merges += 1
        self.schedule.agree(ex.interval)
        if ex.flag:
            self.trace.meta.setdefault("flagged_at", ex.step)
            self.schedule.burst(step + 1)
            if "flag_written" not in self.trace.meta:
                self.trace.meta["flag_written"] = step
                self.write()
        if ex.packets is not None:
            for r, packet in enumerate(ex.packets):
                if r != self.info.rank:
                    self.series.fill(r, ex.step, *self._unpack(packet))

    def _drain_local(self) -> None:
        steps, batches = self.probe.drain_batches()
        if len(steps):
            self.series.add_batches(steps, {self.info.rank: batches})

    def _note_channel(self) -> bool:
        """Record a merge that failed, once; True the first time."""
        if self.channel is None or self.channel.failure is None or "merge_failure" in self.trace.meta:
            return False
        self.trace.meta["merge_failure"] = self.channel.failure
        return True

    def _flag(self) -> int:
        """1 when this rank saw its first NaN/Inf, or a loss spike, since the last merge."""
        flag = 0
        if self.trace.nonfinite is not None and not self._nonfinite_flagged:
            self._nonfinite_flagged = True
            flag = 1
        steps, values = self.trace.loss.steps, self.trace.loss.data
        new = steps > self._loss_step
        if new.any():
            before = values[~new][-64:]
            before = before[np.isfinite(before)]
            if not np.isfinite(values[new]).all():
                flag = 1
            elif len(before) >= 4 and np.max(values[new]) > SPIKE * max(abs(float(np.median(before))), 1e-12):
                flag = 1
            self._loss_step = int(steps[-1])
        return flag

    # -- packets ---------------------------------------------------------------------------------
    def _packet(self, row: np.ndarray, steps: np.ndarray, batches: np.ndarray) -> np.ndarray:
        """Fixed size on every rank: the row, then (step, fingerprint, RMS) of up to ``window`` batches."""
        fp = np.full((self.window, 3), np.nan)
        k = min(len(steps), self.window)
        fp[:k, 0] = steps[-k:] if k else []
        fp[:k, 1:] = batches[-k:] if k else np.zeros((0, 2))
        return np.concatenate([row, fp.reshape(-1)])

    def _unpack(self, packet: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A rank's row, and the steps and (fingerprint, RMS) of its batches."""
        n = self.probe.layout.length
        row, fp = packet[:n], packet[n:].reshape(self.window, 3)
        ok = np.isfinite(fp[:, 0])
        return row, fp[ok, 0].astype(np.int64), fp[ok, 1:]
