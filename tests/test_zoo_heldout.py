"""The held-out zoo (``zoo_heldout.py``): the same checks as ``test_zoo.py`` on scenarios that the rules
and default thresholds were not chosen on. A known miss is an xfail with its reason (strict: a fix
makes it fail until the mark goes)."""
from __future__ import annotations

import pytest

from zoo import train
from zoo_heldout import (FAULTY, HEALTHY, TemperedSoftmax, attention_warmup_1e6_steps, gru_grad_clip_1e_8,
                         softmax_head_sgd_lr)

KNOWN_MISSES: dict[str, str] = {}  # scenario -> why its verdict is wrong (an xfail until fixed)


def _verdict(hyps) -> str:
    return "\n".join(f"  {h} {h.chain}" for h in hyps) or "  (none)"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_MISSES[n], strict=True))
                                  if n in KNOWN_MISSES else n for n in sorted(FAULTY)])
def test_heldout_faulty_run_names_its_root_cause(name):
    build, expect = FAULTY[name]
    hyps = train(build()).explain()
    assert hyps, f"{name}: no hypothesis"
    top = hyps[0]
    msg = f"{name}:\n{_verdict(hyps)}"
    assert top.confidence >= 0.5, msg
    assert (str(top.cause), top.layer) in [(c, l) for c, l in expect.accepted], msg
    assert expect.onset[0] <= top.step <= expect.onset[1], msg


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_heldout_healthy_run_stays_quiet(name):
    dbg = train(HEALTHY[name]())
    loud = [h for h in dbg.explain() if h.confidence >= 0.5]
    assert not loud, f"{name}:\n{_verdict(loud)}"


def test_a_bias_far_off_is_named_as_the_bias():
    from zoo_heldout import relu_bias_plus50
    top = train(relu_bias_plus50()).explain()[0]
    assert (str(top.cause), top.layer) == ("bad_initialization", "2")
    assert "bias" in top.chain[0] and "bias" in top.suggestion, top


def test_weights_frozen_by_a_nan_are_no_low_learning_rate():
    """Once the overflow has made everything NaN the weights stop moving: that is no evidence of a
    learning rate too low, next to the one too high."""
    hyps = train(softmax_head_sgd_lr(30.0, TemperedSoftmax)()).explain()
    assert (str(hyps[0].cause), hyps[0].layer) == ("learning_rate_too_high", ""), _verdict(hyps)
    assert not [h for h in hyps if str(h.cause) == "learning_rate_too_low" and h.confidence >= 0.5], _verdict(hyps)


def test_negligible_updates_at_a_usual_learning_rate_point_at_the_gradient():
    """Gradients clipped to 1e-8 under SGD lr 0.5: raising the lr 1000x is not the fix, the clip is; under
    a warm-up that holds the lr at 1e-8, raising it is."""
    clipped = train(gru_grad_clip_1e_8()).explain()[0]
    warmup = train(attention_warmup_1e6_steps()).explain()[0]
    assert str(clipped.cause) == str(warmup.cause) == "learning_rate_too_low"
    assert "clip" in clipped.suggestion and "clip" not in warmup.suggestion
