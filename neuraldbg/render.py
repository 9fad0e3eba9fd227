"""How a verdict reads: each hypothesis is described once, then written out as text, Markdown or HTML.

Text is what ``report()`` and terminals show, Markdown what text exports of a notebook keep, HTML
the explanation panel of the dashboard and ``Verdict._repr_html_``. The early warnings (``watch``) are
written apart from the hypotheses, in a "Watch" section under them, in amber. Backticks mark code (a layer's
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
from .hypothesis import CONFIDENT, NOTICE, CausalHypothesis

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
    weak = [h for h in hyps if NOTICE <= h.confidence < CONFIDENT]   # weak signals, not noise
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


WATCH_HEADING = "Watch (early warnings, not verdicts)"


def watch_text(warnings: Sequence) -> str:
    """The early warnings, one line each (``""`` when there are none)."""
    if not warnings:
        return ""
    return "\n".join([f"{WATCH_HEADING}:", *(f"  - {w.describe()}" for w in warnings)]) + "\n"


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


def watch_markdown(warnings: Sequence) -> str:
    if not warnings:
        return ""
    return f"{WATCH_HEADING}:\n\n" + "\n".join(f"- {_md(w.title)}: {_md(w.outlook)}" for w in warnings) + "\n"


# -- HTML ------------------------------------------------------------------------------------------

# Text takes the theme's colour; tinted backgrounds are translucent, so both themes stay readable.
_FONT = "font:13px/1.5 var(--jp-ui-font-family,system-ui,sans-serif);color:var(--jp-ui-font-color1,inherit)"
_BOX = f"{_FONT};margin:4px 0;padding:6px 8px;border-radius:4px"
_MUTED = "color:var(--jp-ui-font-color2,#616161)"
_STRONG, _WEAK_EDGE, _GOOD = "#c62828", "#9e9e9e", "#2e7d32"
AMBER = "#9a6700"   # a warning: between healthy and failing (white text on it reads at 4.9:1)
_AMBER_TINT = "rgba(154,103,0,0.12)"


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


def warning_html(w) -> str:
    """One early warning: what is heading for which failure, how it moved, and when it gets there."""
    fc = w.forecast
    data = (f' data-signal="{html.escape(str(w.signal))}" data-layer="{html.escape(w.layer)}"'
            f' data-state="{html.escape(str(w.state))}"' + (f' data-forecast="{fc.step}"' if fc is not None else ""))
    return (f'<div class="ndbg-warning"{data} style="{_BOX};border-left:4px solid {AMBER};background:{_AMBER_TINT}">'
            f"<div><b>{_h(w.title)}</b>, since step {w.step}</div>"
            f'<div class="ndbg-outlook">{_h(w.outlook)}</div></div>')


def watch_html(warnings: Sequence, live: bool = False) -> str:
    """The Watch section of the panel: the early warnings, apart from the hypotheses (``""`` when none)."""
    if not warnings:
        return ""
    note = " from the samples so far" if live else ""
    head = (f'<div style="{_FONT};font-weight:bold;margin:6px 0 0">{WATCH_HEADING}{note}:</div>')
    return f'<div class="ndbg-watch">{head}{"".join(warning_html(w) for w in warnings)}</div>'


def panel_html(hyps: Sequence[CausalHypothesis], steps: int, warnings: Sequence = (), live: bool = False) -> str:
    """The explanation panel with its Watch section: the verdict, then the early warnings."""
    return verdict_html(hyps, steps, live=live, watch=len(warnings)) + watch_html(warnings, live=live)


def verdict_html(hyps: Sequence[CausalHypothesis], steps: int, live: bool = False, watch: int = 0) -> str:
    """The explanation panel. ``live``: the run is still going (what is found so far); ``watch``: how many
    early warnings the Watch section under it lists (a run with some is not shown as plainly healthy)."""
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
    elif watch:
        signals = f"{watch} signal" + (" is" if watch == 1 else "s are")
        out.append(f'<div class="ndbg-healthy ndbg-watched" style="{_BOX};border-left:4px solid {AMBER};'
                   f'background:{_AMBER_TINT}">No training failure detected {when}, but {signals} heading '
                   "toward one: see Watch below.</div>")
    else:
        out.append(f'<div class="ndbg-healthy" style="{_BOX};border-left:4px solid {_GOOD};'
                   f'background:rgba(46,125,50,0.12)">No training failure detected {when}.</div>')
    if weak:
        out.append(f'<div style="{_FONT};{_MUTED};margin:6px 0 0">Weak signals (below confidence {CONFIDENT}):</div>')
        out.extend(hypothesis_html(d) for d in weak[:MAX_WEAK])
    return "".join(out)
