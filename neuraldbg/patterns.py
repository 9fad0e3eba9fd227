"""Pattern detection: links between semantic events.

- BLOCKS: a dead or saturated layer, and gradients that vanish in layers before it (in forward
  order) from the same time on: the activation stops the gradient.
- PROPAGATES: a gradient fault spreading along the layer order; the cause is where it starts
  (closest to the output for a vanishing gradient, which fades on its way back).
- PRECEDES: something abnormal (large updates, exploding gradient, blown-up activations, a rising
  loss, an unscaled input) before a critical event (NaN/Inf, a layer dying, the loss diverging).
- FROM_START: a fault present at the first sample (an initialisation or data fault, not a drift).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .events import SemanticEvent
from .states import ActState, FiniteState, GradState, LossState, Signal


class LinkKind(str, Enum):
    BLOCKS = "blocks"
    PROPAGATES = "propagates"
    PRECEDES = "precedes"
    FROM_START = "from_start"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Link:
    kind: LinkKind
    cause: SemanticEvent
    effects: tuple[SemanticEvent, ...] = ()


def _is(ev: SemanticEvent, signal: Signal, *states) -> bool:
    return ev.signal == signal and ev.after in states


def _active_at(ev: SemanticEvent, step: int) -> bool:
    return ev.step <= step and (ev.end is None or ev.end > step)


def blocks(events: list[SemanticEvent], rank: dict[str, int]) -> list[Link]:
    out = []
    vanishing = [e for e in events if _is(e, Signal.GRADIENT, GradState.VANISHING)]
    for act in (e for e in events if _is(e, Signal.ACTIVATION, ActState.DEAD, ActState.SATURATED)):
        pos = rank.get(act.layer, -1)
        upstream = tuple(g for g in vanishing
                         if rank.get(g.layer, 1 << 30) < pos and (g.step >= act.step or _active_at(act, g.step)))
        if upstream:
            out.append(Link(LinkKind.BLOCKS, act, upstream))
    return out


def propagates(events: list[SemanticEvent], rank: dict[str, int]) -> list[Link]:
    out = []
    for state in (GradState.VANISHING, GradState.EXPLODING):
        grads = [e for e in events if _is(e, Signal.GRADIENT, state)]
        if not grads:
            continue
        first = min(e.step for e in grads)
        early = [e for e in grads if e.step == first]
        # vanishing: the deepest layer that fades; exploding: the one closest to the output too,
        # as amplification builds up toward the input
        origin = max(early, key=lambda e: rank.get(e.layer, -1))
        out.append(Link(LinkKind.PROPAGATES, origin, tuple(e for e in grads if e is not origin)))
    return out


_CRITICAL = ((Signal.FINITE, (FiniteState.NONFINITE,)), (Signal.ACTIVATION, (ActState.DEAD,)),
             (Signal.LOSS, (LossState.DIVERGING, LossState.NONFINITE, LossState.OSCILLATING)))


def precedes(events: list[SemanticEvent]) -> list[Link]:
    out = []
    for crit in events:
        if not any(_is(crit, s, *states) for s, states in _CRITICAL):
            continue
        before = [e for e in events if e.bad and e is not crit and e.step <= crit.step and e.signal != crit.signal]
        for e in before:
            out.append(Link(LinkKind.PRECEDES, e, (crit,)))
    return out


def from_start(events: list[SemanticEvent], first_step: int) -> list[Link]:
    return [Link(LinkKind.FROM_START, e) for e in events if e.bad and e.step <= first_step]


def detect(events: list[SemanticEvent], rank: dict[str, int], first_step: int) -> list[Link]:
    return blocks(events, rank) + propagates(events, rank) + precedes(events) + from_start(events, first_step)
