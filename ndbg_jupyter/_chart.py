"""The chart: loss curve and gradient flow, drawn off-screen (Agg) into a PNG for an Image widget.

The figure and its artists are made once; a redraw only swaps their data and renders a PNG.
Gradient flow is a heatmap of log10 RMS(d loss / d output) per layer (rows, input at the top) over
steps (columns): vanishing gradients read as a dark band spreading from the top, exploding ones as
a bright one.
"""
from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from neuraldbg import Stat

_COLUMNS = 240  # heatmap resolution along steps


def gradient_flow(steps: np.ndarray, grad_rms: np.ndarray, columns: int = _COLUMNS, end: int | None = None):
    """Resample per-layer gradient RMS (samples x layers) onto a uniform step grid, as log10.

    Returns (matrix layers x columns, first step, last step); each column holds the latest sample
    at or before its step, so thinned (sparser) old samples keep their place on the time axis.
    A zero gradient becomes -inf (drawn in the colour for "below the scale"), a layer not measured
    NaN (drawn as background). ``end``: the last step of the run (the loss curve's), when it is
    later than the last sample; the columns up to it hold the last sample, so both charts share the axis.
    """
    if len(steps) == 0:
        return np.full((grad_rms.shape[1] if grad_rms.ndim == 2 else 0, 1), np.nan), 0, 1
    lo, hi = int(steps[0]), max(int(steps[-1]), end if end is not None else 0)
    grid = np.linspace(lo, hi, min(columns, hi - lo + 1))
    idx = np.clip(np.searchsorted(steps, grid, side="right") - 1, 0, len(steps) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        logged = np.log10(np.where(grad_rms >= 0, grad_rms, np.nan))
    return logged[idx].T, lo, max(hi, lo + 1)


class Chart:
    """An ``ipywidgets.Image`` showing the loss and the gradient flow of a trace."""

    def __init__(self, width: float = 9.0, height: float = 3.0, dpi: int = 80):
        self.widget = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.widget.add_class("ndbg-chart")
        self._size = (width, height, dpi)
        self._fig = None
        self._key = None
        self.renders = 0

    def _make(self) -> None:
        width, height, dpi = self._size
        fig = Figure(figsize=(width, height), dpi=dpi)  # fixed margins: a layout engine costs more than a draw
        FigureCanvasAgg(fig)
        self._ax_loss, self._ax_grad = fig.subplots(1, 2, width_ratios=(1, 1.3))
        fig.subplots_adjust(left=0.07, right=0.97, bottom=0.16, top=0.9, wspace=0.32)
        self._ax_loss.set_title("loss", fontsize=10)
        self._ax_loss.set_xlabel("step", fontsize=9)
        (self._line,) = self._ax_loss.plot([], [], lw=1.2, color="#1565c0")
        self._no_loss = self._ax_loss.text(0.5, 0.5, "no loss recorded\n(%%neuraldbg --loss NAME)", ha="center",
                                           va="center", transform=self._ax_loss.transAxes, color="#757575")
        self._ax_grad.set_title("gradient flow: log10 RMS(dL/d output)", fontsize=10)
        self._ax_grad.set_xlabel("step", fontsize=9)
        cmap = matplotlib.colormaps["magma"].with_extremes(bad="#eeeeee", under="#000000")
        self._image = self._ax_grad.imshow(np.full((1, 1), np.nan), aspect="auto", interpolation="nearest",
                                           cmap=cmap, extent=(0, 1, 0.5, -0.5))
        bar = fig.colorbar(self._image, ax=self._ax_grad, pad=0.01, extend="min")
        bar.locator = matplotlib.ticker.MaxNLocator(4)
        bar.ax.tick_params(labelsize=8)
        for ax in (self._ax_loss, self._ax_grad):
            ax.tick_params(labelsize=8)
            ax.locator_params(nbins=5)  # few tick labels: text is most of the drawing time
        self._fig = fig

    def update(self, trace, layer_order: list[int]) -> bool:
        """Redraw from ``trace`` when it has new data; ``layer_order``: trace rows, top to bottom.
        Returns whether a new PNG was rendered."""
        key = (trace.loss.n, trace.loss.steps[-1] if trace.loss.n else -1,
               trace.stats.n, trace.stats.steps[-1] if trace.stats.n else -1, tuple(layer_order))
        if key == self._key:
            return False
        self._key = key
        if self._fig is None:
            self._make()
        end = max(int(trace.loss.steps[-1]) if trace.loss.n else 0, int(trace.stats.steps[-1]) if trace.stats.n else 0)
        self._draw_loss(trace, end)
        self._draw_grad(trace, layer_order, end)
        buf = io.BytesIO()
        self._fig.canvas.print_png(buf)
        self.widget.value = buf.getvalue()
        self.renders += 1
        return True

    def close(self) -> None:
        """Let go of the figure (a retired dashboard redraws nothing)."""
        self._fig = None
        self._key = None

    def _draw_loss(self, trace, end: int) -> None:
        ax, steps, loss = self._ax_loss, trace.loss.steps, trace.loss.data.astype(float)
        self._line.set_data(steps, loss)
        self._no_loss.set_visible(len(steps) == 0)
        finite = loss[np.isfinite(loss)]
        if len(finite):
            positive = bool((finite > 0).all())
            spread = finite.max() / max(finite.min(), 1e-300) if positive else 0.0
            ax.set_yscale("log" if positive and spread > 100 else "linear")
            ax.relim()
            ax.autoscale_view()
        ax.set_xlim(0, max(end, 1))

    def _draw_grad(self, trace, layer_order: list[int], end: int) -> None:
        names = [trace.layers[i].name or "(model)" for i in layer_order]
        data = trace.stats.data
        rms = data[:, layer_order, int(Stat.GRAD_RMS)] if len(layer_order) else np.zeros((len(data), 0))
        matrix, lo, hi = gradient_flow(trace.stats.steps, rms, end=end)
        n = max(len(layer_order), 1)
        finite = matrix[np.isfinite(matrix)]
        if finite.size:
            vmin, vmax = float(finite.min()), float(finite.max()) + 1e-6
            self._image.set_clim(vmin, vmax)
            matrix = np.where(np.isneginf(matrix), vmin - 1.0, matrix)  # zero: below the scale
        self._image.set_data(matrix if matrix.size else np.full((1, 1), np.nan))
        self._image.set_extent((lo, hi, n - 0.5, -0.5))
        ax = self._ax_grad
        if len(names) <= 12:
            ax.set_yticks(range(len(names)), names, fontsize=7)
        else:
            ticks = np.linspace(0, len(names) - 1, 6).round().astype(int)
            ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=7)
