"""``CausalHypothesis``: what the reasoner concludes."""
from __future__ import annotations

from dataclasses import dataclass, field

from .causes import Cause
from .events import SemanticEvent

CONFIDENT = 0.5  # a hypothesis at or above this confidence means "this run has this failure"
NOTICE = 0.15    # below this, a hypothesis is noise: ``explain()`` keeps it, the verdict does not list it


@dataclass
class CausalHypothesis:
    """A root cause, where and when it starts, how sure we are, why, and what to do.

    ``layer``: the module name as in ``model.named_modules()``; ``""`` for the model as a whole;
    ``"input"`` for the data; ``"loss"`` for the loss's own arithmetic. ``chain``: cause to effect, in order.
    ``evidence``: the events behind it.
    ``rank``: in a multi-process run, the rank where it starts first (None: one process, or every rank
    at once).
    """

    cause: Cause
    layer: str
    step: int
    confidence: float
    chain: list[str] = field(default_factory=list)
    evidence: list[SemanticEvent] = field(default_factory=list)
    suggestion: str = ""
    rank: int | None = None

    @property
    def where(self) -> str:
        where = {"": "the model", "input": "the input data", "loss": "the loss"}.get(self.layer, f"`{self.layer}`")
        return where if self.rank is None else f"{where} on rank {self.rank}"

    def __str__(self) -> str:
        return f"{self.cause} in {self.where} from step {self.step} (confidence {self.confidence:.2f})"
