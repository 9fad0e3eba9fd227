"""Training-framework spokes: callbacks that watch ``Trainer.fit`` / ``Trainer.train``.

``from neuraldbg.integrations.lightning import NeuralDbgCallback`` (PyTorch Lightning) and
``from neuraldbg.integrations.transformers import NeuralDbgCallback`` (Hugging Face). Importing this
package imports neither framework; each module imports its own framework only when it is imported.
"""
from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager
from typing import Iterator

from ._common import active_session, session_scope

__all__ = ["trainer_kind", "bind", "session_scope", "active_session"]

# framework -> (module that defines its Trainer, the spoke module); looked up only in sys.modules
_TRAINERS = {
    "lightning": (("pytorch_lightning", "lightning.pytorch"), "neuraldbg.integrations.lightning"),
    "transformers": (("transformers",), "neuraldbg.integrations.transformers"),
}


def trainer_kind(obj) -> str | None:
    """``"lightning"`` or ``"transformers"`` when ``obj`` is a trainer of a framework already imported
    (this never imports one), else None."""
    for kind, (modules, _) in _TRAINERS.items():
        for name in modules:
            module = sys.modules.get(name)
            trainer = getattr(module, "Trainer", None) if module is not None else None
            if isinstance(trainer, type) and isinstance(obj, trainer):
                return kind
    return None


@contextmanager
def bind(trainer, session) -> Iterator[object]:
    """Within the block, ``trainer`` reports to ``session`` through a callback of its framework, which
    is taken off the trainer again at the end, however the block ends."""
    kind = trainer_kind(trainer)
    if kind is None:
        raise TypeError(f"not a Lightning or Hugging Face trainer: {type(trainer).__name__}")
    spoke = importlib.import_module(_TRAINERS[kind][1])
    mine = spoke.find_callback(trainer)
    if mine is not None:  # the user's own callback: it reports to ``session`` in a ``session_scope``
        with session_scope(session):
            yield mine
        return
    callback = spoke.callback_for(trainer, session=session, report=False)
    spoke.add_callback(trainer, callback)
    try:
        yield callback
    finally:
        spoke.remove_callback(trainer, callback)
