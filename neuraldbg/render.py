"""How a verdict reads: each hypothesis is described once, then written out as text, Markdown or HTML.

Text is what ``report()`` and terminals show, Markdown what text exports of a notebook keep, HTML
the explanation panel of the dashboard and ``Verdict._repr_html_``. Backticks mark code (a layer's
name, a fix) in the hub's sentences; each writer turns them into its own markup. The HTML takes its
colours from JupyterLab's theme variables (readable in light and dark themes) and falls back to
plain colours anywhere else (an exported page), with no script and nothing loaded from a network.
"""
from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .formatting import confidence as fmt_confidence
from .formatting import percent
from .hypothesis import CONFIDENT, CausalHypothesis

MAX_EVIDENCE = 5   # events listed under a hypothesis; the others are counted
MAX_WEAK = 5       # weak signals listed under a verdict

_CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Described:
    """What one hypothesis says, before any markup."""

    rank: int | None
    cause: str
    layer: str
    where: str              # "`enc.3`", "the model", "the input data"
    step: int
    confidence: float
    chain: tuple[str, ...]
    evidence: tuple[str, ...]
    more_evidence: int      # events beyond the ones listed
    fix: str
    on_rank: int | None = None  # the rank where it starts, in a multi-process run

    @property
    def weak(self) -> bool:
        return self.confidence < CONFIDENT

    @property
    def title(self) -> str:
        return f"{self.cause} in {self.where}, from step {self.step}"


def describe(hyp: CausalHypothesis, rank: int | None = None) -> Described:
    evidence = [e.describe() if hasattr(e, "describe") else str(e) for e in (hyp.evidence or [])]
    return Described(rank=rank, cause=str(getattr(hyp.cause, "value", hyp.cause)), layer=str(hyp.layer),
                     where=hyp.where, step=int(hyp.step), confidence=float(hyp.confidence),
                     chain=tuple(str(c) for c in hyp.chain or ()), evidence=tuple(evidence[:MAX_EVIDENCE]),
                     more_evidence=max(len(evidence) - MAX_EVIDENCE, 0), fix=str(hyp.suggestion or ""),
                     on_rank=getattr(hyp, "rank", None))


def _split(hyps: Sequence[CausalHypothesis]) -> tuple[list[Described], list[Described]]:
    strong = [h for h in hyps if h.confidence >= CONFIDENT]
    weak = [h for h in hyps if h.confidence < CONFIDENT]
    return ([describe(h, i) for i, h in enumerate(strong, 1)],
            [describe(h, len(strong) + i) for i, h in enumerate(weak, 1)])


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


# -- one line --------------------------------------------------------------------------------------

def summary(hyps: Sequence[CausalHypothesis], steps: int) -> str:
    """The verdict in one line: ``healthy after 300 steps``, ``nothing was trained (0 steps)``, or the
    top hypothesis."""
    strong, _ = _split(hyps)
    if not strong:
        return "nothing was trained (0 steps)" if steps == 0 else f"healthy after {_steps(steps)}"
    top = strong[0]
    more = f"; {len(strong) - 1} more" if len(strong) > 1 else ""
    return f"{top.title} (confidence {fmt_confidence(top.confidence)}), after {_steps(steps)}{more}"


def headline(hyps: Sequence[CausalHypothesis], steps: int) -> str:
    """The report's ``Verdict:`` line."""
    strong, _ = _split(hyps)
    if strong:
        return f"Verdict: {strong[0].title}."
    if steps == 0:
        return "Verdict: nothing was trained: no training step completed (0 steps)."
    return f"Verdict: healthy. No failure found in {steps} steps (no hypothesis at confidence >= {CONFIDENT})."


# -- text ------------------------------------------------------------------------------------------

def hypothesis_text(d: Described) -> list[str]:
    head = f"{d.rank}. " if d.rank is not None else ""
    lines = [f"{head}{d.title} (confidence {fmt_confidence(d.confidence)})"]
    if d.chain:
        lines.append("   why:")
        lines += [f"     {'->' if i else '*'} {c}" for i, c in enumerate(d.chain)]
    if d.evidence:
        lines.append("   evidence:")
        lines += [f"     - {e}" for e in d.evidence]
        if d.more_evidence:
            lines.append(f"     - ... and {d.more_evidence} more events")
    if d.fix:
        lines.append(f"   fix: {d.fix}")
    return lines


def verdict_text(hyps: Sequence[CausalHypothesis], steps: int) -> str:
    """The headline, each confident hypothesis in full, then the weak signals in one line each."""
    strong, weak = _split(hyps)
    lines = [headline(hyps, steps)]
    if strong:
        lines.append("")
    for d in strong:
        lines += hypothesis_text(d)
        lines.append("")
    if weak:
        lines.append(f"Weak signals (below confidence {CONFIDENT}):")
        lines += [f"  - {d.title} (confidence {fmt_confidence(d.confidence)})" + (f" : {d.chain[0]}" if d.chain else "")
                  for d in weak[:MAX_WEAK]]
    return "\n".join(lines).rstrip() + "\n"


# -- Markdown --------------------------------------------------------------------------------------

def _md(s: str) -> str:
    """Markdown-safe text that keeps the backticked code spans."""
    parts = re.split(r"(`[^`]+`)", s)
    return "".join(p if p.startswith("`") else re.sub(r"([\\*<>\[\]])", r"\\\1", p) for p in parts)


def hypothesis_markdown(d: Described) -> str:
    head = f"{d.rank}. " if d.rank is not None else "- "
    lines = [f"{head}**{_md(d.cause)}** in {_md(d.where)}, from step {d.step} "
             f"(confidence {fmt_confidence(d.confidence)})"]
    pad = " " * len(head)
    lines += [f"{pad}- {'why: ' if i == 0 else '&rarr; '}{_md(c)}" for i, c in enumerate(d.chain)]
    if d.fix:
        lines.append(f"{pad}- **fix:** {_md(d.fix)}")
    return "\n".join(lines)


def verdict_markdown(hyps: Sequence[CausalHypothesis], steps: int) -> str:
    strong, weak = _split(hyps)
    out = [f"**NeuralDbg:** {_md(summary(hyps, steps))}"]
    if strong:
        out.append("\n".join(hypothesis_markdown(d) for d in strong))
    if weak:
        out.append(f"Weak signals (below confidence {CONFIDENT}):\n\n" +
                   "\n".join(f"- {_md(d.title)} (confidence {fmt_confidence(d.confidence)})" for d in weak[:MAX_WEAK]))
    return "\n\n".join(out) + "\n"


# -- HTML ------------------------------------------------------------------------------------------

# Text takes the theme's colour; tinted backgrounds are translucent, so both themes stay readable.
_FONT = "font:13px/1.5 var(--jp-ui-font-family,system-ui,sans-serif);color:var(--jp-ui-font-color1,inherit)"
_BOX = f"{_FONT};margin:4px 0;padding:6px 8px;border-radius:4px"
_MUTED = "color:var(--jp-ui-font-color2,#616161)"
_STRONG, _WEAK_EDGE, _GOOD = "#c62828", "#9e9e9e", "#2e7d32"


def _h(s: str) -> str:
    """Escaped text with backticked names set as code."""
    return _CODE.sub(r"<code>\1</code>", html.escape(s))


def _bar(confidence: float) -> str:
    pct = max(0.0, min(1.0, confidence)) * 100
    colour = _STRONG if confidence >= 0.75 else "#ef6c00" if confidence >= CONFIDENT else _WEAK_EDGE
    return (f'<span class="ndbg-confidence" title="confidence {fmt_confidence(confidence)}" '
            f'style="display:inline-block;'
            f'width:6em;height:0.7em;background:rgba(128,128,128,0.25);border-radius:3px;vertical-align:middle">'
            f'<span style="display:block;width:{pct:.0f}%;height:100%;background:{colour};border-radius:3px">'
            f"</span></span> {percent(confidence)}")


def hypothesis_html(d: Described) -> str:
    edge, tint = (_WEAK_EDGE, "rgba(158,158,158,0.08)") if d.weak else (_STRONG, "rgba(198,40,40,0.07)")
    where = {"the model": "the model as a whole"}.get(d.where, d.where)
    parts = [
        f'<div class="ndbg-hyp{" ndbg-weak" if d.weak else ""}" data-cause="{html.escape(d.cause)}"'
        f' data-layer="{html.escape(d.layer)}" data-confidence="{d.confidence:.3f}"'
        + (f' data-rank="{int(d.on_rank)}"' if d.on_rank is not None else "")
        + f' style="{_BOX};border-left:4px solid {edge};background:{tint}">',
        f"<div><b>{d.rank}. {html.escape(d.cause.replace('_', ' '))}</b> in {_h(where)}, from step {d.step}"
        f" &nbsp; {_bar(d.confidence)}</div>",
    ]
    if d.chain:
        links = "".join(f'<div style="padding-left:1.2em;text-indent:-1.2em">{"&rarr; " if k else ""}{_h(c)}</div>'
                        for k, c in enumerate(d.chain))
        parts.append(f'<div class="ndbg-chain" style="margin:2px 0">{links}</div>')
    if d.fix:
        parts.append(f'<div class="ndbg-fix"><b>Fix:</b> {_h(d.fix)}</div>')
    if d.evidence:
        more = f"<li>... and {d.more_evidence} more events</li>" if d.more_evidence else ""
        items = "".join(f"<li>{_h(e)}</li>" for e in d.evidence)
        parts.append(f'<details><summary style="{_MUTED}">evidence ({len(d.evidence) + d.more_evidence})</summary>'
                     f'<ul style="margin:2px 0">{items}{more}</ul></details>')
    parts.append("</div>")
    return "".join(parts)


def verdict_html(hyps: Sequence[CausalHypothesis], steps: int, live: bool = False) -> str:
    """The explanation panel. ``live``: the run is still going (what is found so far)."""
    if live and steps == 0:
        return f'<div class="ndbg-waiting" style="{_BOX};{_MUTED}">Waiting for the first training step...</div>'
    strong, weak = _split(hyps)
    when = f"so far (step {steps})" if live else f"after {_steps(steps)}"
    out = []
    if strong:
        title = f"Failure detected while training, at step {steps}" if live else f"Why this run fails ({when})"
        out.append(f'<div style="{_FONT};font-weight:bold;margin:4px 0">{title}:</div>')
        out.extend(hypothesis_html(d) for d in strong)
    elif steps == 0:
        out.append(f'<div class="ndbg-untrained" style="{_BOX};border-left:4px solid {_WEAK_EDGE};'
                   f'background:rgba(158,158,158,0.1)">Nothing was trained: no training step completed '
                   "(0 steps), so there is nothing to explain.</div>")
    else:
        out.append(f'<div class="ndbg-healthy" style="{_BOX};border-left:4px solid {_GOOD};'
                   f'background:rgba(46,125,50,0.12)">No training failure detected {when}.</div>')
    if weak:
        out.append(f'<div style="{_FONT};{_MUTED};margin:6px 0 0">Weak signals (below confidence {CONFIDENT}):</div>')
        out.extend(hypothesis_html(d) for d in weak[:MAX_WEAK])
    return "".join(out)
