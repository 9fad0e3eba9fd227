"""How health states look: a colour, a short label and a severity for each state value.

States come from the hub as str-valued enums (``ActState``, ``GradState``); the view only reads
their ``.value``, so a state the hub adds later still renders (grey, severity 1) instead of failing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Look:
    colour: str      # background of the state chip
    label: str       # text on the chip
    severity: int    # 0 = fine; higher = worse; the worst state of a folded group is shown


UNKNOWN = Look("#9e9e9e", "—", 1)

LOOKS: dict[str, Look] = {
    # activation states
    "normal": Look("#2e7d32", "normal", 0),
    "saturated": Look("#ef6c00", "saturated", 2),
    "dead": Look("#c62828", "dead", 3),
    "anomalous": Look("#6a1b9a", "anomalous", 3),
    # gradient states
    "healthy": Look("#2e7d32", "healthy", 0),
    "vanishing": Look("#1565c0", "vanishing", 2),
    "exploding": Look("#c62828", "exploding", 3),
}

NONFINITE = Look("#000000", "NaN/Inf", 4)
# a layer whose forward never ran, or that only returned its input: nothing measured, nothing healthy
NOT_OBSERVED = "not_observed"
LOOKS[NOT_OBSERVED] = Look("#bdbdbd", "not observed", 0)


def value_of(state) -> str:
    """The string value of a state enum member (or of a plain string); ``""`` for None."""
    if state is None:
        return ""
    return str(getattr(state, "value", state))


def look(state) -> Look:
    return LOOKS.get(value_of(state), UNKNOWN)


def worst(states) -> str:
    """The value of the most severe state among ``states`` (``""`` when there are none)."""
    values = [value_of(s) for s in states if value_of(s)]
    if not values:
        return ""
    return max(values, key=lambda v: LOOKS.get(v, UNKNOWN).severity)
