"""Re-analysis time: health states, events, links and hypotheses from a stored trace, no model.

    python benchmarks/reanalyze.py [--layers 200] [--steps 10000] [--repeat 5]

Builds a synthetic trace (a deep MLP-like layer table: Linear/ReLU pairs, gradients fading
toward the input, one ReLU layer dying halfway through, a recorded loss) and times
``analyze`` with the default thresholds and with a changed one. Target: <= 100 ms for
200 layers x 10k stored steps.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from neuraldbg import Stat, Thresholds
from neuraldbg import health
from neuraldbg.analysis import analyze
from neuraldbg.layers import Kind, LayerInfo
from neuraldbg.stats import N_STATS
from neuraldbg.trace import GLOBAL_COLUMNS, BoundedSeries, Trace


def synthetic_trace(n_layers: int, n_steps: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(n_layers):
        relu = i % 2 == 1
        layers.append(LayerInfo(index=i, name=f"net.{i}", type_name="ReLU" if relu else "Linear",
                                kind=Kind.RELU if relu else Kind.LINEAR, n_params=0 if relu else 4160,
                                n_trainable=0 if relu else 4160, order=i))
    data = np.full((n_steps, n_layers, N_STATS), np.nan, dtype=np.float32)
    data[:, :, Stat.ACT_MEAN] = rng.normal(0, 0.1, (n_steps, n_layers))
    data[:, :, Stat.ACT_STD] = 1.0 + 0.05 * rng.random((n_steps, n_layers))
    data[:, :, Stat.ACT_ABSMAX] = 4.0
    data[:, :, Stat.ACT_NONFINITE] = 0.0
    data[:, 1::2, Stat.ACT_DEAD] = 0.05 * rng.random((n_steps, n_layers // 2))
    data[:, :, Stat.GRAD_RMS] = np.logspace(-3, -1, n_layers)[None, :] * (1 + 0.1 * rng.random((n_steps, n_layers)))
    data[:, :, Stat.GRAD_NONFINITE] = 0.0
    data[:, 0::2, Stat.W_NORM] = 8.0
    data[:, 0::2, Stat.W_GRAD_NORM] = data[:, 0::2, Stat.GRAD_RMS] * 10
    data[:, 0::2, Stat.W_UPDATE_NORM] = 8e-3
    dead = n_layers // 2 + 1
    data[n_steps // 2:, dead, Stat.ACT_DEAD] = 1.0
    data[n_steps // 2:, :dead, Stat.W_GRAD_NORM] = 0.0
    steps = np.arange(n_steps, dtype=np.int64)
    g = np.full((n_steps, len(GLOBAL_COLUMNS)), np.nan, dtype=np.float32)
    g[:, :5] = [0.01, 0.0, 1.0, 4.0, 0.0]
    trace = Trace(layers, capacity=n_steps)
    trace.stats = BoundedSeries.from_arrays(steps, data, n_steps)
    trace.globals = BoundedSeries.from_arrays(steps, g, n_steps)
    loss = (2.0 * np.exp(-steps / 2000) + 0.05 * rng.random(n_steps)).astype(np.float32)
    trace.loss = BoundedSeries.from_arrays(steps, loss, n_steps)
    return trace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    trace = synthetic_trace(args.layers, args.steps)
    th = Thresholds()
    cold = []
    for _ in range(args.repeat):
        health._CACHE.clear()  # the first analysis of a trace also copies its statistics out
        t0 = time.perf_counter()
        analyze(trace, th, steps=args.steps)
        cold.append(time.perf_counter() - t0)
    rows = []
    for label, thresholds in (("defaults", th), ("dead_fraction=0.3", th.replace(dead_fraction=0.3))):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = analyze(trace, thresholds, steps=args.steps)
            times.append(time.perf_counter() - t0)
        rows.append((label, statistics.median(times), result))
    print(f"reanalyze: {args.layers} layers x {args.steps} stored steps (target <= 100 ms)")
    print(f"  {'first analysis':<20} {statistics.median(cold) * 1e3:8.1f} ms   (statistics copied out of the trace)")
    for label, t, result in rows:
        top = result.hypotheses[0] if result.hypotheses else None
        print(f"  {label:<20} {t * 1e3:8.1f} ms   {len(result.events):4d} events   top: {top}")


if __name__ == "__main__":
    main()
