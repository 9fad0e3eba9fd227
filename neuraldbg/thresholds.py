"""Decision thresholds: every number the analysis compares a statistic against, and nothing else.

The defaults are ratios and fractions, so they hold across widths, depths, batch sizes and loss
scales. Each field's metadata (label, scale, min, max, doc) is enough to build a slider for it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def _f(default, label: str, scale: str, lo, hi, doc: str, group: str = ""):
    return field(default=default, metadata={"label": label, "scale": scale, "min": lo, "max": hi, "doc": doc,
                                            "group": group})


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy. Change one with ``dbg.reanalyze(name=value)``."""

    # -- activations -------------------------------------------------------------------------------
    dead_fraction: float = _f(0.6, "dead units", "linear", 0.05, 1.0,
                              "share of a ReLU layer's units never positive over a batch for the layer to be dead")
    saturated_fraction: float = _f(0.6, "saturated outputs", "linear", 0.05, 1.0,
                                   "share of a sigmoid/tanh layer's outputs at their bounds for it to be saturated")
    activation_growth: float = _f(1e3, "activation growth", "log", 3.0, 1e6,
                                  "growth of a layer's output spread since the first sample that is anomalous")
    layer_gain: float = _f(10.0, "layer gain", "log", 2.0, 1e3,
                           "output/input scale (RMS) ratio of a weight layer (either way) that points at its init scale")
    # -- gradients ---------------------------------------------------------------------------------
    vanishing_ratio: float = _f(1e-4, "gradient attenuation", "log", 1e-8, 0.3,
                                "relative weight gradient of a layer vs the layers after it, below which it vanished")
    exploding_ratio: float = _f(1e3, "gradient amplification", "log", 3.0, 1e8,
                                "relative weight gradient vs the layers after it, or vs its own start, that explodes")
    # -- updates -----------------------------------------------------------------------------------
    update_too_large: float = _f(0.1, "update/weight high", "log", 1e-3, 10.0,
                                 "update-to-weight ratio of a layer per step above which its update is too large")
    update_negligible: float = _f(1e-5, "update/weight low", "log", 1e-10, 1e-2,
                                  "largest update-to-weight ratio per step below which updates are negligible")
    # -- loss --------------------------------------------------------------------------------------
    loss_rise: float = _f(1.0, "loss rise", "log", 0.05, 100.0,
                          "rise of the smoothed loss above its best, as a fraction of the start loss: divergence")
    loss_oscillation: float = _f(0.5, "loss oscillation", "log", 0.05, 10.0,
                                 "typical step-to-step loss change, as a fraction of its level, with no progress")
    loss_progress: float = _f(0.05, "loss progress", "log", 1e-4, 0.5,
                              "least improvement of the smoothed loss, as a fraction of the start loss, not a plateau")
    plateau_steps: int = _f(50, "plateau steps", "linear", 5, 1000,
                            "recorded losses needed before the loss can be called flat")
    # -- data --------------------------------------------------------------------------------------
    input_scale: float = _f(20.0, "input scale", "log", 2.0, 1e4,
                            "input mean or spread above which the batch looks unnormalised (e.g. 0-255 pixels)")
    # -- ranks (multi-process runs) ----------------------------------------------------------------
    replica_divergence: float = _f(1e-5, "replica divergence", "log", 1e-9, 1e-1,
                                   "relative difference of a layer's weight checksum from the other ranks' above "
                                   "which its replicas diverged (data-parallel replicas are bit-identical)",
                                   group="ranks")
    duplicate_batches: float = _f(0.5, "duplicate batches", "linear", 0.05, 1.0,
                                  "share of steps with the same batch on two ranks, or at a fixed distance on one "
                                  "rank (every epoch), for the data to be duplicated", group="ranks")
    rank_input_scale: float = _f(5.0, "rank input scale", "log", 1.5, 1e4,
                                 "RMS of a rank's batches over the median rank's (either way) above which its data "
                                 "is out of scale", group="ranks")
    bn_rank_spread: float = _f(0.5, "BatchNorm rank spread", "log", 0.01, 10.0,
                               "difference of BatchNorm running means across ranks, in running standard "
                               "deviations (or of their log variances), above which the ranks normalise "
                               "differently", group="ranks")
    grad_world_ratio: float = _f(1.25, "gradient world ratio", "log", 1.01, 100.0,
                                 "gradient after the all-reduce over the mean of the ranks' own (an average gives "
                                 "1, a sum the world size) above which it was summed over the ranks",
                                 group="ranks")
    # -- events ------------------------------------------------------------------------------------
    persist: int = _f(2, "persistence", "linear", 1, 20,
                      "consecutive samples a state must hold before it becomes an event (hysteresis)")

    def replace(self, **changes) -> "Thresholds":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Thresholds":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
