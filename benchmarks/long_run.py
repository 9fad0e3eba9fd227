"""A long run: memory stays within the trace bound and the cost per step does not grow.

    python benchmarks/long_run.py [--steps 100000]

Trains a small MLP for ``--steps`` steps under one NeuralDbg session and prints, at 1k, 10k
and 100k steps, the mean time per step over the last window, the trace's memory and the
number of sampled rows kept.
"""
from __future__ import annotations

import argparse
import time
import resource

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    data = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(8)]
    checkpoints = {c for c in (1_000, 10_000, 100_000, args.steps) if c <= args.steps}
    def bare(n):
        t = time.perf_counter()
        for step in range(n):
            x, y = data[step % len(data)]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t) / n * 1e6

    bare(200)
    print(f"bare loop: {bare(2000):.1f} us/step")
    print(f"{'steps':>8s} {'us/step (last window)':>22s} {'trace MB':>9s} {'rows kept':>10s} {'max RSS MB':>11s}")
    with NeuralDbg(model, optimizer=opt) as dbg:
        t0, last = time.perf_counter(), 0
        for step in range(1, args.steps + 1):
            x, y = data[step % len(data)]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            if step in checkpoints:
                t1 = time.perf_counter()
                per_step = (t1 - t0) / (step - last) * 1e6
                heap = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"{step:8d} {per_step:22.1f} {dbg.trace.nbytes / 2 ** 20:9.2f} "
                      f"{dbg.trace.stats.n:10d} {heap:11.1f}")
                t0, last = time.perf_counter(), step
    print("verdict:", [(h.cause.value, h.layer, round(h.confidence, 2)) for h in dbg.explain()] or "healthy")


if __name__ == "__main__":
    main()
