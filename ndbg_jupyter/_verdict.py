"""The verdict as a displayable object: HTML (the explanation panel) where a front end renders it,
plain text in a terminal or a text export."""
from __future__ import annotations

import dataclasses

from ._panel import CONFIDENT, panel_html
from ._states import value_of

_HEADINGS = {
    "finished": "the run finished",
    "error": "the run stopped with an exception",
    "interrupted": "the run was interrupted",
    "loaded": "trace loaded from file",
    "explain": "explanation",
}


def hypotheses_text(hypotheses) -> str:
    """One block per hypothesis: rank, cause, layer, onset, confidence, chain, fix."""
    if not any(float(h.confidence) >= CONFIDENT for h in hypotheses):
        lines = ["No training failure detected."]
    else:
        lines = []
    for i, h in enumerate(hypotheses, 1):
        layer = {"": "the model as a whole", "input": "the input data"}.get(h.layer, f"`{h.layer}`")
        if getattr(h, "rank", None) is not None:
            layer += f" on rank {h.rank}"
        weak = " (weak)" if float(h.confidence) < CONFIDENT else ""
        lines.append(f"{i}. {value_of(h.cause)} in {layer}, from step {h.step}: "
                     f"confidence {float(h.confidence):.0%}{weak}")
        for k, link in enumerate(h.chain or []):
            lines.append(("   why: " if k == 0 else "     -> ") + str(link))
        if h.suggestion:
            lines.append(f"   fix: {h.suggestion}")
    return "\n".join(lines)


def thresholds_text(thresholds) -> str:
    lines = ["Thresholds (change one with %%neuraldbg --name VALUE, or _ndbg.reanalyze(name=value)):"]
    for f in dataclasses.fields(thresholds):
        doc = f.metadata.get("doc", "")
        lines.append(f"  {f.name} = {getattr(thresholds, f.name)!r}" + (f"   # {doc}" if doc else ""))
    return "\n".join(lines)


class Verdict:
    """What a session concludes, for ``display``: the panel as HTML, the report as text."""

    def __init__(self, dbg, outcome: str = "finished"):
        self.dbg = dbg
        self.outcome = outcome

    def text(self) -> str:
        if self.outcome == "explain":
            return hypotheses_text(self.dbg.explain())
        heading = _HEADINGS.get(self.outcome, self.outcome)
        return f"NeuralDbg verdict: {heading}, {self.dbg.step} steps.\n{self.dbg.report()}"

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return panel_html(self.dbg.explain(), step=self.dbg.step, finished=True)
