"""Running a case: build it, train it with the real NeuralDbg over the loop a user writes (or bare,
for the fault checks), and collect the verdict and the probes."""
from __future__ import annotations

import contextlib
import math
import re
import traceback
from dataclasses import dataclass

import torch

from .design import Case
from .faults import Evidence, Expect
from .families import Build, Variation
from .probe import Probe, snapshot
from . import registry


def build(case: Case, fault: bool = True) -> Build:
    """The run of ``case``; ``fault=False``: the same run without the fault (its scenario kept)."""
    family = registry.family(case.family)
    b = Build(family, case.var)
    mech = registry.mechanism(case.mechanism) if case.mechanism else None
    if mech is not None and mech.setup is not None:
        mech.setup(b)
    if mech is not None and fault and mech.configure is not None:
        mech.configure(b)
    b.materialize()
    if mech is not None and fault:
        mech.inject(b)
    return b


def train(b: Build, watch: bool, every: int | None = None):
    """Train ``b`` as a user would; returns (the session or None, the probe). ``every``: NeuralDbg's
    sampling interval (None: its default, which adapts to the measured cost of a step)."""
    from neuraldbg import NeuralDbg

    start = snapshot(b, b.task.data(0), backward=True)
    opt = b.opt.make([p for p in b.model.parameters() if p.requires_grad])
    losses: list[float] = []
    dbg = NeuralDbg(b.model, optimizer=opt, every=every) if watch else None
    with dbg if dbg is not None else contextlib.nullcontext():
        for step in range(b.steps):
            for change in b.schedule:
                change(step, opt)
            x, y = b.task.data(step)
            opt.zero_grad()
            loss = b.loss(b.model(x), y)
            loss.backward()
            opt.step()
            if dbg is not None:
                dbg.record_loss(loss)
            losses.append(float(loss.detach()))
    end = snapshot(b, b.task.data(b.steps), backward=False)
    return dbg, Probe(losses, b.task.baseline(), start, end, fresh_loss(b))


FRESH_BATCHES = 4


def fresh_loss(b: Build) -> float:
    """The trained model's mean loss, in eval mode, on batches of the task as drawn before any fault changed
    its data, none of them trained on: what the user's validation would show."""
    was = b.model.training
    b.model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            values = [float(b.loss(b.model(x), y)) for x, y in
                      (b.clean_task.data(90_000 + i) for i in range(FRESH_BATCHES))]
    finally:
        b.model.train(was)
    return sum(values) / len(values)


def bite(case: Case) -> str | None:
    """None when the fault does harm; otherwise why the run is no failure (trained bare, no NeuralDbg)."""
    if not case.faulty:
        _, p = train(build(case), watch=False)
        if p.nonfinite_step is None and p.last <= 0.7 * p.baseline:
            return None
        return f"healthy run does not learn: loss {p.first:.3g} -> {p.last:.3g}, chance {p.baseline:.3g}"
    b = build(case)
    _, probe = train(b, watch=False)
    ev = Evidence(probe, lambda: train(build(case, fault=False), watch=False)[1], b)
    return registry.mechanism(case.mechanism).bites(ev)


@dataclass(frozen=True)
class Hyp:
    cause: str
    layer: str
    step: int
    confidence: float
    chain: tuple
    suggestion: str

    @classmethod
    def of(cls, h) -> "Hyp":
        return cls(str(h.cause), h.layer, int(h.step), float(h.confidence), tuple(h.chain), h.suggestion)


def run(case_id: str, every: int | None = None) -> dict:
    """One case, watched: its expectation, the verdict and the loss summary, as plain data."""
    case = registry.case(case_id)
    try:
        b = build(case)
        exp = registry.mechanism(case.mechanism).expect(b) if case.faulty else None
        dbg, probe = train(b, watch=True, every=every)
        hyps = [Hyp.of(h) for h in dbg.explain()]
        watched = early_warnings(dbg)
        error = None
    except Exception:  # noqa: BLE001 - a crash is a result too: reported, never hidden
        exp, hyps, probe, watched, error = None, [], None, None, traceback.format_exc(limit=3)
    return {
        "id": case_id, "family": case.family, "mechanism": case.mechanism, "part": registry.part(case),
        "gradual": case.faulty and registry.mechanism(case.mechanism).gradual, "watch": watched,
        "var": case.var.__dict__, "expect": _expect_dict(exp),
        "hypotheses": [h.__dict__ | {"chain": list(h.chain)} for h in hyps],
        "loss": None if probe is None else {"first": _num(probe.first), "last": _num(probe.last),
                                            "nonfinite_step": probe.nonfinite_step, "chance": probe.baseline},
        "error": error,
    }


def early_warnings(dbg) -> dict:
    """What the early warnings said in the run, as plain data: whether any showed, the longest run of
    samples one held, and the first failure of a watched signal (after a healthy start) with the forecast
    made at that signal's first warning before it, and how many samples that signal spent in its band
    before failing (fewer than a warning needs to show: it jumped from healthy to failing)."""
    from neuraldbg import bands, health, watch

    th, trace = dbg.thresholds, dbg.trace
    episodes = watch.episodes(trace, th)
    crossings = watch.crossings(trace, th)
    out: dict = {"warned": bool(episodes), "longest": watch.longest(trace, th), "crossing": None,
                 "warnings": [e.warning.describe() for e in episodes[:5]]}
    if crossings:
        signal, layer, failure, step, before = crossings[0]
        # (the first shown of the warnings that lead to this failure: a signal may have two bands toward it)
        ep = min((e for e in episodes if (e.warning.signal, e.warning.layer, e.warning.failure) ==
                  (signal, layer, failure) and e.shown_at < step), key=lambda e: e.shown_at, default=None)
        fc = ep.warning.forecast if ep is not None else None
        leading = [s for s in bands.compute(trace, health.features(trace), th)
                   if (s.signal, s.failure) == (signal, failure) and layer in s.names]
        in_band = max(int(s.in_band[s.steps < step, s.names.index(layer)].sum()) for s in leading)
        jumped = all(int(s.in_band[s.steps < step, s.names.index(layer)].sum()) < watch.warning_persistence(s, th)
                     for s in leading)
        out["crossing"] = {
            "signal": str(signal), "layer": layer, "failure": str(failure), "step": step, "after": before,
            "band_samples": in_band, "jumped": jumped,
            "warned_at": ep.shown_at if ep is not None else None,
            "forecast": None if fc is None else {"step": fc.step, "low": fc.low, "high": fc.high,
                                                 "made_at": fc.made_at},
            "right": bool(ep is not None and ep.forecast_right)}
    return out


def _num(v: float):
    return v if math.isfinite(v) else str(v)


def _expect_dict(exp: Expect | None):
    if exp is None:
        return None
    return {"accepted": [{"cause": v.cause, "places": list(v.places), "chain": v.chain} for v in exp.accepted],
            "onset": list(exp.onset), "text": exp.describe()}


_KEY = re.compile(r"s(\d+)d(\d+)w(\d+)h(\d+)n(\d+)b(\d+)$")


def variation(key: str) -> Variation:
    m = _KEY.match(key)
    if not m:
        raise ValueError(f"not a variation key: {key!r}")
    return Variation(*map(int, m.groups()))


def set_threads() -> None:
    torch.set_num_threads(1)
