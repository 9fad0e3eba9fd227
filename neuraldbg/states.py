"""Health states: the vocabulary of semanticization. Each signal has its own str-valued enum.

The integer codes (``code``) index the vectorised state arrays in ``health``; the first member of
each enum is the healthy state, code 0.
"""
from __future__ import annotations

from enum import Enum
from typing import TypeVar

S = TypeVar("S", bound="_State")


class _State(str, Enum):
    def __str__(self) -> str:
        return self.value

    @property
    def code(self) -> int:
        return list(type(self)).index(self)

    @property
    def healthy(self) -> bool:
        return self.code == 0

    @classmethod
    def of(cls: type[S], code: int) -> S:
        return list(cls)[int(code)]


class ActState(_State):
    """What a layer's output looks like."""

    NORMAL = "normal"
    SATURATED = "saturated"   # bounded units pinned at their bounds
    DEAD = "dead"             # ReLU-family units never positive
    ANOMALOUS = "anomalous"   # spread blown up (or NaN/Inf)


class GradState(_State):
    """How the gradient reaching a layer's weights compares with the layers after it and with its start."""

    HEALTHY = "healthy"
    VANISHING = "vanishing"
    EXPLODING = "exploding"


class GainState(_State):
    """Output spread over input spread of a weight layer: how its weight scale shapes the signal."""

    NORMAL = "normal"
    SHRINKS = "shrinks"
    AMPLIFIES = "amplifies"


class FiniteState(_State):
    FINITE = "finite"
    NONFINITE = "nonfinite"


class UpdateState(_State):
    """Update-to-weight ratio of the optimizer step, for the model as a whole."""

    NORMAL = "normal"
    TOO_LARGE = "too_large"
    NEGLIGIBLE = "negligible"


class InputState(_State):
    NORMAL = "normal"
    UNSCALED = "unscaled"     # mean or spread far from unit scale
    NONFINITE = "nonfinite"


class LossState(_State):
    IMPROVING = "improving"
    PLATEAU = "plateau"
    DIVERGING = "diverging"
    OSCILLATING = "oscillating"
    NONFINITE = "nonfinite"


class Signal(str, Enum):
    """What an event is about."""

    ACTIVATION = "activation"
    GRADIENT = "gradient"
    GAIN = "gain"
    FINITE = "finite"
    UPDATE = "update"
    INPUT = "input"
    LOSS = "loss"

    def __str__(self) -> str:
        return self.value
