"""``%%neuraldbg`` (watch a training cell) and ``%neuraldbg`` (work on the last session)."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import keyword
import numbers
import re
import time
from dataclasses import dataclass

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments, parse_argstring
from IPython.display import display
from torch import nn
from traitlets import Bool, CaselessStrEnum, Dict, Float, Int, TraitError, Unicode, validate
from traitlets.config.configurable import Configurable

from neuraldbg import NeuralDbg, Thresholds
from neuraldbg.integrations import bind, session_scope, trainer_kind

from ._namespace import model_candidates, optimizer_for, trainer_candidates
from ._outcome import verdict_text

_CORE_FLAGS = {"model", "optimizer", "trainer", "loss", "every", "no_live", "out"}


def _threshold_flags(func):
    """One ``--name VALUE`` flag per ``Thresholds`` field a user would tune (those with a slider), generated
    from its metadata; the others are reached with ``%config NeuralDbgMagics.thresholds``."""
    defaults = Thresholds()
    for f in reversed(dataclasses.fields(Thresholds)):
        if f.name in _CORE_FLAGS or not f.metadata.get("slider", True):
            continue
        value = getattr(defaults, f.name)
        kind = int if isinstance(value, int) and not isinstance(value, bool) else float
        doc = f.metadata.get("doc", f.metadata.get("label", ""))
        func = argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=None, metavar="X",
                        help=f"{doc} (default {value})")(func)
    # listed under their own heading in %%neuraldbg? (decorators apply bottom-up: the group comes first)
    return argument_group("thresholds", "override a decision threshold for this run")(func)


def _widget_frontend(shell) -> bool:
    """A kernel talking to a front end (JupyterLab, Notebook, VS Code) can show widgets; a terminal can't."""
    return any(c.__name__ == "ZMQInteractiveShell" for c in type(shell).__mro__)


def _parse(magic, line: str):
    try:
        return parse_argstring(magic, line)
    except ValueError as e:  # shlex: an unclosed quote or a trailing backslash
        raise UsageError(f"cannot parse the arguments {line!r}: {e}") from None
    except UsageError as e:
        raise UsageError(_suggest(str(e), magic.parser)) from None


def _suggest(message: str, parser) -> str:
    """argparse's message with the closest valid flag or command for each unrecognised one."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    unknown = re.search(r"unrecognized arguments: (.*)", message)
    if unknown:
        for word in unknown.group(1).split():
            flag = word.split("=", 1)[0]
            close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6) if flag.startswith("-") else []
            if close:
                hints.append(f"{flag}: did you mean {close[0]}?")
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        valid = re.findall(r"'?([\w-]+)'?", choice.group(2))
        close = difflib.get_close_matches(choice.group(1), valid, n=1, cutoff=0.6)
        if close:
            hints.append(f"did you mean {close[0]}?")
    return message + (f" ({'; '.join(hints)})" if hints else "")


def _identifier(value: str, what: str) -> str:
    if not value.isidentifier() or keyword.iskeyword(value):
        raise UsageError(f"{what} must be a Python variable name, got {value!r}")
    return value


@dataclass
class _Plan:
    """Everything a %%neuraldbg cell needs, checked before the cell runs."""

    model: nn.Module
    model_name: str
    optimizer: torch.optim.Optimizer | None
    thresholds: Thresholds
    every: int | None
    loss: str
    out: str
    widgets: bool
    trainer: object = None  # a Lightning or Hugging Face trainer the cell calls


class _LossFeed:
    """Records the ``--loss`` variable after each step (the hub's unthrottled ``after_step``)."""

    def __init__(self, ns: dict, name: str):
        self.ns = ns
        self.name = name
        self._last = ns.get(name) if name else None  # a value left from before the cell is not this run's

    def __call__(self, dbg: NeuralDbg) -> None:
        if not self.name:
            return
        value = self.ns.get(self.name)
        if value is None or value is self._last:
            return
        self._last = value
        if isinstance(value, torch.Tensor):
            if value.numel() == 0 or value.dtype == torch.bool:
                return
        elif not isinstance(value, numbers.Real) or isinstance(value, bool):
            return
        dbg.record_loss(value)

    def close(self) -> None:
        self._last = None
        self.ns = {}


@magics_class
class NeuralDbgMagics(Magics, Configurable):
    """``%%neuraldbg`` and ``%neuraldbg``; defaults are settable with ``%config NeuralDbgMagics.<name> = value``."""

    every = Int(None, allow_none=True, help="Full statistics every N steps (None: adaptive).").tag(config=True)
    loss = Unicode("loss", help="Variable recorded as the loss after each step ('' to record none).").tag(config=True)
    out = Unicode("_ndbg", help="Variable that receives the session.").tag(config=True)
    live = Bool(True, help="Show the live dashboard (False: print the verdict as text at the end).").tag(config=True)
    frontend = CaselessStrEnum(("auto", "widgets", "text"), default_value="auto",
                               help="auto: widgets in a kernel with a front end, text in a terminal.").tag(config=True)
    update_interval = Float(0.25, help="Seconds between live dashboard updates, at least.").tag(config=True)
    chart_interval = Float(1.0, help="Seconds between chart redraws, at least.").tag(config=True)
    live_dashboards = Int(3, help="Dashboards kept interactive; older ones become static copies "
                                  "(their widgets closed, their sessions let go).").tag(config=True)
    fold_above = Int(40, help="Fold the health grid into parent modules above this many layers.").tag(config=True)
    thresholds = Dict({}, help="Threshold overrides for every run, e.g. {'dead_fraction': 0.95}.").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.clock = time.monotonic  # replaceable: tests drive the throttles with a fake clock
        self.session: NeuralDbg | None = None
        self.dashboard = None
        self._live: list[tuple] = []  # (dashboard, its display handles), oldest first

    @validate("every", "live_dashboards")
    def _check_every(self, proposal):
        if proposal["value"] is not None and proposal["value"] < 1:
            raise TraitError(f"{proposal['trait'].name} must be a positive integer, got {proposal['value']}")
        return proposal["value"]

    @validate("thresholds")
    def _check_thresholds(self, proposal):
        try:
            Thresholds(**proposal["value"])
        except (TypeError, ValueError) as e:
            raise TraitError(f"NeuralDbgMagics.thresholds: {e}") from None
        return proposal["value"]

    @validate("out")
    def _check_out(self, proposal):
        if not proposal["value"].isidentifier():
            raise TraitError(f"out must be a variable name, got {proposal['value']!r}")
        return proposal["value"]

    # -- %%neuraldbg ------------------------------------------------------------------------------
    @magic_arguments(name="%neuraldbg")  # the usage line reads "%%neuraldbg"
    @argument("model", nargs="?", metavar="MODEL",
              help="expression for the model; default: the one nn.Module in the namespace")
    @argument("--optimizer", metavar="OPT", default=None,
              help="expression for the optimizer (steps are counted by it); default: the one optimizer "
                   "owning the model's parameters, if any")
    @argument("--trainer", metavar="NAME", default=None,
              help="a Lightning or Hugging Face trainer the cell trains with (default: the one the cell names)")
    @argument("--loss", metavar="NAME", default=None, help="variable recorded as the loss after each step")
    @argument("--every", metavar="N", type=int, default=None, help="full statistics every N steps")
    @argument("--no-live", action="store_true", help="no live dashboard: print the verdict as text at the end")
    @argument("--out", metavar="VAR", default=None, help="variable that receives the session (default _ndbg)")
    @_threshold_flags
    @cell_magic("neuraldbg")
    def neuraldbg_cell(self, line, cell):
        """Watch the training in this cell; show health, loss, gradient flow and the verdict.

        The cell runs in your namespace as it would without the magic. The session goes into
        ``_ndbg`` (or VAR) however the cell ends. After it: ``%neuraldbg explain | report |
        save PATH | load PATH | thresholds``. A cell that calls ``trainer.fit(...)`` (PyTorch
        Lightning) or ``trainer.train()`` (Hugging Face) is watched through the trainer's callbacks:
        the trainer the cell names (or ``--trainer NAME``), or a ``NeuralDbgCallback()`` given to a
        trainer made in the cell.
        """
        plan = self._plan(_parse(self.neuraldbg_cell, line), cell)
        self._run(plan, cell)

    def _trainer(self, args, cell: str):
        """The framework trainer the cell trains with, if any."""
        if args.trainer:
            trainer = self._eval(args.trainer, "--trainer")
            if trainer_kind(trainer) is None:
                raise UsageError(f"--trainer {args.trainer!r} is a {type(trainer).__name__}, "
                                 "not a PyTorch Lightning or Hugging Face Trainer")
            return trainer
        found = trainer_candidates(self.shell.user_ns, cell)
        if len(found) > 1:
            names = ", ".join(n for n, _ in found)
            raise UsageError(f"the cell names several trainers ({names}): pick one, e.g. --trainer {found[0][0]}")
        return found[0][1] if found else None

    def _plan(self, args, cell: str = "") -> _Plan:
        ns = self.shell.user_ns
        trainer = self._trainer(args, cell)
        kind = trainer_kind(trainer) if trainer is not None else None
        if args.model:
            model = self._eval(args.model, "MODEL")
            if not isinstance(model, nn.Module):
                raise UsageError(f"MODEL {args.model!r} is a {type(model).__name__}, not a torch.nn.Module")
            model_name = args.model
        elif kind == "transformers":
            model, model_name = trainer.model, f"{args.trainer or 'trainer'}.model"
        else:
            found = model_candidates(ns, lightning=kind == "lightning")
            if not found:
                raise UsageError("no torch.nn.Module in the namespace: create the model first, "
                                 "or name it: %%neuraldbg MODEL")
            if len(found) > 1:
                names = ", ".join(n for n, _ in found)
                raise UsageError(f"several models in the namespace ({names}): name one, "
                                 f"e.g. %%neuraldbg {found[0][0]}")
            model_name, model = found[0]
        if args.optimizer:
            optimizer = self._eval(args.optimizer, "--optimizer")
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise UsageError(f"--optimizer {args.optimizer!r} is a {type(optimizer).__name__}, "
                                 "not a torch.optim.Optimizer")
        else:
            found_opt = optimizer_for(ns, model)
            optimizer = found_opt[1] if found_opt else None
        every = args.every if args.every is not None else self.every
        if every is not None and every < 1:
            raise UsageError(f"--every must be a positive integer, got {every}")
        loss = args.loss if args.loss is not None else self.loss
        if loss:
            _identifier(loss, "--loss")
        out = _identifier(args.out if args.out is not None else self.out, "--out")
        flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(Thresholds)
                 if getattr(args, f.name, None) is not None}
        try:
            thresholds = Thresholds(**self.thresholds)
        except (TypeError, ValueError) as e:  # set before the check existed, or by hand
            raise UsageError(f"bad thresholds in %config NeuralDbgMagics.thresholds: {e}") from None
        try:
            thresholds = thresholds.replace(**flags)
        except ValueError as e:
            raise UsageError(f"bad threshold flag: {e}") from None
        widgets = self.live and not args.no_live and self._widgets_available()
        return _Plan(model, model_name, optimizer, thresholds, every, loss, out, widgets, trainer)

    def _eval(self, expr: str, what: str):
        try:
            return self.shell.ev(expr)
        except Exception as e:  # noqa: BLE001 - any failure of the user's expression is a usage error
            raise UsageError(f"{what} {expr!r} could not be evaluated: {type(e).__name__}: {e}") from None

    def _widgets_available(self) -> bool:
        if self.frontend == "text":
            return False
        if self.frontend == "widgets":
            return True
        return _widget_frontend(self.shell)

    def _new_dashboard(self, title: str):
        from ._dashboard import Dashboard

        return Dashboard(fold_above=self.fold_above, chart_interval=self.chart_interval, clock=self.clock,
                         title=title)

    def _run(self, plan: _Plan, cell: str) -> None:
        ns = self.shell.user_ns
        feed = _LossFeed(ns, plan.loss)
        dash = self._new_dashboard(plan.model_name) if plan.widgets else None
        try:
            dbg = NeuralDbg(plan.model, plan.optimizer, plan.thresholds, every=plan.every,
                            on_step=dash.on_step if dash is not None else None,
                            update_interval=self.update_interval, clock=self.clock, after_step=feed)
            dbg.start()
        except (TypeError, ValueError, RuntimeError) as e:
            raise UsageError(str(e)) from None
        outer = self.shell.displayhook.exec_result  # the %%neuraldbg cell's own result
        result = None
        handle = None
        try:
            ns[plan.out] = dbg
            if dash is not None:
                try:
                    dash.watch(dbg)
                except Exception as e:  # noqa: BLE001 - a view failure must not stop the user's cell
                    dash._fail(e)
                handle = display(dash.root, display_id=True)
                try:
                    self._keep(dash, handle)
                except Exception as e:  # noqa: BLE001 - an older view's failure must not stop this cell
                    print(f"neuraldbg: could not retire an older dashboard: {type(e).__name__}: {e}")
            with contextlib.ExitStack() as stack:  # trainers report to this session while the cell runs
                stack.enter_context(session_scope(dbg))
                if plan.trainer is not None:
                    stack.enter_context(bind(plan.trainer, dbg))
                result = self.shell.run_cell(cell)  # shows the user's traceback, displays the last value
        finally:
            dbg.stop()  # every way out: hooks removed
            feed.close()
            ns[plan.out] = dbg
            self.session, self.dashboard = dbg, dash
            self.shell.displayhook.exec_result = outer
        error = None if result is None else (result.error_before_exec or result.error_in_exec)
        outcome = ("finished" if error is None else
                   "interrupted" if isinstance(error, KeyboardInterrupt) else "error")
        did_not_compile = result is not None and result.error_before_exec is not None
        if dash is not None or not did_not_compile:  # nothing ran: no verdict to print
            self._verdict(dbg, dash, handle, outcome)
        if error is not None and outer is not None:
            outer.error_in_exec = error  # the cell fails as it would without the magic

    def _verdict(self, dbg: NeuralDbg, dash, handle, outcome: str) -> None:
        try:
            if dash is not None:
                dash.finish(outcome)
                self._show_static(dash)  # after the cell's own output, as a text verdict would be
                return
            print(verdict_text(dbg, outcome))
        except Exception as e:  # noqa: BLE001 - the user's own outcome was shown; say why ours is missing
            print(f"neuraldbg: could not analyse the run: {type(e).__name__}: {e}")

    @staticmethod
    def _show_static(dash, panel_only: bool = False) -> None:
        """Display the dashboard's static companion (what exports and viewers without widgets show)."""
        handle = display(dash.static_bundle(panel_only), raw=True, display_id=True)
        if handle is not None:
            dash.static_handles.append((handle, panel_only))

    # -- %neuraldbg -------------------------------------------------------------------------------
    @magic_arguments(name="neuraldbg")
    @argument("command", choices=("explain", "report", "save", "load", "thresholds"),
              help="what to do with the last session")
    @argument("path", nargs="?", help="the trace file, for save and load (load: or a run directory of rank files)")
    @line_magic("neuraldbg")
    def neuraldbg_line(self, line):
        """Work on the last session: explain, report, save PATH, load PATH (the dashboard of a saved
        trace, or of the ranks of a run directory merged; the session goes into ``_ndbg``), thresholds
        (sliders that re-analyse the trace)."""
        args = _parse(self.neuraldbg_line, line)
        path = args.path
        if path and len(path) >= 2 and path[0] == path[-1] and path[0] in "'\"":
            path = path[1:-1]  # the argument splitter keeps quotes: %neuraldbg load "my run.ndbg"
        if args.command in ("save", "load") and not path:
            raise UsageError(f"%neuraldbg {args.command} needs a PATH")
        if args.command not in ("save", "load") and path:
            raise UsageError(f"%neuraldbg {args.command} takes no argument")
        if args.command == "load":
            return self._load(path)
        dbg = self._current()
        if args.command == "explain":
            verdict = dbg.explain()  # Markdown, not HTML: a text export keeps it as text
            display({"text/markdown": verdict.markdown(), "text/plain": verdict.text()}, raw=True)
        elif args.command == "report":
            print(dbg.report())
        elif args.command == "save":
            try:
                dbg.save(path)
            except (OSError, ValueError) as e:
                raise UsageError(f"cannot save to {path!r}: {e}") from None
            print(f"saved {dbg.step} steps to {path}")
        else:
            self._thresholds(dbg)
        return None

    def _current(self) -> NeuralDbg:
        if self.session is not None:
            return self.session
        dbg = self.shell.user_ns.get(self.out)
        if isinstance(dbg, NeuralDbg):
            return dbg
        raise UsageError("no session yet: run a cell under %%neuraldbg, or %neuraldbg load PATH")

    def _load(self, path: str) -> None:
        try:
            dbg = NeuralDbg.load(path)
        except (OSError, ValueError) as e:
            raise UsageError(f"cannot load {path!r}: {e}") from None
        self.shell.user_ns[self.out] = dbg
        self.session, self.dashboard = dbg, None
        if self.live and self._widgets_available():
            dash = self._new_dashboard(f"trace {path}")
            dash.show(dbg, "loaded")
            self.dashboard = dash
            self._keep(dash, display(dash.root, display_id=True))
            self._show_static(dash)
        else:
            print(verdict_text(dbg, "loaded"))

    def _thresholds(self, dbg: NeuralDbg) -> None:
        if not self._widgets_available():
            print("Thresholds (change one with _ndbg.reanalyze(name=value), %%neuraldbg --name VALUE, or "
                  "%config NeuralDbgMagics.thresholds = {'name': value}):\n" + dbg.thresholds.describe())
            return
        dash = self.dashboard
        if dash is None or dash.dbg is not dbg:
            dash = self._new_dashboard("")
            dash.show(dbg, "loaded" if dbg.model is None else "finished")
            self.dashboard = dash
            self._keep(dash, display(dash.thresholds_view(), display_id=True))
        else:
            handle = display(dash.thresholds_view(), display_id=True)
            for kept, handles in self._live:
                if kept is dash:  # a second view of a kept dashboard: retired with it
                    handles.append(handle)
        self._show_static(dash, panel_only=True)

    def _keep(self, dash, handle) -> None:
        """Track a new dashboard; beyond ``live_dashboards``, the oldest becomes a static copy."""
        self._live.append((dash, [handle] if handle is not None else []))
        while len(self._live) > self.live_dashboards:
            # the oldest that is not watching a run now (a %neuraldbg load inside a watched cell), and
            # never the one just shown
            k = next((i for i, (d, _) in enumerate(self._live[:-1]) if d.state != "watching"), None)
            if k is None:
                break
            old, handles = self._live.pop(k)
            old.retire()
            for h in handles:  # its static companions, below each view, now show in its place
                h.update({"text/html": "", "text/plain": ""}, raw=True)

    def close(self) -> None:
        if self.session is not None and self.session.watching:
            self.session.stop()
        self.session = self.dashboard = None
        self._live.clear()
