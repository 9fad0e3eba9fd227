"""How fast the dashboard reacts: a threshold move on a 50-layer, 2k-step trace (target < 100 ms),
a live refresh, and a chart redraw. Run: ``.venv/bin/python benchmarks/dashboard.py``."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from jupyter_cells import synthetic_session  # noqa: E402
from ndbg_jupyter._dashboard import Dashboard  # noqa: E402


def _ms(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dbg = synthetic_session(Path(tmp) / "bench.ndbg", n_layers=50, n_steps=2000, dead=25)
    dash = Dashboard()
    dash.show(dbg)
    print(f"trace: {len(dbg.trace.layers)} layers, {dbg.trace.stats.n} sampled steps")
    for name, slider in dash.controls.sliders.items():
        lo, hi = slider.min, slider.max
        log = type(slider).__name__ == "FloatLogSlider"
        values = [lo + (hi - lo) * k / 8 for k in range(1, 8)]
        values = [slider.base ** v for v in values] if log else values
        it = iter(values * 2)

        def move():
            slider.value = next(it)
        ms = _ms(move)
        print(f"slider {name:28s} reanalyze + redraw grid and panel: {ms:7.1f} ms  ({ms / 100:.2f} x the 100 ms target)")
    dash.controls.reset.click()
    print(f"live refresh (progress, grid, panel):       {_ms(dash.refresh):7.1f} ms")

    def chart():
        dash.chart._key = None
        dash.chart.update(dbg.trace, [l.index for l in dbg.trace.layers])
    print(f"chart redraw (PNG):                          {_ms(chart, 3):7.1f} ms")


if __name__ == "__main__":
    main()
