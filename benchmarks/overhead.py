"""Overhead of watching a training loop: watched/bare time ratio, same process, alternating rounds.

    python benchmarks/overhead.py [--rounds 9] [--run-steps 200] [--quick]

Each workload trains the same model with the same data in alternating bare and watched rounds (default
NeuralDbg settings), on the CPU with one thread, and is measured twice:

- **whole run**: each watched round is a new session over ``--run-steps`` steps, from its first step
  (the session's set-up, every early step sampled, its end), against as many bare steps; the order of
  the two rotates from round to round;
- **steady state**: one session per workload, paused between its rounds, that first watched the first
  steps of its run (every step is sampled at the start of a run, and the sampling interval may grow to
  at most a quarter of the steps run so far): a run past its first ~100 steps, as most runs are.
  ``torch.autograd.detect_anomaly`` is a reference column.

The tiny MLP's step is well under a millisecond: what watching adds to it, per step, is printed in
microseconds: on an unsampled step (the fixed cost: the hooks' dispatch, the every-step check, the
schedule), in the thread's CPU time, and in the steady state with the sampled steps amortised.
Each ratio is the median over rounds, with its range. Targets: steady state <= 1.03x on the MLP and the
CNN, <= 1.15x on the deep net; whole run <= 1.05x; fixed cost <= 30 us a step.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # this checkout

from workloads import WORKLOADS, build, tiny_mlp  # noqa: E402

from neuraldbg import NeuralDbg  # noqa: E402

# steps per steady-state round; the session first watches 8 rounds' worth (at least 64 steps) of its run
STEADY_STEPS = {"wide_mlp": 10, "deep": 60, "cnn": 10, "tiny": 2000}
TARGETS = {"steady": {"wide_mlp": 1.03, "cnn": 1.03, "deep": 1.15, "tiny": None}, "whole": 1.05}
FIXED_TARGET_US = 30.0


def run(model, opt, data, steps, start=0):
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = data[(start + i) % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def watched_run(model, opt, data, steps):
    """A new session over ``steps`` steps, timed from its creation to its end."""
    t0 = time.perf_counter()
    with NeuralDbg(model, optimizer=opt):
        run(model, opt, data, steps)
    return time.perf_counter() - t0


def setup(name):
    if name == "tiny":
        torch.manual_seed(0)
        model, data = tiny_mlp()
    else:
        model, data = build(name)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    run(model, opt, data, 3)  # warm-up: allocator, kernels
    return model, opt, data


def whole(name, steps, rounds):
    """Per round: (bare seconds, watched seconds) of ``steps`` steps, the order alternating."""
    model, opt, data = setup(name)
    watched_run(model, opt, data, 3)  # the first session of the process: imports, first calls
    bare, watched = [], []
    for r in range(rounds):
        if r % 2:
            watched.append(watched_run(model, opt, data, steps))
            bare.append(run(model, opt, data, steps))
        else:
            bare.append(run(model, opt, data, steps))
            watched.append(watched_run(model, opt, data, steps))
    return bare, watched


def steady(name, steps, rounds, anomaly=True):
    """Per round: bare, watched and detect_anomaly seconds of ``steps`` steps, one session past its start."""
    model, opt, data = setup(name)
    dbg = NeuralDbg(model, optimizer=opt)
    dbg.start()
    run(model, opt, data, max(8 * steps, 64))  # the first steps of the run: sampled densely
    dbg.stop()
    bare, watched, anomalous = [], [], []
    for r in range(rounds):
        order = ("bare", "watched") if r % 2 == 0 else ("watched", "bare")
        for what in order:
            if what == "bare":
                bare.append(run(model, opt, data, steps))
                continue
            dbg.start()
            try:
                watched.append(run(model, opt, data, steps))
            finally:
                dbg.stop()
        if anomaly:
            n = max(steps // 3, 2)
            with torch.autograd.detect_anomaly(check_nan=True):
                anomalous.append(run(model, opt, data, n) * steps / n)
    return bare, watched, anomalous, dbg


def spread(watched, bare):
    rs = [w / b for w, b in zip(watched, bare)]
    return f"{statistics.median(rs):.3f}x ({min(rs):.2f}-{max(rs):.2f})", statistics.median(rs)


def main(argv=None):
    import warnings
    warnings.filterwarnings("ignore", message=".*Anomaly Detection.*")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--run-steps", type=int, default=200, help="steps of a whole run, from its first")
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rounds, run_steps = (3, 30) if args.quick else (args.rounds, args.run_steps)
    print(f"torch {torch.__version__}, CPU, 1 thread, {rounds} alternating rounds; median watched/bare ratio "
          "(range); '!' marks a missed target")
    print(f"{'workload':64s} {'bare ms/step':>12s} {f'whole run, {run_steps} steps':>24s} "
          f"{'steady state':>20s} {'detect_anomaly':>14s} {'sampled/steps':>14s}")
    for name in ("wide_mlp", "cnn", "deep"):
        steps = max(2, STEADY_STEPS[name] // 3) if args.quick else STEADY_STEPS[name]
        wb, ww = whole(name, run_steps, rounds)
        sb, sw, sa, dbg = steady(name, steps, rounds)
        w_text, w_ratio = spread(ww, wb)
        s_text, s_ratio = spread(sw, sb)
        w_text += " !" if w_ratio > TARGETS["whole"] else ""
        s_text += " !" if s_ratio > TARGETS["steady"][name] else ""
        ratio_anomaly = statistics.median(a / b for a, b in zip(sa, sb))
        ms = statistics.median(sb) / steps * 1e3
        print(f"{WORKLOADS[name][1]:64s} {ms:12.2f} {w_text:>24s} {s_text:>20s} {ratio_anomaly:13.2f}x "
              f"{dbg.trace.stats.n:>7d}/{dbg.step:<6d}", flush=True)
    steps = 200 if args.quick else STEADY_STEPS["tiny"]
    sb, sw, _, dbg = steady("tiny", steps, rounds, anomaly=False)
    wb, ww = whole("tiny", run_steps, rounds)
    ms = statistics.median(sb) / steps * 1e3
    w_text, _ = spread(ww, wb)
    s_text, _ = spread(sw, sb)
    print(f"{'tiny MLP (3 Linear of 32, batch 32)':64s} {ms:12.3f} {w_text:>24s} {s_text:>20s} {'':>14s} "
          f"{dbg.trace.stats.n:>7d}/{dbg.step:<6d}")
    amortised = sorted((w - b) / steps * 1e6 for w, b in zip(sw, sb))
    fixed = fixed_cost(steps, rounds)
    mark = "" if statistics.median(fixed) <= FIXED_TARGET_US else " !"
    print(f"tiny MLP, what watching adds to a step: {statistics.median(fixed):.1f} us on an unsampled step "
          f"(CPU time; range {fixed[0]:.1f}-{fixed[-1]:.1f}; target <= {FIXED_TARGET_US:.0f} us){mark}; "
          f"{statistics.median(amortised):.1f} us with the sampled steps amortised (wall clock; "
          f"range {amortised[0]:.1f}-{amortised[-1]:.1f})")


def fixed_cost(steps, rounds):
    """Microseconds watching adds to an unsampled step of the tiny MLP, per round (sorted): the thread's
    CPU time, which other processes on a shared machine disturb less than the wall clock."""
    model, opt, data = setup("tiny")
    dbg = NeuralDbg(model, optimizer=opt, every=1 << 40)  # step 0 sampled, then none
    dbg.start()
    run(model, opt, data, 64)
    dbg.stop()
    out = []
    for r in range(max(rounds, 9)):
        t0 = time.thread_time()
        run(model, opt, data, steps)
        bare = time.thread_time() - t0
        dbg.start()
        t0 = time.thread_time()
        run(model, opt, data, steps)
        watched = time.thread_time() - t0
        dbg.stop()
        out.append((watched - bare) / steps * 1e6)
    return sorted(out)


if __name__ == "__main__":
    main()
