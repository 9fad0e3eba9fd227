"""A loss that stops improving when nothing more specific explains it."""
from __future__ import annotations

from ..causes import Cause
from ..states import LossState, Signal
from .context import Context
from .evidence import Candidate, clip01, persistence


def candidates(ctx: Context) -> list[Candidate]:
    plateau = ctx.all(Signal.LOSS, LossState.PLATEAU)
    if not plateau:
        return []
    ev = plateau[-1]
    # how flat: no progress at all is full severity
    progress = ev.values.get("progress", 0.0)
    return [Candidate(Cause.LOSS_PLATEAU, "", ev.step, "plateau", [ev],
                      severity=clip01(1.0 - progress / ctx.th.loss_progress) if progress == progress else 1.0,
                      persistence=persistence(ev, ctx), loss_kinds=frozenset({LossState.PLATEAU}))]
