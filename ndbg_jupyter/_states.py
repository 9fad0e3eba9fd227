"""How health states look: a colour, a short label, a severity and what the state means, for each state value.

States come from the hub as str-valued enums (``ActState``, ``GradState``); the view only reads
their ``.value``, so a state the hub adds later still renders (grey, severity 1) instead of failing.
The warning bands (drifting, narrowing, diminishing) are amber: worse than healthy, short of a failure.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

AMBER = "#9a6700"   # a warning band, as the panel's Watch section draws it (white text on it reads at 4.9:1)


@dataclass(frozen=True)
class Look:
    colour: str      # background of the state chip (white text on it)
    label: str       # text on the chip
    severity: int    # 0 = fine; higher = worse; the worst state of a folded group is shown
    meaning: str     # shown on hover, in the legend and on every chip


UNKNOWN = Look("#757575", "\u2014", 1, "not measured yet")

LOOKS: dict[str, Look] = {
    # activation states
    "normal": Look("#2e7d32", "normal", 0, "activation normal: the output keeps a usable spread"),
    "saturated": Look("#e65100", "saturated", 2,
                      "activation saturated: more than saturated_fraction of the outputs of a sigmoid/tanh layer "
                      "sit at their bounds, where their gradient is ~0"),
    "dead": Look("#c62828", "dead", 3,
                 "activation dead: more than dead_fraction of the units of a ReLU-family layer output 0 for every "
                 "input, so no gradient flows through them"),
    "anomalous": Look("#6a1b9a", "anomalous", 3,
                      "activation anomalous: the output's spread grew more than activation_growth times since the "
                      "start, or holds NaN/Inf"),
    # gradient states
    "healthy": Look("#2e7d32", "healthy", 0,
                    "gradient healthy: the relative gradient of the layer is in line with the layers after it"),
    "vanishing": Look("#1565c0", "vanishing", 2,
                      "gradient vanishing: the relative gradient of the layer is below vanishing_ratio times that of "
                      "the layers after it"),
    "exploding": Look("#c62828", "exploding", 3,
                      "gradient exploding: the relative gradient is above exploding_ratio times that of the layers "
                      "after it, or of its own start"),
    "unreached": Look("#4527a0", "unreached", 2,
                      "no gradient reaches the layer: its weights are trainable and it ran, but the backward pass "
                      "never got to it (the graph is cut after it)"),
}

# the warning bands: between healthy and failing, and heading for failure (amber; never a verdict)
LOOKS["drifting"] = Look(AMBER, "drifting", 1,
                         "activation drifting (a warning, not a verdict): the share of dead units (ReLU family) or "
                         "of saturated outputs (sigmoid/tanh) is past drift_fraction and keeps rising toward "
                         "dead_fraction / saturated_fraction, or the share of a ReLU layer's outputs firing is "
                         "below firing_drop of its early level and keeps falling toward none; Watch says when it "
                         "gets there at this rate")
LOOKS["narrowing"] = Look(AMBER, "narrowing", 1,
                          "attention narrowing (a warning, not a verdict): its entropy is below attention_narrowing "
                          "and keeps falling toward attention_entropy; Watch says when it gets there at this rate")
LOOKS["diminishing"] = Look(AMBER, "diminishing", 1,
                            "gradient diminishing (a warning, not a verdict): the relative gradient of the layer is "
                            "below diminishing_ratio times that of the layers after it, within ten times of "
                            "vanishing; listed in Watch while it keeps falling")

NONFINITE = Look("#212121", "NaN/Inf", 4, "NaN or Inf in the layer's output or its gradient at the latest sample")

# a layer whose forward never ran, or that only returned its input: nothing measured, and not shown as healthy
NOT_OBSERVED = "not_observed"
LOOKS[NOT_OBSERVED] = Look("#9e9e9e", "not observed", 0,
                           "not observed: its forward never ran (a parent used its weights directly), or it only "
                           "returned its input (an identity, a dropout at p=0 or in eval mode); nothing is measured")


@dataclass(frozen=True)
class Unobserved:
    """The grid's row state of a layer not observed (in place of the hub's health for it)."""

    act: str = NOT_OBSERVED
    grad: str = NOT_OBSERVED
    nonfinite: bool = False

ACT_STATES = ("normal", "drifting", "narrowing", "saturated", "dead", "anomalous")
GRAD_STATES = ("healthy", "diminishing", "vanishing", "unreached", "exploding")

# white on the state's colour, with a thin edge that keeps a dark chip apart from a dark theme
CHIP = ("display:block;text-align:center;border-radius:3px;padding:0 4px;color:#fff;white-space:nowrap;"
        "overflow:hidden;text-overflow:ellipsis;font-weight:normal;box-shadow:inset 0 0 0 1px rgba(128,128,128,0.5);"
        "background:{colour}")


def value_of(state) -> str:
    """The string value of a state enum member (or of a plain string); ``""`` for None."""
    if state is None:
        return ""
    return str(getattr(state, "value", state))


def look(state) -> Look:
    return LOOKS.get(value_of(state), UNKNOWN)


def worst(states) -> str:
    """The value of the most severe state among ``states`` (``""`` when there are none)."""
    values = [value_of(s) for s in states if value_of(s)]
    if not values:
        return ""
    return max(values, key=lambda v: LOOKS.get(v, UNKNOWN).severity)


def chip(lk: Look, title: str = "", cls: str = "ndbg-chip") -> str:
    """A state chip: its label on its colour, its meaning (and ``title``) on hover."""
    tip = f"{title}\n{lk.meaning}" if title else lk.meaning
    return (f'<span class="{cls}" style="{CHIP.format(colour=lk.colour)}" title="{html.escape(tip)}">'
            f"{html.escape(lk.label)}</span>")


def legend_html() -> str:
    """Every state the grid can show, with its meaning on hover."""
    def item(lk: Look) -> str:
        box = "display:inline-block;min-width:5.5em;margin:0 3px 2px 0"
        return f'<span style="{box}">{chip(lk, cls="ndbg-legend-chip")}</span>'

    act = "".join(item(LOOKS[s]) for s in ACT_STATES)
    grad = "".join(item(LOOKS[s]) for s in GRAD_STATES)
    muted = "color:var(--jp-ui-font-color2,#616161)"
    label = f"display:inline-block;width:5.5em;{muted}"
    return (f'<div class="ndbg-legend" style="font:11px/1.6 var(--jp-ui-font-family,sans-serif);margin:4px 0 0 2px">'
            f'<div><span style="{label}">activation</span>{act}</div>'
            f'<div><span style="{label}">gradient</span>{grad}{item(NONFINITE)}{item(UNKNOWN)}'
            f'{item(LOOKS[NOT_OBSERVED])}</div>'
            f'<div style="{muted}">hover a state for its meaning, a layer for the numbers behind it</div></div>')
