"""The ``.ndbg`` trace file: versioned, self-describing, and never unpickled.

Layout (all integers little-endian)::

    8 bytes   magic  b"NDBGTRC\\x00"
    4 bytes   format version (uint32), currently 2
    8 bytes   header length H (uint64)
    H bytes   header: UTF-8 JSON with "meta", "layers", "nonfinite", "overflow", "capacity",
              "stat_columns" and "global_columns" (the names of the statistics' columns) and "arrays",
              where each array is {"name", "dtype", "shape", "offset", "nbytes"}; a trace of one rank of
              a multi-process run adds "ranks" (see ``ranktrace``) and its ``rank_*`` arrays, which
              readers without them skip
    ...       the arrays' raw bytes, C order, at ``offset`` from the end of the header

Columns are matched by name: a statistic this version does not record is dropped, one the file lacks
reads as not measured (NaN). Version 1 files (no skipped steps; without "stat_columns", the thirteen
statistics of ``_V1_COLUMNS`` by position) still load. Reading checks every declared
size against the file's real size before allocating anything, accepts only the numeric dtypes it
writes, and raises ``ValueError`` with one line for any truncated, foreign or inconsistent file.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from .layers import LayerInfo
from .ranktrace import LAYOUT_VERSION, RankSeries
from .trace import GLOBAL_COLUMNS, BoundedSeries, NonFiniteOrigin, Trace
from .stats import N_STATS, Stat

MAGIC = b"NDBGTRC\x00"
VERSION = 2
_READS = (1, 2)
_STAT_NAMES = [s.name for s in Stat]
# The statistics of version 1 files without "stat_columns", in their order.
_V1_COLUMNS = ["ACT_MEAN", "ACT_STD", "ACT_ABSMAX", "ACT_NONFINITE", "ACT_DEAD", "ACT_SATURATED", "GRAD_RMS",
               "GRAD_ABSMAX", "GRAD_NONFINITE", "GRAD_DEAD", "W_NORM", "W_GRAD_NORM", "W_UPDATE_NORM"]
_PREFIX = struct.Struct("<8sIQ")
_DTYPES = {"<f4": np.float32, "<f8": np.float64, "<i8": np.int64}
_MAX_HEADER = 64 * 1024 * 1024

_ARRAYS = ("stats_steps", "stats", "globals", "loss_steps", "loss", "skipped_steps", "skipped")
_ARRAYS_V1 = _ARRAYS[:5]
_RANK_ARRAYS = ("rank_row_steps", "rank_rows", "rank_batch_steps", "rank_batches")  # present with "ranks"


def save(trace: Trace, path: str | os.PathLike, extra_meta: dict | None = None) -> None:
    arrays = {
        "stats_steps": trace.stats.steps.astype("<i8"),
        "stats": trace.stats.data.astype("<f4"),
        "globals": trace.globals.data.astype("<f4"),
        "loss_steps": trace.loss.steps.astype("<i8"),
        "loss": trace.loss.data.astype("<f8"),
        "skipped_steps": trace.skipped.steps.astype("<i8"),
        "skipped": trace.skipped.data.astype("<f8"),
    }
    if trace.ranks is not None:
        arrays.update(trace.ranks.arrays())
    specs, offset = [], 0
    for name in arrays:
        a = np.ascontiguousarray(arrays[name])
        arrays[name] = a
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                      "nbytes": int(a.nbytes)})
        offset += a.nbytes
    header = {
        "meta": {**trace.meta, **(extra_meta or {})},
        "layers": [l.to_dict() for l in trace.layers],
        "nonfinite": trace.nonfinite.to_dict() if trace.nonfinite else None,
        "overflow": trace.overflow.to_dict() if trace.overflow else None,
        "capacity": trace.capacity, "loss_capacity": trace.loss_capacity,
        "n_stats": N_STATS, "stat_columns": _STAT_NAMES, "global_columns": list(GLOBAL_COLUMNS),
        "arrays": specs,
    }
    if trace.ranks is not None:
        header["ranks"] = trace.ranks.header()
    blob = json.dumps(header, allow_nan=True, default=str).encode("utf-8")
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(_PREFIX.pack(MAGIC, VERSION, len(blob)))
        f.write(blob)
        for name in arrays:
            f.write(arrays[name].tobytes())
    os.replace(tmp, path)


def _fail(path, why: str):
    raise ValueError(f"{os.fspath(path)} is not a readable NeuralDbg trace: {why}")


def load(path: str | os.PathLike) -> tuple[Trace, dict]:
    """Read a trace file; returns (trace, meta). Raises ValueError for anything malformed."""
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as exc:
        raise ValueError(f"cannot open trace {os.fspath(path)}: {exc.strerror or exc}") from None
    with f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            _fail(path, "file too short")
        magic, version, hlen = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            _fail(path, "wrong magic bytes (not a .ndbg file)")
        if version not in _READS:
            _fail(path, f"format version {version} is not supported (this NeuralDbg reads versions "
                        f"{', '.join(map(str, _READS))})")
        if hlen > min(_MAX_HEADER, size - _PREFIX.size):
            _fail(path, "declared header size exceeds the file")
        try:
            header = json.loads(f.read(hlen).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            _fail(path, "corrupt header")
        if not isinstance(header, dict):
            _fail(path, "corrupt header")
        body = size - _PREFIX.size - hlen
        try:
            ranks = header.get("ranks")
            ranked = isinstance(ranks, dict) and ranks.get("version") == LAYOUT_VERSION
            names = (_ARRAYS if version >= 2 else _ARRAYS_V1) + (_RANK_ARRAYS if ranked else ())
            arrays = _read_arrays(f, header, _PREFIX.size + hlen, body, names)
            layers = [LayerInfo.from_dict(d) for d in header["layers"]]
            n_stats = int(header["n_stats"])
            stat_names = ([str(c) for c in header["stat_columns"]] if "stat_columns" in header else
                          _V1_COLUMNS if version == 1 and n_stats == len(_V1_COLUMNS) else None)
            global_names = [str(c) for c in header["global_columns"]]
            # (a global column this version does not know, from a newer writer, is dropped like a statistic)
            if (stat_names is None or len(stat_names) != n_stats or len(set(stat_names)) != n_stats
                    or len(set(global_names)) != len(global_names)):
                _fail(path, "statistics columns differ from this version's")
            n = len(arrays["stats_steps"])
            if (arrays["stats"].shape != (n, len(layers), n_stats)
                    or arrays["globals"].shape != (n, len(global_names))
                    or arrays["loss"].shape != arrays["loss_steps"].shape
                    or arrays.get("skipped", np.zeros(0)).shape != arrays.get("skipped_steps", np.zeros(0)).shape):
                _fail(path, "array shapes are inconsistent")
            stats = _by_name(arrays["stats"], stat_names or [], _STAT_NAMES)
            glob = _by_name(arrays["globals"], global_names, list(GLOBAL_COLUMNS))
            cap, lcap = int(header["capacity"]), int(header["loss_capacity"])
            skipped_steps = arrays.get("skipped_steps", np.zeros(0, dtype=np.int64))
            trace = Trace(layers, capacity=max(cap, 4), loss_capacity=max(lcap, 4),
                          stats=BoundedSeries.from_arrays(arrays["stats_steps"], stats, cap),
                          globals=BoundedSeries.from_arrays(arrays["stats_steps"], glob, cap),
                          loss=BoundedSeries.from_arrays(arrays["loss_steps"], arrays["loss"], lcap),
                          skipped=BoundedSeries.from_arrays(skipped_steps, arrays.get("skipped", np.zeros(0)), lcap),
                          nonfinite=NonFiniteOrigin.from_dict(header["nonfinite"]) if header.get("nonfinite") else None,
                          overflow=NonFiniteOrigin.from_dict(header["overflow"]) if header.get("overflow") else None,
                          meta=dict(header.get("meta") or {}),
                          ranks=RankSeries.from_arrays(ranks, arrays, len(layers)) if ranked else None)
            if ranks is not None and not ranked:  # another version's rank statistics: the rest stands
                trace.meta["ranks_skipped"] = "rank statistics of another format version"
        except ValueError as exc:
            if "not a readable NeuralDbg trace" in str(exc):
                raise
            _fail(path, f"inconsistent content ({exc})")
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            _fail(path, f"missing or malformed field ({type(exc).__name__}: {exc})")
    return trace, trace.meta


def _by_name(data: np.ndarray, names: list[str], layout: list[str]) -> np.ndarray:
    """``data``'s last axis, whose columns are ``names``, placed in ``layout``: columns the layout lacks are
    dropped, the layout's columns the data lacks are NaN."""
    if names == layout:
        return data
    out = np.full((*data.shape[:-1], len(layout)), np.nan, dtype=data.dtype)
    for k, name in enumerate(names):
        if name in layout:
            out[..., layout.index(name)] = data[..., k]
    return out


def _read_arrays(f, header: dict, base: int, body: int, names: tuple[str, ...] = _ARRAYS) -> dict[str, np.ndarray]:
    specs = {s["name"]: s for s in header["arrays"]}
    out = {}
    for name in names:
        s = specs[name]
        dtype = _DTYPES.get(s["dtype"])
        if dtype is None:
            raise ValueError(f"array {name} has unsupported dtype {s['dtype']!r}")
        shape = tuple(int(d) for d in s["shape"])
        if any(d < 0 for d in shape):
            raise ValueError(f"array {name} has a negative dimension")
        count = 1
        for d in shape:
            count *= d
        nbytes, offset = int(s["nbytes"]), int(s["offset"])
        if nbytes != count * np.dtype(dtype).itemsize or offset < 0 or offset + nbytes > body:
            raise ValueError(f"array {name} declares {nbytes} bytes at {offset}, beyond the file's {body}")
        out[name] = (offset, nbytes, dtype, shape)
    result = {}
    for name, (offset, nbytes, dtype, shape) in out.items():
        f.seek(base + offset)
        raw = f.read(nbytes)
        if len(raw) != nbytes:
            raise ValueError(f"array {name} is truncated")
        result[name] = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape).copy()
    return result
