"""Threshold sliders, generated from the ``Thresholds`` field metadata, and a reset button, in a
"Thresholds" section that starts collapsed.

Each numeric field whose metadata names a ``scale`` gets a slider over its documented range:
logarithmic for norms and ratios, linear for fractions. A slider is labelled with the field's name,
as ``reanalyze(name=...)``, ``%%neuraldbg --name`` and ``%config`` spell it, and says what it means
on hover. Moving one calls ``on_change`` with the new ``Thresholds``; the dashboard re-runs the
analysis on the recorded trace (the model is not touched).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import ipywidgets as widgets

from neuraldbg import Thresholds


def slider_fields() -> list[dataclasses.Field]:
    """The ``Thresholds`` fields that get a slider (numeric, with a min/max in their metadata, and meant for one)."""
    out = []
    defaults = Thresholds()
    for f in dataclasses.fields(Thresholds):
        md = f.metadata
        value = getattr(defaults, f.name)
        if ("min" in md and "max" in md and md.get("slider", True) and isinstance(value, (int, float))
                and not isinstance(value, bool)):
            out.append(f)
    return out


def _slider(f: dataclasses.Field, value) -> widgets.Widget:
    md = f.metadata
    lo, hi = float(md["min"]), float(md["max"])
    tip = f"{f.name}: {md.get('doc', '')} (from {lo:g} to {hi:g}; default {f.default})"
    common = dict(description=f.name, tooltip=tip,
                  continuous_update=False, style={"description_width": "11.5em"},
                  layout=widgets.Layout(width="32em", max_width="100%"))
    if md.get("scale") == "log" and lo > 0:
        lmin, lmax = math.log10(lo), math.log10(hi)
        s = widgets.FloatLogSlider(value=value, base=10, min=lmin, max=lmax, step=(lmax - lmin) / 200,
                                   readout_format=".3g", **common)
    elif isinstance(value, int):
        s = widgets.IntSlider(value=value, min=int(lo), max=int(hi), step=1, **common)
    else:
        s = widgets.FloatSlider(value=value, min=lo, max=hi, step=(hi - lo) / 200, readout_format=".3g", **common)
    s.add_class("ndbg-slider")
    s.add_class(f"ndbg-slider-{f.name}")
    return s


class ThresholdControls:
    """Sliders + reset. ``set_thresholds`` shows a session's thresholds without calling ``on_change``.

    The section starts collapsed and its sliders are made when it first opens (or when ``sliders`` is
    read): a dashboard that nobody tunes costs no slider (each is a few widget models, and each model a
    message to the front end while the training cell runs)."""

    def __init__(self, on_change: Callable[[Thresholds], None]):
        self.on_change = on_change
        self._base = Thresholds()
        self._enabled = True
        self._sliders: dict[str, widgets.Widget] | None = None
        self._reset: widgets.Button | None = None
        self._quiet = False
        self._moved: dict[str, float] = {}  # values set by the user since the last set/reset
        self._groups: dict[str, bool] = {"ranks": False}  # groups of sliders shown (ranks: multi-process runs)
        self._body = widgets.VBox([])
        self.widget = widgets.Accordion(children=[self._body], titles=("Thresholds",), selected_index=None)
        self.widget.add_class("ndbg-thresholds")
        self.widget.observe(lambda change: self._build() if change["new"] is not None else None,
                            names="selected_index")

    @property
    def built(self) -> bool:
        return self._sliders is not None

    @property
    def sliders(self) -> dict[str, widgets.Widget]:
        return self._build()

    @property
    def reset(self) -> widgets.Button:
        self._build()
        assert self._reset is not None
        return self._reset

    def _build(self) -> dict[str, widgets.Widget]:
        if self._sliders is not None:
            return self._sliders
        sliders = {f.name: _slider(f, getattr(self._base, f.name)) for f in slider_fields()}
        reset = widgets.Button(description="Reset thresholds", icon="undo", tooltip="back to the default thresholds")
        reset.add_class("ndbg-reset")
        reset.on_click(lambda _: self.reset_defaults())
        for name, s in sliders.items():
            s.observe(lambda change, name=name: self._changed(name, change["new"]), names="value")
        self._sliders, self._reset = sliders, reset
        hint = widgets.HTML('<span style="color:var(--jp-ui-font-color2,#616161)">Each slider re-analyses the '
                            "recorded run (no retraining); the same names work in "
                            "<code>_ndbg.reanalyze(name=value)</code> and <code>%%neuraldbg --name VALUE</code>."
                            "</span>")
        self._set_values(self._base, notify=False, keep_moved=True)
        self.set_enabled(self._enabled)
        for group, visible in self._groups.items():
            self._apply_group(group, visible)
        self._body.children = [hint, *sliders.values(), reset]
        return sliders

    @property
    def thresholds(self) -> Thresholds:
        # only moved sliders count: a slider clamps values outside its range, the session's do not change
        return self._base.replace(**self._moved)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        self._base = thresholds
        self._set_values(thresholds, notify=False)

    def reset_defaults(self) -> None:
        self._base = Thresholds()
        self._set_values(self._base, notify=True)

    def show_group(self, group: str, visible: bool) -> None:
        """Show or hide the sliders of one group of thresholds (``ranks``: only for multi-process runs)."""
        self._groups[group] = visible
        self._apply_group(group, visible)

    def _apply_group(self, group: str, visible: bool) -> None:
        if self._sliders is None:
            return
        for f in slider_fields():
            if f.metadata.get("group", "") == group:
                self._sliders[f.name].layout.display = "" if visible else "none"

    def expand(self, is_open: bool = True) -> None:
        """Open (or close) the collapsed "Thresholds" section."""
        self.widget.selected_index = 0 if is_open else None

    def set_enabled(self, enabled: bool) -> None:
        self._enabled = enabled
        if self._sliders is not None and self._reset is not None:
            for w in (*self._sliders.values(), self._reset):
                w.disabled = not enabled

    def _set_values(self, thresholds: Thresholds, notify: bool, keep_moved: bool = False) -> None:
        if not keep_moved:
            self._moved = {}
        if self._sliders is not None:
            self._quiet = True
            try:
                for name, s in self._sliders.items():
                    s.value = getattr(thresholds, name)
            finally:
                self._quiet = False
        if notify:
            self.on_change(self.thresholds)

    def _changed(self, name: str, value) -> None:
        if not self._quiet:
            self._moved[name] = value
            self.on_change(self.thresholds)
