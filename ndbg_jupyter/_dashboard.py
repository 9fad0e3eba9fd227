"""The live dashboard: progress, health grid, chart, explanation panel and threshold sliders.

Built once; afterwards only widget values change. The hub calls ``on_step`` at most every
``update_interval`` seconds (its ``Throttle``); on top of that the dashboard keeps its own work
under about a tenth of the wall time, and redraws the chart at most every ``chart_interval``.
"""
from __future__ import annotations

import base64
import html
import math
import time
from contextlib import ExitStack

import ipywidgets as widgets

from neuraldbg.schedule import Throttle

from ._chart import Chart
from ._controls import ThresholdControls
from ._grid import HealthGrid
from ._panel import CONFIDENT, panel_html
from ._ranks import RankSelector

# Share of wall time the live dashboard may use: after an update that took t seconds, the next
# one waits at least t * (1 / _SHARE - 1).
_SHARE = 0.1

_OUTCOMES = {
    "watching": ("#1565c0", "watching"),
    "finished": ("#2e7d32", "finished"),
    "error": ("#c62828", "stopped by an exception"),
    "interrupted": ("#ef6c00", "interrupted"),
    "loaded": ("#455a64", "loaded from file"),
}


class _Root(widgets.VBox):
    """The dashboard's outer box; its plain-text form (nbconvert to text, terminals) is the verdict."""

    text = "NeuralDbg dashboard"

    def _repr_mimebundle_(self, **kwargs):
        data = super()._repr_mimebundle_(**kwargs)
        if data:
            data["text/plain"] = self.text
        return data


def _close_tree(w) -> None:
    """Close a widget, its children, and the layout and style widgets each one owns."""
    for child in getattr(w, "children", ()):
        _close_tree(child)
    for part in (getattr(w, "layout", None), getattr(w, "style", None)):
        if isinstance(part, widgets.Widget):
            part.close()
    w.close()


def _elapsed(seconds: float) -> str:
    m, s = divmod(max(seconds, 0.0), 60)
    return f"{int(m)}:{s:04.1f}"


class Dashboard:
    """One dashboard per session. ``watch(dbg)`` before a run, ``on_step`` during, ``finish`` after;
    ``show(dbg)`` for a finished or loaded session."""

    def __init__(self, *, fold_above: int = 40, chart_interval: float = 1.0, clock=time.monotonic,
                 title: str = ""):
        self.clock = clock
        self.dbg = None
        self.state = "watching"
        self.updates = 0                  # completed refreshes (grid, panel, progress)
        self.error: BaseException | None = None
        self._chart_throttle = Throttle(chart_interval, clock)
        self._t0 = None
        self._t_end = None
        self._last_rate_point = None
        self._rate = math.nan
        self._not_before = -math.inf
        self._thresholds_view = None

        self.progress = widgets.HTML()
        self.progress.add_class("ndbg-progress")
        self.grid = HealthGrid(fold_above)
        self.chart = Chart()
        self.panel = widgets.HTML(layout=widgets.Layout(flex="1 1 28em", min_width="24em"))
        self.panel.add_class("ndbg-panel")
        self.controls = ThresholdControls(self._thresholds_changed)
        self.ranks = RankSelector(self._rank_changed)
        self.status = widgets.HTML()
        header = widgets.HTML(f"<b>NeuralDbg</b> &middot; {html.escape(title)}" if title else "<b>NeuralDbg</b>")
        body = widgets.HBox([self.grid.widget, self.panel], layout=widgets.Layout(flex_flow="row wrap"))
        self.root = _Root([header, self.progress, self.ranks.widget, self.chart.widget, body, self.controls.widget,
                           self.status])
        self.root.add_class("ndbg-dashboard")

    # -- life cycle -------------------------------------------------------------------------------
    def watch(self, dbg) -> None:
        """Start showing a session that is about to train."""
        self.dbg = dbg
        self.state = "watching"
        self._t0 = self.clock()
        self._last_rate_point = (dbg.step, self._t0)
        self.controls.set_thresholds(dbg.thresholds)
        self.controls.set_enabled(False)  # the kernel is busy while training: sliders act afterwards
        self.ranks.update(dbg)
        self.root.text = "NeuralDbg: watching..."
        self.refresh(chart=True)

    def finish(self, outcome: str = "finished") -> None:
        """The run is over (``finished``, ``error`` or ``interrupted``): the post-mortem view."""
        self.state = outcome
        self._t_end = self.clock()
        self._final()

    def show(self, dbg, outcome: str = "loaded") -> None:
        """Show a session that is not training (loaded from a file, or an earlier run). A merged
        multi-process run opens on the rank where its top hypothesis starts."""
        self.dbg = dbg
        self.state = outcome
        if len(getattr(dbg, "ranks", None) or []) > 1:
            top = [h for h in dbg.explain() if h.confidence >= CONFIDENT and h.rank is not None]
            if top:
                dbg.view_rank(top[0].rank)
        self._final()

    def _final(self) -> None:
        self.controls.set_thresholds(self.dbg.thresholds)
        self.controls.set_enabled(True)
        self.ranks.update(self.dbg)
        self.controls.show_group("ranks", len(getattr(self.dbg, "ranks", None) or []) > 1)
        self.refresh(chart=True)
        try:
            self.root.text = self.dbg.report()
        except Exception as e:  # noqa: BLE001 - the view must not hide the user's own outcome
            self._fail(e)

    # -- updates ----------------------------------------------------------------------------------
    def on_step(self, dbg) -> None:
        """The hub's throttled callback during training; never raises into the training loop."""
        if self.error is not None:
            return
        start = self.clock()
        if start < self._not_before:
            return
        try:
            self.refresh()
        except Exception as e:  # noqa: BLE001 - a view failure must not stop training
            self._fail(e)
        cost = self.clock() - start
        self._not_before = start + cost / _SHARE

    def refresh(self, chart: bool = False) -> None:
        """Update progress, grid and panel from the session; the chart too when its throttle allows
        (or ``chart=True``)."""
        dbg = self.dbg
        with ExitStack() as held:
            for w in (self.progress, self.panel, *self.grid.widgets_to_sync()):
                held.enter_context(w.hold_sync())
            self._draw_analysis()
            self.progress.value = self._progress_html()
        if self._chart_throttle.ready(force=chart):
            self.chart.update(dbg.trace, [l.index for l in self._layers()])
        self.updates += 1

    def _draw_analysis(self) -> None:
        dbg = self.dbg
        measured = dbg.trace.stats.n > 0 or dbg.trace.loss.n > 0
        health = dbg.health() if measured else {}  # nothing to analyse before the first step
        hypotheses = dbg.explain() if measured else []
        self.grid.update(self._layers(), health)
        self.panel.value = panel_html(hypotheses, step=dbg.step, finished=self.state != "watching",
                                      measured=measured)
        if self.ranks.visible:
            self.ranks.update(dbg)  # the ranks flagged follow the thresholds

    def _layers(self):
        trace = self.dbg.trace
        seen = trace.execution_order()
        return seen + [l for l in trace.layers if l.order is None]

    def _progress_html(self) -> str:
        dbg = self.dbg
        colour, label = _OUTCOMES.get(self.state, ("#455a64", self.state))
        parts = [f'<b style="color:{colour}">{label}</b>', f"step {dbg.step}"]
        if self._t0 is not None:
            now = self._t_end if self._t_end is not None else self.clock()
            if self.state == "watching":
                s0, t0 = self._last_rate_point
                if now > t0 and dbg.step > s0:
                    self._rate = (dbg.step - s0) / (now - t0)
                    self._last_rate_point = (dbg.step, now)
            elif now > self._t0:
                self._rate = dbg.step / (now - self._t0)
            if math.isfinite(self._rate):
                parts.append(f"{self._rate:.3g} steps/s")
        loss = dbg.trace.loss
        if loss.n:
            parts.append(f"loss {float(loss.data[-1]):.4g}")
        if self._t0 is not None:
            now = self._t_end if self._t_end is not None else self.clock()
            parts.append(f"{_elapsed(now - self._t0)} elapsed")
        return '<div style="font:13px var(--jp-ui-font-family,sans-serif)">' + " &middot; ".join(parts) + "</div>"

    def _rank_changed(self, rank: int) -> None:
        if self.dbg is None:
            return
        try:
            self.dbg.view_rank(rank)
            self.refresh(chart=True)
            self.root.text = self.dbg.report()
        except Exception as e:  # noqa: BLE001 - shown in the dashboard, not raised into a comm handler
            self.status.value = f'<span style="color:#c62828">rank view failed: {html.escape(repr(e))}</span>'

    # -- thresholds -------------------------------------------------------------------------------
    def thresholds_view(self) -> widgets.VBox:
        """A second view of the sliders with the panel they redraw (built once)."""
        if self._thresholds_view is None:
            self._thresholds_view = widgets.VBox([self.controls.widget, self.panel])
        return self._thresholds_view

    def _thresholds_changed(self, thresholds) -> None:
        if self.dbg is None:
            return
        try:
            self.dbg.reanalyze(thresholds)
            with ExitStack() as held:
                for w in (self.panel, *self.grid.widgets_to_sync()):
                    held.enter_context(w.hold_sync())
                self._draw_analysis()
            self.root.text = self.dbg.report()
            self.status.value = ""
        except Exception as e:  # noqa: BLE001 - shown in the dashboard, not raised into a comm handler
            self.status.value = f'<span style="color:#c62828">re-analysis failed: {html.escape(repr(e))}</span>'

    # -- retiring --------------------------------------------------------------------------------
    def snapshot_html(self) -> str:
        """A static copy of what the dashboard shows (progress, chart, grid, panel): no widgets."""
        parts = [self.root.children[0].value, self.progress.value]
        if self.chart.widget.value:
            png = base64.b64encode(self.chart.widget.value).decode("ascii")
            parts.append(f'<img class="ndbg-chart" style="max-width:100%" src="data:image/png;base64,{png}">')
        grid = "".join(w.value for w in self.grid.widgets_to_sync() if w.value)
        parts.append(f'<div style="display:flex;flex-flow:row wrap"><div class="ndbg-grid" style="min-width:30em;flex:0 0 auto">'
                     f'{grid}</div><div class="ndbg-panel" style="flex:1 1 28em;min-width:24em">'
                     f"{self.panel.value}</div></div>")
        parts.append('<div style="color:#757575;font-size:12px">An earlier run: a static copy. '
                     "<code>%neuraldbg thresholds</code> re-analyses the latest one.</div>")
        return '<div class="ndbg-dashboard ndbg-archived">' + "".join(parts) + "</div>"

    def retire(self) -> str:
        """Close every widget of this dashboard and let go of its session; returns the static copy to
        show in its place. A notebook that runs many watched cells keeps a bounded number alive."""
        snapshot = self.snapshot_html()
        for w in (self.root, self._thresholds_view, self.controls.widget):
            if w is not None:
                _close_tree(w)
        self.dbg = None
        self.chart.close()
        self.state = "retired"
        return snapshot

    def _fail(self, e: BaseException) -> None:
        self.error = e
        self.status.value = (f'<span style="color:#c62828">dashboard updates stopped: '
                             f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</span>")
