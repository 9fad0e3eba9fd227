"""The health grid: one row per watched layer, activation and gradient state as colour and label.

Models with more than ``fold_above`` layers fold into their parent modules: a folded row shows the
worst state of its members and unfolds on demand. The widgets are built once per layer layout;
updates only change HTML values.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

import ipywidgets as widgets

from ._states import NONFINITE, NOT_OBSERVED, look, value_of, worst

_ROW_STYLE = ("display:grid;grid-template-columns:minmax(10em,1fr) 9em 7em 7em 4.5em;gap:4px;"
              "align-items:center;font:12px/1.6 var(--jp-code-font-family,monospace);padding:0 2px")
_CHIP = ("display:inline-block;min-width:6em;text-align:center;border-radius:3px;padding:0 4px;"
         "color:#fff;background:{colour}")


@dataclass(frozen=True)
class Group:
    """A row of the grid: one layer, or a parent module folding several layers."""

    key: str               # qualified name of the layer or of the parent module
    members: tuple[str, ...]

    @property
    def foldable(self) -> bool:
        return len(self.members) > 1


def fold(names: list[str], max_rows: int) -> list[Group]:
    """Rows for ``names`` (in display order): the deepest grouping by parent module with at most
    ``max_rows`` rows; consecutive top-level groups are merged when even that is too many."""
    if len(names) <= max_rows:
        return [Group(n, (n,)) for n in names]
    depth = max(n.count(".") + 1 for n in names)
    best = None
    for d in range(1, depth):
        groups = _group_at(names, d)
        if len(groups) > max_rows:
            break  # deeper groupings only refine this one
        best = groups
    if best is None:
        best = _chunk(_group_at(names, 1), max_rows)
    return [g if g.foldable else Group(g.members[0], g.members) for g in best]


def _group_at(names: list[str], depth: int) -> list[Group]:
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(".".join(n.split(".")[:depth]), []).append(n)
    return [Group(k, tuple(v)) for k, v in members.items()]


def _chunk(groups: list[Group], max_rows: int) -> list[Group]:
    size = math.ceil(len(groups) / max_rows)
    out = []
    for i in range(0, len(groups), size):
        part = groups[i:i + size]
        key = part[0].key if len(part) == 1 else f"{part[0].key}..{part[-1].key}"
        out.append(Group(key, tuple(m for g in part for m in g.members)))
    return out


def _chip(state_value: str, title: str = "") -> str:
    lk = look(state_value)
    return f'<span style="{_CHIP.format(colour=lk.colour)}" title="{html.escape(title)}">{lk.label}</span>'


def row_html(name: str, type_name: str, health, observed: bool = True) -> str:
    """The HTML of one layer's row (``health`` may be None before the layer has been measured; a layer
    not ``observed`` -- its forward never ran, or it only returned its input -- shows so, not healthy)."""
    act = value_of(getattr(health, "act", None)) if observed else NOT_OBSERVED
    grad = value_of(getattr(health, "grad", None)) if observed else NOT_OBSERVED
    nonfinite = bool(getattr(health, "nonfinite", False))
    flag = (f'<span style="{_CHIP.format(colour=NONFINITE.colour)};min-width:0">{NONFINITE.label}</span>'
            if nonfinite else "")
    label = html.escape(name or "(model)")
    numbers = getattr(health, "values", None) or {}
    shown = [f"{k.replace('_', ' ')} {v:.3g}" for k, v in numbers.items()
             if isinstance(v, (int, float)) and math.isfinite(v)]
    title = html.escape("\n".join([name or "(model)", *shown]))  # the numbers the states were decided on
    return (f'<div class="ndbg-row" data-layer="{html.escape(name)}" data-act="{act}" data-grad="{grad}"'
            f' data-nonfinite="{str(nonfinite).lower()}" style="{_ROW_STYLE}">'
            f'<span title="{title}" style="overflow:hidden;text-overflow:ellipsis">{label}</span>'
            f'<span style="color:#757575">{html.escape(type_name)}</span>'
            f'{_chip(act, "activation")}{_chip(grad, "gradient")}{flag}</div>')


def group_html(group: Group, health: dict, is_open: bool) -> str:
    """The header row of a foldable group: the worst activation and gradient state of its members."""
    hs = [health.get(m) for m in group.members]
    act = worst(getattr(h, "act", None) for h in hs)
    grad = worst(getattr(h, "grad", None) for h in hs)
    bad = sum(1 for h in hs if h is not None and (look(getattr(h, "act", None)).severity > 0
                                                  or look(getattr(h, "grad", None)).severity > 0))
    unmeasured = sum(1 for h in hs if h is None)
    nonfinite = any(bool(getattr(h, "nonfinite", False)) for h in hs)
    cls = "ndbg-row ndbg-group" if is_open else "ndbg-row ndbg-fold"
    summary = (f"{bad}/{len(hs)} unwell" if bad else f"{len(hs)} layers") + (f", {unmeasured} unseen" if unmeasured else "")
    flag = (f'<span style="{_CHIP.format(colour=NONFINITE.colour)};min-width:0">{NONFINITE.label}</span>'
            if nonfinite else "")
    return (f'<div class="{cls}" data-layer="{html.escape(group.key)}" data-act="{act}" data-grad="{grad}"'
            f' data-nonfinite="{str(nonfinite).lower()}" style="{_ROW_STYLE};font-weight:bold">'
            f'<span>{html.escape(group.key)}</span><span style="color:#757575;font-weight:normal;'
            f'white-space:nowrap;overflow:hidden;text-overflow:ellipsis" title="{summary}">{summary}</span>'
            f'{_chip(act, "worst activation state")}{_chip(grad, "worst gradient state")}{flag}</div>')


class HealthGrid:
    """The grid widget. ``update(layers, health)`` with ``layers`` in display order."""

    def __init__(self, fold_above: int = 40):
        self.fold_above = int(fold_above)
        self.widget = widgets.VBox(layout=widgets.Layout(min_width="30em"))
        self.widget.add_class("ndbg-grid")
        self._key: tuple | None = None
        self.groups: list[Group] = []
        self._types: dict[str, str] = {}
        self._health: dict = {}
        self._unobserved: set[str] = set()
        self._flat: widgets.HTML | None = None
        self._headers: dict[str, widgets.HTML] = {}
        self._bodies: dict[str, widgets.HTML] = {}
        self.toggles: dict[str, widgets.ToggleButton] = {}

    # -- structure (built once per layer layout) --------------------------------------------------
    def _build(self, layers) -> None:
        names = [l.name for l in layers]
        self._types = {l.name: l.type_name for l in layers}
        self.groups = fold(names, self.fold_above)
        self._headers.clear()
        self._bodies.clear()
        self.toggles.clear()
        if not any(g.foldable for g in self.groups):
            self._flat = widgets.HTML()
            self.widget.children = [self._flat]
            return
        self._flat = None
        children = []
        for g in self.groups:
            if not g.foldable:
                body = widgets.HTML()
                self._bodies[g.key] = body
                children.append(body)
                continue
            toggle = widgets.ToggleButton(value=False, description="\u25b8", tooltip=f"unfold {g.key}",
                                          layout=widgets.Layout(width="2.2em", height="1.7em", padding="0"))
            toggle.add_class("ndbg-unfold")
            toggle.observe(lambda change, key=g.key: self._toggle(key, change["new"]), names="value")
            header = widgets.HTML(layout=widgets.Layout(flex="1"))
            body = widgets.HTML(layout=widgets.Layout(display="none", margin="0 0 0 2.6em"))
            self.toggles[g.key], self._headers[g.key], self._bodies[g.key] = toggle, header, body
            children.append(widgets.VBox([widgets.HBox([toggle, header]), body]))
        self.widget.children = children

    def _toggle(self, key: str, is_open: bool) -> None:
        toggle, body = self.toggles[key], self._bodies[key]
        with toggle.hold_sync(), body.hold_sync():
            toggle.description = "\u25be" if is_open else "\u25b8"
            toggle.tooltip = f"{'fold' if is_open else 'unfold'} {key}"
            body.layout.display = "" if is_open else "none"
            self._fill_group(next(g for g in self.groups if g.key == key))

    def unfold(self, key: str, is_open: bool = True) -> None:
        """Open (or close) a folded group, as its toggle button does."""
        self.toggles[key].value = is_open

    # -- values -----------------------------------------------------------------------------------
    def update(self, layers, health: dict) -> None:
        key = tuple(l.name for l in layers)
        if key != self._key:
            self._build(layers)
            self._key = key
        self._health = health
        # once something is measured, a layer with no place in the forward order was not observed
        self._unobserved = {l.name for l in layers if getattr(l, "order", 0) is None} if health else set()
        if self._flat is not None:
            self._flat.value = "".join(self._row(n) for n in key)
            return
        for g in self.groups:
            self._fill_group(g)

    def _row(self, name: str) -> str:
        return row_html(name, self._types[name], self._health.get(name), name not in self._unobserved)

    def _fill_group(self, g: Group) -> None:
        if not g.foldable:
            self._bodies[g.key].value = self._row(g.key)
            return
        is_open = self.toggles[g.key].value
        self._headers[g.key].value = group_html(g, self._health, is_open)
        # a closed group's members are rendered only when it opens
        self._bodies[g.key].value = ("".join(self._row(m) for m in g.members)
                                     if is_open else "")

    def widgets_to_sync(self) -> list:
        return [self._flat] if self._flat is not None else list(self._headers.values()) + list(self._bodies.values())
