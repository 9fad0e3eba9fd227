"""binder/: what mybinder needs to open notebooks/01_quickstart.ipynb with CPU torch and the package."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"


def _requirements() -> list[str]:
    lines = [l.split("#")[0].strip() for l in (BINDER / "requirements.txt").read_text().splitlines()]
    return [l for l in lines if l]


def test_binder_files_pin_cpu_torch_and_install_the_package():
    reqs = _requirements()
    torch_pins = [r for r in reqs if re.match(r"torch\b", r)]
    assert torch_pins and all("+cpu" in r for r in torch_pins), "a bare torch pulls a CUDA build"
    assert any(r.startswith("--extra-index-url") and "/whl/cpu" in r for r in reqs)
    post = BINDER / "postBuild"
    assert os.access(post, os.X_OK)
    assert "pip install" in post.read_text()
    assert (BINDER / "runtime.txt").read_text().startswith("python-3.")
    assert (REPO / "notebooks" / "01_quickstart.ipynb").exists()


@pytest.mark.slow  # minutes: a fresh venv with torch, JupyterLab, Notebook, Lightning and transformers
def test_binder_requirements_install_into_a_fresh_venv_and_import(tmp_path):
    # The CPU wheel index is out of reach from these machines; the pinned CPU wheel resolves from
    # the machine's own package sources, so the index option is left out here (mybinder uses it).
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("\n".join(r for r in _requirements() if not r.startswith("--")) + "\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "-r", str(reqs)], check=True, env=env)
    subprocess.run(["bash", str(BINDER / "postBuild")], check=True, env=env, cwd=REPO)  # as repo2docker does
    check = (
        "import torch, neuraldbg, ndbg_jupyter, ipywidgets, jupyterlab, notebook\n"
        "import neuraldbg.integrations.lightning, neuraldbg.integrations.transformers\n"
        "assert torch.__version__.endswith('+cpu'), torch.__version__\n"
        "assert 'site-packages' in neuraldbg.__file__, neuraldbg.__file__\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'ndbg_jupyter')\n"
        "assert 'neuraldbg' in ip.magics_manager.magics['cell']\n"
        "print('ok')\n"
    )
    out = subprocess.run([py, "-c", check], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
