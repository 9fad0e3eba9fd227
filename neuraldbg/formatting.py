"""How numbers read in every output of the package (reports, chains, evidence, the dashboard)."""
from __future__ import annotations

import math


def number(v: float) -> str:
    """Three significant digits, in scientific notation outside [1e-3, 1e4); ``n/a`` for NaN."""
    v = float(v)
    if v != v:
        return "n/a"
    a = abs(v)
    v = v + 0.0  # a negative zero reads as 0
    return f"{v:.3g}" if (a == 0 or 1e-3 <= a < 1e4 or math.isinf(v)) else f"{v:.2e}"


def percent(v: float) -> str:
    """A fraction as a whole percentage: 0.953 -> ``95%``."""
    return "n/a" if v != v else f"{float(v):.0%}"


def confidence(v: float) -> str:
    """A confidence (0..1) with two decimals: ``0.95``."""
    return f"{float(v):.2f}"
