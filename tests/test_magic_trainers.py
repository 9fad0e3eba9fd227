"""%%neuraldbg around ``trainer.fit(...)`` / ``trainer.train()``: the trainer reports to the cell's
session through its framework's callback, and the live dashboard follows it as it follows a plain loop."""
from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jupyter_cells import FakeClock, ip, magics_of, no_hooks  # noqa: F401 - ip is a fixture

LIGHTNING = """
import pytorch_lightning as pl
from frameworks import Case, loader
from test_lightning import Lit, trainer as lightning_trainer
case = Case("dead", dead=True, steps=20)
lit = Lit(case)
data = loader(case)
trainer = lightning_trainer(case, [])
"""

HF = """
import tempfile
from frameworks import Case
from test_transformers import hf_trainer
case = Case("dead", dead=True, steps=20)
trainer = hf_trainer(case, [], tempfile.mkdtemp())
"""


def run(shell, cell: str):
    with capture_output() as io:
        result = shell.run_cell(cell)
    return result, io


def top(dbg):
    h = dbg.explain()[0]
    return h.cause.value, h.layer, h.step


def test_a_lightning_fit_cell_is_watched_through_the_trainer_it_names(ip):
    ip.run_cell(LIGHTNING)
    result, io = run(ip, "%%neuraldbg\ntrainer.fit(lit, data)")
    assert result.error_in_exec is None
    dbg, trainer = ip.user_ns["_ndbg"], ip.user_ns["trainer"]
    assert dbg.model is ip.user_ns["lit"] and dbg.step == trainer.global_step == 20
    assert top(dbg) == ("dead_units", "model.net.3", 0)
    assert dbg.trace.loss.n == 20
    assert "dead_units in `model.net.3`" in io.stdout
    assert not any(type(cb).__name__ == "NeuralDbgCallback" for cb in trainer.callbacks)  # taken off again
    assert no_hooks(ip.user_ns["lit"], trainer.optimizers[0])


def test_the_live_dashboard_follows_a_lightning_fit(ip):
    ip.run_cell(LIGHTNING)
    magics = magics_of(ip)
    magics.frontend, magics.clock, magics.update_interval = "widgets", FakeClock(), 0.0
    result, _ = run(ip, "%%neuraldbg lit --trainer trainer\ntrainer.fit(lit, data)")
    assert result.error_in_exec is None
    dash = magics.dashboard
    assert dash.dbg is ip.user_ns["_ndbg"] and dash.state == "finished"
    assert dash.updates >= 20  # a refresh after every optimizer step (the clock never holds it back)
    assert "step 20" in dash.progress.value
    assert 'data-cause="dead_units"' in dash.panel.value
    assert 'data-layer="model.net.3" data-act="dead"' in dash.grid.widget.value


def test_a_callback_made_in_the_cell_reports_to_the_cell_session(ip):
    ip.run_cell(LIGHTNING)
    cell = ("%%neuraldbg lit\n"
            "from neuraldbg.integrations.lightning import NeuralDbgCallback\n"
            "cb = NeuralDbgCallback()\n"
            "lightning_trainer(case, [cb]).fit(lit, data)")
    result, io = run(ip, cell)
    assert result.error_in_exec is None
    dbg = ip.user_ns["_ndbg"]
    assert ip.user_ns["cb"].session is dbg and dbg.step == 20
    assert top(dbg) == ("dead_units", "model.net.3", 0)
    assert io.stdout.count("NeuralDbg verdict") == 1 and "NeuralDbg: training" not in io.stdout  # the magic's only
    assert no_hooks(ip.user_ns["lit"])


def test_a_trainer_that_already_holds_a_callback_gets_no_second_one(ip):
    ip.run_cell(LIGHTNING + "from neuraldbg.integrations.lightning import NeuralDbgCallback\n"
                            "cb = NeuralDbgCallback()\ntrainer = lightning_trainer(case, [cb])\n")
    result, io = run(ip, "%%neuraldbg\ntrainer.fit(lit, data)")
    assert result.error_in_exec is None
    dbg, trainer = ip.user_ns["_ndbg"], ip.user_ns["trainer"]
    assert ip.user_ns["cb"].session is dbg and dbg.step == 20
    assert [type(c).__name__ for c in trainer.callbacks].count("NeuralDbgCallback") == 1
    assert dbg.trace.loss.n == 20  # one loss per step: the steps were not fed twice
    assert io.stdout.count("NeuralDbg verdict") == 1 and "NeuralDbg: training" not in io.stdout


def test_a_fit_that_raises_leaves_no_hook_and_no_callback(ip):
    ip.run_cell(LIGHTNING + "lit.fail_at = 7\n")
    result, io = run(ip, "%%neuraldbg\ntrainer.fit(lit, data)")
    assert isinstance(result.error_in_exec, RuntimeError)
    dbg, trainer = ip.user_ns["_ndbg"], ip.user_ns["trainer"]
    assert dbg.step == 7 and not dbg.watching
    assert "dead_units in `model.net.3`" in io.stdout
    assert not any(type(cb).__name__ == "NeuralDbgCallback" for cb in trainer.callbacks)
    assert no_hooks(ip.user_ns["lit"], trainer.optimizers[0])


def test_a_hugging_face_train_cell_watches_the_trainer_model(ip):
    ip.run_cell(HF)
    result, io = run(ip, "%%neuraldbg\ntrainer.train()")
    assert result.error_in_exec is None
    dbg, trainer = ip.user_ns["_ndbg"], ip.user_ns["trainer"]
    assert dbg.model is trainer.model and dbg.step == trainer.state.global_step == 20
    assert top(dbg) == ("dead_units", "net.3", 0)
    assert dbg.trace.loss.n == 20
    assert "dead_units in `net.3`" in io.stdout
    assert not any(type(cb).__name__ == "NeuralDbgCallback" for cb in trainer.callback_handler.callbacks)
    assert no_hooks(trainer.model, trainer.optimizer.optimizer)


def test_trainer_arguments_are_checked_before_the_cell_runs(ip):
    ip.run_cell(HF + "other = trainer\nsecond = hf_trainer(case, [], tempfile.mkdtemp())\n")
    with pytest.raises(UsageError, match="not a PyTorch Lightning or Hugging Face Trainer"):
        ip.run_cell_magic("neuraldbg", "--trainer case", "ran = True")
    with pytest.raises(UsageError, match=r"several trainers \(trainer, second\): pick one"):
        ip.run_cell_magic("neuraldbg", "", "ran = True\ntrainer.train(); second.train()")
    assert "ran" not in ip.user_ns
    # a trainer the cell does not name is left alone: a plain loop next to it is watched as before
    ip.run_cell("import torch\nnet = torch.nn.Linear(3, 1)\nsgd = torch.optim.SGD(net.parameters(), lr=0.1)\n")
    run(ip, "%%neuraldbg net\nfor _ in range(3):\n"
            "    sgd.zero_grad(); net(torch.randn(4, 3)).sum().backward(); sgd.step()")
    assert ip.user_ns["_ndbg"].model is ip.user_ns["net"] and ip.user_ns["_ndbg"].step == 3
