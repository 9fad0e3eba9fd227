"""The scoreboard: from the outcomes of runs (``runner.run``) to top-1 / top-3, per-cause precision and
recall, the confusion matrix, false alarms, root-vs-symptom swaps, calibration and the misses.

A faulty run is a top-1 hit when its first hypothesis names an accepted cause at an accepted place
(its chain matching where the verdict asks for it), at confidence >= 0.5, dated inside the onset
window. A healthy run is quiet when no hypothesis reaches 0.5.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from .faults import Verdict

CONFIDENT = 0.5
BANDS = (("<0.5", 0.0, 0.5), ("0.5-0.7", 0.5, 0.7), ("0.7-0.9", 0.7, 0.9), (">=0.9", 0.9, 1.01))
HEALTHY = "healthy"

# -- fixes that contradict the verdict ---------------------------------------------------------------

_LR = r"(learning rate|\blr\b)"
RAISE_LR = re.compile(rf"\b(raise|increase|larger|higher|bigger)\b[^.;]*{_LR}", re.IGNORECASE)
LOWER_LR = re.compile(rf"\b(lower|reduce|decrease|smaller|cut)\b[^.;]*{_LR}", re.IGNORECASE)
_DOWN_CAUSES = {"learning_rate_too_high", "exploding_gradients"}


def contradictions(hyps, diverged: bool = False) -> list[str]:
    """Fixes (of any hypothesis shown) that point the opposite way of the top hypothesis: a larger
    learning rate next to a learning rate too high, exploding gradients or a loss that diverged; a
    smaller one next to a learning rate too low. ``hyps``: CausalHypothesis objects or dicts."""
    if not hyps:
        return []
    get = (lambda h, k: h[k]) if isinstance(hyps[0], dict) else (lambda h, k: getattr(h, k))
    top = str(get(hyps[0], "cause"))
    wrong = RAISE_LR if (top in _DOWN_CAUSES or diverged) else LOWER_LR if top == "learning_rate_too_low" else None
    if wrong is None:
        return []
    return [f"{get(h, 'cause')}: {get(h, 'suggestion')}" for h in hyps if wrong.search(get(h, "suggestion") or "")]


# -- one run -----------------------------------------------------------------------------------------

def _accepts(expect: dict, hyp: dict, onset: bool = False) -> bool:
    """The hypothesis is one of the accepted verdicts (and, with ``onset``, dated inside the window)."""
    ok = any(Verdict(v["cause"], tuple(v["places"]), v["chain"]).matches(hyp["cause"], hyp["layer"], hyp["chain"])
             for v in expect["accepted"])
    lo, hi = expect["onset"]
    return ok and (not onset or lo <= hyp["step"] <= hi)


def judge(run: dict) -> dict:
    """What the verdict of one run amounts to. ``said``: the cause of the top hypothesis at >= 0.5, or
    "healthy"; ``hit``: a right top-1 verdict (a quiet healthy run); ``correct``: the top hypothesis is
    right whatever its confidence (for calibration)."""
    hyps = run["hypotheses"]
    top = hyps[0] if hyps else None
    said = top["cause"] if top is not None and top["confidence"] >= CONFIDENT else HEALTHY
    out = {"top": top and f"{top['cause']}@{top['layer'] or '(model)'} {top['confidence']:.2f} step {top['step']}",
           "top_confidence": top["confidence"] if top else None, "said": said,
           "contradictions": contradictions(hyps)}
    if run["error"]:
        return out | {"hit": False, "why": "error", "correct": False, "expected": run["expect"] and
                      run["expect"]["accepted"][0]["cause"] or HEALTHY, "cause_ok": False, "top3": False,
                      "swap": False}
    if run["mechanism"] is None:
        return out | {"hit": said == HEALTHY, "why": None if said == HEALTHY else "false alarm", "correct": False,
                      "expected": HEALTHY}
    exp = run["expect"]
    accepted_causes = {v["cause"] for v in exp["accepted"]}
    right_verdict = top is not None and _accepts(exp, top)
    right_dated = top is not None and _accepts(exp, top, onset=True)
    hit = right_dated and top["confidence"] >= CONFIDENT
    if hit:
        why = None
    elif said == HEALTHY:
        why = "right verdict below 0.5" if right_verdict else "no hypothesis at 0.5"
    elif right_verdict:
        why = "onset outside the window"
    elif said in accepted_causes:
        why = "right cause, wrong place or chain"
    else:
        why = "wrong cause"
    swap = not hit and not right_verdict and any(_accepts(exp, h) for h in hyps[1:])
    return out | {"hit": hit, "why": why, "expected": exp["accepted"][0]["cause"], "correct": right_dated,
                  "cause_ok": said in accepted_causes, "top3": any(_accepts(exp, h) for h in hyps[:3]), "swap": swap}


# -- a part ------------------------------------------------------------------------------------------

def _rate(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def summarize(runs: list[dict]) -> dict:
    faulty = [r for r in runs if r["mechanism"] is not None]
    healthy = [r for r in runs if r["mechanism"] is None]
    for r in runs:
        r.setdefault("judged", judge(r))
    j = lambda r: r["judged"]  # noqa: E731
    causes = sorted({j(r)["expected"] for r in faulty})
    per_cause = {}
    for c in causes:
        mine = [r for r in faulty if j(r)["expected"] == c]
        said = [r for r in runs if j(r)["said"] == c]
        per_cause[c] = {"runs": len(mine), "recall": _rate(sum(j(r)["hit"] for r in mine), len(mine)),
                        "cause_recall": _rate(sum(j(r)["cause_ok"] for r in mine), len(mine)),
                        "said": len(said), "precision": _rate(sum(j(r)["hit"] for r in said), len(said))}
    confusion: dict = defaultdict(Counter)
    for r in runs:
        confusion[j(r)["expected"]][j(r)["said"]] += 1
    bands = []
    for name, lo, hi in BANDS:
        inside = [r for r in runs if j(r)["top_confidence"] is not None and lo <= j(r)["top_confidence"] < hi]
        right = _rate(sum(j(r)["correct"] for r in inside), len(inside))
        bands.append({"band": name, "runs": len(inside), "right": right})
    per_mechanism = {}
    for m in sorted({r["mechanism"] for r in faulty}):
        mine = [r for r in faulty if r["mechanism"] == m]
        per_mechanism[m] = {"runs": len(mine), "top1": _rate(sum(j(r)["hit"] for r in mine), len(mine))}
    per_family = {}
    for f in sorted({r["family"] for r in runs}):
        mine = [r for r in faulty if r["family"] == f]
        calm = [r for r in healthy if r["family"] == f]
        per_family[f] = {"faulty": len(mine), "top1": _rate(sum(j(r)["hit"] for r in mine), len(mine)),
                         "healthy": len(calm), "false_alarms": sum(not j(r)["hit"] for r in calm)}
    return {
        "faulty_runs": len(faulty), "healthy_runs": len(healthy),
        "top1": _rate(sum(j(r)["hit"] for r in faulty), len(faulty)),
        "top3": _rate(sum(j(r)["top3"] for r in faulty), len(faulty)),
        "false_alarms": sum(not j(r)["hit"] for r in healthy),
        "false_alarm_rate": _rate(sum(not j(r)["hit"] for r in healthy), len(healthy)),
        "swaps": sum(j(r)["swap"] for r in faulty),
        "contradicting_fixes": sum(bool(j(r)["contradictions"]) for r in runs),
        "errors": sum(bool(r["error"]) for r in runs),
        "per_cause": per_cause, "per_mechanism": per_mechanism, "per_family": per_family,
        "confusion": {k: dict(v) for k, v in sorted(confusion.items())},
        "calibration": bands,
        "misses": [miss(r) for r in runs if not j(r)["hit"]],
        "contradicting": [{"id": r["id"], "top": j(r)["top"], "fixes": j(r)["contradictions"]}
                          for r in runs if j(r)["contradictions"]],
    }


def miss(r: dict) -> dict:
    j = r["judged"]
    return {"id": r["id"], "why": j["why"], "expected": r["expect"]["text"] if r["expect"] else "quiet",
            "verdict": [f"{h['cause']}@{h['layer'] or '(model)'} {h['confidence']:.2f} step {h['step']}"
                        for h in r["hypotheses"][:3]],
            "chain": r["hypotheses"][0]["chain"][:4] if r["hypotheses"] else [],
            "loss": r["loss"], "error": r["error"]}


# -- printing ----------------------------------------------------------------------------------------

def _pct(v) -> str:
    return "  n/a" if v is None else f"{100 * v:5.1f}%"


def render(name: str, s: dict, misses: bool = True) -> str:
    out = [f"== {name}: {s['faulty_runs']} faulty runs, {s['healthy_runs']} healthy runs",
           f"top-1 {_pct(s['top1'])}   top-3 {_pct(s['top3'])}   false alarms {s['false_alarms']}/{s['healthy_runs']} "
           f"({_pct(s['false_alarm_rate']).strip()})   root-vs-symptom swaps {s['swaps']}   "
           f"runs with a contradicting fix {s['contradicting_fixes']}   errors {s['errors']}",
           "", f"{'cause':<24}{'runs':>6}{'recall':>9}{'cause ok':>10}{'said':>6}{'precision':>11}"]
    for c, v in s["per_cause"].items():
        out.append(f"{c:<24}{v['runs']:>6}{_pct(v['recall']):>9}{_pct(v['cause_recall']):>10}{v['said']:>6}"
                   f"{_pct(v['precision']):>11}")
    out += ["", "calibration (top hypothesis of every run): " +
            "   ".join(f"{b['band']}: {_pct(b['right']).strip()} right of {b['runs']}" for b in s["calibration"])]
    cols = sorted({p for row in s["confusion"].values() for p in row})
    short = {c: c.replace("learning_rate_too_", "lr_").replace("_activations", "").replace("_gradients", "")
             .replace("bad_initialization", "bad_init").replace("attention_collapse", "attention")
             for c in cols}
    out += ["", "confusion (rows: the expected cause; columns: the cause of the top hypothesis at >= 0.5):",
            f"{'':<24}" + "".join(f"{short[c][:10]:>11}" for c in cols)]
    for row, counts in s["confusion"].items():
        out.append(f"{row:<24}" + "".join(f"{counts.get(c, 0) or '.':>11}" for c in cols))
    out += ["", "per mechanism: " + ", ".join(f"{m} {_pct(v['top1']).strip()} of {v['runs']}"
                                               for m, v in s["per_mechanism"].items())]
    out += ["per family: " + ", ".join(f"{f} {_pct(v['top1']).strip()} of {v['faulty']}"
                                       + (f" ({v['false_alarms']} alarms)" if v["false_alarms"] else "")
                                       for f, v in s["per_family"].items())]
    if misses and s["misses"]:
        out += ["", f"misses ({len(s['misses'])}):"]
        for m in s["misses"]:
            out.append(f"  {m['id']}: {m['why']}; expected {m['expected']}; got {' | '.join(m['verdict']) or '(none)'}")
    if misses and s["contradicting"]:
        out += ["", f"fixes that contradict the top hypothesis ({len(s['contradicting'])} runs):"]
        for c in s["contradicting"]:
            out.append(f"  {c['id']}: top {c['top']}; " + " / ".join(c["fixes"]))
    return "\n".join(out)
