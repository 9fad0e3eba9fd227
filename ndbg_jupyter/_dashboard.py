"""The live dashboard: progress, chart, health grid, explanation panel and the collapsed threshold sliders.

Built once; afterwards only widget values change. The hub calls ``on_step`` at most every
``update_interval`` seconds (its ``Throttle``); on top of that the dashboard keeps its own work
under about a tenth of the wall time, and redraws the chart at most every ``chart_interval``.

Every view of a dashboard has a static companion (``static_bundle``): its final state as
self-contained HTML (no widget, no script, nothing from a network) and as text. The magic shows it
after the cell's own output; a live view hides it (a style only the live widgets carry), and
wherever widgets do not render (an exported notebook, a viewer without a kernel) it is what shows.
"""
from __future__ import annotations

import html
import math
import time
import uuid
from contextlib import ExitStack

import ipywidgets as widgets

from neuraldbg import Throttle, Verdict
from neuraldbg.formatting import number

from ._chart import Chart
from ._controls import ThresholdControls
from ._grid import HealthGrid
from ._outcome import outcome
from ._ranks import RankSelector
from ._states import Unobserved

# Share of wall time the live dashboard may use: after an update that took t seconds, the next
# one waits at least t * (1 / _SHARE - 1).
_SHARE = 0.1

_MUTED = "color:var(--jp-ui-font-color2,#616161)"
_FONT = "font:13px var(--jp-ui-font-family,sans-serif);color:var(--jp-ui-font-color1,inherit)"


class _Root(widgets.VBox):
    """The dashboard's outer box; its plain-text form (a front end without widgets) is its title: the
    verdict itself follows the cell's output, in the static companion."""

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


def _settings(thresholds) -> str:
    """The thresholds that differ from the defaults, as users type them (HTML)."""
    changed = thresholds.changed()
    if not changed:
        return "the default thresholds"
    return "<code>" + html.escape(", ".join(f"{k}={number(v)}" for k, v in changed.items())) + "</code>"


class Dashboard:
    """One dashboard per session. ``watch(dbg)`` before a run, ``on_step`` during, ``finish`` after;
    ``show(dbg)`` for a finished or loaded session."""

    def __init__(self, *, fold_above: int = 40, chart_interval: float = 1.0, clock=time.monotonic,
                 title: str = ""):
        self.clock = clock
        self.dbg = None
        self.state = "watching"
        self.title = title
        self.uid = uuid.uuid4().hex[:12]
        self.updates = 0                  # completed refreshes (grid, panel, progress)
        self.error: BaseException | None = None
        self.static_handles: list = []    # display handles of the static companions, kept current
        self._chart_throttle = Throttle(chart_interval, clock)
        self._t0 = None
        self._t_end = None
        self._last_rate_point = None
        self._rate = math.nan
        self._not_before = -math.inf
        self._thresholds_view = None

        self.header = widgets.HTML(self._header_html())
        self.progress = widgets.HTML()
        self.progress.add_class("ndbg-progress")
        self.grid = HealthGrid(fold_above, on_fold=self._redraw_chart)
        self.chart = Chart()
        self.note = widgets.HTML()
        self.note.add_class("ndbg-reanalysed")
        self.panel = widgets.HTML()
        self.panel.add_class("ndbg-panel")
        self.controls = ThresholdControls(self._thresholds_changed)
        self.ranks = RankSelector(self._rank_changed)
        self.status = widgets.HTML()
        # hides this dashboard's static companions wherever a live view of it renders
        self._hide = widgets.HTML(f'<style>.ndbg-static[data-ndbg="{self.uid}"]{{display:none}}'
                                  f'.jp-OutputArea-child:has(.ndbg-static[data-ndbg="{self.uid}"]){{display:none}}'
                                  "</style>", layout=widgets.Layout(display="none"))
        right = widgets.VBox([self.note, self.panel], layout=widgets.Layout(flex="1 1 26em", min_width="22em"))
        body = widgets.HBox([self.grid.widget, right], layout=widgets.Layout(flex_flow="row wrap"))
        self.root = _Root([self.header, self.progress, self.ranks.widget, self.chart.widget, body, self.controls.widget,
                           self.status, self._hide])
        self.root.add_class("ndbg-dashboard")
        self.root.text = f"NeuralDbg dashboard ({title})" if title else "NeuralDbg dashboard"

    def _header_html(self) -> str:
        name = f" &middot; {html.escape(self.title)}" if self.title else ""
        return f'<div style="{_FONT}"><b>NeuralDbg</b>{name}</div>'

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
            top = [h for h in dbg.explain().confident if h.rank is not None]
            if top:
                dbg.view_rank(top[0].rank)
        self._final()

    def _final(self) -> None:
        self.controls.set_thresholds(self.dbg.thresholds)
        self.controls.set_enabled(True)
        self.ranks.update(self.dbg)
        self.controls.show_group("ranks", len(getattr(self.dbg, "ranks", None) or []) > 1)
        self.refresh(chart=True)
        self.publish_static()

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
        with ExitStack() as held:
            for w in (self.progress, self.panel, *self.grid.widgets_to_sync()):
                held.enter_context(w.hold_sync())
            self._draw_analysis()
            self.progress.value = self._progress_html()
        if self._chart_throttle.ready(force=chart):
            self._redraw_chart()
        self.updates += 1

    def _redraw_chart(self) -> None:
        if self.dbg is not None:
            self.chart.update(self.dbg.view, self.grid.rows())

    def _measured(self) -> bool:
        view = self.dbg.view
        return len(view.steps) > 0 or len(view.loss) > 0

    def _verdict(self) -> Verdict:
        # nothing to analyse before the first step
        return self.dbg.explain() if self._measured() else Verdict([], steps=self.dbg.step)

    def _draw_analysis(self) -> Verdict:
        dbg = self.dbg
        verdict = self._verdict()
        view = dbg.view
        layers = [view.layers[i] for i in view.order]
        health = dict(dbg.health()) if self._measured() else {}
        if health:  # once something is measured, a layer with no place in the forward order was not observed
            health.update({l.name: Unobserved() for l in layers if l.order is None})
        # early warnings and their forecasts, from the statistics already sampled (nothing on the training path)
        warnings = dbg.warnings() if self._measured() else []
        self.grid.update(layers, health, warnings)
        self.panel.value = verdict.html(live=self.state == "watching", warnings=warnings)
        if self.ranks.visible:
            self.ranks.update(dbg)  # the ranks flagged follow the thresholds
        return verdict

    def _progress_html(self) -> str:
        dbg = self.dbg
        look = outcome(self.state)
        parts = [f'<b style="color:{look.colour}">{look.label}</b>', f"step {dbg.step}"]
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
                parts.append(f"{number(self._rate)} steps/s")
        loss = dbg.view.loss
        if len(loss):
            parts.append(f"loss {number(float(loss[-1]))}")
        if self._t0 is not None:
            now = self._t_end if self._t_end is not None else self.clock()
            parts.append(f"{_elapsed(now - self._t0)} elapsed")
        return f'<div style="{_FONT}">' + " &middot; ".join(parts) + "</div>"

    def _rank_changed(self, rank: int) -> None:
        if self.dbg is None:
            return
        try:
            self.dbg.view_rank(rank)
            self.refresh(chart=True)
            self.publish_static()
        except Exception as e:  # noqa: BLE001 - shown in the dashboard, not raised into a comm handler
            self.status.value = f'<span style="color:#c62828">rank view failed: {html.escape(repr(e))}</span>'

    # -- thresholds -------------------------------------------------------------------------------
    def thresholds_view(self) -> widgets.VBox:
        """A second view of the sliders (opened) with the panel they redraw (built once)."""
        if self._thresholds_view is None:
            self._thresholds_view = widgets.VBox([self.controls.widget, self.note, self.panel, self._hide])
            self._thresholds_view.add_class("ndbg-thresholds-view")
        self.controls.expand()
        return self._thresholds_view

    def _thresholds_changed(self, thresholds) -> None:
        if self.dbg is None:
            return
        start = time.perf_counter()
        try:
            before = [(h.cause, h.layer, h.step) for h in self._verdict().confident]
            self.dbg.reanalyze(thresholds)
            with ExitStack() as held:
                for w in (self.panel, *self.grid.widgets_to_sync()):
                    held.enter_context(w.hold_sync())
                verdict = self._draw_analysis()
            after = [(h.cause, h.layer, h.step) for h in verdict.confident]
            ms = (time.perf_counter() - start) * 1e3
            change = "the verdict did not change" if after == before else "the verdict changed"
            self.note.value = (f'<div class="ndbg-note" style="{_FONT};{_MUTED};margin:2px 0">Re-analysed with '
                               f"{_settings(thresholds)} in {ms:.0f} ms: {change}.</div>")
            self.status.value = ""
            self.publish_static()
        except Exception as e:  # noqa: BLE001 - shown in the dashboard, not raised into a comm handler
            self.status.value = f'<span style="color:#c62828">re-analysis failed: {html.escape(repr(e))}</span>'

    # -- the static companion ---------------------------------------------------------------------
    def static_html(self, panel_only: bool = False) -> str:
        """What the dashboard shows, as self-contained HTML: inline styles and SVG, no widget, no script."""
        if panel_only:
            parts = [self.header.value, self.note.value, self.panel.value]
        else:
            parts = [self.header.value, self.progress.value, self.chart.widget.value,
                     f'<div style="display:flex;flex-flow:row wrap;gap:8px"><div style="flex:1 1 34em;min-width:30em">'
                     f"{self.grid.static_html()}</div>"
                     f'<div style="flex:1 1 26em;min-width:22em">{self.note.value}'
                     f'<div class="ndbg-panel">{self.panel.value}</div></div></div>']
        if self.dbg is not None:
            parts.append(f'<div style="{_FONT};{_MUTED};font-size:12px;margin-top:4px">Analysed with '
                         f"{_settings(self.dbg.thresholds)}. A static copy of the dashboard: run the notebook "
                         "for the live one, whose sliders re-analyse the run.</div>")
        return (f'<div class="ndbg-static" data-ndbg="{self.uid}" style="{_FONT}">' + "".join(parts) + "</div>")

    def static_bundle(self, panel_only: bool = False) -> dict[str, str]:
        """The static companion as a display bundle: self-contained HTML and the text report."""
        text = self.dbg.report() if self.dbg is not None else self.root.text
        return {"text/html": self.static_html(panel_only), "text/plain": text}

    def publish_static(self) -> None:
        """Bring every static companion shown so far up to date (after a run, a slider move, a reset)."""
        for handle, panel_only in self.static_handles:
            handle.update(self.static_bundle(panel_only), raw=True)

    # -- retiring --------------------------------------------------------------------------------
    def retire(self) -> None:
        """Close every widget of this dashboard and let go of its session; its static companions stay as
        they are, and show once the widgets are gone. A notebook that runs many watched cells keeps a
        bounded number alive."""
        for w in (self.root, self._thresholds_view, self.controls.widget):
            if w is not None:
                _close_tree(w)
        self.dbg = None
        self.chart.close()
        self.state = "retired"

    def _fail(self, e: BaseException) -> None:
        self.error = e
        self.status.value = (f'<span style="color:#c62828">dashboard updates stopped: '
                             f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</span>")
