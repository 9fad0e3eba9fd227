"""``Verdict``: the ranked hypotheses of a run, as a list, that also reads as a verdict."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import render
from .hypothesis import CONFIDENT, CausalHypothesis


class Verdict(list):
    """Causal hypotheses, best first (a ``list``: ``verdict[0]``, ``len(verdict)``, ``verdict == []``),
    with the number of steps they cover.

    ``str(verdict)`` is one line (``healthy after 300 steps``); in a notebook it shows as the
    explanation panel (HTML), in a text export as Markdown, in a terminal as text.
    """

    def __init__(self, hypotheses: Iterable[CausalHypothesis] = (), steps: int = 0) -> None:
        super().__init__(hypotheses)
        self.steps = int(steps)

    @property
    def confident(self) -> list[CausalHypothesis]:
        """The hypotheses at confidence >= 0.5: the failures this run has."""
        return [h for h in self if h.confidence >= CONFIDENT]

    @property
    def healthy(self) -> bool:
        """No hypothesis at confidence >= 0.5 (a run of 0 steps is not called healthy)."""
        return not self.confident and self.steps > 0

    def text(self) -> str:
        return render.verdict_text(self, self.steps)

    def markdown(self) -> str:
        return render.verdict_markdown(self, self.steps)

    def html(self, live: bool = False, warnings: Iterable = ()) -> str:
        """The explanation panel; ``live``: the run is still going; ``warnings``: early warnings
        (``dbg.warnings()``) for its Watch section, under the hypotheses."""
        return render.panel_html(self, self.steps, list(warnings), live=live)

    def __str__(self) -> str:
        return render.summary(self, self.steps)

    def __repr__(self) -> str:
        return f"Verdict({list.__repr__(self)}, steps={self.steps})"

    def _repr_html_(self) -> str:
        return self.html()

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text().rstrip())
