"""A run directory: the trace files of the ranks of one multi-process run, read and merged.

Each rank writes ``rank00000.ndbg``, ``rank00001.ndbg``, ... (``rankwatch``), and a file saved by hand
under such a name merges the same way. The merged run keeps every rank's trace and one rank axis
combined from all files: a rank's own measurements where its file exists, the copy gathered by rank 0
where it does not (a rank on another machine, or one that died before writing).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from . import fileformat
from .ranktrace import RankSeries
from .trace import Trace

RANK_FILE = re.compile(r"^rank(\d{5})\.ndbg$")


@dataclass
class MergedRun:
    """The ranks of one run. ``traces``: by rank, those with a trace here; ``steps``: completed steps per rank."""

    traces: dict[int, Trace]
    world: int
    ranks: RankSeries | None
    steps: dict[int, int]
    source: str = ""

    @property
    def present(self) -> list[int]:
        return sorted(self.traces)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.traces]

    @property
    def step(self) -> int:
        return max(self.steps.values(), default=0)

    def summary(self) -> str:
        """One line: how many ranks, and which stopped early or left no file."""
        parts = [f"{len(self.traces)} of {self.world} ranks"]
        full = self.step
        short = [f"rank {r} stopped at step {s}" for r, s in sorted(self.steps.items()) if s < full]
        if self.missing:
            parts.append("no trace from " + ", ".join(f"rank {r}" for r in self.missing))
        if short:
            parts.append(", ".join(short))
        failed = [(r, t.meta["merge_failure"]) for r, t in sorted(self.traces.items()) if t.meta.get("merge_failure")]
        if failed:
            parts.append(f"merging stopped (rank {failed[0][0]}: {failed[0][1]}): merged from the files")
        return "ranks: " + "; ".join(parts)


def rank_files(path: str | os.PathLike) -> dict[int, str]:
    """The rank files of a run directory, by the rank in their names."""
    try:
        names = os.listdir(path)
    except OSError as exc:
        raise ValueError(f"cannot read run directory {os.fspath(path)}: {exc.strerror or exc}") from None
    out = {}
    for name in names:
        m = RANK_FILE.match(name)
        if m:
            out[int(m.group(1))] = os.path.join(os.fspath(path), name)
    return out


def load_run(path: str | os.PathLike) -> tuple[MergedRun, dict]:
    """Read every rank file of a run directory; returns (run, meta of its lowest rank). ValueError for a
    directory with no rank file, an unreadable file, or files of different models or runs."""
    files = rank_files(path)
    if not files:
        raise ValueError(f"{os.fspath(path)} holds no rank trace files (rank00000.ndbg, rank00001.ndbg, ...)")
    traces: dict[int, Trace] = {}
    metas: dict[int, dict] = {}
    for named, f in sorted(files.items()):
        trace, meta = fileformat.load(f)  # ValueError with the file's name
        rank = meta.get("rank", named)
        if not isinstance(rank, int) or rank != named:
            raise ValueError(f"{f} holds the trace of rank {rank}, not of rank {named}")
        traces[rank], metas[rank] = trace, meta
    first = min(traces)
    names = traces[first].layer_names
    for r, t in traces.items():
        if t.layer_names != names:
            raise ValueError(f"rank {r}'s trace watches other layers than rank {first}'s: not one run")
    worlds = {int(m["world_size"]) for m in metas.values() if isinstance(m.get("world_size"), int)}
    if len(worlds) > 1:
        raise ValueError(f"the rank files disagree on the world size ({sorted(worlds)}): not one run")
    world = worlds.pop() if worlds else max(traces) + 1
    if max(traces) >= world:
        raise ValueError(f"rank {max(traces)} in a world of {world}")
    series = [t.ranks for t in traces.values() if t.ranks is not None]
    if any(s.world != world or s.layout != series[0].layout for s in series):
        raise ValueError("the rank files' rank statistics have different layouts: not one run")
    combined = RankSeries.combine(series, rank=first) if series else None
    steps = {r: int(m.get("step", 0)) for r, m in metas.items()}
    return MergedRun(traces=traces, world=world, ranks=combined, steps=steps, source=os.fspath(path)), metas[first]


def from_trace(trace: Trace, step: int) -> MergedRun | None:
    """The run as one rank's own trace sees it (its own column, and every rank's on rank 0); None for a
    trace of one process."""
    series = trace.ranks
    if series is None or series.world < 2:
        return None
    return MergedRun(traces={series.rank: trace}, world=series.world, ranks=series, steps={series.rank: step})
