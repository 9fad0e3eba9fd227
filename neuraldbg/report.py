"""Human-readable output of an analysis: a text report and a Mermaid flowchart of the causal graph."""
from __future__ import annotations

import re

from .formatting import number
from .hypothesis import CONFIDENT
from .render import verdict_text, watch_text

_MAX_LISTED = 5  # modules listed by name in a line of the report


def _loss_line(trace) -> str | None:
    if trace is None or trace.loss.n == 0:
        return None
    v = trace.loss.data
    ok = v[~(v != v)]
    if len(ok) == 0:
        return f"loss: NaN from the first recorded step ({trace.loss.n} recorded)"
    first, last = float(v[0]), float(v[-1])
    return (f"loss: {number(first)} at step {int(trace.loss.steps[0])} -> {number(last)} at step "
            f"{int(trace.loss.steps[-1])} (best {number(float(ok.min()))}, {trace.loss.n} recorded)")


def render_report(analysis, trace=None, step: int | None = None, extra: list[str] | None = None,
                  warnings=()) -> str:
    """The verdict as text: what was watched (and what could not be), the loss, skipped steps, then the
    verdict (the top cause, its chain, the numbers and the fix; then the others), then the early warnings
    (``warnings``), apart. ``extra``: lines under the heading (the ranks of a multi-process run)."""
    steps = step if step is not None else analysis.steps
    sampled = trace.stats.n if trace is not None else 0
    n_layers = len(trace.layers) if trace is not None else len(analysis.health)
    n_ops = sum(1 for l in trace.layers if l.is_site) if trace is not None else 0
    watched = f"{n_layers - n_ops} layers" + (f" and {n_ops} functional operations" if n_ops else "")
    lines = [f"NeuralDbg report: {steps} steps, {sampled} sampled, {watched} watched", *(extra or [])]
    unobserved = trace.unobserved() if trace is not None and sampled else {}
    if unobserved:
        shown = [f"`{n}` ({why})" for n, why in list(unobserved.items())[:_MAX_LISTED]]
        more = len(unobserved) - len(shown)
        lines.append("not observed (nothing measured, not shown as healthy): " + ", ".join(shown)
                     + (f" and {more} more" if more > 0 else ""))
    loss = _loss_line(trace)
    if loss:
        lines.append(loss)
    stopped = trace.meta.get("stopped_by") if trace is not None else None
    if stopped:
        said = f": {stopped['message']}" if stopped.get("message") else ""
        lines.append(f"stopped: the run ended on {stopped['error']} at step {stopped['step']}{said} (what follows "
                     "covers the steps before it)")
    if trace is not None and trace.skipped.n:
        sc = trace.skipped.data
        scale = (f"; loss scale {number(float(sc[0]))} -> {number(float(sc[-1]))}"
                 if sc[0] == sc[0] and sc[-1] == sc[-1] else "")
        lines.append(f"skipped: {trace.skipped.n} optimizer steps with NaN/Inf gradients, not counted as steps "
                     f"(first at step {int(trace.skipped.steps[0])}{scale})")
    watch = watch_text(warnings)
    return "\n".join(lines) + "\n" + verdict_text(analysis.hypotheses, steps) + (f"\n{watch}" if watch else "")


def _label(text: str) -> str:
    text = re.sub(r'["\[\]{}()<>|`#;]', "", text)
    return text if len(text) <= 90 else text[:87] + "..."


def render_mermaid(analysis, limit: int = 3) -> str:
    """A Mermaid flowchart: for each top hypothesis, its root node and its chain, cause to effect."""
    lines = ["flowchart TD"]
    hyps = analysis.hypotheses[:limit]
    if not hyps:
        lines.append('    healthy["healthy: no failure found"]')
        return "\n".join(lines) + "\n"
    for i, h in enumerate(hyps):
        root = f"h{i}"
        style = "root" if h.confidence >= CONFIDENT else "weak"
        title = _label(f"{h.cause} in {h.where} from step {h.step} ({h.confidence:.2f})")
        lines.append(f'    {root}["{title}"]:::{style}')
        prev = root
        for j, c in enumerate(h.chain):
            node = f"h{i}c{j}"
            lines.append(f'    {node}["{_label(c)}"]')
            lines.append(f"    {prev} --> {node}")
            prev = node
        if h.suggestion:
            lines.append(f'    h{i}fix["fix: {_label(h.suggestion)}"]:::fix')
            lines.append(f"    {root} -.-> h{i}fix")
    lines.append("    classDef root fill:#ffcdd2,stroke:#c62828")
    lines.append("    classDef weak fill:#eeeeee,stroke:#9e9e9e")
    lines.append("    classDef fix fill:#e8f5e9,stroke:#2e7d32")
    return "\n".join(lines) + "\n"
