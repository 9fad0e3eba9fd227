"""Importing the hub or the spoke costs nothing: no IPython, ipywidgets or matplotlib until the
extension is loaded into a shell."""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("IPython", "ipywidgets", "matplotlib", "traitlets")


@pytest.mark.parametrize("module", ["neuraldbg", "ndbg_jupyter"])
def test_import_leaves_front_end_libraries_unloaded(module):
    code = (f"import sys, {module}\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_extension_entry_points_are_the_whole_public_surface():
    import ndbg_jupyter

    assert ndbg_jupyter.__all__ == ["load_ipython_extension", "unload_ipython_extension"]
