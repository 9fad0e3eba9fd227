"""How fast the dashboard reacts: a threshold move on a 50-layer, 2k-step trace (target < 100 ms),
a live refresh, and a chart redraw of a 60-layer, 2k-step trace, flat and folded (the chart is
``render_chart(view, rows) -> SVG text``; a redraw is that call, at most once a ``chart_interval``).
Run: ``.venv/bin/python benchmarks/dashboard.py``."""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from jupyter_cells import synthetic_session  # noqa: E402
from ndbg_jupyter._chart import render_chart  # noqa: E402
from ndbg_jupyter._dashboard import Dashboard  # noqa: E402
from ndbg_jupyter._grid import HealthGrid  # noqa: E402


def _ms(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _mover(slider):
    lo, hi = slider.min, slider.max
    log = type(slider).__name__ == "FloatLogSlider"
    values = [lo + (hi - lo) * k / 8 for k in range(1, 8)]
    values = [slider.base ** v for v in values] if log else values
    it = iter(values * 2)

    def move():
        slider.value = next(it)
    return move


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dbg = synthetic_session(Path(tmp) / "bench.ndbg", n_layers=50, n_steps=2000, dead=25)
        big = synthetic_session(Path(tmp) / "chart.ndbg", n_layers=60, n_steps=2000, dead=30)
    dash = Dashboard()
    dash.show(dbg)
    print(f"trace: {len(dbg.trace.layers)} layers, {dbg.trace.stats.n} sampled steps")
    for name, slider in dash.controls.sliders.items():
        ms = _ms(_mover(slider))
        print(f"slider {name:28s} reanalyze + redraw grid and panel: {ms:7.1f} ms  "
              f"({ms / 100:.2f} x the 100 ms target)")
    dash.controls.reset.click()
    print(f"live refresh (progress, grid, panel):       {_ms(dash.refresh):7.1f} ms")

    view = big.view
    layers = [view.layers[i] for i in view.order]
    for fold_above, what in ((100, "60 rows, one per layer"), (40, "folded to 6 rows")):
        grid = HealthGrid(fold_above=fold_above)
        grid.update(layers, big.health())
        rows = grid.rows()
        svg = render_chart(view, rows)
        ms = _ms(lambda rows=rows: render_chart(view, rows), 9)
        print(f"chart redraw, 60 layers x {len(view.steps)} samples, {what:24s}: {ms:6.1f} ms "
              f"({len(svg) / 1024:.0f} kB of SVG)")


if __name__ == "__main__":
    main()
