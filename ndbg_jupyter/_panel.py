"""The explanation panel: ranked causal hypotheses as HTML (cause, layer, onset, confidence, chain, fix)."""
from __future__ import annotations

import html
import re

from ._states import value_of

CONFIDENT = 0.5  # a hypothesis at or above this confidence means "this run has this failure"

_BOX = "font:13px/1.5 var(--jp-ui-font-family,sans-serif);margin:4px 0;padding:6px 8px;border-radius:4px"


_CODE = re.compile(r"`([^`]+)`")


def _text(s: str) -> str:
    """Escaped text with `names` (layers, code) set as code, as the report writes them."""
    return _CODE.sub(r"<code>\1</code>", html.escape(s))


def _bar(confidence: float) -> str:
    pct = max(0.0, min(1.0, confidence)) * 100
    colour = "#c62828" if confidence >= 0.75 else "#ef6c00" if confidence >= CONFIDENT else "#9e9e9e"
    return (f'<span class="ndbg-confidence" title="confidence {confidence:.2f}" style="display:inline-block;'
            f'width:8em;height:0.7em;background:#e0e0e0;border-radius:3px;vertical-align:middle">'
            f'<span style="display:block;width:{pct:.0f}%;height:100%;background:{colour};border-radius:3px">'
            f'</span></span> {confidence:.0%}')


def hypothesis_html(rank: int, hyp) -> str:
    cause = value_of(getattr(hyp, "cause", ""))
    layer = str(getattr(hyp, "layer", ""))
    confidence = float(getattr(hyp, "confidence", 0.0))
    step = getattr(hyp, "step", None)
    chain = [str(c) for c in (getattr(hyp, "chain", None) or [])]
    evidence = list(getattr(hyp, "evidence", None) or [])
    fix = str(getattr(hyp, "suggestion", "") or "")
    where = {"": "the model as a whole", "input": "the input data"}.get(layer, f"<code>{html.escape(layer)}</code>")
    on_rank = getattr(hyp, "rank", None)
    if on_rank is not None:
        where += f" on rank {int(on_rank)}"
    weak = confidence < CONFIDENT
    parts = [
        f'<div class="ndbg-hyp{" ndbg-weak" if weak else ""}" data-cause="{html.escape(cause)}"'
        f' data-layer="{html.escape(layer)}" data-confidence="{confidence:.3f}"'
        + (f' data-rank="{int(on_rank)}"' if on_rank is not None else "") +
        f' style="{_BOX};border-left:4px solid {"#bdbdbd" if weak else "#c62828"};background:#fafafa">',
        f'<div><b>{rank}. {html.escape(cause.replace("_", " "))}</b> in {where}'
        + (f", from step {int(step)}" if step is not None else "") + f" &nbsp; {_bar(confidence)}</div>",
    ]
    if chain:
        links = "".join(f'<div style="padding-left:1.2em;text-indent:-1.2em">{"&rarr; " if k else ""}'
                        f"{_text(c)}</div>" for k, c in enumerate(chain))
        parts.append(f'<div class="ndbg-chain" style="margin:2px 0">{links}</div>')
    if fix:
        parts.append(f'<div class="ndbg-fix"><b>Fix:</b> {_text(fix)}</div>')
    if evidence:
        items = "".join(f"<li>{_text(str(e))}</li>" for e in evidence[:12])
        more = f"<li>... {len(evidence) - 12} more</li>" if len(evidence) > 12 else ""
        parts.append(f"<details><summary>evidence ({len(evidence)})</summary><ul>{items}{more}</ul></details>")
    parts.append("</div>")
    return "".join(parts)


def panel_html(hypotheses, *, step: int, finished: bool, measured: bool = True) -> str:
    """The whole panel. ``finished``: the run is over (post-mortem); ``measured``: any data recorded yet."""
    if not measured:
        return f'<div style="{_BOX};color:#757575">Waiting for the first training step...</div>'
    strong = [h for h in hypotheses if float(getattr(h, "confidence", 0.0)) >= CONFIDENT]
    weak = [h for h in hypotheses if float(getattr(h, "confidence", 0.0)) < CONFIDENT]
    when = f"after {step} steps" if finished else f"so far (step {step})"
    out = []
    if strong:
        title = "Why this run fails" if finished else "Failure detected while training"
        out.append(f'<div style="font-weight:bold;margin:4px 0">{title} ({when}):</div>')
        out.extend(hypothesis_html(i + 1, h) for i, h in enumerate(strong))
    else:
        out.append(f'<div class="ndbg-healthy" style="{_BOX};background:#e8f5e9;border-left:4px solid #2e7d32">'
                   f"No training failure detected {when}.</div>")
    if weak:
        out.append('<div style="color:#757575;margin:6px 0 0">Weak signals (below the confidence threshold):</div>')
        out.extend(hypothesis_html(len(strong) + i + 1, h) for i, h in enumerate(weak))
    return "".join(out)
