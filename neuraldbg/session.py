"""``NeuralDbg``: the public session object tying extraction, the trace and the analysis together."""
from __future__ import annotations

import os
from typing import Callable, Literal

import torch
from torch import nn

from . import fileformat
from .recorder import Recorder
from .schedule import Clock, Schedule, Throttle
from .thresholds import Thresholds
from .trace import Trace
from .verdict import Verdict
from .view import TraceView


class NeuralDbg:
    """Watch a training loop and explain why it fails.

    >>> with NeuralDbg(model, optimizer=opt) as dbg:
    ...     for x, y in batches:
    ...         opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step()
    ...         dbg.record_loss(loss)
    >>> print(dbg.report())

    Options: ``every`` (full statistics every N steps; default: adaptive, dense at the start),
    ``capacity`` (rows kept per series), ``on_step`` (called with the session at most every
    ``update_interval`` seconds of ``clock``; the notebook dashboard uses it), ``after_step``
    (called with the session after every step, unthrottled; keep it cheap), ``scaler`` (the
    ``torch.amp.GradScaler`` of a mixed-precision loop: its scale is recorded and the gradient
    statistics are divided by it). A step the optimizer skips because its gradients hold NaN/Inf
    (a GradScaler's calibration) is not counted and is not a fault by itself; a run of them is.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 thresholds: Thresholds | None = None, *, every: int | None = None, capacity: int = 2048,
                 on_step: Callable[["NeuralDbg"], None] | None = None, update_interval: float = 0.25,
                 clock: Clock | None = None, after_step: Callable[["NeuralDbg"], None] | None = None,
                 scaler=None):
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds must be a neuraldbg.Thresholds, got {type(thresholds).__name__}")
        self.thresholds = thresholds or Thresholds()
        self.model: nn.Module | None = model
        self.optimizer = optimizer
        self._analysis = None
        self._analysis_key = None
        self._on_step = on_step
        throttle = Throttle(update_interval, clock) if clock is not None else Throttle(update_interval)
        self._recorder: Recorder | None = Recorder(
            model, optimizer, every=every, capacity=capacity, schedule=Schedule(every),
            on_step=self._notify if on_step is not None else None, throttle=throttle,
            after_step=(lambda: after_step(self)) if after_step is not None else None, scaler=scaler,
            spike_factor=self.thresholds.spike_factor)
        self._trace: Trace = self._recorder.trace
        self._loaded_step = 0

    @classmethod
    def _from_trace(cls, trace: Trace, thresholds: Thresholds | None = None) -> "NeuralDbg":
        self = cls.__new__(cls)
        self.thresholds = thresholds or Thresholds()
        self.model = None
        self.optimizer = None
        self._analysis = None
        self._analysis_key = None
        self._on_step = None
        self._recorder = None
        self._trace = trace
        self._loaded_step = int(trace.meta.get("step", 0))
        return self

    # -- watching ---------------------------------------------------------------------------------
    def __enter__(self) -> "NeuralDbg":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.stop()
        return False  # never swallow the user's exception

    def start(self) -> "NeuralDbg":
        if self._recorder is None:
            raise RuntimeError("a loaded session cannot watch a model; create a new NeuralDbg")
        self._recorder.attach()
        return self

    def stop(self) -> None:
        if self._recorder is not None:
            self._recorder.detach()
            self._trace.meta["step"] = self._recorder.step

    @property
    def watching(self) -> bool:
        return self._recorder is not None and self._recorder.attached

    def record_loss(self, loss) -> None:
        """Record the loss of the current step (a tensor or a float); enables loss-based reasoning."""
        if self._recorder is None:
            raise RuntimeError("a loaded session records nothing")
        self._recorder.record_loss(loss)

    # -- driven by a training framework --------------------------------------------------------------
    def _live_recorder(self) -> Recorder:
        if self._recorder is None:
            raise RuntimeError("a loaded session watches no training")
        return self._recorder

    def set_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count steps by ``optimizer`` from now on, in place of the one given before, if any: for an
        optimizer created only once training begins (by a trainer). Call it before the first step."""
        self._live_recorder().set_optimizer(optimizer)
        self.optimizer = optimizer

    def begin_pass(self, inputs=(), run: Callable[[nn.Module], object] | None = None) -> None:
        """A training pass starts that does not go through the model's own forward (a training step that
        calls the model's submodules, as a LightningModule's ``training_step`` may). ``inputs``: the batch
        (checked for NaN/Inf, described as the input); ``run(copy)``: the same pass on a copy of the model,
        returning its loss, to replay it when NaN/Inf must be located. Until ``end_forward``, calls of
        the model's own forward are part of this pass.

        >>> dbg.begin_pass(batch, run=lambda m: loss_of(m, batch))
        >>> loss = loss_of(model, batch)
        >>> dbg.end_forward(loss); loss.backward(); opt.step()
        """
        self._live_recorder().begin_pass((inputs,), {}, run)

    def end_forward(self, outputs) -> None:
        """The forward part of the pass begun by ``begin_pass`` is over; ``outputs`` (the loss, or the
        tensors the backward starts from) are watched through the backward pass."""
        self._live_recorder().end_forward(outputs)

    def read_gradients(self) -> None:
        """Measure the parameter gradients now, for the step in progress, in place of what the backward
        pass measured: for a loop that unscales gradients after backward (mixed precision). Call it after
        the step's last backward and before gradients are clipped or zeroed. By default the gradients are
        read at the end of each backward pass (the last one of a step counts)."""
        self._live_recorder().read_gradients()

    @property
    def step(self) -> int:
        """Completed steps: optimizer steps when an optimizer was given, else backward passes."""
        return self._recorder.step if self._recorder is not None else self._loaded_step

    def snapshot(self) -> "NeuralDbg":
        """What is recorded so far, as a session of its own that watches nothing (its trace is a copy):
        another thread can analyse it while this session goes on recording. Take it between steps."""
        if self._recorder is not None:
            self._recorder.flush_losses()
        snap = NeuralDbg._from_trace(self._trace.copy(), self.thresholds)
        snap._loaded_step = self.step
        return snap

    @property
    def last_loss(self) -> float:
        """The latest recorded loss (NaN when none): for a progress line, without recording anything."""
        if self._recorder is not None:
            latest = self._recorder.latest_loss()
            if latest is not None:
                return latest
        return float(self._trace.loss.data[-1]) if self._trace.loss.n else float("nan")

    @property
    def trace(self) -> Trace:
        """The recorded trace itself (internal layout; front ends read ``view``)."""
        return self._trace

    @property
    def view(self) -> TraceView:
        """A read-only view of what was recorded: layers in forward order, sampled statistics, loss."""
        return TraceView(self._trace)

    def _notify(self) -> None:
        if self._on_step is not None:
            self._on_step(self)

    # -- analysis ---------------------------------------------------------------------------------
    def analysis(self):
        """The full analysis of the trace so far (health, events, hypotheses), cached until new data."""
        from .analysis import analyze

        if self._recorder is not None:
            self._recorder.flush_losses()
        key = (self._trace.stats.n, int(self._trace.stats.steps[-1]) if self._trace.stats.n else -1,
               self._trace.loss.n, self._trace.nonfinite, self.thresholds, self.step)
        if self._analysis is None or key != self._analysis_key:
            self._analysis = analyze(self._trace, self.thresholds, steps=self.step)
            self._analysis_key = key
        return self._analysis

    def explain(self) -> Verdict:
        """Ranked causal hypotheses, best first; ``[]`` when nothing is wrong. A ``Verdict``: a list
        that prints as one line (``healthy after 300 steps``) and shows as the panel in a notebook."""
        return Verdict(self.analysis().hypotheses, steps=self.step)

    @property
    def events(self):
        """Semantic events (state transitions), in step order."""
        return list(self.analysis().events)

    def health(self):
        """The latest health of every watched layer, by name."""
        return dict(self.analysis().health)

    def reanalyze(self, thresholds: Thresholds | None = None, **changes: float) -> Verdict:
        """Re-run the analysis on the stored trace with new thresholds (no retraining):
        ``dbg.reanalyze(dead_fraction=0.9)`` or ``dbg.reanalyze(Thresholds(...))``. An unknown name or a
        value out of its range raises ``ValueError`` and leaves the session's thresholds as they were."""
        if thresholds is None:
            thresholds = self.thresholds
        if not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds must be a neuraldbg.Thresholds, got {type(thresholds).__name__}")
        if changes:
            thresholds = thresholds.replace(**changes)
        self.thresholds = thresholds
        return self.explain()

    def report(self) -> str:
        from .report import render_report

        return render_report(self.analysis(), self._trace, step=self.step)

    def mermaid(self) -> str:
        """The causal graph of the top hypotheses as a Mermaid flowchart."""
        from .report import render_mermaid

        return render_mermaid(self.analysis())

    # -- files ------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        if self._recorder is not None:
            self._recorder.flush_losses()
        fileformat.save(self._trace, path, extra_meta={"step": self.step, "thresholds": self.thresholds.to_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike, thresholds: Thresholds | None = None) -> "NeuralDbg":
        trace, meta = fileformat.load(path)
        if thresholds is None and isinstance(meta.get("thresholds"), dict):
            try:
                thresholds = Thresholds.from_dict(meta["thresholds"])
            except (TypeError, ValueError):
                thresholds = None
        return cls._from_trace(trace, thresholds)

    def __repr__(self) -> str:
        state = "watching" if self.watching else ("loaded" if self._recorder is None else "stopped")
        return f"<NeuralDbg {state}, step {self.step}, {len(self._trace.layers)} layers>"
