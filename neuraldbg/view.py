"""``TraceView``: a read-only view of what a session recorded, for front ends (the notebook dashboard).

Arrays come back as read-only numpy views of the live trace: cheap, and valid until the session
records its next step (the bounded trace thins its rows in place). Copy one to keep it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats import Stat
from .trace import Trace


@dataclass(frozen=True)
class Layer:
    """A watched module: its name in ``model.named_modules()``, its class name, its family (``relu``,
    ``linear``, ... as in ``neuraldbg.layers.Kind``) and its place in the forward pass (None: never seen
    running, e.g. a submodule whose parent calls its weights directly)."""

    name: str
    type_name: str
    kind: str
    order: int | None


def _frozen(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class TraceView:
    """What a front end reads: the layers in forward order, the sampled statistics and the loss."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace

    @property
    def layers(self) -> tuple[Layer, ...]:
        """Every watched layer, indexed like the columns of ``stat()``."""
        return tuple(Layer(l.name, l.type_name, str(l.kind.value), l.order) for l in self._trace.layers)

    @property
    def order(self) -> tuple[int, ...]:
        """Layer indices in the order they ran forward; layers never seen running come last."""
        seen = sorted((l.order, l.index) for l in self._trace.layers if l.order is not None)
        return tuple(i for _, i in seen) + tuple(l.index for l in self._trace.layers if l.order is None)

    @property
    def steps(self) -> np.ndarray:
        """The steps that have per-layer statistics (sampled steps), ascending."""
        return _frozen(self._trace.stats.steps)

    def stat(self, stat: Stat) -> np.ndarray:
        """One statistic of every layer at every sampled step: (samples, layers); NaN where not measured."""
        return _frozen(self._trace.stats.data[:, :, int(Stat(stat))])

    @property
    def loss_steps(self) -> np.ndarray:
        return _frozen(self._trace.loss.steps)

    @property
    def loss(self) -> np.ndarray:
        """The recorded losses (one per recorded step, float64)."""
        return _frozen(self._trace.loss.data)

    @property
    def version(self) -> tuple[int, int, int, int]:
        """Changes whenever something new is recorded: compare it to skip work when nothing changed."""
        stats, loss = self._trace.stats, self._trace.loss
        return (stats.n, int(stats.steps[-1]) if stats.n else -1, loss.n, int(loss.steps[-1]) if loss.n else -1)
