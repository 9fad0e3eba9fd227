"""Which loss failures each kind of cause can produce (the loss states a candidate may explain)."""
from __future__ import annotations

from ..states import LossState, SpikeState, TargetState

__all__ = ["LossState", "FLAT", "UNSTABLE", "ANY", "SLOWED", "NONFINITE", "UNBOUNDED", "SPIKES"]

FLAT = frozenset({LossState.PLATEAU, LossState.STALLED})
UNSTABLE = frozenset({LossState.DIVERGING, LossState.OSCILLATING})
ANY = FLAT | UNSTABLE
# a loss that came down, but hardly: a failure when a scale the run starts with and keeps accounts for it
SLOWED = ANY | {LossState.SLOW}
# a NaN loss is its NaN's: the cause that explains where the NaN came from gets it with it
NONFINITE = frozenset({LossState.NONFINITE})
UNBOUNDED = frozenset({TargetState.UNBOUNDED})
SPIKES = frozenset({SpikeState.SPIKE})  # the loss far above its recent level for a step
