"""Overhead of watching a training loop: watched/bare time ratio, same process, alternating rounds.

    python benchmarks/overhead.py [--rounds 7] [--quick]

Each workload trains the same model with the same data in alternating bare and watched
rounds (default NeuralDbg settings; one session per workload, paused between its rounds), on the
CPU with one thread. Before the rounds, the session watches the first steps of its run: every
step is sampled at the start of a run, and the sampling interval may grow to at most a quarter of
the steps run so far, so the rounds measure a run past its first ~100 steps, as most runs are.
``torch.autograd.detect_anomaly`` is shown as a reference row.
Targets: <= 1.03x on the MLP and the CNN, <= 1.15x on the deep net.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


def wide_mlp():
    layers = []
    for _ in range(7):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(1024, 10))
    return model, (lambda: torch.randn(256, 1024)), 10


def deep_net():
    blocks = []
    for _ in range(50):
        blocks += [nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU()]
    model = nn.Sequential(*blocks, nn.Linear(64, 10))
    return model, (lambda: torch.randn(64, 64)), 10


def small_cnn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    model = nn.Sequential(*block(3, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64), *block(64, 64),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    return model, (lambda: torch.randn(64, 3, 32, 32)), 10


# steps per round; the session first watches 8 rounds' worth (at least 64 steps) of its run
WORKLOADS = {"wide MLP (8x1024, batch 256)": (wide_mlp, 10),
             "deep net (151 layers, batch 64)": (deep_net, 60),
             "small CNN + BatchNorm (batch 64)": (small_cnn, 10)}


def run(model, opt, data, steps, start=0):
    t0 = time.perf_counter()
    for i in range(steps):
        x, y = data[(start + i) % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def bench(name, build, steps, rounds):
    torch.manual_seed(0)
    model, make_x, n_classes = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    data = [(make_x(), torch.randint(0, n_classes, (make_x().shape[0],))) for _ in range(4)]
    run(model, opt, data, 3)  # warm-up: allocator, kernels
    dbg = NeuralDbg(model, optimizer=opt)
    bare, watched, anomaly = [], [], []
    dbg.start()
    run(model, opt, data, max(8 * steps, 64))  # the first steps of the run: sampled densely
    dbg.stop()
    for r in range(rounds):
        bare.append(run(model, opt, data, steps))
        dbg.start()
        try:
            watched.append(run(model, opt, data, steps))
        finally:
            dbg.stop()
        with torch.autograd.detect_anomaly(check_nan=True):
            anomaly.append(run(model, opt, data, max(steps // 3, 2)) * steps / max(steps // 3, 2))
    ratio = statistics.median(w / b for w, b in zip(watched, bare))
    ratio_anomaly = statistics.median(a / b for a, b in zip(anomaly, bare))
    ms = statistics.median(bare) / steps * 1e3
    return name, ms, ratio, ratio_anomaly, len(dbg.trace.stats.steps), dbg.step


def main():
    import warnings
    warnings.filterwarnings("ignore", message=".*Anomaly Detection.*")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="fewer steps per round (a smoke run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU, 1 thread, {args.rounds} alternating rounds, median ratio")
    print(f"{'workload':34s} {'bare ms/step':>12s} {'NeuralDbg':>10s} {'detect_anomaly':>15s} {'sampled/steps':>14s}")
    for name, (build, steps) in WORKLOADS.items():
        if args.quick:
            steps = max(2, steps // 3)
        name, ms, ratio, ratio_anomaly, n_sampled, n_steps = bench(name, build, steps, args.rounds)
        print(f"{name:34s} {ms:12.2f} {ratio:9.3f}x {ratio_anomaly:14.2f}x {n_sampled:>7d}/{n_steps:<6d}")


if __name__ == "__main__":
    main()
