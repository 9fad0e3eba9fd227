"""NeuralDbg in Jupyter: ``%load_ext ndbg_jupyter``, then ``%%neuraldbg`` on a training cell.

Importing this package is cheap: IPython, ipywidgets and matplotlib are imported only when the
extension is loaded into a shell.
"""
from __future__ import annotations

__all__ = ["load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """Register ``%%neuraldbg`` and ``%neuraldbg`` (called by ``%load_ext ndbg_jupyter``)."""
    from ._magic import NeuralDbgMagics

    ipython.register_magics(NeuralDbgMagics(ipython))


def unload_ipython_extension(ipython) -> None:
    """Stop any session still watching a model and forget the magics' state."""
    magics = ipython.magics_manager.registry.get("NeuralDbgMagics")
    if magics is not None:
        magics.close()
