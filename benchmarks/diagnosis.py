"""Diagnosis scoreboard: every case of the fault generator (``benchmarks/faultgen``) trained with the
real NeuralDbg over a real loop, scored against the verdict a practitioner would give.

    .venv/bin/python benchmarks/diagnosis.py [--part dev|heldout|all] [--filter NAME ...] [--jobs N]
                                             [--quick] [--slice] [--every N] [--out PATH] [--check-faults]

Prints the scoreboard of the development and the held-out part separately and saves everything
(every run's verdict) as JSON. ``--check-faults`` instead trains every selected case without NeuralDbg
and lists the faults that do no harm (mislabelled cases; there should be none).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from faultgen import registry, score  # noqa: E402
from faultgen.design import Case  # noqa: E402

DEFAULT_OUT = ROOT / "results" / "diagnosis.json"


def _init_worker() -> None:
    import torch
    torch.set_num_threads(1)


def _run(case_id: str, every: int | None = None) -> dict:
    from faultgen import runner
    return runner.run(case_id, every=every)


def _check(case_id: str) -> tuple[str, str | None]:
    from faultgen import runner
    try:
        return case_id, runner.bite(registry.case(case_id))
    except Exception as e:  # noqa: BLE001 - a crash while checking is a failed check
        return case_id, f"error: {e!r}"


def select(part: str, filters: list[str], quick: bool, slice_: bool = False) -> list[Case]:
    chosen = registry.slice_cases(part) if slice_ else registry.cases(part)
    if filters:
        chosen = [c for c in chosen if any(f in (c.family, c.mechanism or "healthy") or f in c.id for f in filters)]
    if quick:  # per pair, the first 150-step row; per family, two healthy ones
        kept, seen = [], Counter()
        for c in chosen:
            key = (c.family, c.mechanism)
            if c.var.steps == 150 and seen[key] < (2 if c.mechanism is None else 1):
                seen[key] += 1
                kept.append(c)
        chosen = kept
    return sorted(chosen, key=lambda c: -c.var.steps * c.var.batch)  # long runs first: the pool ends together


def _pool(jobs: int):
    import multiprocessing as mp
    return ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, mp_context=mp.get_context("spawn"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("dev", "heldout", "all"), default="all")
    ap.add_argument("--filter", action="append", default=[], metavar="NAME",
                    help="keep cases of this family or mechanism ('healthy' for the healthy runs); repeatable")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one 150-step run per (family, fault), two healthy ones")
    ap.add_argument("--slice", action="store_true", help="the cases of the test suite's slice instead")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check-faults", action="store_true", help="check that every fault harms its run (no NeuralDbg)")
    ap.add_argument("--no-misses", action="store_true", help="do not print the list of misses")
    ap.add_argument("--every", type=int, default=None, metavar="N",
                    help="NeuralDbg's sampling interval (default: its own, which adapts to the measured cost of a "
                         "step, so a few verdicts move with the machine's load; a fixed N makes runs repeatable)")
    args = ap.parse_args(argv)

    cases = select(args.part, args.filter, args.quick, args.slice)
    if not cases:
        print("no case matches", file=sys.stderr)
        return 2
    start = time.perf_counter()
    with _pool(args.jobs) as pool:
        if args.check_faults:
            bad = [(i, why) for i, why in pool.map(_check, [c.id for c in cases]) if why]
            for i, why in bad:
                print(f"DOES NOT BITE {i}: {why}")
            took = time.perf_counter() - start
            print(f"{len(cases)} cases checked, {len(bad)} whose fault does no harm ({took:.0f} s)")
            return 1 if bad else 0
        runs = []
        for n, out in enumerate(pool.map(partial(_run, every=args.every), [c.id for c in cases], chunksize=1), 1):
            runs.append(out)
            if n % 50 == 0 or n == len(cases):
                print(f"  {n}/{len(cases)} runs, {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start

    runs.sort(key=lambda r: r["id"])
    parts = {p: score.summarize([r for r in runs if r["part"] == p]) for p in ("dev", "heldout")
             if any(r["part"] == p for r in runs)}
    for name, s in parts.items():
        label = {"dev": "development part", "heldout": "held-out part"}[name]
        print(score.render(label, s, misses=not args.no_misses))
        print()
    print(f"{len(runs)} runs in {elapsed:.0f} s with {args.jobs} workers")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"runs": len(runs), "seconds": round(elapsed, 1), "jobs": args.jobs, "quick": args.quick,
            "part": args.part, "filters": args.filter, "every": args.every, "slice": args.slice}
    args.out.write_text(json.dumps({"meta": meta, "parts": parts, "runs": runs}, indent=1, default=str))
    print(f"saved {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
