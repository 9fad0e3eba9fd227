"""The variation design: which runs of each (family, fault) pair are made.

Factors and levels: the model's initialisation seed (3), the data seed (2), width (2), depth (2),
run length (150 or 600 steps) and batch size (16 or 64). The full factorial would be 96 runs per
pair; instead each pair gets three rows, one per initialisation seed, in which every two-level
factor takes both levels (a covering design: every level of every factor appears for every pair).
Which row gets which level is drawn per pair and factor from a fixed hash, so that pairs differ in
how factors combine; the first level of each factor (data seed 0, narrow, shallow, 150 steps,
batch 16) takes two of the three rows, which keeps the cheap runs in the majority. Healthy runs
get six rows per family, each two-level factor balanced 3/3.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from .families import Variation

SEEDS = (0, 1, 2)
LEVELS = {"data_seed": (0, 1), "width": (0, 1), "depth": (0, 1), "steps": (150, 600), "batch": (16, 64)}
FAULTY_ROWS = 3
HEALTHY_ROWS = 6


def rows(key: str, n: int) -> list[Variation]:
    """``n`` variations for the pair named ``key``: seeds cycle; each two-level factor takes both levels."""
    rng = random.Random(zlib.crc32(key.encode()))
    while True:  # drawn again, from where the draws are, in the rare case two rows come out the same
        columns = {}
        for factor, levels in LEVELS.items():
            while True:
                pattern = [levels[i % 2] for i in range(n)]
                rng.shuffle(pattern)
                if len(set(pattern)) == 2:
                    break
            columns[factor] = pattern
        out = [Variation(seed=SEEDS[i % len(SEEDS)], **{f: columns[f][i] for f in LEVELS}) for i in range(n)]
        if len(set(out)) == n:
            return out


@dataclass(frozen=True)
class Case:
    family: str
    mechanism: str | None      # None: a healthy run
    var: Variation

    @property
    def id(self) -> str:
        return f"{self.family}/{self.mechanism or 'healthy'}/{self.var.key}"

    @property
    def faulty(self) -> bool:
        return self.mechanism is not None


def covers_every_level(variations: list[Variation]) -> bool:
    seen = {f: {getattr(v, f) for v in variations} for f in LEVELS}
    return all(seen[f] == set(LEVELS[f]) for f in LEVELS) and {v.seed for v in variations} == set(SEEDS)
