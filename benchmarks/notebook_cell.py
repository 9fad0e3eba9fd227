"""What a notebook user pays: the whole training cell, bare and under ``%%neuraldbg`` (live dashboard,
and ``--no-live``), in a real Jupyter kernel driven by nbclient.

    python benchmarks/notebook_cell.py [--lengths 200 2000] [--rounds 5] [--long-budget 300]
                                       [--workloads wide_mlp cnn deep net50 transformer] [--quick]

Each workload gets its own kernel (CPU torch, one thread). The same training cell runs bare, under
``%%neuraldbg model --optimizer opt`` and under ``%%neuraldbg model --optimizer opt --no-live``, in
alternating rounds (the order rotates from round to round); each cell is timed inside the kernel,
from the moment it starts to the moment it ends (IPython's ``pre_run_cell`` / ``post_run_cell``):
the session's set-up, every step from the first, the dashboard's updates, the verdict and the static
copy after the cell. Each watched cell is a new session, so every round pays a run's start again.

The ratios are watched/bare per round, by the wall clock; the table shows their median and range, and
the median ratio of the kernel process's CPU time with the live dashboard (its renderer thread
included; less disturbed than the wall clock by other jobs on a shared machine). Cells of the longer
length take minutes for the two heavy workloads: their number of rounds is cut so that a workload's
rounds at that length fit ``--long-budget`` seconds (at least one), and the table says how many ran.
Targets: live <= 1.10x at 200 steps and <= 1.05x at 2000; --no-live <= 1.05x at 200.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workloads import WORKLOADS  # noqa: E402

VARIANTS = {"bare": "", "live": "%%neuraldbg model --optimizer opt\n",
            "no-live": "%%neuraldbg model --optimizer opt --no-live\n"}
TARGETS = {("live", "short"): 1.10, ("live", "long"): 1.05, ("no-live", "short"): 1.05, ("no-live", "long"): 1.05}

SETUP = """\
import sys, time, torch, torch.nn.functional as F
sys.path[:0] = [{root!r}, {here!r}]  # the code of this checkout, and the workloads
%load_ext ndbg_jupyter
torch.set_num_threads(1)
from workloads import build
model, data = build({name!r})
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
_bench = {{"depth": 1, "start": (0.0, 0.0), "times": []}}  # (this cell's own end is seen, not its start)

def _bench_pre(info):  # the outermost cell only (the magic runs the cell's body as a cell of its own)
    if _bench["depth"] == 0:
        _bench["start"] = (time.perf_counter(), time.process_time())
    _bench["depth"] += 1

def _bench_post(result):
    _bench["depth"] -= 1
    if _bench["depth"] == 0:
        wall, cpu = _bench["start"]
        _bench["times"].append((time.perf_counter() - wall, time.process_time() - cpu))

get_ipython().events.register("pre_run_cell", _bench_pre)
get_ipython().events.register("post_run_cell", _bench_post)
"""

LOOP = """\
for step in range({steps}):
    x, y = data[step % len(data)]
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""

# the previous cell's time, and for a watched cell how many of its steps were sampled
READ = """print(*_bench["times"][-1], _ndbg.trace.stats.n if "_ndbg" in globals() else -1)"""


class Kernel:
    """One kernel, cells executed one by one (outputs kept, as a notebook would)."""

    def __init__(self, cwd: Path):
        import nbclient

        self.nb = nbformat.v4.new_notebook()
        self.nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        self.client = nbclient.NotebookClient(self.nb, timeout=3600, kernel_name="python3",
                                              resources={"metadata": {"path": str(cwd)}})

    def run(self, source: str):
        cell = nbformat.v4.new_code_cell(source)
        self.nb.cells.append(cell)
        self.client.execute_cell(cell, len(self.nb.cells) - 1)
        return cell

    def timed(self, source: str) -> tuple[float, float, int]:
        """Run ``source``; its wall and CPU time inside the kernel, and the sampled steps of its session
        (-1: none)."""
        self.run(source)
        out = self.run(READ).outputs
        text = "".join(o.get("text", "") for o in out if o.get("output_type") == "stream")
        wall, cpu, sampled = text.split()
        return float(wall), float(cpu), int(sampled)


def bench(name: str, lengths: list[int], rounds: int, long_budget: float, cwd: Path) -> list[dict]:
    kernel = Kernel(cwd)
    rows = []
    with kernel.client.setup_kernel():
        kernel.run(SETUP.format(root=str(HERE.parent), here=str(HERE), name=name))
        for prefix in VARIANTS.values():  # first runs: imports, the allocator, the first widgets
            kernel.run(prefix + LOOP.format(steps=10))
        step_s = kernel.timed(LOOP.format(steps=10))[0] / 10
        for steps in lengths:
            n = rounds
            if steps > min(lengths):  # long cells: as many rounds as fit the budget
                n = max(1, min(rounds, math.floor(long_budget / (len(VARIANTS) * steps * step_s))))
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            sampled: dict[str, list[int]] = {v: [] for v in VARIANTS}
            order = list(VARIANTS)
            for r in range(n):
                for variant in order[r % len(order):] + order[:r % len(order)]:
                    t, c, s = kernel.timed(VARIANTS[variant] + LOOP.format(steps=steps))
                    times[variant].append(t)
                    cpu[variant].append(c)
                    sampled[variant].append(s)
            rows.append({"name": name, "steps": steps, "rounds": n, "times": times, "cpu": cpu,
                         "sampled": sampled})
            print_row(rows[-1], lengths)
    return rows


def ratios(row: dict, variant: str, clock: str = "times") -> list[float]:
    return [w / b for w, b in zip(row[clock][variant], row[clock]["bare"])]


def print_header() -> None:
    print(f"{'workload':64s} {'steps':>5s} {'rounds':>6s} {'bare ms/step':>12s} "
          f"{'live (range)':>20s} {'--no-live (range)':>20s} {'live, CPU':>10s} {'sampled':>8s}")


def print_row(row: dict, lengths: list[int]) -> None:
    kind = "short" if row["steps"] == min(lengths) else "long"
    cells = []
    for variant in ("live", "no-live"):
        rs = ratios(row, variant)
        target = TARGETS[(variant, kind)]
        mark = "" if statistics.median(rs) <= target else " !"
        cells.append(f"{statistics.median(rs):.3f}x ({min(rs):.2f}-{max(rs):.2f}){mark}")
    ms = statistics.median(row["times"]["bare"]) / row["steps"] * 1e3
    sampled = statistics.median(row["sampled"]["live"])
    live_cpu = statistics.median(ratios(row, "live", "cpu"))
    print(f"{WORKLOADS[row['name']][1]:64s} {row['steps']:5d} {row['rounds']:6d} {ms:12.2f} "
          f"{cells[0]:>20s} {cells[1]:>20s} {live_cpu:9.3f}x {sampled:8.0f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[200, 2000], help="steps per cell")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (the shortest cells)")
    ap.add_argument("--long-budget", type=float, default=300.0, metavar="S",
                    help="seconds a workload's rounds of the longer cells may take (at least one round runs)")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--quick", action="store_true", help="cells of 20 and 60 steps, two rounds (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.lengths, args.rounds = [20, 60], 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import tempfile

    import torch
    print(f"torch {torch.__version__}, CPU, 1 thread; a kernel per workload, nbclient; median watched/bare ratio "
          f"of the whole cell over alternating rounds (range). Targets: live <= 1.10x at {min(args.lengths)} steps, "
          f"<= 1.05x at {max(args.lengths)}; --no-live <= 1.05x. '!' marks a miss.")
    print_header()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            bench(name, sorted(args.lengths), args.rounds, args.long_budget, Path(tmp))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
