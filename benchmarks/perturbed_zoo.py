"""The zoo off its tuning: every case of ``tests/zoo.py`` / ``test_zoo.py`` and ``tests/zoo_heldout.py``
re-run with the model initialised from seed +1 and +2, and with twice the steps, and checked against
the case's own expectation (faulty: the top hypothesis's cause, layer and onset at confidence >= 0.5;
healthy: nothing at 0.5). A NaN's onset moves with the seed: a ``non_finite`` verdict may also be dated at
this run's own first non-finite loss (or up to the case's window width before it). Prints the failures.

    .venv/bin/python benchmarks/perturbed_zoo.py [--jobs N] [--filter NAME ...] [--every N] [--out PATH] [--strict]

The zoo builders seed the model themselves with ``torch.manual_seed(n)``; the seed is shifted by
calling each builder with ``torch.manual_seed`` replaced by one that adds the offset (the data, drawn
from generators of their own, stays the same).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent
TESTS = ROOT.parent / "tests"
DEFAULT_OUT = ROOT / "results" / "perturbed_zoo.json"
VARIANTS = {"seed+1": (1, 1), "seed+2": (2, 1), "steps x2": (0, 2)}   # name -> (seed offset, step factor)


@contextlib.contextmanager
def shifted_seed(offset: int):
    """``torch.manual_seed(n)`` seeds with ``n + offset`` inside the block."""
    import torch
    original = torch.manual_seed
    torch.manual_seed = lambda seed: original(int(seed) + offset)
    try:
        yield
    finally:
        torch.manual_seed = original


def _zoos():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import test_zoo
    import zoo_heldout
    cases = {}
    for name, (build, exp) in test_zoo.FAULTY.items():
        cases[f"zoo/{name}"] = (build, [(str(exp.cause), exp.layer)], tuple(exp.onset))
    for name, build in test_zoo.HEALTHY.items():
        cases[f"zoo/{name}"] = (build, None, None)
    for name, (build, exp) in zoo_heldout.FAULTY.items():
        cases[f"heldout/{name}"] = (build, [(str(c), l) for c, l in exp.accepted], tuple(exp.onset))
    for name, build in zoo_heldout.HEALTHY.items():
        cases[f"heldout/{name}"] = (build, None, None)
    return cases


def _init_worker() -> None:
    import torch
    torch.set_num_threads(1)
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))


def _nan_dated(top, onset: tuple[int, int], bad: list[int]) -> bool:
    """A NaN's onset moves with the seed: a ``non_finite`` verdict is on time when it is dated at or before this
    run's own first non-finite loss, by no more than the case's window is wide."""
    if str(top.cause) != "non_finite" or not bad:
        return False
    return bad[0] - (onset[1] - onset[0]) <= top.step <= bad[0]


def check(task: tuple[str, str, int | None]) -> dict:
    """One case under one variant: its verdict and whether it still meets the case's expectation."""
    from zoo import train
    name, variant, every = task
    build, accepted, onset = _zoos()[name]
    offset, factor = VARIANTS[variant]
    try:
        with shifted_seed(offset):
            run = build()
        run.steps *= factor
        if every is not None:
            run.options = {**run.options, "every": every}
        dbg = train(run)
        hyps = dbg.explain()
    except Exception as e:  # noqa: BLE001 - a crash is a failure, reported with the rest
        return {"case": name, "variant": variant, "ok": False, "why": f"error: {e!r}", "verdict": []}
    loss = dbg.trace.loss
    bad = [int(s) for s, v in zip(loss.steps, loss.data) if not math.isfinite(float(v))]
    verdict = [f"{h.cause}@{h.layer or '(model)'} {h.confidence:.2f} step {h.step}" for h in hyps[:3]]
    loud = [h for h in hyps if h.confidence >= 0.5]
    if accepted is None:
        ok, why = not loud, "false alarm" if loud else None
    else:
        top = hyps[0] if hyps else None
        if top is None or top.confidence < 0.5:
            ok, why = False, "no hypothesis at 0.5"
        elif (str(top.cause), top.layer) not in accepted:
            ok, why = False, f"expected {' or '.join(f'{c}@{l}' for c, l in accepted)}"
        elif onset[0] <= top.step <= onset[1] or _nan_dated(top, onset, bad):
            ok, why = True, None
        else:
            why = f"onset {top.step} outside {onset[0]}-{onset[1]}"
            if bad:
                why += f" (first non-finite loss at step {bad[0]})"
            ok = False
    return {"case": name, "variant": variant, "ok": ok, "why": why, "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--filter", action="append", default=[], metavar="NAME")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--strict", action="store_true", help="exit with 1 when a run fails")
    ap.add_argument("--every", type=int, default=None, metavar="N",
                    help="NeuralDbg's sampling interval (default: its own, which adapts to the machine's speed)")
    args = ap.parse_args(argv)
    names = [n for n in _zoos() if not args.filter or any(f in n for f in args.filter)]
    tasks = [(n, v, args.every) for n in names for v in VARIANTS]
    start = time.perf_counter()
    import multiprocessing as mp
    with ProcessPoolExecutor(args.jobs, initializer=_init_worker, mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(check, tasks, chunksize=1))
    elapsed = time.perf_counter() - start
    failed = [r for r in results if not r["ok"]]
    print(f"perturbed zoo: {len(results)} runs ({len(names)} cases x {', '.join(VARIANTS)}), "
          f"{len(failed)} fail, {elapsed:.0f} s")
    for r in failed:
        print(f"  FAIL {r['case']} [{r['variant']}]: {r['why']}; got {' | '.join(r['verdict']) or '(none)'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": len(results), "failed": len(failed), "seconds": round(elapsed, 1),
                                    "results": results}, indent=1))
    return 1 if (failed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
