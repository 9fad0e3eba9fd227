"""Two real processes (DDP over gloo on the CPU): every rank records, global rank 0 alone prints the
verdict and writes the trace."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import pytorch_lightning as pl
import torch
from frameworks import Case, loader, verdict
from test_lightning import Lit
from neuraldbg.integrations.lightning import NeuralDbgCallback


class Record(pl.Callback):
    def __init__(self, cb, out):
        self.cb, self.out = cb, out

    def on_fit_end(self, trainer, pl_module):  # after the NeuralDbg callback's own on_fit_end
        s = self.cb.session
        with open(f"{{self.out}}/rank{{trainer.global_rank}}.json", "w") as f:
            json.dump({{"step": s.step, "watching": s.watching, "verdict": verdict(s)}}, f)


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = sys.argv[1]
    case = Case("dead", dead=True, steps=6)
    cb = NeuralDbgCallback(every=1, save=f"{{out}}/run.ndbg")
    trainer = pl.Trainer(max_steps=case.steps, accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb, Record(cb, out)])
    trainer.fit(Lit(case), loader(case))
"""


@pytest.mark.slow  # about 30 s on two cores: two processes, each importing torch and Lightning
def test_every_rank_records_and_rank_zero_alone_reports(tmp_path):
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT.format(tests=str(TESTS)))
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert rank["step"] == 6 and not rank["watching"]
        assert rank["verdict"][0][:2] == ["dead_units", "model.net.3"]
    assert out.stdout.count("NeuralDbg: training finished after 6 steps") == 1
    assert (tmp_path / "run.ndbg").exists()
