"""What a framework callback does with its session, whatever the framework: which session (its own,
one given, or the one a ``%%neuraldbg`` cell is running), the loss of each optimizer step, when to
stop training, and what global rank 0 shows and writes at the end."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from neuraldbg import Cause, NeuralDbg, Thresholds
from neuraldbg.hypothesis import CONFIDENT

_ACTIVE: list[NeuralDbg] = []


@contextmanager
def session_scope(session: NeuralDbg) -> Iterator[NeuralDbg]:
    """Within the block, a callback made without a session reports to ``session`` when its trainer
    trains the model ``session`` watches (the notebook magic runs its cell in this scope)."""
    _ACTIVE.append(session)
    try:
        yield session
    finally:
        _ACTIVE.remove(session)


def active_session() -> NeuralDbg | None:
    """The innermost ``session_scope`` session, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _watches(session: NeuralDbg, model: nn.Module) -> bool:
    watched = session.model
    return watched is model or getattr(watched, "_orig_mod", None) is model


def _causes(stop_on) -> frozenset[Cause]:
    if isinstance(stop_on, (str, Cause)):
        stop_on = (stop_on,)
    try:
        return frozenset(Cause(c) for c in stop_on)
    except ValueError:
        known = ", ".join(c.value for c in Cause)
        raise ValueError(f"stop_on takes causes among: {known}; got {tuple(stop_on)!r}") from None


def optimizer_of(optimizer) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a framework's wrapper (whose own ``step`` runs no step hooks)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


class Watch:
    """The session side of a callback. ``start`` when training begins, ``add_loss`` per micro-batch,
    ``step_end`` after each optimizer step, ``finish`` however training ends."""

    def __init__(self, thresholds: Thresholds | None = None, *, session: NeuralDbg | None = None,
                 stop_on: Iterable[str] = (), report: bool = True, save: str | os.PathLike | None = None,
                 check_every: int = 50, **options):
        if session is not None and not isinstance(session, NeuralDbg):
            raise TypeError(f"session must be a neuraldbg.NeuralDbg, got {type(session).__name__}")
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds must be a neuraldbg.Thresholds, got {type(thresholds).__name__}")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"check_every must be a positive integer, got {check_every!r}")
        if save is not None and not os.path.isdir(os.path.dirname(os.path.abspath(save))):
            raise ValueError(f"save: the folder of {os.fspath(save)!r} does not exist")
        self.thresholds = thresholds
        self.stop_on = _causes(stop_on)
        self.report = report
        self.save = save
        self.check_every = check_every
        self.options = options
        self._given = session
        self.session: NeuralDbg | None = session
        self.rank_zero = True
        self.stopped_by: str | None = None
        self._stop_at_end = False
        self._adopted = False
        self._running = False
        self._losses: list = []

    # -- training begins / ends ----------------------------------------------------------------------
    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, rank_zero: bool) -> NeuralDbg:
        self.finish("stopped")  # a run that never said it ended
        session = self._given
        if session is not None and not _watches(session, model):
            raise ValueError(f"the session watches a {type(session.model).__name__}, but the trainer trains "
                             f"a {type(model).__name__}: give the session that model")
        if session is None:
            scoped = active_session()
            session = scoped if scoped is not None and _watches(scoped, model) else None
        self._adopted = session is not None and session is not self._given  # its owner shows the verdict
        optimizer = optimizer_of(optimizer)
        if session is None:
            options = dict(self.options)
            if not rank_zero:
                options.pop("on_step", None)  # only global rank 0 displays
            session = NeuralDbg(model, optimizer, self.thresholds, **options)
        elif optimizer is not None:
            session.set_optimizer(optimizer)
        self._stop_at_end = not session.watching
        if self._stop_at_end:
            session.start()
        self.session = session
        self.rank_zero = rank_zero
        self.stopped_by = None
        self._losses = []
        self._running = True
        return session

    def finish(self, outcome: str) -> None:
        """Stop watching (a session it started), record what is pending; on global rank 0, write the
        trace and print the verdict when asked. Safe to call more than once."""
        if not self._running:
            return
        self._running = False
        session = self._watching()
        try:
            self._record_window()
        finally:
            if self._stop_at_end:
                session.stop()
        if not self.rank_zero:
            return
        try:
            if self.save is not None:
                session.save(self.save)
            if self.report and not self._adopted:
                print(f"NeuralDbg: training {outcome} after {session.step} steps\n{session.report()}")
        except Exception as e:  # noqa: BLE001 - the training's own outcome must not be hidden by ours
            print(f"neuraldbg: could not write the verdict: {type(e).__name__}: {e}")

    @property
    def running(self) -> bool:
        return self._running

    def _watching(self) -> NeuralDbg:
        """The session of the run in progress (there is one from ``begin`` on)."""
        if self.session is None:
            raise RuntimeError("no training run has begun")
        return self.session

    # -- per step ------------------------------------------------------------------------------------
    def add_loss(self, value) -> None:
        """A micro-batch's loss (not divided by the accumulation): the step records their mean."""
        if self._running and value is not None:
            self._losses.append(value.detach().float().mean() if isinstance(value, torch.Tensor) else float(value))

    def _record_window(self) -> None:
        losses, self._losses = self._losses, []
        if not losses:
            return
        if all(isinstance(v, torch.Tensor) for v in losses):
            self._watching().record_loss(torch.stack([v.to(losses[0].device) for v in losses]).mean())
        else:
            self._watching().record_loss(sum(float(v) for v in losses) / len(losses))

    def step_end(self, agree: Callable[[bool], bool] = bool) -> str | None:
        """After an optimizer step: record its loss; the cause to stop training for, if any.
        ``agree(found)`` makes the ranks of a distributed run decide together; it is called on steps
        every rank reaches, never on the others."""
        if not self._running:
            return None
        self._record_window()
        if not self.stop_on or self.stopped_by is not None:
            return None
        session = self._watching()
        found: str | None = None
        # NaN/Inf reaches every rank's gradients at once (they are averaged): decided locally, every step
        if Cause.NON_FINITE in self.stop_on and session.trace.nonfinite is not None:
            found = Cause.NON_FINITE.value
        rest = self.stop_on - {Cause.NON_FINITE}
        if found is None and rest and session.step % self.check_every == 0:
            mine = next((h.cause.value for h in session.explain() if h.confidence >= CONFIDENT and h.cause in rest),
                        None)
            if agree(mine is not None):
                found = mine or "a fault found on another rank"
        if found is not None:
            self.stopped_by = found
            if self.rank_zero:
                print(f"NeuralDbg: stopping training after step {session.step}: {found}")
        return found
