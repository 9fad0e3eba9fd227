"""Overhead of watching a 2-rank DistributedDataParallel run, and what merging the ranks adds.

    python benchmarks/distributed.py [--rounds 9] [--quick]

Two CPU processes (gloo, one thread each) train the same DDP model in alternating rounds: bare, watched
as one process would be (``distributed=False``: no merge), and watched as a rank (the default under a
process group: the same hooks plus the merge every ``merge_every`` steps over the gloo side group and the
rank's file in a run directory). Each session watches the first steps of its run before the rounds (the
dense start), and is paused between its rounds. Rank 0 prints the median ratios.

Each ratio is printed for wall time and for CPU time (of the process, all its threads: what the work
costs, whatever else the machine runs). What merging adds is the ratio of the ranked rounds to the
one-process rounds, and the time spent inside the rank machinery (batch fingerprints, gradient
projections, the rows, both collectives with any wait, the files), clocked around each of its calls,
over the bare time of the same steps. On a shared machine the wall-time ratios move by several percent
from run to run; the clocked share does not. Target: at most 2% on top of the one-process figure.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from neuraldbg import NeuralDbg


def mlp():
    layers = []
    for _ in range(5):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(512, 10)), (lambda: torch.randn(128, 512)), 10


def small_cnn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    model = nn.Sequential(*block(3, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    return model, (lambda: torch.randn(32, 3, 32, 32)), 10


WORKLOADS = {"MLP (6 Linear of 512, batch 128/rank)": (mlp, 50),
             "CNN + BatchNorm (batch 32/rank)": (small_cnn, 20)}


def run(model, opt, data, steps, start=0):
    """Wall and CPU time (of this process, all its threads) of ``steps`` training steps."""
    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        x, y = data[(start + i) % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, time.process_time() - c0


class Clocked:
    """Time spent inside the rank machinery of a session: its step-end work and its hooks."""

    def __init__(self, dbg):
        self.total = 0.0
        watch, probe = dbg._ranks, dbg._ranks.probe
        watch.step_done = self.wrap(watch.step_done)
        probe._on_forward = self.wrap(probe._on_forward)  # before attach: the hook registered is this one
        make = probe._make_grad_hook
        probe._make_grad_hook = lambda j: self.wrap(make(j))

    def wrap(self, fn):
        def timed(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.total += time.perf_counter() - t0
        return timed


def bench(build, steps, rounds, run_dir):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model, make_x, n_classes = build()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    torch.manual_seed(rank)
    data = [(make_x(), torch.randint(0, n_classes, (make_x().shape[0],))) for _ in range(4)]
    run(ddp, opt, data, 3)
    local = NeuralDbg(ddp, optimizer=opt, distributed=False)
    ranked = NeuralDbg(ddp, optimizer=opt, run_dir=run_dir)
    clocked = Clocked(ranked)
    for dbg in (local, ranked):  # the first steps of each run: sampled densely
        dbg.start()
        run(ddp, opt, data, max(8 * steps, 64))
        dbg.stop()
    clocked.total = 0.0
    times = {"bare": [], "local": [], "ranked": []}
    for _ in range(rounds):
        times["bare"].append(run(ddp, opt, data, steps))
        for name, dbg in (("local", local), ("ranked", ranked)):
            dbg.start()
            try:
                times[name].append(run(ddp, opt, data, steps))
            finally:
                dbg.stop()

    def median_ratio(a, b, k):  # k: 0 wall time, 1 CPU time
        return statistics.median(x[k] / y[k] for x, y in zip(times[a], times[b]))

    wall = {k: median_ratio(k, "bare", 0) for k in times}
    cpu = {k: median_ratio(k, "bare", 1) for k in times}
    merge = (median_ratio("ranked", "local", 0), median_ratio("ranked", "local", 1))
    ms = statistics.median(t for t, _ in times["bare"]) / steps * 1e3
    inside = clocked.total / sum(t for t, _ in times["bare"])
    sampled = (local.trace.stats.n, ranked.trace.stats.n)
    return ms, (wall["local"], cpu["local"]), (wall["ranked"], cpu["ranked"]), merge, inside, sampled, ranked.step


def worker(rank, world, port, rounds, quick):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            print(f"torch {torch.__version__}, CPU, {world} ranks (gloo), 1 thread each, {rounds} alternating "
                  "rounds, median ratio")
            print("wall / CPU time ratios; merge: ranked over one-process; inside: time in the rank machinery; "
                  "sampled: one-process/ranked/steps")
            print(f"{'workload':38s} {'bare ms/step':>12s} {'one-process':>14s} {'ranked':>14s} {'merge':>15s} "
                  f"{'inside':>7s} {'sampled/steps':>16s}")
        with tempfile.TemporaryDirectory() as tmp:
            for name, (build, steps) in WORKLOADS.items():
                steps = max(5, steps // 4) if quick else steps
                ms, local, ranked, merge, inside, sampled, n = bench(build, steps, rounds,
                                                                     os.path.join(tmp, str(len(name))))
                if rank == 0:
                    print(f"{name:38s} {ms:12.2f} {local[0]:6.3f}/{local[1]:.3f}x {ranked[0]:6.3f}/{ranked[1]:.3f}x "
                          f"{100 * (merge[0] - 1):+6.1f}/{100 * (merge[1] - 1):+.1f}% {100 * inside:+6.2f}% "
                          f"{sampled[0]:>5d}/{sampled[1]}/{n:<5d}", flush=True)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="fewer steps per round (a smoke run)")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(2, port, args.rounds, args.quick), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
