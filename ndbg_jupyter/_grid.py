"""The health grid: one row per watched layer, activation and gradient state as colour and label.

Columns have a header and the states a legend (each explained on hover); a name or a type too long
for its column ends in an ellipsis and shows in full on hover. Models with more than ``fold_above``
layers fold into their parent modules (``blocks.0`` .. ``blocks.11``): a folded row shows the worst
state of its members and unfolds on click. The grid is one HTML widget, the same markup live and in
the static copy: a folded group is an HTML ``<details>`` element, opened and closed by the browser
itself (no widget per group, no round trip to the kernel, and it works in an exported page). The
chart's gradient-flow heatmap draws ``rows()`` and, for each group, its ``members()``; a style rule
shows a group's member lines in the heatmap while its ``<details>`` is open, so the heatmap keeps the
grid's rows, line for line. An early warning shows in amber (drifting, narrowing, diminishing) in its
column, over a healthy state.
"""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets

from neuraldbg.formatting import number

from ._states import NONFINITE, UNKNOWN, chip, legend_html, look, value_of, worst

_FONT = "font:12px/1.7 var(--jp-code-font-family,monospace);color:var(--jp-ui-font-color1,inherit)"
_COLUMNS = "grid-template-columns:minmax(6em,1fr) minmax(4em,10em) 6.8em 6.8em 5.4em;column-gap:4px"
_ROW = f"display:grid;{_COLUMNS};align-items:center;{_FONT};padding:0 2px;min-height:1.7em"
_CELL = "overflow:hidden;text-overflow:ellipsis;white-space:nowrap;min-width:0"
_MUTED = "color:var(--jp-ui-font-color2,#616161)"
GUTTER = "calc(1.8em + 4px)"   # room for the unfold button, so every row's columns line up
_INDENT = "calc(2.8em + 4px)"  # the members of an unfolded group

_HEADINGS = (
    ("layer", "the module's name in model.named_modules(); hover one for the numbers behind its states"),
    ("type", "the module's class"),
    ("activation", "what the layer's output looks like at the latest sample: normal, saturated, dead or anomalous"),
    ("gradient", "how the gradient reaching the layer compares with the layers after it: healthy, vanishing or "
                 "exploding"),
    ("NaN/Inf", "marked when the output or its gradient holds NaN or Inf at the latest sample"),
)


@dataclass(frozen=True)
class Group:
    """A row of the grid: one layer, or a parent module folding several layers."""

    key: str               # qualified name of the layer or of the parent module ("a..b" for merged ones)
    members: tuple[str, ...]

    @property
    def foldable(self) -> bool:
        return len(self.members) > 1


@dataclass(frozen=True)
class Row:
    """A row as shown: ``key`` (its ``data-layer``), whether it is a group's header, and the layers it covers."""

    key: str
    members: tuple[str, ...]
    group: bool = False


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
    return [Group(_span(k, v, depth), tuple(v)) for k, v in members.items()]


def _span(key: str, members: list[str], depth: int) -> str:
    """A container of repeated numbered blocks reads as its range: ``blocks`` holding the layers of
    ``blocks.0`` .. ``blocks.11`` is ``blocks.0..11`` (a container of numbered layers keeps its name)."""
    blocks = []
    for m in members:
        parts = m.split(".")
        if len(parts) <= depth + 1 or not parts[depth].isdigit():
            return key
        blocks.append(int(parts[depth]))
    lo, hi = min(blocks), max(blocks)
    return f"{key}.{lo}..{hi}" if hi > lo else key


def _chunk(groups: list[Group], max_rows: int) -> list[Group]:
    size = math.ceil(len(groups) / max_rows)
    out = []
    for i in range(0, len(groups), size):
        part = groups[i:i + size]
        key = part[0].key if len(part) == 1 else f"{part[0].key}..{part[-1].key}"
        out.append(Group(key, tuple(m for g in part for m in g.members)))
    return out


def _prefix(group: Group) -> str:
    """The module path every member of a group starts with (``blocks.3``; ``""`` for merged groups)."""
    parts = [m.split(".") for m in group.members]
    common = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    if len(common) == min(len(p) for p in parts):  # a member is the prefix itself: keep one level above
        common = common[:-1]
    return ".".join(common)


# which column of the grid a warning's signal shows in
_COLUMN_OF = {"activation": "act", "attention": "act", "gradient": "grad"}


@dataclass(frozen=True)
class Watched:
    """A layer's row state with its early warnings: a warning band shows where the state is healthy, and
    each warning's text on hover."""

    act: object
    grad: object
    nonfinite: bool
    values: dict
    watch: tuple[str, ...]


def with_warnings(health: dict, warnings) -> dict:
    """``health`` with each warned layer's row state replaced by a ``Watched`` one."""
    by_layer: dict[str, list] = {}
    for w in warnings:
        for layer in (w.layer, *getattr(w, "also", ())):  # (the other calls of a loop warned of alike)
            if value_of(w.signal) in _COLUMN_OF and layer in health:
                by_layer.setdefault(layer, []).append(w)
    out = dict(health)
    for name, ws in by_layer.items():
        h = health[name]
        cells = {"act": getattr(h, "act", None), "grad": getattr(h, "grad", None)}
        for w in ws:
            col = _COLUMN_OF[value_of(w.signal)]
            if look(cells[col]).severity < look(w.state).severity:
                cells[col] = w.state
        out[name] = Watched(cells["act"], cells["grad"], bool(getattr(h, "nonfinite", False)),
                            dict(getattr(h, "values", None) or {}), tuple(w.describe() for w in ws))
    return out


def header_html() -> str:
    cells = "".join(f'<span style="{_CELL}" title="{html.escape(tip)}">{name}</span>' for name, tip in _HEADINGS)
    return (f'<div class="ndbg-row ndbg-head" style="{_ROW};padding-left:{GUTTER};font-weight:bold;{_MUTED};'
            f'border-bottom:1px solid var(--jp-border-color2,#e0e0e0)">{cells}</div>')


def _flag(nonfinite: bool) -> str:
    return chip(NONFINITE, cls="ndbg-chip ndbg-nonfinite") if nonfinite else "<span></span>"


def row_html(name: str, type_name: str, health, indent: str = GUTTER, parent: str = "") -> str:
    """The HTML of one layer's row (``health`` may be None before the layer has been measured); under an
    unfolded group (``parent``) the name is shown relative to it, in full on hover."""
    act = value_of(getattr(health, "act", None))
    grad = value_of(getattr(health, "grad", None))
    nonfinite = bool(getattr(health, "nonfinite", False))
    shown_name = name[len(parent) + 1:] if parent and name.startswith(parent + ".") else name
    label = html.escape(shown_name or "(model)")
    numbers = getattr(health, "values", None) or {}
    shown = [f"{k.replace('_', ' ')} {number(v)}" for k, v in numbers.items()
             if isinstance(v, (int, float)) and math.isfinite(v)]
    watch = list(getattr(health, "watch", ()))
    title = html.escape("\n".join([name or "(model)", *shown, *watch]))  # the numbers the states were decided on
    warned = "\n".join(watch)
    return (f'<div class="ndbg-row" data-layer="{html.escape(name)}" data-act="{act}" data-grad="{grad}"'
            f' data-nonfinite="{str(nonfinite).lower()}" style="{_ROW};padding-left:{indent}">'
            f'<span class="ndbg-name" style="{_CELL}" title="{title}">{label}</span>'
            f'<span class="ndbg-type" style="{_CELL};{_MUTED}" title="{html.escape(type_name)}">'
            f"{html.escape(type_name)}</span>"
            f'{chip(look(act), _tip(f"activation of {name}", warned, act))}'
            f'{chip(look(grad), _tip(f"gradient of {name}", warned, grad))}'
            f"{_flag(nonfinite)}</div>")


def _tip(what: str, warned: str, state: str) -> str:
    """A chip's hover: what it shows, and the warnings behind a warning band."""
    return f"{what}\n{warned}" if warned and look(state).severity == 1 else what


def group_html(group: Group, health: dict, is_open: bool, indent: str = "0") -> str:
    """The header row of a foldable group: the worst activation and gradient state of its members."""
    hs = [health.get(m) for m in group.members]
    act = worst(getattr(h, "act", None) for h in hs)
    grad = worst(getattr(h, "grad", None) for h in hs)
    bad = sum(1 for h in hs if h is not None and (look(getattr(h, "act", None)).severity > 0
                                                  or look(getattr(h, "grad", None)).severity > 0))
    unmeasured = sum(1 for h in hs if h is None)
    nonfinite = any(bool(getattr(h, "nonfinite", False)) for h in hs)
    cls = "ndbg-row ndbg-group" if is_open else "ndbg-row ndbg-fold"
    summary = f"{bad}/{len(hs)} unwell" if bad else f"{len(hs)} layers"
    summary += f", {unmeasured} unseen" if unmeasured else ""
    hint = "click to fold" if is_open else "click to unfold"
    return (f'<div class="{cls}" data-layer="{html.escape(group.key)}" data-act="{act}" data-grad="{grad}"'
            f' data-nonfinite="{str(nonfinite).lower()}" style="{_ROW};padding-left:{indent};font-weight:bold">'
            f'<span class="ndbg-name" style="{_CELL}" title="{html.escape(group.key)}: {len(hs)} layers ({hint})">'
            f"{html.escape(group.key)}</span>"
            f'<span class="ndbg-type" style="{_CELL};{_MUTED};font-weight:normal" title="{summary}">{summary}</span>'
            f'{chip(look(act) if act else UNKNOWN, f"worst activation state in {group.key}")}'
            f'{chip(look(grad) if grad else UNKNOWN, f"worst gradient state in {group.key}")}{_flag(nonfinite)}</div>')


# the fold marker turns when its group opens; the browser's own marker is hidden
_FOLD_STYLE = ("<style>.ndbg-fold-block>summary{list-style:none;cursor:pointer;display:flex;align-items:center}"
               ".ndbg-fold-block>summary::-webkit-details-marker{display:none}"
               ".ndbg-fold-block[open]>summary .ndbg-unfold{transform:rotate(90deg)}</style>")


def grid_html(groups: Sequence[Group], types: dict[str, str], health: dict) -> str:
    """The whole grid as self-contained HTML: header, rows, legend; a folded group is a ``<details>``
    (closed) whose summary is the group's row and whose body its members' rows."""
    rows = [header_html()]
    folds = False
    for g in groups:
        if not g.foldable:
            rows.append(row_html(g.key, types.get(g.key, ""), health.get(g.key)))
            continue
        folds = True
        head = group_html(g, health, is_open=False, indent=GUTTER)
        head = head.replace(f"padding-left:{GUTTER}", "padding-left:0", 1)
        members = "".join(row_html(m, types.get(m, ""), health.get(m), indent=_INDENT, parent=_prefix(g))
                          for m in g.members)
        key = html.escape(g.key)
        rows.append(f'<details class="ndbg-fold-block" data-group="{key}"><summary>'
                    f'<span class="ndbg-unfold" title="unfold {key}" style="width:{GUTTER};flex:none;'
                    f'text-align:center;transition:transform .1s">\u25b8</span>'
                    f'<span style="flex:1;min-width:0">{head}</span></summary>{members}</details>')
    style = _FOLD_STYLE if folds else ""
    return f'<div class="ndbg-grid" style="min-width:30em">{style}{"".join(rows)}{legend_html()}</div>'


static_grid_html = grid_html  # the static copy is the live markup


class HealthGrid:
    """The grid widget. ``update(layers, health)`` with ``layers`` (name and type_name) in display order.
    ``layout``/``style``: shared widget models to use (one comm message fewer each)."""

    def __init__(self, fold_above: int = 40, layout: widgets.Layout | None = None, style=None):
        self.fold_above = int(fold_above)
        extra = {"style": style} if style is not None else {}
        self.widget = widgets.HTML(layout=layout or widgets.Layout(min_width="30em", flex="1 1 34em"), **extra)
        self.widget.add_class("ndbg-grid")
        self._key: tuple | None = None
        self.groups: list[Group] = []
        self._types: dict[str, str] = {}
        self._health: dict = {}

    def update(self, layers, health: dict, warnings=()) -> None:
        """Show ``health`` (each layer's latest state, by name) and the early ``warnings`` over it."""
        key = tuple(l.name for l in layers)
        if key != self._key:
            self._types = {l.name: l.type_name for l in layers}
            self.groups = fold(list(key), self.fold_above)
            self._key = key
        self._health = with_warnings(health, warnings) if warnings else health
        self.widget.value = self.html()

    def show(self, markup: str, groups: list[Group], types: dict[str, str], health: dict) -> None:
        """Show ``markup``, the ``grid_html`` of ``groups`` drawn elsewhere (the dashboard's renderer)."""
        self.groups, self._types, self._health = groups, types, health
        self._key = tuple(m for g in groups for m in g.members)
        self.widget.value = markup

    def html(self) -> str:
        return grid_html(self.groups, self._types, self._health)

    def rows(self) -> list[Row]:
        """The rows as shown with every group folded, top to bottom (a group: its summary row)."""
        return [Row(g.key, g.members, group=True) if g.foldable else Row(g.key, g.members) for g in self.groups]

    def members(self) -> dict[str, list[Row]]:
        """Per folded group, the rows its ``<details>`` shows when opened."""
        return {g.key: [Row(m, (m,)) for m in g.members] for g in self.groups if g.foldable}

    def static_html(self) -> str:
        return self.html()

    def widgets_to_sync(self) -> list:
        return [self.widget]
