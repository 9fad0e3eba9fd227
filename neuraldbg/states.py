"""Health states: the vocabulary of semanticization. Each signal has its own str-valued enum.

The integer codes (``code``) index the vectorised state arrays in ``health``; the first member of
each enum is the healthy state, code 0. The warning bands (``DRIFTING``, ``DIMINISHING``, ``CREEPING``,
``NARROWING``, ``FALLING``, ``SHRINKING``) lie between a signal's healthy state and its failure state:
``watch`` reports them apart from the hypotheses, which they never become.
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
    DRIFTING = "drifting"     # a warning band: the dead or saturated share keeps rising toward its threshold
    #                           (or the share of outputs firing keeps falling toward none)


class GradState(_State):
    """How the gradient reaching a layer's weights compares with the layers after it and with its start."""

    HEALTHY = "healthy"
    VANISHING = "vanishing"
    EXPLODING = "exploding"
    DIMINISHING = "diminishing"   # attenuated toward the input, within ten times of vanishing (a warning band)
    UNREACHED = "unreached"       # trainable, ran forward, and no gradient reaches it: the graph is cut after it


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
    CREEPING = "creeping"     # a warning band: the largest ratio keeps growing toward too_large


class InputState(_State):
    NORMAL = "normal"
    UNSCALED = "unscaled"     # mean or spread far from unit scale
    NONFINITE = "nonfinite"
    DRIFTING = "drifting"     # a warning band: the scale keeps growing toward unscaled
    CONSTANT = "constant"     # every value of the batch the same: the samples cannot be told apart


class LossState(_State):
    IMPROVING = "improving"
    PLATEAU = "plateau"
    DIVERGING = "diverging"
    OSCILLATING = "oscillating"
    NONFINITE = "nonfinite"
    STALLED = "stalled"       # a run too short for a plateau whose loss has not come down beyond its noise
    SLOW = "slow"             # long enough for a plateau, it came down, but hardly (a failure when explained)


class TargetState(_State):
    """What the loss says of the targets, and their classes read off the output's gradient."""

    NORMAL = "normal"
    OUT_OF_REACH = "out_of_reach"   # a first loss far beyond what the outputs' scale can reach
    UNBOUNDED = "unbounded"         # a loss that cannot be negative falls deep below zero, still falling
    ORDERED = "ordered"             # batches whose classes are far from the run's mix (data not shuffled)
    ONE_CLASS = "one_class"         # every target read is one class, and the loss fits it to ~0


class WeightState(_State):
    """The size of the weights against their start, for the model as a whole (the median layer)."""

    NORMAL = "normal"
    COLLAPSING = "collapsing"       # shrunk toward zero many times over (a weight decay that holds them there)
    SHRINKING = "shrinking"         # a warning band: shrinking toward a collapse, and still shrinking


class ScalerState(_State):
    """A loss scaler (GradScaler) that skips optimizer steps whose gradients hold NaN/Inf."""

    NORMAL = "normal"
    SKIPPING = "skipping"           # a run of skipped steps longer than its calibration: no scale fixes it
    FALLING = "falling"             # a warning band: the loss scale halved many times from its peak, still falling


class LrState(_State):
    """The learning rate of the first parameter group, as the optimizer reports it."""

    STEADY = "steady"
    RAISED = "raised"               # risen several times over from a rate that held steady
    DECAYED = "decayed"             # falling from its peak on a decline that takes it lr_decayed times below it


class AttnState(_State):
    """What an attention computation does: spread over its keys, or collapsed onto a few."""

    NORMAL = "normal"
    COLLAPSED = "collapsed"   # entropy over the keys far below its maximum: one or two keys take all
    GROWING = "growing"       # the largest logit many times its start (entropy not collapsed yet)
    NARROWING = "narrowing"   # a warning band: the entropy keeps falling toward collapsed


class RangeState(_State):
    """How much of its dtype's range a layer's output uses (float16 tops out at 65504)."""

    NORMAL = "normal"
    NEAR_LIMIT = "near_limit"  # within a factor of the largest finite value: the next growth overflows


class SpikeState(_State):
    """A value far above where it was: a layer's update-to-weight ratio against the previous sample, or
    the loss against its recent level."""

    NORMAL = "normal"
    SPIKE = "spike"


class Signal(str, Enum):
    """What an event is about."""

    ACTIVATION = "activation"
    GRADIENT = "gradient"
    GAIN = "gain"
    FINITE = "finite"
    UPDATE = "update"
    INPUT = "input"
    LOSS = "loss"
    TARGET = "target"
    LR = "lr"
    SCALER = "scaler"
    WEIGHTS = "weights"
    ATTENTION = "attention"
    RANGE = "range"
    SPIKE = "spike"

    def __str__(self) -> str:
        return self.value
