"""The public API's rough edges: the verdict object, threshold names and ranges, threshold-free figures,
the read-only trace view, old trace files, and a hub that imports nothing of its spokes."""
from __future__ import annotations

import dataclasses
import json
import re
import struct

import numpy as np
import pytest
import torch
from torch import nn

from neuraldbg import NeuralDbg, Stat, Thresholds, TraceView, Verdict
from neuraldbg.formatting import number


def dead_run(steps: int = 12, dead: bool = True) -> NeuralDbg:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    with torch.no_grad():
        model[0].bias[:11 if dead else 0].fill_(-50.0)  # 11 of 16 units dead: dead at the default threshold
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, opt) as dbg:
        for _ in range(steps):
            x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


# -- the verdict --------------------------------------------------------------------------------------

def test_explain_and_reanalyze_return_a_verdict_that_is_still_a_list():
    dbg = dead_run()
    verdict = dbg.explain()
    assert isinstance(verdict, Verdict) and isinstance(verdict, list) and verdict.steps == 12
    assert (verdict[0].cause, verdict[0].layer) == ("dead_units", "1") and verdict == list(verdict)
    assert str(verdict).startswith("dead_units in `1`, from step 0 (confidence ") and "after 12 steps" in str(verdict)
    assert [h.cause for h in verdict.confident] == ["dead_units"] and not verdict.healthy
    # in a notebook: the panel; in a Markdown export: Markdown; in a terminal: the text verdict
    assert 'class="ndbg-hyp" data-cause="dead_units" data-layer="1"' in verdict._repr_html_()
    assert verdict._repr_markdown_().startswith("**NeuralDbg:** dead_units in `1`")
    assert verdict.text().startswith("Verdict: dead_units in `1`, from step 0.")
    # 69% of the units is no dead layer at 0.9, and the bias of -50 behind them no fault at a gain of 1000x
    healthy = dbg.reanalyze(dead_fraction=0.9, layer_gain=1000.0)
    assert isinstance(healthy, Verdict) and healthy.healthy and healthy.confident == []
    assert str(healthy) == "healthy after 12 steps"
    assert "No training failure detected after 12 steps." in healthy._repr_html_()
    assert repr(Verdict([], steps=3)) == "Verdict([], steps=3)"
    from IPython.lib.pretty import pretty
    assert pretty(healthy).startswith("Verdict: healthy. No failure found in 12 steps")


def test_one_renderer_for_text_html_and_markdown():
    # every form of a hypothesis carries the same chain and fix; the report is built from the same text
    dbg = dead_run()
    verdict = dbg.explain()
    top = verdict[0]
    for form in (verdict.text(), verdict.markdown(), dbg.report()):
        for line in top.chain:
            assert line.split("`")[0] in form
        assert top.suggestion.split("`")[0] in form
    assert verdict.text() in dbg.report()


def test_zero_steps_say_nothing_was_trained():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with NeuralDbg(model) as dbg:
        model(torch.randn(2, 4))  # a forward pass, no backward: no step
    assert dbg.step == 0
    assert str(dbg.explain()) == "nothing was trained (0 steps)"
    assert "nothing was trained" in dbg.report() and "healthy" not in dbg.report()


# -- threshold names and ranges -----------------------------------------------------------------------

def test_an_unknown_threshold_name_raises_one_value_error_with_the_valid_names():
    dbg = dead_run()
    before = dbg.thresholds
    with pytest.raises(ValueError) as err:
        dbg.reanalyze(update_ratio_high=2)
    msg = str(err.value)
    assert "unknown threshold 'update_ratio_high'" in msg and "\n" not in msg
    assert all(name in msg for name in Thresholds.names())
    assert dbg.thresholds is before  # nothing of the session changed
    with pytest.raises(ValueError, match=r"did you mean 'dead_fraction'\?"):
        dbg.reanalyze(dead_fractoin=0.9)
    with pytest.raises(ValueError, match="unknown threshold"):
        Thresholds(dead_fractoin=0.9)


@pytest.mark.parametrize("name", Thresholds.names())
def test_every_threshold_is_checked_against_its_documented_range(name):
    lo, hi = Thresholds.range_of(name)
    whole = isinstance(getattr(Thresholds(), name), int)
    assert Thresholds(**{name: lo}) and Thresholds(**{name: hi})  # both ends allowed
    below = lo - 1 if whole else lo / 2 if lo > 0 else lo - 1
    for bad in (below, hi * 2 + 1, float("nan"), "0.5", True, None):
        with pytest.raises(ValueError, match=name):
            Thresholds(**{name: bad})
    with pytest.raises(ValueError, match=name):
        Thresholds().replace(**{name: hi * 2 + 1})
    if whole:
        with pytest.raises(ValueError, match="whole number"):
            Thresholds(**{name: lo + 0.5})
        assert Thresholds(**{name: float(lo)}) == Thresholds(**{name: lo})


def test_thresholds_out_of_range_in_a_saved_file_fall_back_to_the_defaults(tmp_path):
    dbg = dead_run()
    path = tmp_path / "run.ndbg"
    dbg.save(path)
    raw = bytearray(path.read_bytes())
    blob = b'"dead_fraction": 0.6'
    assert raw.count(blob) == 1
    raw[raw.index(blob):raw.index(blob) + len(blob)] = b'"dead_fraction": 9.9'  # same length: the header holds
    path.write_bytes(bytes(raw))
    assert NeuralDbg.load(path).thresholds == Thresholds()


def test_describe_lists_every_threshold_with_its_range():
    text = Thresholds().describe()
    for f in dataclasses.fields(Thresholds):
        span = re.escape(f"{f.metadata['min']:g}..{f.metadata['max']:g}: ")
        assert re.search(rf"^  {f.name} = .*# {span}", text, re.M)


# -- figures that do not depend on a threshold --------------------------------------------------------

def test_measured_figures_in_chains_do_not_move_with_the_thresholds():
    from test_zoo import FAULTY
    from zoo import train

    dbg = train(FAULTY["relu_mlp_lr10"][0]())
    peaks = set()
    for v in (0.005, 0.05, 0.1, 0.5):
        for h in dbg.reanalyze(update_too_large=v):
            peaks.update(re.findall(r"updates of up to (\S+) x the weights", " ".join(h.chain)))
    ratio = dbg.trace.stats.data[:, :, Stat.W_UPDATE_NORM] / dbg.trace.stats.data[:, :, Stat.W_NORM]
    assert peaks == {number(float(np.nanmax(ratio)))}  # the run's largest update, whatever the threshold


# -- the public view of a trace -----------------------------------------------------------------------

def test_the_trace_view_is_read_only_and_follows_the_forward_order():
    dbg = dead_run()
    view = dbg.view
    assert isinstance(view, TraceView)
    assert [view.layers[i].name for i in view.order] == ["0", "1", "2"]
    assert view.layers[1].type_name == "ReLU" and view.layers[1].kind == "relu"
    grad = view.stat(Stat.GRAD_RMS)
    assert grad.shape == (len(view.steps), 3) and list(view.loss_steps) == list(range(12))
    for a in (grad, view.steps, view.loss, view.loss_steps):
        with pytest.raises(ValueError):
            a[0] = 0
    version = view.version
    assert dbg.view.version == version


def test_the_notebook_spoke_imports_only_public_names_of_the_hub():
    import ast
    import pathlib

    import neuraldbg
    for path in pathlib.Path(neuraldbg.__file__).parent.parent.joinpath("ndbg_jupyter").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neuraldbg"):
                allowed = ("neuraldbg", "neuraldbg.formatting", "neuraldbg.integrations")
                assert node.module in allowed, f"{path.name}: {node.module}"
                assert all(not a.name.startswith("_") for a in node.names), f"{path.name}: {node.module}"
                if node.module == "neuraldbg":
                    assert all(a.name in neuraldbg.__all__ for a in node.names), path.name
            if isinstance(node, ast.Attribute) and node.attr in ("stats", "execution_order", "_trace"):
                raise AssertionError(f"{path.name} reads the trace's internals ({node.attr})")


# -- trace files written before the statistics were renamed -------------------------------------------

_V1 = ("ACT_MEAN", "ACT_STD", "ACT_ABSMAX", "ACT_NONFINITE", "ACT_DEAD", "ACT_SATURATED", "GRAD_RMS",
       "GRAD_ABSMAX", "GRAD_NONFINITE", "GRAD_DEAD", "W_NORM", "W_GRAD_NORM", "W_UPDATE_NORM")


def _write_v1(dbg: NeuralDbg, path) -> np.ndarray:
    """The file as the first version wrote it: thirteen statistics, no column names."""
    from neuraldbg.fileformat import MAGIC
    from neuraldbg.trace import GLOBAL_COLUMNS
    t = dbg.trace
    new = t.stats.data
    old = np.full((*new.shape[:2], len(_V1)), 7.0, dtype="<f4")  # GRAD_ABSMAX / GRAD_DEAD: anything
    for i, name in enumerate(_V1):
        if name in Stat.__members__:
            old[:, :, i] = new[:, :, int(Stat[name])]
    arrays = {"stats_steps": t.stats.steps.astype("<i8"), "stats": old, "globals": t.globals.data.astype("<f4"),
              "loss_steps": t.loss.steps.astype("<i8"), "loss": t.loss.data.astype("<f8")}
    specs, offset = [], 0
    for name, a in arrays.items():
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                      "nbytes": int(a.nbytes)})
        offset += a.nbytes
    header = {"meta": {"step": dbg.step}, "layers": [l.to_dict() for l in t.layers], "nonfinite": None,
              "capacity": t.capacity, "loss_capacity": t.loss_capacity, "n_stats": len(_V1),
              "global_columns": list(GLOBAL_COLUMNS), "arrays": specs}
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIQ", MAGIC, 1, len(blob)) + blob)
        for a in arrays.values():
            f.write(np.ascontiguousarray(a).tobytes())
    return new


def test_a_file_of_the_first_version_loads_with_its_columns_matched_by_name(tmp_path):
    dbg = dead_run()
    path = tmp_path / "v1.ndbg"
    stats = _write_v1(dbg, path)
    loaded = NeuralDbg.load(path)
    kept = [int(Stat[n]) for n in _V1 if n in Stat.__members__]
    np.testing.assert_array_equal(loaded.trace.stats.data[:, :, kept], stats[:, :, kept])
    later = [int(s) for s in Stat if s.name not in _V1]  # recorded by later versions only: not measured
    assert later and np.isnan(loaded.trace.stats.data[:, :, later]).all()
    assert [(h.cause, h.layer) for h in loaded.explain()] == [(h.cause, h.layer) for h in dbg.explain()]
    # and the current version names its columns
    dbg.save(tmp_path / "now.ndbg")
    raw = (tmp_path / "now.ndbg").read_bytes()
    (hlen,) = struct.unpack("<Q", raw[12:20])
    assert json.loads(raw[20:20 + hlen])["stat_columns"] == [s.name for s in Stat]


# -- the package --------------------------------------------------------------------------------------

def test_the_package_is_typed_and_licensed():
    import pathlib
    import tomllib

    import neuraldbg
    root = pathlib.Path(neuraldbg.__file__).parent
    assert (root / "py.typed").exists() and (root.parent / "ndbg_jupyter" / "py.typed").exists()
    meta = tomllib.loads((root.parent / "pyproject.toml").read_text())
    licence = (root.parent / "LICENSE").read_text()
    assert meta["project"]["license"] == "MIT" and licence.startswith("MIT License")
    assert "License :: OSI Approved :: MIT License" not in meta["project"]["classifiers"]  # SPDX field says it
    extras = meta["project"]["optional-dependencies"]
    assert {"jupyter", "test", "browser"} <= set(extras)
    assert not any(p.startswith(("playwright", "jupyterlab")) for p in extras["test"])


def test_a_model_with_lazy_parameters_gets_one_clear_error_and_is_left_as_it_was():
    model = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.ReLU(), torch.nn.LazyLinear(2))
    with pytest.raises(ValueError, match="forward pass with a sample batch") as err:
        NeuralDbg(model)
    assert "0.weight" in str(err.value)
    assert not torch.nn.modules.module._global_forward_hooks and not model[0]._forward_hooks
    model(torch.randn(2, 5))  # materialised: watched as any model
    with NeuralDbg(model) as dbg:
        model(torch.randn(4, 5)).sum().backward()
    assert [l.name for l in dbg.trace.layers] == ["0", "1", "2"]


def test_a_run_that_stops_on_an_exception_says_so_in_its_report(tmp_path):
    """A cell whose training raises after three steps (a second backward through a freed graph): the user's
    exception goes through, and the report says where the run stopped, so "no failure found" reads as
    covering those steps only. Watching again clears it; a saved trace keeps it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    dbg = NeuralDbg(model, optimizer=opt)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        with dbg:
            for step in range(5):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                if step == 3:
                    loss.backward()
                opt.step()
                dbg.record_loss(loss)
    report = dbg.report()
    assert "stopped: the run ended on RuntimeError at step 3: Trying to backward" in report, report
    dbg.save(tmp_path / "stopped.ndbg")
    assert "stopped: the run ended on RuntimeError at step 3" in NeuralDbg.load(tmp_path / "stopped.ndbg").report()
    with dbg:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert "stopped:" not in dbg.report()
