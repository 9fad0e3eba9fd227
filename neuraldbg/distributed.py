"""torch.distributed, as far as watching a multi-process run needs it.

- ``RankInfo``: this process's rank and the world size, when a default process group exists;
- ``unwrap``: the module a ``DistributedDataParallel`` wrapper trains, so layer names carry no
  ``module.`` prefix;
- ``merge_step``: the global steps at which ranks exchange statistics, fixed by the step number alone;
- ``AgreedSchedule``: the sampling schedule, identical on every rank (timings only propose an interval;
  the ranks agree on one at merge steps);
- ``SideChannel``: the exchange itself, over a separate gloo group with a timeout: a two-integer
  all-reduce (a flag: NaN/Inf or a loss spike on some rank; the sampling interval each rank proposes)
  and a gather of fixed-size float64 tensors to rank 0, both started without waiting and collected at
  the next merge. A collective that fails or times out disables the channel on that rank; training goes
  on and the per-rank files carry the run.

Nothing here runs inside a hook: the exchange happens once per merge step, after the optimizer step.
"""
from __future__ import annotations

import datetime
import re
import statistics
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .schedule import Schedule


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world: int
    backend: str


def rank_info(required: bool = False) -> RankInfo | None:
    """This process's place in the default process group; None outside one, or in a world of one unless
    ``required`` (then a missing process group is a ValueError)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        if required:
            raise ValueError("distributed=True needs a torch.distributed process group: call "
                             "torch.distributed.init_process_group first")
        return None
    world = dist.get_world_size()
    if world < 2 and not required:
        return None
    return RankInfo(rank=dist.get_rank(), world=world, backend=str(dist.get_backend()))


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` (or ``DataParallel``) wrapper; other models as they are."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    while isinstance(model, wrappers):
        model = model.module
    return model


def ignored_parameters(model: nn.Module) -> set[str]:
    """Names (as in the unwrapped module) of parameters a DDP wrapper leaves unsynchronised on purpose."""
    names = getattr(model, "parameters_to_ignore", None)
    return {str(n) for n in names} if isinstance(model, nn.parallel.DistributedDataParallel) and names else set()


def merge_step(step: int, every: int) -> bool:
    """Whether ranks exchange statistics after ``step``: steps 0, 1, 2, 4, 8, ... below ``every``, then
    every ``every`` steps. The same answer on every rank: it depends on the global step alone."""
    if step < every:
        return step == 0 or (step & (step - 1)) == 0
    return step % every == 0


class AgreedSchedule(Schedule):
    """``Schedule`` whose sampled steps are the same on every rank.

    The auto schedule picks its interval from timings measured on this rank; here those timings only
    make a ``proposal``: the median of the intervals they gave at the last few sampled steps (one noisy
    timing must not set the interval until the next merge). The interval in force is ``agreed``: the
    largest proposal of all ranks, set at each merge step (``agree``), so no rank samples more than its
    budget allows and all sample the same steps. The warm-up, the bursts (a learning rate that rises, a
    flag raised on some rank) and the cap of a quarter of the steps run so far depend on the step alone.
    """

    def __init__(self, every: int | None = None, **kwargs):
        super().__init__(every, **kwargs)
        self.proposal = 0           # 0: nothing measured yet
        self.agreed = 0             # 0: nothing agreed yet, the interval follows the step count
        self._proposals: deque[int] = deque(maxlen=9)

    def _auto_interval(self, step: int) -> int:
        if step + 1 < self.warmup:
            return 1
        if self._plain and self._sampled:  # a step of each kind timed: a proposal of this rank's own
            self._proposals.append(super()._auto_interval(step))
            self.proposal = int(statistics.median(self._proposals))
        interval = self.agreed if self.agreed > 0 else max(2, (step + 1) // 8)
        return int(min(interval, self.max_every, max(1, (step + 1) // 4)))

    def agree(self, interval: int) -> None:
        """The largest proposal of all ranks (0: none made one yet)."""
        if int(interval) > 0:
            self.agreed = int(interval)


def destroy(group) -> None:
    """Release a group this process made (local for gloo; nothing to do once the default group is gone)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError):
            pass


_SOURCE = re.compile(r"^\[[^\]]*\]\s*")


@dataclass
class Exchange:
    """What one merge brought back: every rank's packet (on rank 0 only), the flag of any rank, the agreed
    sampling interval, and the step of the merge."""

    packets: list[np.ndarray] | None
    flag: int
    interval: int
    step: int


class SideChannel:
    """A gloo group of its own for the merge, with a timeout (see the module docstring).

    ``post`` starts a merge's two collectives without waiting for them; ``collect`` waits for the merge
    posted last (at the next merge step, by when it has long completed; at most ``timeout`` seconds).
    Training never waits on a rank that is still finishing its step.
    """

    def __init__(self, info: RankInfo, timeout: float):
        self.info = info
        self.timeout = float(timeout)
        self.failure: str | None = None
        self.exchanges = 0
        self._pending: tuple | None = None
        try:
            self.group = torch.distributed.new_group(backend="gloo",
                                                     timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as exc:  # no gloo in this build, or a rank that never came
            self.group = None
            self._fail(f"no side group ({exc})")

    @property
    def open(self) -> bool:
        return self.group is not None and self.failure is None

    def post(self, step: int, packet: np.ndarray, flag: int, proposal: int) -> None:
        """Start the merge of ``step``: the all-reduce of (flag, proposed interval) and the gather of every
        rank's ``packet`` (same size on every rank) to rank 0. Collect the previous one first."""
        if not self.open or self._pending is not None:
            return
        dist = torch.distributed
        votes = torch.tensor([int(flag), int(proposal)], dtype=torch.int64)
        mine = torch.from_numpy(np.array(packet, dtype=np.float64))
        gathered = [torch.empty_like(mine) for _ in range(self.info.world)] if self.info.rank == 0 else None
        try:
            works = [dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.group, async_op=True),
                     dist.gather(mine, gathered, dst=0, group=self.group, async_op=True)]
        except RuntimeError as exc:
            self._failed(exc)
            return
        self._pending = (step, works, votes, mine, gathered)

    def collect(self) -> Exchange | None:
        """The merge posted last, once complete; None when there is none or it failed."""
        if self._pending is None:
            return None
        step, works, votes, _, gathered = self._pending
        self._pending = None
        try:
            for w in works:
                w.wait(datetime.timedelta(seconds=self.timeout))
        except RuntimeError as exc:  # a timeout, or a rank that died: the files carry the run from here
            self._failed(exc)
            return None
        self.exchanges += 1
        packets = [g.numpy() for g in gathered] if gathered is not None else None
        return Exchange(packets=packets, flag=int(votes[0]), interval=int(votes[1]), step=step)

    def _failed(self, exc: BaseException) -> None:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        text = _SOURCE.sub("", text)  # "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer"
        self._fail(f"merge {self.exchanges + 1} failed: {text[:160]}")

    def _fail(self, why: str) -> None:
        self.failure = why
        warnings.warn(f"NeuralDbg rank {self.info.rank}: {why}; statistics of this rank go to its own file only",
                      RuntimeWarning, stacklevel=3)
