"""Which loss failures each kind of cause can produce (the loss states a candidate may explain)."""
from __future__ import annotations

from ..states import LossState, TargetState

__all__ = ["LossState", "FLAT", "UNSTABLE", "ANY", "NONFINITE", "UNBOUNDED"]

FLAT = frozenset({LossState.PLATEAU, LossState.STALLED})
UNSTABLE = frozenset({LossState.DIVERGING, LossState.OSCILLATING, LossState.NONFINITE})
ANY = FLAT | UNSTABLE
NONFINITE = frozenset({LossState.NONFINITE})
UNBOUNDED = frozenset({TargetState.UNBOUNDED})
