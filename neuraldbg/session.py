"""``NeuralDbg``: the public session object tying extraction, the trace and the analysis together."""
from __future__ import annotations

import os
from typing import Callable, Literal

import torch
from torch import nn

from . import fileformat
from .distributed import AgreedSchedule, ignored_parameters, rank_info, unwrap
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

    Multi-process runs (a ``torch.distributed`` process group of two or more exists; ``distributed=False``
    opts out, ``distributed=True`` opts in even in a world of one):
    every rank records with the same schedule, ranks exchange statistics every ``merge_every`` steps over
    a gloo group of their own (``merge_timeout`` seconds at most), and each rank writes
    ``run_dir/rank00000.ndbg`` (its own rank) when watching stops, at merges (at most every
    ``checkpoint_interval`` seconds) and on failure; ``NeuralDbg.load(run_dir)`` merges them. ``model``
    may be the ``DistributedDataParallel`` wrapper or the module inside it (same layer names).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 thresholds: Thresholds | None = None, *, every: int | None = None, capacity: int = 2048,
                 on_step: Callable[["NeuralDbg"], None] | None = None, update_interval: float = 0.25,
                 clock: Clock | None = None, after_step: Callable[["NeuralDbg"], None] | None = None,
                 scaler=None, run_dir: str | os.PathLike | None = None, distributed: bool | None = None,
                 merge_every: int = 50, merge_timeout: float = 300.0, checkpoint_interval: float = 30.0):
        if thresholds is not None and not isinstance(thresholds, Thresholds):
            raise TypeError(f"thresholds must be a neuraldbg.Thresholds, got {type(thresholds).__name__}")
        self.thresholds = thresholds or Thresholds()
        unsynced = ignored_parameters(model)  # parameters a DDP wrapper leaves to each rank on purpose
        model = unwrap(model)  # a DDP wrapper: the module inside, so that names carry no "module." prefix
        self.model: nn.Module | None = model
        self._analysis = None
        self._analysis_key = None
        self._warnings: list = []
        self._warnings_key: tuple | None = None
        self._on_step = on_step
        self._after_step = after_step
        self._run = None
        self._view = None
        info = rank_info(required=distributed is True) if distributed is not False else None
        throttle = Throttle(update_interval, clock) if clock is not None else Throttle(update_interval)
        self._recorder: Recorder | None = Recorder(
            model, optimizer, every=every, capacity=capacity,
            schedule=AgreedSchedule(every) if info is not None else Schedule(every),
            on_step=self._notify if on_step is not None else None, throttle=throttle,
            after_step=self._step_end if (after_step is not None or info is not None) else None, scaler=scaler,
            spike_factor=self.thresholds.spike_factor, creeping=self.thresholds.update_creeping,
            next_token_share=self.thresholds.next_token_share)
        self._trace: Trace = self._recorder.trace
        self._loaded_step = 0
        self._ranks = None
        if info is not None:
            from .rankwatch import RankWatch

            self._ranks = RankWatch.for_session(self, info, run_dir=run_dir, merge_every=merge_every,
                                                merge_timeout=merge_timeout, checkpoint_interval=checkpoint_interval,
                                                unsynced=unsynced)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer whose steps are counted: the one given, set, or found stepping on the model's weights
        (the latest, when the loop makes it again); None before one is found, and for a loaded session."""
        rec = getattr(self, "_recorder", None)
        return rec.optimizer if rec is not None else None

    @classmethod
    def _from_trace(cls, trace: Trace, thresholds: Thresholds | None = None) -> "NeuralDbg":
        self = cls.__new__(cls)
        self.thresholds = thresholds or Thresholds()
        self.model = None
        self._analysis = None
        self._analysis_key = None
        self._warnings = []
        self._warnings_key = None
        self._on_step = None
        self._recorder = None
        self._trace = trace
        self._loaded_step = int(trace.meta.get("step", 0))
        self._after_step = None
        self._ranks = None
        self._run = None
        self._view = None
        return self

    @classmethod
    def _from_run(cls, run, thresholds: Thresholds | None = None) -> "NeuralDbg":
        self = cls._from_trace(run.traces[run.present[0]], thresholds)
        self._run = run
        self._view = run.present[0]
        self._loaded_step = run.step
        return self

    # -- watching ---------------------------------------------------------------------------------
    def __enter__(self) -> "NeuralDbg":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc_type is not None and self._recorder is not None:
            # the report says the run stopped there: what it found covers the steps before, no more (set before
            # stopping, which writes a rank's file)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self._trace.meta["stopped_by"] = {"error": exc_type.__name__, "message": first[:200],
                                              "step": int(self._recorder.step)}
        self.stop()
        return False  # never swallow the user's exception

    def start(self) -> "NeuralDbg":
        if self._recorder is None:
            raise RuntimeError("a loaded session cannot watch a model; create a new NeuralDbg")
        self._trace.meta.pop("stopped_by", None)  # watching again: the run goes on past where it stopped
        self._recorder.attach()
        if self._ranks is not None:
            try:
                self._ranks.attach()
            except BaseException:
                self._recorder.detach()
                raise
        return self

    def stop(self) -> None:
        if self._recorder is not None:
            self._recorder.detach()
            self._trace.meta["step"] = self._recorder.step
        if self._ranks is not None:
            self._ranks.detach()  # writes this rank's file

    def _step_end(self) -> None:
        if self._ranks is not None and self._recorder is not None:
            self._ranks.step_done(self._recorder.step - 1)
        if self._after_step is not None:
            self._after_step(self)

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
        if self._ranks is not None and self.watching:
            self._ranks.probe.see_pass((inputs,), {})
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
        """The recorded trace (of the rank in view, for a merged multi-process run)."""
        return self._run.traces[self._view] if self._run is not None else self._trace

    # -- ranks ------------------------------------------------------------------------------------
    @property
    def rank(self) -> int | None:
        """This process's rank in a multi-process run, or the rank in view of a merged one; None otherwise."""
        if self._run is not None:
            return self._view
        return self._ranks.info.rank if self._ranks is not None else self._trace.meta.get("rank")

    @property
    def ranks(self) -> list[int]:
        """The ranks whose traces this session holds ([] for one process)."""
        if self._run is not None:
            return self._run.present
        return [self.rank] if self.rank is not None else []

    def view_rank(self, rank: int) -> None:
        """Show another rank of a merged run: ``trace`` and ``health()`` become that rank's."""
        if self._run is None or rank not in self._run.traces:
            raise ValueError(f"no trace of rank {rank!r} here (ranks: {self.ranks})")
        self._view = int(rank)

    def _merged(self):
        """The multi-process run behind this session, or None for one process."""
        if self._run is not None:
            return self._run
        from .merge import from_trace

        return from_trace(self._trace, self.step)

    @property
    def view(self) -> TraceView:
        """A read-only view of what was recorded: layers in forward order, sampled statistics, loss (of the
        rank in view, for a merged multi-process run)."""
        return TraceView(self.trace)

    def _notify(self) -> None:
        if self._on_step is not None:
            self._on_step(self)

    # -- analysis ---------------------------------------------------------------------------------
    def analysis(self):
        """The full analysis of the trace so far (health, events, hypotheses), cached until new data."""
        from .analysis import analyze

        if self._recorder is not None:
            self._recorder.flush_losses()
        ranked = self._trace.ranks
        key = (self._trace.stats.n, int(self._trace.stats.steps[-1]) if self._trace.stats.n else -1,
               self._trace.loss.n, self._trace.nonfinite, self.thresholds, self.step,
               None if ranked is None else (ranked.rows.n, ranked.batches.n), id(self._run),
               # (the weights' distance from their start, read again as watching stops)
               (self._trace.meta.get("weights_moved") or {}).get("step"))
        run = self._merged()
        if self._analysis is None or key != self._analysis_key:
            if run is None:
                self._analysis = analyze(self._trace, self.thresholds, steps=self.step)
            else:
                from .rankanalysis import analyze_run

                self._analysis = analyze_run(run, self.thresholds)
            self._analysis_key = key
        if run is None:
            return self._analysis
        return self._analysis.view(self._view if self._run is not None else run.present[0])

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

    def warnings(self) -> list:
        """Early warnings (``EarlyWarning``): signals in their warning band at the latest sample that keep
        moving toward their failure state (a layer's dead units climbing toward ``dead_fraction``, updates
        creeping up to ``update_too_large``, ...), each with a forecast of the step it gets there at its
        recent rate and a range, the soonest first. Never verdicts: ``explain()`` does not count them."""
        from .watch import warnings

        trace = self.trace
        key = (id(trace), trace.stats.n, int(trace.stats.steps[-1]) if trace.stats.n else -1, self.thresholds)
        if self._warnings_key != key:
            self._warnings = warnings(trace, self.thresholds)
            self._warnings_key = key
        return list(self._warnings)

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

        run = self._merged()
        return render_report(self.analysis(), self.trace, step=self.step,
                             extra=[run.summary()] if run is not None else None, warnings=self.warnings())

    def mermaid(self) -> str:
        """The causal graph of the top hypotheses as a Mermaid flowchart."""
        from .report import render_mermaid

        return render_mermaid(self.analysis())

    # -- files ------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        if self._run is not None:
            raise ValueError("a merged run stays in its run directory; save one rank with "
                             "NeuralDbg.load(run_dir).view_rank(r) ... from its own file")
        if self._recorder is not None:
            self._recorder.flush_losses()
        fileformat.save(self._trace, path, extra_meta={"step": self.step, "thresholds": self.thresholds.to_dict()})

    @classmethod
    def load(cls, path: str | os.PathLike, thresholds: Thresholds | None = None) -> "NeuralDbg":
        """A saved trace (``run.ndbg``), or a run directory of rank files (``run_dir/rank00000.ndbg``, ...):
        their ranks merged into one session."""
        if os.path.isdir(path):
            from .merge import load_run

            run, meta = load_run(path)
            return cls._from_run(run, thresholds or _saved_thresholds(meta))
        trace, meta = fileformat.load(path)
        return cls._from_trace(trace, thresholds or _saved_thresholds(meta))

    def __repr__(self) -> str:
        state = "watching" if self.watching else ("loaded" if self._recorder is None else "stopped")
        ranks = f", {len(self._run.present)} ranks" if self._run is not None else (
            f", rank {self.rank}" if self.rank is not None else "")
        return f"<NeuralDbg {state}, step {self.step}, {len(self._trace.layers)} layers{ranks}>"


def _saved_thresholds(meta: dict) -> Thresholds | None:
    if isinstance(meta.get("thresholds"), dict):
        try:
            return Thresholds.from_dict(meta["thresholds"])
        except (TypeError, ValueError):
            return None
    return None
