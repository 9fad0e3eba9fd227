"""%%neuraldbg and %neuraldbg in an in-process IPython shell: arguments, namespace, every way a cell ends."""
from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from neuraldbg import NeuralDbg
from jupyter_cells import DEAD_SETUP, ip, magics_of, no_hooks, train  # noqa: F401 - ip is a fixture

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def run(shell, cell: str):
    with capture_output() as io:
        result = shell.run_cell(cell)
    return result, io


# -- bad input: one line, cell not run, namespace unchanged -------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("nosuchname", "NameError"),
    ("opt", "not a torch.nn.Module"),
    ("model --optimizer model", "not a torch.optim.Optimizer"),
    ("model --every 0", "positive integer"),
    ("model --out 1bad", "variable name"),
    ("model --loss not-a-name", "variable name"),
    ("model --bogus-flag 3", "unrecognized arguments"),
    ("model extra words", "unrecognized arguments"),
])
def test_bad_arguments_give_one_line_error_and_leave_namespace_alone(ip, line, message):
    ip.run_cell(DEAD_SETUP)
    before = dict(ip.user_ns)
    with pytest.raises(UsageError, match=message) as err:
        ip.run_cell_magic("neuraldbg", line, "ran = True\n" + train(2))
    assert "\n" not in str(err.value)
    assert "ran" not in ip.user_ns and "_ndbg" not in ip.user_ns
    assert {k: id(v) for k, v in ip.user_ns.items()} == {k: id(v) for k, v in before.items()}
    assert no_hooks(ip.user_ns["model"], ip.user_ns["opt"])


def test_threshold_flags_come_from_the_thresholds_fields_and_override_config(ip):
    import dataclasses

    from neuraldbg import Thresholds
    magics = magics_of(ip)
    for f in dataclasses.fields(Thresholds):  # a flag for each threshold a user tunes; %config for the rest
        flag = f"--{f.name.replace('_', '-')} "
        assert (flag in magics.neuraldbg_cell.__doc__) == f.metadata["slider"], f.name
    ip.run_cell(DEAD_SETUP)
    magics.thresholds = {"dead_fraction": 0.8, "persist": 3, "evidence_bias": -3.5}
    run(ip, "%%neuraldbg model --dead-fraction 0.9\n" + train(2))
    th = ip.user_ns["_ndbg"].thresholds
    assert (th.dead_fraction, th.persist, th.evidence_bias) == (0.9, 3, -3.5)
    assert th.vanishing_ratio == Thresholds().vanishing_ratio
    with pytest.raises(UsageError, match="invalid int value"):
        ip.run_cell_magic("neuraldbg", "model --persist 2.5", "ran = True")


@pytest.mark.parametrize("line, message", [
    ("model --dead-fraction 2", "dead_fraction must be from 0.05 to 1"),
    ("model --persist 0", "persist must be from 1 to 20"),
    ("model --update-too-large 0", "update_too_large must be from 0.001 to 10"),
])
def test_a_threshold_flag_out_of_its_documented_range_is_a_usage_error(ip, line, message):
    ip.run_cell(DEAD_SETUP)
    with pytest.raises(UsageError, match=message) as err:
        ip.run_cell_magic("neuraldbg", line, "ran = True")
    assert "\n" not in str(err.value) and "ran" not in ip.user_ns and "_ndbg" not in ip.user_ns


@pytest.mark.parametrize("value, message", [
    ("{'dead_fraction': 2}", "dead_fraction must be from 0.05 to 1"),
    ("{'dead_fractio': 0.9}", "unknown threshold 'dead_fractio' (did you mean 'dead_fraction'?); valid names: "),
])
def test_config_thresholds_are_checked_when_set(ip, value, message):
    magics = magics_of(ip)
    magics.thresholds = {"persist": 3}
    with capture_output() as io:
        ip.run_line_magic("config", f"NeuralDbgMagics.thresholds = {value}")
    assert message in io.stderr + io.stdout or message in _logged(ip, value)
    assert magics.thresholds == {"persist": 3}  # the earlier setting stands
    from traitlets import TraitError
    with pytest.raises(TraitError, match=message.split(" (")[0]):
        magics.thresholds = eval(value)


def _logged(ip, value):
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        ip.run_line_magic("config", f"NeuralDbgMagics.thresholds = {value}")
    finally:
        logging.getLogger().removeHandler(handler)
    return " ".join(r.getMessage() for r in records)


@pytest.mark.parametrize("line, hint", [
    ("model --optimiser opt", "--optimiser: did you mean --optimizer?"),
    ("model --dead-fractoin 0.9", "--dead-fractoin: did you mean --dead-fraction?"),
    ("model --evrey=3", "--evrey: did you mean --every?"),
])
def test_a_misspelt_flag_gets_the_closest_one(ip, line, hint):
    ip.run_cell(DEAD_SETUP)
    with pytest.raises(UsageError, match="unrecognized arguments") as err:
        ip.run_cell_magic("neuraldbg", line, "ran = True")
    assert hint in str(err.value) and "\n" not in str(err.value) and "ran" not in ip.user_ns


def test_a_misspelt_command_gets_the_closest_one(ip):
    with pytest.raises(UsageError, match="did you mean explain"):
        ip.run_line_magic("neuraldbg", "explian")


def test_error_in_a_notebook_cell_is_shown_as_usage_error_and_cell_not_run(ip):
    ip.run_cell(DEAD_SETUP)
    result, io = run(ip, "%%neuraldbg nosuchname\nran = True")
    assert isinstance(result.error_in_exec, UsageError)
    assert "ran" not in ip.user_ns


# -- model detection ----------------------------------------------------------------------------------

def test_single_model_is_found_ignoring_private_names_loss_modules_and_submodules(ip):
    ip.run_cell(DEAD_SETUP + "loss_fn = nn.CrossEntropyLoss()\nhead = model[2]\n_spare = nn.Linear(2, 2)\n")
    run(ip, "%%neuraldbg\n" + train(3))
    dbg = ip.user_ns["_ndbg"]
    assert dbg.model is ip.user_ns["model"]
    assert dbg.optimizer is ip.user_ns["opt"]  # the one optimizer owning the model's parameters
    assert dbg.step == 3


def test_a_compiled_model_is_preferred_over_the_module_it_wraps():
    from torch import nn

    from ndbg_jupyter._namespace import model_candidates
    net = nn.Linear(2, 2)
    fast = torch.compile(net, backend="aot_eager")  # wrapping only: nothing is compiled until called
    assert [n for n, _ in model_candidates({"net": net, "fast": fast})] == ["fast"]
    assert [n for n, _ in model_candidates({"net": net, "alias": net})] == ["net"]


def test_several_models_give_a_one_line_error_listing_them(ip):
    ip.run_cell(DEAD_SETUP + "other = nn.Linear(3, 3)\n")
    with pytest.raises(UsageError) as err:
        ip.run_cell_magic("neuraldbg", "", "ran = True")
    msg = str(err.value)
    assert "\n" not in msg and "model" in msg and "other" in msg
    assert "ran" not in ip.user_ns


def test_no_model_is_an_error(ip):
    with pytest.raises(UsageError, match="no torch.nn.Module"):
        ip.run_cell_magic("neuraldbg", "", "ran = True")


def test_model_and_optimizer_are_expressions(ip):
    ip.run_cell(DEAD_SETUP + "models = {'m': model}\nopts = [opt]\n")
    run(ip, "%%neuraldbg models['m'] --optimizer opts[0] --out run1\n" + train(2))
    dbg = ip.user_ns["run1"]
    assert dbg.model is ip.user_ns["model"] and dbg.optimizer is ip.user_ns["opt"]
    assert "_ndbg" not in ip.user_ns


# -- namespace semantics ------------------------------------------------------------------------------

def test_cell_runs_in_the_user_namespace_and_displays_its_last_value(ip):
    ip.run_cell(DEAD_SETUP + "offset = 40\n")
    result, io = run(ip, "%%neuraldbg model\n" + train(3) + "answer = offset + 2\nanswer * 10\n")
    assert result.error_in_exec is None
    assert ip.user_ns["answer"] == 42 and ip.user_ns["step"] == 2
    assert "420" in io.stdout  # the last expression is displayed like in a plain cell
    assert isinstance(ip.user_ns["_ndbg"], NeuralDbg)


def test_loss_variable_is_recorded_every_step(ip):
    ip.run_cell(DEAD_SETUP + "loss = 'stale, from an earlier cell'\n")
    run(ip, "%%neuraldbg model\n" + train(7))
    dbg = ip.user_ns["_ndbg"]
    assert dbg.trace.loss.n == 7
    assert list(dbg.trace.loss.steps) == list(range(7))
    assert dbg.trace.loss.data[-1] == pytest.approx(float(ip.user_ns["loss"].detach()))


def test_loss_flag_names_another_variable(ip):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model --loss l2\n" + train(4, "    l2 = loss.item() * 2\n"))
    dbg = ip.user_ns["_ndbg"]
    # l2 is assigned after opt.step(): the value seen at step end is the previous step's
    assert dbg.trace.loss.n >= 3
    assert dbg.trace.loss.data[-1] > 0


def test_config_defaults_apply(ip):
    ip.run_cell(DEAD_SETUP)
    ip.run_line_magic("config", "NeuralDbgMagics.out = 'watched'")
    ip.run_line_magic("config", "NeuralDbgMagics.every = 3")
    run(ip, "%%neuraldbg model\n" + train(7))
    dbg = ip.user_ns["watched"]
    assert list(dbg.trace.stats.steps) == [0, 3, 6]


# -- every way a cell ends ----------------------------------------------------------------------------

def test_normal_end_prints_the_verdict_as_text(ip):
    ip.run_cell(DEAD_SETUP)
    result, io = run(ip, "%%neuraldbg model\n" + train(12))
    dbg = ip.user_ns["_ndbg"]
    assert no_hooks(ip.user_ns["model"], ip.user_ns["opt"]) and not dbg.watching
    assert "NeuralDbg verdict: the run finished, 12 steps." in io.stdout
    assert dbg.report().strip() in io.stdout
    assert not any(WIDGET_VIEW in o.data for o in io.outputs)  # a terminal gets no widgets
    top = dbg.explain()[0]
    assert top.cause == "dead_units" and top.layer == "1" and top.confidence >= 0.5


@pytest.mark.parametrize("raised, outcome", [("ValueError('boom in the loop')", "stopped with an exception"),
                                             ("KeyboardInterrupt()", "was interrupted")])
def test_exception_or_interrupt_keeps_traceback_session_and_partial_verdict(ip, raised, outcome):
    ip.run_cell(DEAD_SETUP)
    cell = "%%neuraldbg model\n" + train(20, f"    if step == 7: raise {raised}\n")
    result, io = run(ip, cell)
    name = raised.split("(")[0]
    assert type(result.error_in_exec).__name__ == name  # the cell fails as it would without the magic
    assert name in io.stdout + io.stderr  # the user's traceback is shown
    dbg = ip.user_ns["_ndbg"]
    assert dbg.step == 8 and not dbg.watching
    assert no_hooks(ip.user_ns["model"], ip.user_ns["opt"])
    assert f"NeuralDbg verdict: the run {outcome}, 8 steps." in io.stdout
    assert any(h.cause == "dead_units" for h in dbg.explain())
    # the model can be watched again at once
    run(ip, "%%neuraldbg model\n" + train(2))
    assert ip.user_ns["_ndbg"] is not dbg and ip.user_ns["_ndbg"].step == 2


def test_syntax_error_in_the_cell_fails_it_without_a_verdict(ip):
    ip.run_cell(DEAD_SETUP)
    result, io = run(ip, "%%neuraldbg model\nfor step in range(3)\n    pass\n")
    assert isinstance(result.error_in_exec, SyntaxError)
    assert "SyntaxError" in io.stdout + io.stderr and "NeuralDbg verdict" not in io.stdout
    assert ip.user_ns["_ndbg"].step == 0 and no_hooks(ip.user_ns["model"], ip.user_ns["opt"])


def test_exception_in_widget_mode_finishes_the_dashboard(ip):
    ip.run_cell(DEAD_SETUP)
    magics = magics_of(ip)
    magics.frontend = "widgets"
    result, io = run(ip, "%%neuraldbg model\n" + train(20, "    if step == 5: raise RuntimeError('x')\n"))
    assert isinstance(result.error_in_exec, RuntimeError)
    dash = magics.dashboard
    assert dash.state == "error" and "stopped by an exception" in dash.progress.value
    assert 'data-cause="dead_units"' in dash.panel.value
    views = [o.data for o in io.outputs if WIDGET_VIEW in o.data]
    assert len(views) == 1 and views[0]["text/plain"] == "NeuralDbg dashboard (model)"
    # after the cell's output: the final state as text and as self-contained HTML, for exports
    outs = [o.data for o in io.outputs]
    at = [i for i, o in enumerate(outs) if "ndbg-static" in o.get("text/html", "")]
    assert len(at) == 1 and at[0] > next(i for i, o in enumerate(outs) if WIDGET_VIEW in o)
    static = [io.outputs[at[0]]]
    assert static[0].data["text/plain"] == ip.user_ns["_ndbg"].report()
    assert 'data-cause="dead_units"' in static[0].data["text/html"] and "stopped by an exception" in \
        static[0].data["text/html"]
    assert all(not s.disabled for s in dash.controls.sliders.values())
    assert no_hooks(ip.user_ns["model"], ip.user_ns["opt"])


def test_no_live_flag_prints_text_even_with_widgets(ip):
    ip.run_cell(DEAD_SETUP)
    magics_of(ip).frontend = "widgets"
    result, io = run(ip, "%%neuraldbg model --no-live\n" + train(5))
    assert not any(WIDGET_VIEW in o.data for o in io.outputs)
    assert "NeuralDbg verdict: the run finished, 5 steps." in io.stdout


# -- %neuraldbg ---------------------------------------------------------------------------------------

def test_line_magic_without_a_session_is_an_error(ip):
    with pytest.raises(UsageError, match="no session yet"):
        ip.run_line_magic("neuraldbg", "report")


@pytest.mark.parametrize("line, message", [("bogus", "invalid choice"), ("save", "needs a PATH"),
                                           ("report extra", "takes no argument")])
def test_line_magic_argument_errors(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("neuraldbg", line)


def test_explain_report_and_thresholds_as_text(ip):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model\n" + train(12))
    dbg = ip.user_ns["_ndbg"]
    with capture_output() as io:
        ip.run_line_magic("neuraldbg", "explain")
        ip.run_line_magic("neuraldbg", "report")
        ip.run_line_magic("neuraldbg", "thresholds")
    explained = io.outputs[0].data
    assert "text/html" not in explained  # a text export (Markdown, PDF) keeps it as text
    text, markdown = explained["text/plain"], explained["text/markdown"]
    assert text.startswith("Verdict: dead_units in `1`, from step") and "\n1. dead_units in `1`, from step" in text
    assert "\n   why:\n" in text and "\n   fix: " in text
    assert markdown.startswith("**NeuralDbg:** dead_units in `1`, from step") and "**fix:**" in markdown
    assert "<div" not in markdown and "style=" not in markdown
    assert dbg.report().strip() in io.stdout
    import dataclasses
    for f in dataclasses.fields(dbg.thresholds):
        assert f"{f.name} = " in io.stdout


def test_thresholds_line_magic_shows_sliders_bound_to_the_last_session(ip):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model --no-live\n" + train(12))
    magics = magics_of(ip)
    magics.frontend = "widgets"
    with capture_output() as io:
        ip.run_line_magic("neuraldbg", "thresholds")
    dash = magics.dashboard
    assert dash.dbg is ip.user_ns["_ndbg"]
    view = dash.thresholds_view()
    assert io.outputs[0].data[WIDGET_VIEW]["model_id"] == view.model_id
    assert view.children[:3] == (dash.controls.widget, dash.note, dash.panel)
    assert dash.controls.widget.selected_index == 0  # asked for: the thresholds section is open
    assert 'data-cause="dead_units"' in io.outputs[1].data["text/html"]  # its static companion
    assert 'data-cause="dead_units"' in dash.panel.value
    dash.controls.reset.click()  # the sliders act on this session
    assert ip.user_ns["_ndbg"].thresholds == type(ip.user_ns["_ndbg"].thresholds)()


def test_save_then_load_gives_the_same_verdict(ip, tmp_path):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model\n" + train(12))
    first = ip.user_ns["_ndbg"]
    path = tmp_path / "run.ndbg"
    with capture_output() as io:
        ip.run_line_magic("neuraldbg", f"save {path}")
    assert path.exists() and f"saved 12 steps to {path}" in io.stdout
    ip.run_cell("del _ndbg")
    with capture_output() as io:
        ip.run_line_magic("neuraldbg", f"load {path}")
    loaded = ip.user_ns["_ndbg"]
    assert loaded is not first and loaded.step == 12 and loaded.model is None
    assert [(h.cause, h.layer) for h in loaded.explain()] == [(h.cause, h.layer) for h in first.explain()]
    assert "NeuralDbg verdict: trace loaded from file, 12 steps." in io.stdout
    assert loaded.report().strip() in io.stdout


def test_load_shows_the_dashboard_with_widgets(ip, tmp_path):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model --no-live\n" + train(12))
    path = tmp_path / "run.ndbg"
    ip.run_line_magic("neuraldbg", f"save {path}")
    magics = magics_of(ip)
    magics.frontend = "widgets"
    with capture_output() as io:
        ip.run_line_magic("neuraldbg", f"load {path}")
    dash = magics.dashboard
    assert io.outputs[0].data[WIDGET_VIEW]["model_id"] == dash.root.model_id
    assert io.outputs[1].data["text/plain"] == ip.user_ns["_ndbg"].report()
    assert "loaded from file" in dash.progress.value
    assert 'data-layer="1" data-act="dead"' in "".join(w.value for w in dash.grid.widgets_to_sync())
    chart = dash.chart.widget.value
    assert chart.count('class="ndbg-loss"') == 1 and chart.count('class="ndbg-flow"') == 1
    assert chart.count('class="ndbg-flow-label" data-row=') == 3  # one heatmap line per layer


def test_load_of_a_bad_file_is_a_usage_error(ip, tmp_path):
    bad = tmp_path / "bad.ndbg"
    bad.write_bytes(b"not a trace")
    with pytest.raises(UsageError, match="cannot load"):
        ip.run_line_magic("neuraldbg", f"load {bad}")
    with pytest.raises(UsageError, match="cannot load"):
        ip.run_line_magic("neuraldbg", f"load {tmp_path / 'missing.ndbg'}")


# -- the same cell, run again and again ---------------------------------------------------------------

@pytest.mark.parametrize("frontend, runs", [("text", 100), ("widgets", 24)])
def test_the_same_cell_rerun_many_times_builds_up_nothing(ip, frontend, runs):
    import gc
    import tracemalloc
    import weakref

    import ipywidgets

    ip.run_cell(DEAD_SETUP)
    magics = magics_of(ip)
    magics.frontend = frontend
    cell = "%%neuraldbg model --loss loss\n" + train(3)
    sessions = []

    def rerun(n):
        for _ in range(n):
            with capture_output():
                ip.run_cell(cell, store_history=False)
            sessions.append(weakref.ref(ip.user_ns["_ndbg"]))
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    warm = max(runs // 5, magics.live_dashboards + 1)
    rerun(warm)  # imports, caches, as many dashboards as are kept live
    n_widgets = len(ipywidgets.widgets.widget._instances)
    tracemalloc.start()
    try:
        # traced from here: every kept dashboard was made while traced, at the start as at the end
        start = rerun(magics.live_dashboards + 1)
        measured = runs - warm - magics.live_dashboards - 1
        end = rerun(measured)
    finally:
        tracemalloc.stop()
    per_run = (end - start) / measured
    assert no_hooks(ip.user_ns["model"], ip.user_ns["opt"])
    # only the sessions still shown live (and the latest, in _ndbg) are alive
    assert sum(r() is not None for r in sessions) <= magics.live_dashboards
    assert len(ipywidgets.widgets.widget._instances) == n_widgets
    # a kept session is ~150 kB, a kept dashboard ~2 MB; what remains is the shell's own history
    # (and, over the widget runs measured, the noise of bounded caches)
    print(f"{frontend}: memory grows {per_run:.0f} bytes per rerun")
    assert per_run < (5_000 if frontend == "text" else 40_000), f"memory grows {per_run:.0f} bytes per rerun"
    if frontend == "widgets":
        assert len(magics._live) == magics.live_dashboards


def test_an_older_dashboard_becomes_a_static_copy_of_its_verdict(ip):
    ip.run_cell(DEAD_SETUP)
    magics = magics_of(ip)
    magics.frontend, magics.live_dashboards = "widgets", 1
    _, first_io = run(ip, "%%neuraldbg model --loss loss\n" + train(5))
    first = magics.dashboard
    first_sliders = list(first.controls.sliders.values())
    # the first cell shows the live dashboard, then its static companion, hidden while the widget renders
    static = first_io.outputs[-1].data
    assert f'class="ndbg-static" data-ndbg="{first.uid}"' in static["text/html"]
    assert f'.ndbg-static[data-ndbg="{first.uid}"]{{display:none}}' in first._hide.value
    assert 'data-cause="dead_units"' in static["text/html"] and 'data-layer="1"' in static["text/html"]
    assert "<svg" in static["text/html"] and "<script" not in static["text/html"]
    assert static["text/plain"].startswith("NeuralDbg report")
    result, io = run(ip, "%%neuraldbg model --loss loss\n" + train(5))
    assert first.state == "retired" and first.dbg is None
    assert all(s.comm is None for s in first_sliders)  # closed: the front end drops them
    assert magics.dashboard is not first and magics.dashboard.state == "finished"
    # the first cell's widget output is emptied: its static companion (its style gone) shows instead
    emptied = [o for o in io.outputs if o.update]
    assert len(emptied) == 1 and emptied[0].data == {"text/html": "", "text/plain": ""}


# -- fuzzing the argument line ------------------------------------------------------------------------

def _fuzz_lines():
    import dataclasses

    from hypothesis import strategies as st

    from neuraldbg import Thresholds

    flags = ["--optimizer", "--loss", "--every", "--out", "--no-live", "--bogus", "-x", "--"]
    flags += [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(Thresholds)]
    words = ["model", "opt", "loss", "nosuch", "1bad", "model[0]", "model[9]", "(model", "None", "0", "-1", "3",
             "1e9", "nan", "inf", "-inf", "0.5", "2.5", "''", '"a b"', "'unclosed", "\\", "=", "_ndbg", "x.y"]
    token = st.one_of(st.sampled_from(flags + words),
                      st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=6))
    return st.lists(token, max_size=6).map(" ".join)


def test_fuzzed_argument_lines_run_the_cell_or_fail_in_one_line_leaving_everything_as_it_was(ip):
    from hypothesis import HealthCheck, example, given, settings

    cell = "ran = True\n" + train(2)
    outcomes = {"ran": 0, "refused": 0}

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(line=_fuzz_lines())
    @example(line="model --every 2 --dead-fraction 0.9 --out run1")
    @example(line="--no-live")
    def check(line):
        for name in ("ran", "_ndbg"):
            ip.user_ns.pop(name, None)
        ip.run_cell(DEAD_SETUP)
        model, opt = ip.user_ns["model"], ip.user_ns["opt"]
        before = {k: id(v) for k, v in ip.user_ns.items()}
        try:
            with capture_output():
                ip.run_cell_magic("neuraldbg", line, cell)
        except UsageError as e:
            assert "\n" not in str(e).strip(), line
            assert "ran" not in ip.user_ns, line
            assert {k: id(v) for k, v in ip.user_ns.items()} == before, line
            outcomes["refused"] += 1
        else:
            assert ip.user_ns.get("ran") is True, line
            assert any(isinstance(v, NeuralDbg) for v in ip.user_ns.values()), line
            outcomes["ran"] += 1
        assert no_hooks(model, opt), line

    check()
    assert outcomes["ran"] and outcomes["refused"]


def test_fuzzed_line_magic_commands_work_or_fail_in_one_line(ip, tmp_path, monkeypatch):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    monkeypatch.chdir(tmp_path)  # `save PATH` writes where it is told
    ip.run_cell(DEAD_SETUP)
    with capture_output():
        ip.run_cell_magic("neuraldbg", "model", train(3))
    session = ip.user_ns["_ndbg"]
    word = st.one_of(st.sampled_from(["explain", "report", "save", "load", "thresholds", "run.ndbg", "missing.ndbg",
                                      "--x", "''", "'open", "a b", "/"]),
                     st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=5))

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(line=st.lists(word, max_size=3).map(" ".join))
    def check(line):
        ip.user_ns["_ndbg"] = session  # an earlier example's `load` may have replaced it
        try:
            with capture_output():
                ip.run_line_magic("neuraldbg", line)
        except UsageError as e:
            assert "\n" not in str(e).strip(), line
        session_now = ip.user_ns["_ndbg"]
        assert session_now is session or line.split()[:1] == ["load"], line

    check()


def test_a_quoted_path_with_a_space_saves_and_loads(ip, tmp_path):
    ip.run_cell(DEAD_SETUP)
    run(ip, "%%neuraldbg model\n" + train(4))
    path = tmp_path / "my run.ndbg"
    with capture_output():
        ip.run_line_magic("neuraldbg", f'save "{path}"')
        ip.run_line_magic("neuraldbg", f"load '{path}'")
    assert path.exists() and ip.user_ns["_ndbg"].step == 4


def test_retiring_replaces_every_view_of_a_dashboard_and_never_one_still_watching(ip, tmp_path):
    ip.run_cell(DEAD_SETUP)
    magics = magics_of(ip)
    magics.frontend, magics.live_dashboards = "widgets", 1
    run(ip, "%%neuraldbg model --loss loss\n" + train(4))
    first = magics.dashboard
    run(ip, "%neuraldbg thresholds")  # a second view of the same dashboard
    _, io = run(ip, "%%neuraldbg model --loss loss\n" + train(4))
    assert first.state == "retired"
    updates = [o for o in io.outputs if o.update and o.data == {"text/html": "", "text/plain": ""}]
    assert len(updates) == 2  # the dashboard and its thresholds view
    # a trace loaded inside a watched cell retires the older dashboard, not the one watching this cell
    second = magics.dashboard
    second.dbg.save(tmp_path / "r.ndbg")
    load = f"    if step == 1: get_ipython().run_line_magic('neuraldbg', 'load {tmp_path / 'r.ndbg'}')\n"
    run(ip, "%%neuraldbg model --loss loss\n" + train(3, load))
    third = magics.dashboard
    assert second.state == "retired"
    assert third.state == "finished" and third.error is None and 'data-cause="dead_units"' in third.panel.value
    assert [d.state for d, _ in magics._live] == ["finished", "loaded"]  # the one watching, then the loaded


def test_a_model_with_lazy_modules_gets_one_line_and_the_cell_does_not_run(ip):
    ip.run_cell("import torch\nlazy = torch.nn.Sequential(torch.nn.LazyLinear(4))")
    with pytest.raises(UsageError, match="forward pass with a sample batch") as err:
        ip.run_cell_magic("neuraldbg", "lazy", "ran = True")
    assert "\n" not in str(err.value) and "ran" not in ip.user_ns
