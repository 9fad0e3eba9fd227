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
        "early_warnings": early_warnings(runs),
    }


def miss(r: dict) -> dict:
    j = r["judged"]
    return {"id": r["id"], "why": j["why"], "expected": r["expect"]["text"] if r["expect"] else "quiet",
            "verdict": [f"{h['cause']}@{h['layer'] or '(model)'} {h['confidence']:.2f} step {h['step']}"
                        for h in r["hypotheses"][:3]],
            "chain": r["hypotheses"][0]["chain"][:4] if r["hypotheses"] else [],
            "loss": r["loss"], "error": r["error"]}


# -- early warnings ----------------------------------------------------------------------------------

def forecast_outcome(run: dict) -> str:
    """How the forecast of a slowly failing run fared: "right" (the first failure of a watched signal came
    within the range forecast at that signal's first warning), "wrong range", "no forecast" (a warning
    before the failure, without a forecast), "no warning" (the signal failed unannounced, after at least
    ``persist`` samples in its band), "jumped" (unannounced, straight from healthy to failing: fewer samples
    in its band than a warning needs to show), "no failure" (no watched signal failed after a healthy start:
    nothing to judge the forecast by) or "error"."""
    w = run.get("watch")
    if run["error"] or w is None:
        return "error"
    c = w["crossing"]
    if c is None:
        return "no failure"
    if c["warned_at"] is None:
        return "jumped" if c.get("jumped") else "no warning"
    if c["forecast"] is None:
        return "no forecast"
    return "right" if c["right"] else "wrong range"


OUTCOMES = ("right", "wrong range", "no forecast", "no warning", "jumped", "no failure", "error")


def early_warnings(runs: list[dict]) -> dict:
    """Forecast accuracy on the slowly failing runs (every one counts: a run with no forecast to judge is no
    right forecast; apart, the same over the runs whose failing signal passed through its band) and the
    warning rate on healthy runs (a warning shows once it has held for ``persist`` samples)."""
    gradual = [r for r in runs if r.get("gradual")]
    healthy = [r for r in runs if r["mechanism"] is None]
    outcomes = Counter(forecast_outcome(r) for r in gradual)
    passed = [r for r in gradual if forecast_outcome(r) not in ("jumped", "no failure", "error")]
    leads = sorted(r["watch"]["crossing"]["step"] - r["watch"]["crossing"]["forecast"]["made_at"]
                   for r in gradual if forecast_outcome(r) == "right")
    warned = [r for r in healthy if r.get("watch") and r["watch"]["warned"]]
    open_ended = sum(forecast_outcome(r) == "right" and r["watch"]["crossing"]["forecast"]["high"] is None
                     for r in gradual)
    return {"gradual_runs": len(gradual), "forecast_right": outcomes["right"], "right_open_ended": open_ended,
            "forecast_accuracy": _rate(outcomes["right"], len(gradual)),
            "through_band": len(passed), "forecast_accuracy_through_band": _rate(outcomes["right"], len(passed)),
            # how far a forecast once made can be trusted: the right ones among those made at a first warning
            "forecasts_made": outcomes["right"] + outcomes["wrong range"],
            "forecast_precision": _rate(outcomes["right"], outcomes["right"] + outcomes["wrong range"]),
            "outcomes": {k: outcomes[k] for k in OUTCOMES if outcomes[k]},
            "per_mechanism": {m: _rate(sum(forecast_outcome(r) == "right" for r in gradual if r["mechanism"] == m),
                                       sum(r["mechanism"] == m for r in gradual))
                              for m in sorted({r["mechanism"] for r in gradual})},
            "median_lead": leads[len(leads) // 2] if leads else None,
            "healthy_runs": len(healthy), "healthy_warned": len(warned),
            "healthy_warning_rate": _rate(len(warned), len(healthy)),
            "healthy_warnings": [{"id": r["id"], "warnings": r["watch"]["warnings"]} for r in warned],
            "forecast_misses": [{"id": r["id"], "outcome": forecast_outcome(r), "crossing": r["watch"]["crossing"]
                                 if r.get("watch") else None} for r in gradual if forecast_outcome(r) != "right"]}


def render_warnings(s: dict, misses: bool = True) -> str:
    lines = [f"early warnings: forecast right in {s['forecast_right']} of {s['gradual_runs']} slowly failing runs "
             f"({_pct(s['forecast_accuracy']).strip()}, {s['right_open_ended']} of them with no upper bound"
             + (f", median lead {s['median_lead']} steps" if s["median_lead"] is not None else "") + ")   "
             + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items()),
             f"                of the {s['through_band']} whose failing signal passed through its band: "
             f"{_pct(s['forecast_accuracy_through_band']).strip()}; of the {s['forecasts_made']} forecasts made: "
             f"{_pct(s['forecast_precision']).strip()} right",
             "                per mechanism: " + ", ".join(f"{m} {_pct(v).strip()}"
                                                        for m, v in s["per_mechanism"].items()),
             f"                healthy runs showing a warning: {s['healthy_warned']} of {s['healthy_runs']} "
             f"({_pct(s['healthy_warning_rate']).strip()})"]
    if misses:
        for m in s["forecast_misses"]:
            c = m["crossing"] or {}
            fc = c.get("forecast")
            said = (f"forecast at step {fc['made_at']}: {fc['step']} ({fc['low']}-{fc['high'] or '...'})"
                    if fc else "no forecast")
            what = (f"{c['signal']} {c['failure']} in {c['layer'] or '(model)'} at step {c['step']} "
                    f"(after {c['after']}, {c.get('band_samples')} samples in its band); {said}" if c else "")
            lines.append(f"  {m['id']}: {m['outcome']}" + (f"; {what}" if what else ""))
        for h in s["healthy_warnings"]:
            lines.append(f"  {h['id']} (healthy): " + " | ".join(h["warnings"][:2]))
    return "\n".join(lines)


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
    if "early_warnings" in s:
        out += ["", render_warnings(s["early_warnings"], misses)]
    if misses and s["misses"]:
        out += ["", f"misses ({len(s['misses'])}):"]
        for m in s["misses"]:
            out.append(f"  {m['id']}: {m['why']}; expected {m['expected']}; got {' | '.join(m['verdict']) or '(none)'}")
    if misses and s["contradicting"]:
        out += ["", f"fixes that contradict the top hypothesis ({len(s['contradicting'])} runs):"]
        for c in s["contradicting"]:
            out.append(f"  {c['id']}: top {c['top']}; " + " / ".join(c["fixes"]))
    return "\n".join(out)
