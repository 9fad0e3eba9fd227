"""The hub never imports a training framework nor its own framework spokes; the spokes' package
imports no framework until one of its modules is imported."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import neuraldbg

FRAMEWORKS = ("pytorch_lightning", "lightning", "transformers", "accelerate")
HUB = pathlib.Path(neuraldbg.__file__).parent


def _loaded_after(code: str) -> list[str]:
    probe = f"{code}\nimport sys\nprint(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}"
    probe += " or m.startswith('neuraldbg.integrations'))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_a_watched_run_loads_no_framework_and_no_spoke():
    code = ("import torch, neuraldbg\n"
            "m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))\n"
            "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "with neuraldbg.NeuralDbg(m, opt) as dbg:\n"
            "    for _ in range(3):\n"
            "        opt.zero_grad(); m(torch.randn(5, 3)).pow(2).mean().backward(); opt.step()\n"
            "dbg.report()")
    assert _loaded_after(code) == []


def test_the_integrations_package_imports_no_framework():
    assert _loaded_after("import neuraldbg.integrations") == ["neuraldbg.integrations",
                                                              "neuraldbg.integrations._common"]


def test_no_hub_module_names_a_framework_or_a_spoke_in_an_import():
    offenders = []
    for path in HUB.rglob("*.py"):
        if "integrations" in path.relative_to(HUB).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.lstrip(".").split(".")[0] in FRAMEWORKS + ("ndbg_jupyter",) or "integrations" in name:
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []
