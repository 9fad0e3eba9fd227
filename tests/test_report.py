"""``report()`` on real faulty runs reads like a practitioner's note: cause, place, onset, numbers, fix."""
from __future__ import annotations

import re

import pytest

from test_zoo import FAULTY
from zoo import train


def _report(name: str):
    dbg = train(FAULTY[name][0]())
    return dbg, dbg.report()


def test_dead_layer_report():
    dbg, text = _report("dead_middle_relu")
    assert "Verdict: dead_units in `3`, from step 0." in text
    assert "100% of the units of `3` are dead: they output 0 for every input from step 0" in text
    assert "no gradient flows back through `3`: it vanishes in `0`, `2`" in text
    assert "fix: re-initialise `2` (bias to 0" in text and "LeakyReLU(0.01)" in text
    assert "dead_fraction 1" in text  # the number behind the event
    assert text == dbg.report()  # stable


def test_learning_rate_report():
    _, text = _report("relu_mlp_lr10")
    assert "Verdict: learning_rate_too_high in the model, from step 0." in text
    assert re.search(r"updates of up to [0-9.]+ x the weights per step \(lr 10\)", text)
    assert "lower the learning rate from 10 to ~1" in text


def test_nan_targets_report():
    _, text = _report("nan_targets")
    assert "Verdict: data in the input data, from step 6." in text
    assert "the model output is finite at step 6" in text
    assert "NaN in the targets" in text
    assert "assert torch.isfinite(y).all()" in text
    assert "non_finite" in text  # the symptom sits in the chain
    assert "confidence 0.9" in text


@pytest.mark.parametrize("name", ["dead_middle_relu", "tiny_init_deep_tanh", "unnormalised_pixels"])
def test_mermaid_of_a_real_run(name):
    dbg = train(FAULTY[name][0]())
    text = dbg.mermaid()
    assert text.startswith("flowchart TD\n") and str(dbg.explain()[0].cause) in text
