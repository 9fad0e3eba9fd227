"""Finding the model and optimizer a training cell uses, in the user's namespace."""
from __future__ import annotations

import re

import torch
from torch import nn

from neuraldbg.integrations import trainer_kind


def _public(ns: dict, kind: type) -> dict[int, tuple[str, object]]:
    """Objects of ``kind`` under public names, one entry per object (its first name)."""
    found: dict[int, tuple[str, object]] = {}
    for name, obj in list(ns.items()):
        if not name.startswith("_") and isinstance(obj, kind) and id(obj) not in found:
            found[id(obj)] = (name, obj)
    return found


def model_candidates(ns: dict, lightning: bool = False) -> list[tuple[str, nn.Module]]:
    """The top-level ``nn.Module``s in ``ns``: not a part of another candidate (a submodule, or the
    module a ``torch.compile`` wrapper holds), preferring modules with parameters (a loss module
    such as ``nn.CrossEntropyLoss()`` is not a model) and, for a Lightning trainer, modules with a
    ``training_step``."""
    found = list(_public(ns, nn.Module).values())
    with_params = [(n, m) for n, m in found if any(True for _ in m.parameters())]
    found = with_params or found
    if lightning:
        found = [(n, m) for n, m in found if callable(getattr(m, "training_step", None))] or found
    inside: set[int] = set()
    for _, m in found:
        inside.update(id(sub) for sub in m.modules() if sub is not m)
    return [(n, m) for n, m in found if id(m) not in inside]


def optimizer_for(ns: dict, model: nn.Module) -> tuple[str, torch.optim.Optimizer] | None:
    """The one optimizer in ``ns`` that owns parameters of ``model``, or None (none, or several)."""
    params = {id(p) for p in model.parameters()}
    owners = [(n, o) for n, o in _public(ns, torch.optim.Optimizer).values()
              if any(id(p) in params for g in o.param_groups for p in g["params"])]
    return owners[0] if len(owners) == 1 else None


def trainer_candidates(ns: dict, cell: str) -> list[tuple[str, object]]:
    """The Lightning or Hugging Face trainers in ``ns`` whose name the cell's code mentions."""
    return [(n, t) for n, t in _public(ns, object).values()
            if trainer_kind(t) is not None and re.search(rf"(?<![\w.]){re.escape(n)}\b", cell)]
