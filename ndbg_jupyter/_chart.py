"""The chart: loss curve and gradient flow, rendered as SVG text (crisp at any width and pixel density).

``render_chart(view, rows, members)`` is the one place that draws: a read-only trace view and the
grid's rows in, HTML and SVG markup out; no widget, no state. The ``Chart`` widget only decides when
to call it.

Gradient flow is a heatmap of log10 RMS(d loss / d output) over steps (columns), one line per row of
the health grid (a folded group is the median of its layers), every line labelled, input at the top:
vanishing gradients read as a dark band spreading from the top, exploding ones as a bright one. Each
line is a slice of one small PNG, scaled without smoothing; text and axes are vector. The lines of a
folded group's members are there too, hidden until the grid's ``<details>`` of that group opens (a
style rule, in the browser: no redraw). Colours of text and axes follow the notebook's theme.
"""
from __future__ import annotations

import base64
import html
import math
import struct
import zlib
from collections.abc import Sequence

import ipywidgets as widgets
import numpy as np

from neuraldbg import Stat, TraceView
from neuraldbg.formatting import number

from ._grid import Row

_COLUMNS = 240  # heatmap resolution along steps
_LOSS_POINTS = 400  # the loss curve keeps each bin's lowest and highest value beyond this many points

# magma, sampled at 9 stops
_STOPS = np.array([[0, 0, 4], [28, 16, 68], [79, 18, 123], [129, 37, 129], [181, 54, 122], [229, 80, 100],
                   [251, 135, 97], [254, 194, 135], [252, 253, 191]], dtype=float)
_LUT = np.stack([np.interp(np.linspace(0, 8, 256), np.arange(9), _STOPS[:, c]) for c in range(3)], axis=1)
_ZERO = (21, 101, 192)  # a gradient of exactly zero: the grid's "vanishing" blue

_FONT = "font-family:var(--jp-ui-font-family,system-ui,sans-serif);font-size:11px"
_MONO = "var(--jp-code-font-family,monospace)"
_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'style="max-width:100%;height:auto;color:var(--jp-ui-font-color1,#212121);' + _FONT + '" '
        'role="img" aria-label="{label}">')


def gradient_flow(steps: np.ndarray, grad_rms: np.ndarray, columns: int = _COLUMNS, end: int | None = None):
    """Resample per-layer gradient RMS (samples x layers) onto a uniform step grid, as log10.

    Returns (matrix layers x columns, first step, last step); each column holds the latest sample
    at or before its step, so thinned (sparser) old samples keep their place on the time axis.
    A zero gradient becomes -inf (drawn in the colour for zero), a layer not measured NaN (drawn as
    background). ``end``: the last step of the run (the loss curve's), when it is later than the
    last sample; the columns up to it hold the last sample, so both charts share the axis.
    """
    if len(steps) == 0:
        return np.full((grad_rms.shape[1] if grad_rms.ndim == 2 else 0, 1), np.nan), 0, 1
    lo, hi = int(steps[0]), max(int(steps[-1]), end if end is not None else 0)
    grid = np.linspace(lo, hi, min(columns, hi - lo + 1))
    idx = np.clip(np.searchsorted(steps, grid, side="right") - 1, 0, len(steps) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        logged = np.log10(np.where(grad_rms >= 0, grad_rms, np.nan))
    logged = _carried(logged)
    return logged[idx].T, lo, max(hi, lo + 1)


def _carried(x: np.ndarray) -> np.ndarray:
    """(samples x layers) with a sample that did not measure a layer's gradient showing its last measurement
    (output gradients are measured on every other sample under the automatic interval)."""
    if x.ndim != 2 or not len(x):
        return x
    missing = np.isnan(x)
    if not missing.any():
        return x
    last = np.where(missing, 0, np.arange(len(x))[:, None])
    np.maximum.accumulate(last, axis=0, out=last)
    return x[last, np.arange(x.shape[1])[None, :]]


def row_flow(view: TraceView, rows: Sequence[Row], end: int) -> tuple[np.ndarray, int, int]:
    """The gradient-flow matrix with one line per grid row: a group's line is the median of its layers."""
    index = {l.name: i for i, l in enumerate(view.layers)}
    rms = view.stat(Stat.GRAD_RMS)
    matrix, lo, hi = gradient_flow(view.steps, rms, end=end)
    out = np.full((len(rows), matrix.shape[1]), np.nan)
    for r, row in enumerate(rows):
        cols = [index[m] for m in row.members if m in index]
        if cols:
            out[r] = _median(matrix[cols]) if len(cols) > 1 else matrix[cols[0]]
    return out, lo, hi


def _median(m: np.ndarray) -> np.ndarray:
    """The median of each column of ``m`` over its non-NaN entries (-inf, a zero gradient, counts), NaN for a
    column with none: ``np.nanmedian``'s result, without its per-call cost (it is called once per group)."""
    s = np.sort(m, axis=0)  # NaN last
    n = (~np.isnan(m)).sum(axis=0)
    cols = np.arange(m.shape[1])
    lo, hi = s[np.maximum(n - 1, 0) // 2, cols], s[np.maximum(n, 1) // 2 - (n == 0), cols]
    with np.errstate(invalid="ignore"):
        mid = np.where(lo == hi, lo, (lo + hi) / 2)
    return np.where(n > 0, mid, np.nan)


# -- drawing helpers ---------------------------------------------------------------------------------

def png(rgba: np.ndarray) -> bytes:
    """An RGBA uint8 array (height, width, 4) as PNG bytes."""
    h, w, _ = rgba.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgba.reshape(h, w * 4)], axis=1).tobytes()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def colours(matrix: np.ndarray) -> tuple[np.ndarray, float, float]:
    """RGBA for a log10 matrix: magma over its finite range, blue for zero (-inf), clear for NaN."""
    finite = matrix[np.isfinite(matrix)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if vmax - vmin < 1e-6:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    rgba = np.zeros((*matrix.shape, 4), np.uint8)
    ok = np.isfinite(matrix)
    k = np.clip(((matrix[ok] - vmin) / (vmax - vmin) * 255).round(), 0, 255).astype(int)
    rgba[ok, :3] = _LUT[k]
    rgba[ok, 3] = 255
    zero = np.isneginf(matrix)
    rgba[zero, :3] = _ZERO
    rgba[zero, 3] = 255
    return rgba, vmin, vmax


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _t(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, s: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{_t(x)}" y="{_t(y)}" text-anchor="{anchor}" fill="currentColor"{extra}>{html.escape(s)}</text>'


def _shorten(s: str, chars: int) -> str:
    """``s`` in at most ``chars`` characters, cut in the middle (a layer's block and its leaf both stay)."""
    if len(s) <= chars:
        return s
    head = (chars - 1) // 2
    return s[:head] + "\u2026" + s[len(s) - (chars - 1 - head):]


def _x_axis(x0: float, x1: float, y: float, lo: int, hi: int) -> list[str]:
    out = [f'<line x1="{_t(x0)}" y1="{_t(y)}" x2="{_t(x1)}" y2="{_t(y)}" stroke="currentColor" stroke-opacity="0.5"/>']
    for s in _nice_ticks(lo, hi, 5):
        x = x0 + (s - lo) / max(hi - lo, 1) * (x1 - x0)
        out.append(f'<line x1="{_t(x)}" y1="{_t(y)}" x2="{_t(x)}" y2="{_t(y + 4)}" stroke="currentColor" '
                   f'stroke-opacity="0.5"/>')
        out.append(_text(x, y + 15, f"{s:g}", "middle"))
    out.append(_text((x0 + x1) / 2, y + 28, "step", "middle", ' fill-opacity="0.75"'))
    return out


# -- the two panels ----------------------------------------------------------------------------------

def _curve_points(loss: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Indices of the losses drawn: all of them, or beyond ``2 * _LOSS_POINTS`` each bin's lowest and highest
    finite value, in order (a bin with none keeps its first index: a break in the curve)."""
    n = len(loss)
    if n <= 2 * _LOSS_POINTS:
        return np.arange(n)
    bins = np.linspace(0, n, _LOSS_POINTS + 1).astype(int)
    which = np.repeat(np.arange(_LOSS_POINTS), np.diff(bins))
    order = np.lexsort((np.arange(n), np.where(ok, loss, np.inf), which))   # per bin, ascending, NaN last
    first = bins[:-1]
    counts = np.bincount(which[ok], minlength=_LOSS_POINTS)
    lo = order[first]                                        # the lowest finite value of each bin
    order_hi = np.lexsort((np.arange(n), np.where(ok, -loss, np.inf), which))
    hi = order_hi[first]                                     # the highest (the first of equal ones)
    keep = np.where(counts > 0, np.minimum(lo, hi), first)
    other = np.where(counts > 0, np.maximum(lo, hi), -1)
    both = np.stack([keep, other], axis=1).reshape(-1)
    both = both[both >= 0]
    _, unique = np.unique(both, return_index=True)  # a bin whose extremes are one point keeps it once
    return both[np.sort(unique)]


def loss_svg(view: TraceView, end: int, width: int = 360, height: int = 230) -> str:
    left, right, top, bottom = 54, 12, 24, 40
    x0, x1, y0, y1 = left, width - right, top, height - bottom
    steps, loss = view.loss_steps.astype(float), view.loss.astype(float)
    ok = np.isfinite(loss)
    parts = [_SVG.format(cls="ndbg-loss", w=width, h=height, label="loss over steps")]
    finite = loss[ok]
    log = bool(len(finite) and (finite > 0).all() and finite.max() / max(finite.min(), 1e-300) > 100)
    parts.append(_text(4, 14, "loss" + (" (log scale)" if log else ""), extra=' font-weight="bold"'))
    if not len(finite):
        parts.append(_text(width / 2, height / 2, "no loss recorded (%%neuraldbg --loss NAME)", "middle",
                           ' fill-opacity="0.6"'))
        parts.append("</svg>")
        return "".join(parts)
    f = np.log10 if log else (lambda v: v)
    lo_v, hi_v = float(f(finite.min())), float(f(finite.max()))
    if hi_v - lo_v < 1e-12:
        lo_v, hi_v = lo_v - 0.5, hi_v + 0.5
    pad = (hi_v - lo_v) * 0.05
    lo_v, hi_v = lo_v - pad, hi_v + pad
    span = max(end, 1)

    def px(s):
        return x0 + s / span * (x1 - x0)

    def py(v):
        return y1 - (f(v) - lo_v) / (hi_v - lo_v) * (y1 - y0)

    # y ticks
    ticks = ([10.0 ** k for k in range(math.ceil(lo_v), math.floor(hi_v) + 1)] if log
             else _nice_ticks(lo_v, hi_v, 5))
    if log and len(ticks) < 2:
        ticks = [10 ** v for v in _nice_ticks(lo_v, hi_v, 4)]
    for v in ticks:
        y = py(v)
        parts.append(f'<line x1="{x0}" y1="{_t(y)}" x2="{x1}" y2="{_t(y)}" stroke="currentColor" '
                     f'stroke-opacity="0.12"/>')
        parts.append(_text(x0 - 5, y + 4, number(v), "end"))
    parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="currentColor" stroke-opacity="0.5"/>')
    parts += _x_axis(x0, x1, y1, 0, span)
    # the curve: NaN/Inf losses break it; long runs keep each bin's extremes
    idx = _curve_points(loss, ok)
    good = idx[ok[idx]]
    # a point starts a new stroke (M) after a NaN/Inf or at the start, else continues it (L)
    pen = np.zeros(len(idx), dtype=bool)
    pen[1:] = ok[idx[:-1]]
    pen = pen[ok[idx]]
    with np.errstate(divide="ignore", invalid="ignore"):
        xs = x0 + steps[good] / span * (x1 - x0)
        ys = y1 - (f(loss[good]) - lo_v) / (hi_v - lo_v) * (y1 - y0)
    path = " ".join(f"{'L' if p else 'M'}{_t(x)} {_t(y)}" for p, x, y in zip(pen.tolist(), xs.tolist(), ys.tolist()))
    parts.append(f'<path class="ndbg-loss-curve" d="{path}" fill="none" stroke="#1e88e5" '
                 f'stroke-width="1.5" stroke-linejoin="round"/>')
    parts.append("</svg>")
    return "".join(parts)


def _css_string(s: str) -> str:
    """``s`` as a CSS string literal (inside an HTML attribute selector)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bar_png() -> str:
    bar = _LUT[::-1][np.linspace(0, 255, 64).astype(int)][:, None, :]
    rgba = np.concatenate([bar, np.full((64, 1, 1), 255)], axis=2).astype(np.uint8)
    return "data:image/png;base64," + base64.b64encode(png(rgba)).decode("ascii")


_BAR_URI = _bar_png()


def flow_html(view: TraceView, rows: Sequence[Row], end: int, members: dict[str, Sequence[Row]] | None = None,
              width: int = 560) -> str:
    """The gradient-flow heatmap, one labelled line per grid row; after a group's line, its members'
    lines (``members``), shown while the grid's ``<details>`` of that group is open."""
    members = members or {}
    n = max(len(rows), 1)
    row_h = int(max(13, min(26, 160 // n)))
    label_w, right, top = 190, 70, 24
    plot_w = width - label_w - right
    lines: list[tuple[Row, str | None]] = []  # (row, the group it belongs to, for a member line)
    for row in rows:
        lines.append((row, None))
        lines.extend((m, row.key) for m in members.get(row.key, ()))
    matrix, lo, hi = row_flow(view, [r for r, _ in lines], end)
    rgba, vmin, vmax = colours(matrix if lines else np.full((1, 1), np.nan))
    uri = "data:image/png;base64," + base64.b64encode(png(rgba)).decode("ascii")
    chars = int((label_w - 10) / 6.6)
    # the PNG once, in a custom property every line's background reads
    out = [f'<div class="ndbg-flow" role="img" aria-label="gradient flow per grid row over steps" '
           f'style="width:{width}px;max-width:100%;color:var(--jp-ui-font-color1,#212121);{_FONT};'
           f'--ndbg-flow-cells:url({uri})">']
    rules = "".join(f":is(.ndbg-dashboard,.ndbg-static):has(details.ndbg-fold-block[data-group={_css_string(k)}]"
                    f"[open]) .ndbg-flow-member[data-group={_css_string(k)}]{{display:flex!important}}"
                    for k in members)
    if members:  # (where styles are stripped, every member line shows: the heatmap unfolded)
        out.append(f"<style>.ndbg-flow-member{{display:none!important}}{html.escape(rules, quote=False)}</style>")
    out.append(f'<div style="height:{top}px;font-weight:bold;line-height:{top - 6}px;padding-left:4px">'
               "gradient flow: log10 RMS(dL/d output), one line per grid row</div>")
    out.append('<div style="display:flex;align-items:flex-start">')
    out.append(f'<div style="width:{label_w + plot_w}px;font-family:{_MONO};font-size:10.5px;'
               f'line-height:{row_h}px">')
    label_css = f"flex:none;width:{label_w - 6}px;margin-right:6px;text-align:right;overflow:hidden;white-space:nowrap"
    size = f"{plot_w}px {len(lines) * row_h}px"
    for k, (row, group) in enumerate(lines):
        label = _shorten(row.key, chars)
        tip = f"{row.key} ({len(row.members)} layers, median)" if row.group else row.key
        weight = ";font-weight:bold" if row.group else ""
        cls, data_group = "ndbg-flow-row", ""
        if group is not None:
            cls, data_group = "ndbg-flow-row ndbg-flow-member", f' data-group="{html.escape(group)}"'
        # this line's slice of the one PNG: the image scaled to every line's height, moved up to this one
        out.append(f'<div class="{cls}"{data_group} style="display:flex;height:{row_h}px">'
                   f'<span class="ndbg-flow-label" data-row="{html.escape(row.key)}" title="{html.escape(tip)}" '
                   f'style="{label_css}{weight}">{html.escape(label)}</span>'
                   f'<span class="ndbg-flow-cells" style="flex:none;width:{plot_w}px;background:var(--ndbg-flow-cells) '
                   f'0 {-k * row_h}px/{size} no-repeat;image-rendering:pixelated"></span></div>')
    axis = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w}" height="40" '
            f'style="display:block;overflow:visible">']
    axis += _x_axis(label_w, label_w + plot_w, 0, lo, hi)
    axis.append("</svg>")
    out.append("".join(axis) + "</div>")
    out.append(_colour_bar(vmin, vmax, max(n * row_h, 40)))  # the height of the lines with every group folded
    out.append("</div></div>")
    return "".join(out)


def _colour_bar(vmin: float, vmax: float, bar_h: float) -> str:
    """The colour scale: magma over the range, ticks at whole powers of ten; then "zero" and "n/a"."""
    bar_w, width = 10, 62
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_t(bar_h + 30)}" '
             f'style="flex:none;margin-left:8px;overflow:visible;{_FONT}">',
             f'<image x="0" y="0" width="{bar_w}" height="{_t(bar_h)}" preserveAspectRatio="none" href="{_BAR_URI}"/>']
    powers = list(range(math.ceil(vmin), math.floor(vmax) + 1))
    every = max(1, math.ceil(len(powers) * 14 / bar_h))  # labels 14 px apart at least
    ticks = [(k, f"1e{k}") for k in powers[::-1][::every]]
    if len(ticks) < 2:  # less than a decade: the two ends
        ticks = [(vmax, number(10 ** vmax)), (vmin, number(10 ** vmin))]
    for k, label in ticks:
        y = (vmax - k) / (vmax - vmin) * bar_h
        parts.append(_text(bar_w + 3, min(max(y + 4, 8), bar_h), label))
    parts.append(f'<rect x="0" y="{_t(bar_h + 6)}" width="{bar_w}" height="8" fill="rgb{_ZERO}"/>')
    parts.append(_text(bar_w + 3, bar_h + 14, "zero"))
    parts.append(f'<rect x="0" y="{_t(bar_h + 20)}" width="{bar_w}" height="8" fill="none" '
                 f'stroke="currentColor" stroke-opacity="0.4"/>')
    parts.append(f'<text x="{bar_w + 3}" y="{_t(bar_h + 28)}" fill="currentColor">'
                 "<title>not measured</title>n/a</text>")
    parts.append("</svg>")
    return "".join(parts)


def render_chart(view: TraceView, rows: Sequence[Row], members: dict[str, Sequence[Row]] | None = None) -> str:
    """The whole chart as HTML text (the loss and the gradient flow, side by side; they wrap on a narrow
    page). ``members``: per folded group of ``rows``, the lines it shows when opened."""
    loss_steps, steps = view.loss_steps, view.steps
    end = max(int(loss_steps[-1]) if len(loss_steps) else 0, int(steps[-1]) if len(steps) else 0)
    return ('<div class="ndbg-chart" style="display:flex;flex-flow:row wrap;gap:8px;align-items:flex-start">'
            + loss_svg(view, end) + flow_html(view, rows, end, members) + "</div>")


class Chart:
    """An ``ipywidgets.HTML`` showing ``render_chart`` of a session; redrawn only when the trace or the
    rows changed. ``layout``/``style``: shared widget models to use."""

    def __init__(self, layout: widgets.Layout | None = None, style=None) -> None:
        extra = {"style": style} if style is not None else {}
        self.widget = widgets.HTML(layout=layout or widgets.Layout(max_width="100%"), **extra)
        self.widget.add_class("ndbg-chart-box")
        self._key: tuple | None = None
        self.renders = 0

    def key(self, view: TraceView, rows: Sequence[Row], members: dict | None = None) -> tuple:
        return (view.version, tuple(rows), tuple((k, tuple(v)) for k, v in (members or {}).items()))

    def stale(self, key: tuple) -> bool:
        return key != self._key

    def show(self, key: tuple, markup: str) -> None:
        """Show ``markup`` (``render_chart`` of the state ``key`` describes)."""
        self._key = key
        self.widget.value = markup
        self.renders += 1

    def update(self, view: TraceView, rows: Sequence[Row], members: dict | None = None) -> bool:
        """Redraw when ``view`` has new data or the rows changed; returns whether it rendered."""
        key = self.key(view, rows, members)
        if not self.stale(key):
            return False
        self.show(key, render_chart(view, rows, members))
        return True

    def close(self) -> None:
        """Forget what was drawn (a retired dashboard redraws nothing)."""
        self._key = None
