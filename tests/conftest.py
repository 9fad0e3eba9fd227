import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.fixture(scope="session")
def quickstart_html(tmp_path_factory) -> Path:
    """The quickstart exported as a user would: ``jupyter nbconvert --to html --execute`` (the kernel runs
    the notebook; nothing is fetched from a network)."""
    work = tmp_path_factory.mktemp("export")
    shutil.copy(NOTEBOOKS / "01_quickstart.ipynb", work / "quickstart.ipynb")
    env = dict(os.environ, OMP_NUM_THREADS="1", JUPYTER_PLATFORM_DIRS="1")
    out = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--execute",
                          "--ExecutePreprocessor.timeout=300", "quickstart.ipynb"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return work / "quickstart.html"
