"""How a watched run ended, and how each ending is shown (the progress line, the text verdict)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    colour: str     # of the progress line's label
    label: str      # on the progress line
    heading: str    # of the text verdict


OUTCOMES: dict[str, Outcome] = {
    "watching": Outcome("#1565c0", "watching", "watching"),
    "finished": Outcome("#2e7d32", "finished", "the run finished"),
    "error": Outcome("#c62828", "stopped by an exception", "the run stopped with an exception"),
    "interrupted": Outcome("#ef6c00", "interrupted", "the run was interrupted"),
    "loaded": Outcome("#455a64", "loaded from file", "trace loaded from file"),
}


def outcome(name: str) -> Outcome:
    return OUTCOMES.get(name, Outcome("#455a64", name, name))


def verdict_text(dbg, name: str) -> str:
    """The verdict printed where no widget shows (a terminal, ``--no-live``, a text front end)."""
    return f"NeuralDbg verdict: {outcome(name).heading}, {dbg.step} steps.\n{dbg.report()}"
