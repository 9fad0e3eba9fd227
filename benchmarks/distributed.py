"""Overhead of watching a 2-rank DistributedDataParallel run, and what merging the ranks adds.

    python benchmarks/distributed.py [--rounds 9] [--quick]

Two CPU processes (gloo, one thread each) train the same DDP model in alternating rounds: bare, watched
as one process would be (``distributed=False``: no merge), and watched as a rank (the default under a
process group: the same hooks plus the merge every ``merge_every`` steps over the gloo side group and the
rank's file in a run directory). Each session watches the first steps of its run before the rounds (the
dense start), and is paused between its rounds. Rank 0 prints the median ratios.

What merging adds is printed twice: as the ratio of the ranked rounds to the one-process rounds (both
ranks' wall time; on a shared machine it moves by several percent from run to run), and as the time
spent inside the rank machinery (batch fingerprints, gradient projections, the rows, both collectives
with their waits, the files), clocked around each of its calls, over the bare time of the same steps.
Target: at most 2% on top of the one-process figure.
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
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = data[(start + i) % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


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
    ratio = {k: statistics.median(t / b for t, b in zip(v, times["bare"])) for k, v in times.items()}
    merge = statistics.median(r / l for r, l in zip(times["ranked"], times["local"]))
    ms = statistics.median(times["bare"]) / steps * 1e3
    inside = clocked.total / sum(times["bare"])
    return ms, ratio["local"], ratio["ranked"], merge, inside, ranked._ranks.merges, ranked.step


def worker(rank, world, port, rounds, quick):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 0:
            print(f"torch {torch.__version__}, CPU, {world} ranks (gloo), 1 thread each, {rounds} alternating "
                  "rounds, median ratio")
            print(f"{'workload':40s} {'bare ms/step':>12s} {'one-process':>12s} {'ranked':>8s} {'merge':>8s} "
                  f"{'inside':>8s} {'merges/steps':>13s}")
        with tempfile.TemporaryDirectory() as tmp:
            for name, (build, steps) in WORKLOADS.items():
                steps = max(5, steps // 4) if quick else steps
                ms, local, ranked, merge, inside, merges, n = bench(build, steps, rounds,
                                                                    os.path.join(tmp, str(len(name))))
                if rank == 0:
                    print(f"{name:40s} {ms:12.2f} {local:11.3f}x {ranked:7.3f}x {100 * (merge - 1):+7.1f}% "
                          f"{100 * inside:+7.2f}% {merges:>6d}/{n:<6d}", flush=True)
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
