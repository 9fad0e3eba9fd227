"""The live dashboard: progress, chart, health grid, explanation panel and the collapsed threshold sliders.

What training pays for it. Built once from a handful of widgets (those without a layout of their own
share one layout and one style model: every widget model is a message to the front end); the
threshold sliders are made the first time their section opens. The hub calls ``on_step`` between
steps, at most every ``update_interval`` seconds; there the dashboard only:

- sets the progress line (step, steps/s, last loss; one small message) at most every ``PROGRESS_EVERY``
  seconds;
- shows a frame drawn since (grid, panel and chart values);
- hands a copy of the trace (``NeuralDbg.snapshot``) to the renderer, when its budget allows.

The renderer analyses the copy and draws the grid, the panel and the chart as text, on a thread of its
own in a kernel (``threaded``: widgets are only ever set on the training thread, between steps), or
right there when the clock is a test's. Its cost (the copy, the drawing in thread CPU time, showing the
frame) keeps it to ``SHARE`` of the wall time: after a frame that cost ``c`` seconds, the next waits
``c / SHARE``. The chart is drawn at most every ``chart_interval`` seconds. When the run ends, the final
frame is drawn at once.

Every view of a dashboard has a static companion (``static_bundle``): its final state as
self-contained HTML (no widget, no script, nothing from a network) and as text. The magic shows it
after the cell's own output; a live view hides it (a style only the live widgets carry), and
wherever widgets do not render (an exported notebook, a viewer without a kernel) it is what shows.
"""
from __future__ import annotations

import contextvars
import html
import math
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass

import ipywidgets as widgets
from ipywidgets.widgets.widget_string import HTMLStyle

from neuraldbg import Throttle, Verdict
from neuraldbg.formatting import number

from ._chart import Chart, render_chart
from ._controls import ThresholdControls
from ._grid import HealthGrid, Row, fold, grid_html, with_warnings
from ._outcome import outcome
from ._ranks import RankSelector
from ._states import Unobserved

# Share of wall time the live dashboard may use while training (see the module docstring).
SHARE = 0.02
# Seconds between two updates of the progress line, at least.
PROGRESS_EVERY = 0.5

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


@dataclass
class Frame:
    """One drawing of a session's state: HTML text, ready to be set on the widgets."""

    grid: str
    groups: list
    types: dict
    health: dict
    panel: str
    chart: str | None = None       # None: the chart is not redrawn in this frame
    chart_key: tuple | None = None
    verdict: Verdict | None = None


class _Renderer:
    """Draws frames on a thread of its own: ``submit`` a snapshot, collect the result with ``take``."""

    def __init__(self, draw):
        self._draw = draw
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._job = None
        self._done = None
        self._stopping = False
        self.busy = False
        # the thread runs in the cell's context (its messages, if any, belong to the cell)
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._loop,),
                                        name="neuraldbg-dashboard", daemon=True)
        self._thread.start()

    def submit(self, job) -> None:
        with self._lock:
            self._job, self.busy = job, True
        self._event.set()

    def take(self):
        """The last result (frame or exception, thread CPU seconds), once; None when there is none."""
        with self._lock:
            done, self._done = self._done, None
        return done

    def _loop(self) -> None:
        while True:
            self._event.wait()
            self._event.clear()
            if self._stopping:
                return
            with self._lock:
                job, self._job = self._job, None
            if job is None:
                continue
            start = time.thread_time()
            try:
                result = self._draw(*job)
            except Exception as e:  # noqa: BLE001 - shown in the dashboard by the training thread
                result = e
            with self._lock:
                self._done, self.busy = (result, time.thread_time() - start), False

    def stop(self) -> None:
        self._stopping = True
        self._event.set()
        self._thread.join(timeout=10)


class Dashboard:
    """One dashboard per session. ``watch(dbg)`` before a run, ``on_step`` during, ``finish`` after;
    ``show(dbg)`` for a finished or loaded session. ``threaded``: draw on a thread of its own while
    training (None: when the clock is the real one; a test's clock gets frames drawn in place)."""

    def __init__(self, *, fold_above: int = 40, chart_interval: float = 1.0, clock=time.monotonic,
                 title: str = "", threaded: bool | None = None):
        self.clock = clock
        self.threaded = (clock is time.monotonic) if threaded is None else threaded
        self.dbg = None
        self.state = "watching"
        self.title = title
        self.uid = uuid.uuid4().hex[:12]
        self.updates = 0                  # frames shown (grid and panel; the chart when due)
        self.error: BaseException | None = None
        self.static_handles: list = []    # display handles of the static companions, kept current
        self._chart_throttle = Throttle(chart_interval, clock)
        self._t0 = None
        self._t_end = None
        self._last_rate_point = None
        self._rate = math.nan
        self._not_before = -math.inf
        self._last_progress = -math.inf
        self._renderer: _Renderer | None = None
        self._submitted = 0.0             # training-thread seconds spent on the frame being drawn
        self._thresholds_view = None

        # widgets: one layout and one style shared by all that need none of their own
        plain, style = widgets.Layout(), HTMLStyle()
        self.progress = widgets.HTML(layout=plain, style=style)  # the title and the progress line
        self.progress.add_class("ndbg-progress")
        self.grid = HealthGrid(fold_above, style=style)
        self.chart = Chart(layout=widgets.Layout(max_width="100%"), style=style)
        self.note = widgets.HTML(layout=plain, style=style)
        self.note.add_class("ndbg-reanalysed")
        self.panel = widgets.HTML(layout=plain, style=style)
        self.panel.add_class("ndbg-panel")
        self.controls = ThresholdControls(self._thresholds_changed)
        self.ranks = RankSelector(self._rank_changed)
        self.status = widgets.HTML(layout=plain, style=style)
        # hides this dashboard's static companions wherever a live view of it renders
        self._hide = widgets.HTML(f'<style>.ndbg-static[data-ndbg="{self.uid}"]{{display:none}}'
                                  f'.jp-OutputArea-child:has(.ndbg-static[data-ndbg="{self.uid}"]){{display:none}}'
                                  "</style>", layout=widgets.Layout(display="none"), style=style)
        right = widgets.VBox([self.note, self.panel], layout=widgets.Layout(flex="1 1 26em", min_width="22em"))
        body = widgets.HBox([self.grid.widget, right], layout=widgets.Layout(flex_flow="row wrap"))
        self.root = _Root([self.progress, self.ranks.widget, self.chart.widget, body, self.controls.widget,
                           self.status, self._hide], layout=plain)
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
        if self.threaded:
            self._renderer = _Renderer(self._draw)

    def finish(self, outcome: str = "finished") -> None:
        """The run is over (``finished``, ``error`` or ``interrupted``): the post-mortem view."""
        self._stop_renderer()
        self.state = outcome
        self._t_end = self.clock()
        self._final()

    def show(self, dbg, outcome: str = "loaded") -> None:
        """Show a session that is not training (loaded from a file, or an earlier run). A merged
        multi-process run opens on the rank where its top hypothesis starts."""
        self._stop_renderer()
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

    def _stop_renderer(self) -> None:
        renderer, self._renderer = self._renderer, None
        if renderer is not None:
            renderer.stop()

    # -- updates while training -------------------------------------------------------------------
    def on_step(self, dbg) -> None:
        """The hub's throttled callback during training (between steps); never raises into the loop."""
        if self.error is not None:
            return
        start = self.clock()
        try:
            self._on_step(dbg, start)
        except Exception as e:  # noqa: BLE001 - a view failure must not stop training
            self._fail(e)

    def _on_step(self, dbg, start: float) -> None:
        renderer = self._renderer
        if renderer is not None:
            done = renderer.take()
            if done is not None:  # a frame drawn on the renderer's thread: shown now, between steps
                result, cpu = done
                if isinstance(result, BaseException):
                    raise result
                self._show(result)
                self._budget(self._submitted + cpu + (self.clock() - start))
                return
        if start - self._last_progress >= PROGRESS_EVERY:
            self.progress.value = self._progress_html()
            self._last_progress = start
        if start < self._not_before or (renderer is not None and renderer.busy):
            return
        chart = self._chart_throttle.ready()
        if renderer is not None:
            renderer.submit((dbg.snapshot(), chart, True))
            self._submitted = self.clock() - start
            self._not_before = math.inf  # until the frame is back
        else:
            self._show(self._draw(dbg, chart, True))
            self._budget(self.clock() - start)

    def _budget(self, cost: float) -> None:
        """The next frame waits until the dashboard has used at most ``SHARE`` of the time since this one."""
        self._not_before = self.clock() + max(cost, 0.0) * (1 / SHARE - 1)

    def refresh(self, chart: bool = False) -> None:
        """Draw and show a frame of the session now (the chart too when its throttle allows, or ``chart``)."""
        self._show(self._draw(self.dbg, self._chart_throttle.ready(force=chart), self.state == "watching"))

    def _measured(self, dbg) -> bool:
        view = dbg.view
        return len(view.steps) > 0 or len(view.loss) > 0

    def _draw(self, dbg, chart: bool, live: bool) -> Frame:
        """A frame of ``dbg`` (the session, or a snapshot of it on the renderer's thread): text only, no widget."""
        measured = self._measured(dbg)
        verdict = dbg.explain() if measured else Verdict([], steps=dbg.step)  # nothing to analyse before a step
        view = dbg.view
        every = view.layers  # (a tuple made on each read)
        layers = [every[i] for i in view.order]
        health = dict(dbg.health()) if measured else {}
        if health:  # once something is measured, a layer with no place in the forward order was not observed
            health.update({l.name: Unobserved() for l in layers if l.order is None})
        # early warnings and their forecasts, from the statistics already sampled (nothing on the training path)
        warnings = dbg.warnings() if measured else []
        if warnings:
            health = with_warnings(health, warnings)
        groups = fold([l.name for l in layers], self.grid.fold_above)
        types = {l.name: l.type_name for l in layers}
        rows = [Row(g.key, g.members, group=g.foldable) for g in groups]
        frame = Frame(grid=grid_html(groups, types, health), groups=groups, types=types, health=health,
                      panel=verdict.html(live=live, warnings=warnings), verdict=verdict)
        if chart:
            members = {g.key: [Row(m, (m,)) for m in g.members] for g in groups if g.foldable}
            key = self.chart.key(view, rows, members)
            if self.chart.stale(key):
                frame.chart, frame.chart_key = render_chart(view, rows, members), key
        return frame

    def _show(self, frame: Frame) -> None:
        """Set a frame's values on the widgets (the training thread, between steps)."""
        with ExitStack() as held:
            for w in (self.progress, self.panel, self.grid.widget):
                held.enter_context(w.hold_sync())
            self.grid.show(frame.grid, frame.groups, frame.types, frame.health)
            self.panel.value = frame.panel
            self.progress.value = self._progress_html()
            self._last_progress = self.clock()
        if frame.chart is not None and frame.chart_key is not None:
            self.chart.show(frame.chart_key, frame.chart)
        self._show_ranks()
        self.updates += 1

    def _show_ranks(self) -> None:
        if self.ranks.visible and self.dbg is not None:
            self.ranks.update(self.dbg)  # the ranks flagged follow the thresholds

    def _verdict(self) -> Verdict:
        return self.dbg.explain() if self._measured(self.dbg) else Verdict([], steps=self.dbg.step)

    def _draw_analysis(self) -> Verdict:
        """Draw and show the grid and the panel of the session now (after a threshold moved)."""
        frame = self._draw(self.dbg, False, self.state == "watching")
        with ExitStack() as held:
            for w in (self.panel, self.grid.widget):
                held.enter_context(w.hold_sync())
            self.grid.show(frame.grid, frame.groups, frame.types, frame.health)
            self.panel.value = frame.panel
        self._show_ranks()
        return frame.verdict if frame.verdict is not None else self._verdict()

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
        loss = dbg.last_loss
        if math.isfinite(loss):
            parts.append(f"loss {number(loss)}")
        if self._t0 is not None:
            now = self._t_end if self._t_end is not None else self.clock()
            parts.append(f"{_elapsed(now - self._t0)} elapsed")
        return self._header_html() + f'<div style="{_FONT}">' + " &middot; ".join(parts) + "</div>"

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
            parts = [self._header_html(), self.note.value, self.panel.value]
        else:
            parts = [self.progress.value, self.chart.widget.value,
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
        self._stop_renderer()
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
