"""The cause vocabulary: what a hypothesis can name as the root of a failing run."""
from __future__ import annotations

from enum import Enum


class Cause(str, Enum):
    """Root causes, as strings so that ``hyp.cause == "dead_units"`` holds."""

    VANISHING_GRADIENTS = "vanishing_gradients"
    EXPLODING_GRADIENTS = "exploding_gradients"
    DEAD_UNITS = "dead_units"
    SATURATED_ACTIVATIONS = "saturated_activations"
    NON_FINITE = "non_finite"
    LEARNING_RATE_TOO_HIGH = "learning_rate_too_high"
    LEARNING_RATE_TOO_LOW = "learning_rate_too_low"
    BAD_INITIALIZATION = "bad_initialization"
    LOSS_PLATEAU = "loss_plateau"
    DATA = "data"
    ATTENTION_COLLAPSE = "attention_collapse"
    # multi-process runs
    REPLICA_DIVERGENCE = "replica_divergence"
    DUPLICATE_DATA = "duplicate_data"
    RANK_DATA = "rank_data"
    BATCHNORM_RANK_MISMATCH = "batchnorm_rank_mismatch"
    WORLD_SIZE_SCALING = "world_size_scaling"

    def __str__(self) -> str:  # print the value, not "Cause.DATA"
        return self.value

    @property
    def multi_rank(self) -> bool:
        """A cause only a run of several processes can have (it compares ranks)."""
        return self in MULTI_RANK


MULTI_RANK = frozenset({Cause.REPLICA_DIVERGENCE, Cause.DUPLICATE_DATA, Cause.RANK_DATA,
                        Cause.BATCHNORM_RANK_MISMATCH, Cause.WORLD_SIZE_SCALING})
