"""One evidence model for every cause.

A cause family turns the events that match its signature into ``Candidate``s: a cause, a place, an onset
and the measured evidence behind it, each on a 0..1 scale:

- severity: how far past its threshold the defining measurement is (``past_ratio``: up to 2 for a ratio two
  decades past it; ``past_fraction``: up to 1);
- persistence: how long the defining state holds, as a share of the run from its onset on;
- consequence: whether it explains other abnormal events (a gradient it blocks; more for a NaN it produces);
- impact: whether it explains the loss's failure (flat, rising, oscillating, NaN, or a loss it stopped coming down
  for good), partly when no loss is recorded;
  a share of a layer's units (dead, saturated) barely past its threshold explains part of a failure;
- certainty: a fact that is a failure by itself (NaN/Inf produced).

A signature may declare that its measurement alone is no failure (``needs_harm``: a weight scale off its
default, a gradient that only diminishes): then severity and persistence count only in part until the
candidate explains a loss failure or another abnormal event. An explained candidate of that kind counts as
a consequence only where it is a failure itself (``fails``).

``confidence`` turns them into one number the same way for every cause: a logistic model whose weights are
fields of ``Thresholds``. The number of symptom layers does not count, so confidence does not grow with depth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..causes import Cause
from ..events import SemanticEvent
from ..states import LossState, Signal
from .context import Context

# Causal order of the families: the earlier explains the later when both fit the same events.
FAMILY_ORDER = (Cause.RANK_DATA, Cause.WORLD_SIZE_SCALING, Cause.REPLICA_DIVERGENCE, Cause.DUPLICATE_DATA,
                Cause.BATCHNORM_RANK_MISMATCH, Cause.DATA, Cause.BAD_INITIALIZATION, Cause.LEARNING_RATE_TOO_HIGH,
                Cause.ATTENTION_COLLAPSE, Cause.EXPLODING_GRADIENTS, Cause.DEAD_UNITS, Cause.SATURATED_ACTIVATIONS,
                Cause.NON_FINITE, Cause.VANISHING_GRADIENTS, Cause.LEARNING_RATE_TOO_LOW, Cause.LOSS_PLATEAU)


@dataclass(eq=False)
class Candidate:
    """A possible root cause and the evidence for it (see the module docstring)."""

    cause: Cause
    layer: str
    step: int
    kind: str                                   # the mechanism within the family
    events: list[SemanticEvent]                 # the events that make the case
    severity: float = 0.0
    persistence: float = 0.0
    certain: bool = False
    needs_harm: bool = False                    # its measurement alone is no failure
    partial: bool = False                       # its measurement is a share of a layer's units: past its
                                                # threshold, it explains part of a loss failure
    lasting: bool = False                       # its effects outlast its evidence (a scale it starts with)
    acting_from: int | None = None              # the step its cause acts from, when before its evidence shows
                                                # (a penalty in the loss on a layer's output: the first step)
    symptoms: list[SemanticEvent] = field(default_factory=list)   # consequences named by its signature
    loss_kinds: frozenset = frozenset()         # loss states it can explain
    facts: dict = field(default_factory=dict)   # numbers for the wording
    absorbed: list["Candidate"] = field(default_factory=list)     # candidates it explains (set by causality)
    loss: list[SemanticEvent] = field(default_factory=list)       # loss failures it explains
    halts: bool = False                         # it stops a loss that was coming down, for good, within its
                                                # span (``Context.loss_stopped``): a loss failure it explains
    confidence: float = 0.0

    @property
    def family(self) -> int:
        return FAMILY_ORDER.index(self.cause) if self.cause in FAMILY_ORDER else len(FAMILY_ORDER)

    @property
    def order(self) -> tuple[int, int]:
        return (self.since, self.family)

    @property
    def since(self) -> int:
        """The step its cause acts from: its onset, or earlier (``acting_from``)."""
        return self.step if self.acting_from is None else min(self.step, self.acting_from)

    def explained(self) -> list["Candidate"]:
        """Every candidate this one explains, directly or not."""
        return self.tree()[1:]

    def tree(self) -> list["Candidate"]:
        """This candidate and every one it explains, directly or not."""
        out, todo = [], [self]
        while todo:
            c = todo.pop()
            if c not in out:
                out.append(c)
                todo.extend(c.absorbed)
        return out


def clip01(x: float) -> float:
    return 0.0 if x != x else min(max(x, 0.0), 1.0)


# a ratio's severity grows until this many units (``decades`` each) past its threshold
RATIO_CAP = 2.0


def past_ratio(value: float, threshold: float, decades: float = 1.0) -> float:
    """How far ``value`` is above ``threshold`` on a log scale: 0 at the threshold, 1 ``decades`` beyond,
    at most ``RATIO_CAP``."""
    if not (value == value and threshold > 0) or value <= 0:
        return 0.0
    if math.isinf(value):
        return RATIO_CAP
    return min(max(math.log10(value / threshold) / decades, 0.0), RATIO_CAP)


def below_ratio(value: float, threshold: float, decades: float = 1.0) -> float:
    """How far ``value`` is below ``threshold`` on a log scale (a zero value is as far as it gets)."""
    if value != value:
        return 0.0
    if value <= 0:
        return 1.0
    return clip01(math.log10(threshold / value) / decades)


def past_fraction(value: float, threshold: float) -> float:
    """How far a fraction is past its threshold, toward 1."""
    if value != value:
        return 1.0
    th = min(threshold, 0.999)
    return clip01((value - th) / (1 - th))


def persistence(ev: SemanticEvent, ctx: Context) -> float:
    """The share of the run from the event's onset on during which its state held: every stretch of the same
    state of the same signal and place from then on (a state that flickers across its threshold counts for
    all the time it holds, not only for its first stretch)."""
    span = ctx.last_step - ev.step
    if ev.end is None or span <= 0:
        return 1.0
    held = 0.0
    for e in ctx.events:
        if e.signal == ev.signal and e.layer == ev.layer and e.after == ev.after and e.step >= ev.step:
            held += (ctx.last_step if e.end is None else e.end) - e.step
    return clip01(held / span)


def loss_failure(ev: SemanticEvent, ctx: Context) -> float:
    """How much of a failure a loss event is: 1, or less for a partial one: a spike of one step, a short
    run's loss that came down by more than the progress threshold but without a trend beyond its noise, or
    a failure the run left for good (the loss improving from its end to the end of the run: a plateau before
    a phase change, a burst it recovered from)."""
    th = ctx.th
    partial = (ev.signal == Signal.SPIKE
               # a moving objective's level says how the game stands, not how the model fails (NaN aside)
               or ctx.moving_objective and ev.after != LossState.NONFINITE
               or ev.after == LossState.STALLED and ev.values.get("progress", 0.0) >= th.loss_progress
               or recovered(ev, ctx))
    return th.evidence_partial_loss if partial else 1.0


def recovered(ev: SemanticEvent, ctx: Context) -> bool:
    """A loss failure the run left for good: from its end on, the loss improves to the end of the run."""
    return ev.end is not None and ctx.loss_recovered_after(ev.end)


def fails(c: Candidate, ctx: Context) -> bool:
    """A candidate that is a failure by itself: its measurement is one (no ``needs_harm``), it is certain, it
    explains a loss failure the run did not leave, or, explaining none, it set in before the run had learned
    (``loss_learned_at``: the model as it learns, which the loss may learn around). A state that sets in once
    the loss has come down and takes part in no failure of it is none: a squashing layer pinned by a classifier
    grown confident, attention that sharpens, in a run that learned."""
    if not c.needs_harm or c.certain:
        return True
    if c.loss or c.halts:
        return c.halts or any(not recovered(e, ctx) for e in c.loss)
    # (a state dated at a sample began after the sample before it: it may have set in before the loss learned)
    return ctx.loss_learned_at is None or ctx.sample_before(c.since) < ctx.loss_learned_at


def confidence(c: Candidate, ctx: Context) -> float:
    th = ctx.th
    impact = max([loss_failure(e, ctx) for e in c.loss] + [1.0] * c.halts,
                 default=0.0 if ctx.has_loss else th.evidence_unknown_loss)
    # explaining other abnormal events; twice as much when one of them is a failure by itself (a NaN)
    # its effects: what starts with it or after (what came before and opens its chain, updates that pushed
    # an attention's logits up, is no consequence; a flat loss it explains counts as impact, not again here),
    # and only those that are failures by themselves (the tree is walked whole: what makes one of them harm,
    # an effect of its own, is in it too)
    explained = [a for a in c.explained()
                 if a.cause != Cause.LOSS_PLATEAU and a.step >= c.step and fails(a, ctx)]
    # harm is a failure it explains: an unrecorded loss shows none, nor does a loss failure the run then left
    # for good, nor the same state spreading to other layers (its symptoms: no failure by themselves either,
    # when its own measurement is none)
    harmed = any(not recovered(e, ctx) for e in c.loss) or bool(explained) or c.certain or c.halts
    gate = 1.0 if (harmed or not c.needs_harm) else th.evidence_unharmed
    consequence = ((th.evidence_nan_consequence if any(a.certain for a in explained) else 1.0) if explained
                   else gate if c.symptoms else 0.0)
    # a share of a layer's units barely past its threshold explains only part of a loss failure (the other
    # units still learn); well past it, all of it
    explains = min(1.0, th.evidence_floor + c.severity) if c.partial else 1.0
    z = (th.evidence_bias + gate * (th.evidence_severity * c.severity + th.evidence_persistence * c.persistence)
         + th.evidence_impact * impact * explains + th.evidence_consequence * consequence
         + th.evidence_certain * c.certain)
    return round(min(1.0 / (1.0 + math.exp(-z)), 0.99), 3)
