"""Decision thresholds: every number the analysis compares a statistic against, and nothing else.

The defaults are ratios and fractions, so they hold across widths, depths, batch sizes and loss
scales. Each field's metadata (label, scale, min, max, doc) is enough to build a slider for it, and
its ``min``..``max`` is the documented range: a value outside it, or a name that is not a field,
raises one ``ValueError`` wherever it comes from (the API, the magic's flags, ``%config``, a file).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from dataclasses import dataclass, field
from typing import Any


def _f(default, label: str, scale: str, lo, hi, doc: str, slider: bool = True, group: str = ""):
    return field(default=default, metadata={"label": label, "scale": scale, "min": lo, "max": hi, "doc": doc,
                                            "slider": slider, "group": group})


@dataclass(frozen=True, init=False)
class Thresholds:
    """What counts as unhealthy. Change one with ``dbg.reanalyze(name=value)``.

    ``Thresholds(dead_fraction=0.9)``: the named fields, the defaults for the others.
    """

    # -- activations -------------------------------------------------------------------------------
    dead_fraction: float = _f(0.6, "dead units", "linear", 0.05, 1.0,
                              "share of a ReLU layer's units never positive over a batch for the layer to be dead")
    source_spread: float = _f(1.0, "source spread", "linear", 0.1, 5.0,
                              "a layer's output whose mean is above minus this many of its standard deviations has "
                              "values above 0 (a whole ReLU layer that reads it and gets none: something between "
                              "them takes them away)", slider=False)
    saturated_fraction: float = _f(0.6, "saturated outputs", "linear", 0.05, 1.0,
                                   "share of a sigmoid/tanh layer's outputs at their bounds for it to be saturated")
    activation_growth: float = _f(1e3, "activation growth", "log", 3.0, 1e6,
                                  "growth of a layer's output spread since the first sample that is anomalous")
    outputs_out_of_scale: float = _f(10.0, "outputs out of scale", "log", 2.0, 1e4,
                                     "a classification loss that starts, at the first step (before any update), "
                                     "this many times above a uniform guess's loss: the model's outputs are far "
                                     "out of scale as initialised (where no layer's gain says which weights)",
                                     slider=False)
    layer_gain: float = _f(10.0, "layer gain", "log", 2.0, 1e3,
                           "output/input scale (RMS) ratio of a weight layer (either way) that points at its "
                           "init scale")
    # -- gradients ---------------------------------------------------------------------------------
    vanishing_ratio: float = _f(1e-4, "gradient attenuation", "log", 1e-8, 0.3,
                                "relative weight gradient of a layer vs the layers after it, below which it vanished")
    exploding_ratio: float = _f(1e3, "gradient amplification", "log", 3.0, 1e8,
                                "relative weight gradient vs the layers after it, or vs its own start, that explodes")
    updates_rounded: float = _f(0.6, "updates rounded away", "linear", 0.1, 1.0,
                                "share of a 16-bit model's weight entries that an update leaves exactly as they "
                                "were, past which its updates round away (with a loss that does not improve)",
                                slider=False)
    loss_scale: float = _f(256.0, "loss scale", "log", 4.0, 2.0 ** 24,
                           "smallest power of two by which a loss multiplied before backward (a GradScaler's "
                           "scale) is read as a loss scaler's, when the optimizer steps on its gradients undivided",
                           slider=False)
    time_read: float = _f(0.5, "time steps read", "linear", 0.05, 1.0,
                          "share of a recurrent layer's time steps, counted from the start, at or below which "
                          "every gradient reaching its input stops: the loss reads its output before the "
                          "sequence's end (with a loss that does not improve, it is why)")
    rounding_rank: float = _f(0.9, "rounding rows' rank", "linear", 0.0, 1.0,
                              "share of the other rows whose spread the rows a NaN reached in the loss must reach "
                              "at least, for a softmax in the loss rounding to 0 to be its origin (it rounds first "
                              "in the widest rows; which entry rounds depends on the target, so not strictly); "
                              "below it, NaN targets", slider=False)
    diminishing_ratio: float = _f(1e-3, "gradient diminishing", "log", 1e-7, 0.5,
                                  "relative weight gradient vs the layers after it below which it is diminishing "
                                  "(a band above vanishing; with a loss that does not improve, it is why)")
    # -- updates -----------------------------------------------------------------------------------
    update_too_large: float = _f(0.1, "update/weight high", "log", 1e-3, 10.0,
                                 "update-to-weight ratio of a layer per step above which its update is too large")
    update_replaces: float = _f(1.0, "update replaces the weights", "log", 0.1, 100.0,
                                "update-to-weight ratio of the median layer from which an update replaces the model: "
                                "a state measured just before it has held as long as that model existed",
                                slider=False)
    weight_collapse: float = _f(10.0, "weight collapse", "log", 2.0, 1e6,
                                "factor by which the weights (their median layer) shrink from their start toward "
                                "zero that is a collapse (a weight decay holding them there)", slider=False)
    update_negligible: float = _f(1e-5, "update/weight low", "log", 1e-10, 1e-2,
                                  "largest update-to-weight ratio per step below which updates are negligible")
    weights_still: float = _f(0.1, "weights barely moved", "log", 1e-4, 1.0,
                              "share of their norm that the weights of the layer that moved most moved over the whole "
                              "run (its distance from where it started) below which, with a flat loss, the "
                              "updates were too small to train it", slider=False)
    clip_ratio: float = _f(0.1, "gradient clipped", "log", 1e-6, 0.9,
                           "share of their norm the gradients keep after clipping (median of the sampled steps) "
                           "below which the clip, not the learning rate, sets the updates' size")
    # -- loss --------------------------------------------------------------------------------------
    loss_rise: float = _f(1.0, "loss rise", "log", 0.05, 100.0,
                          "rise of the smoothed loss above its best, as a fraction of the start loss: divergence")
    loss_given_back: float = _f(0.5, "loss given back", "linear", 0.05, 1.0,
                                "share of what the loss had come down from its start that a flat loss has given "
                                "back above its best for a fix to look at what undid it, not to raise the "
                                "learning rate", slider=False)
    loss_learned: float = _f(0.5, "loss learned", "linear", 0.05, 1.0,
                             "share of its way down (its start to its best) the smoothed loss has come by the step "
                             "from which the run has learned: a state that sets in from then on and takes part in no "
                             "failure of the loss is no fault (a squashing layer pinned by a classifier grown "
                             "confident, attention that sharpens); a loss's classification term this far below "
                             "chance is learned, no plateau", slider=False)
    loss_oscillation: float = _f(0.5, "loss oscillation", "log", 0.05, 10.0,
                                 "typical step-to-step loss change, as a fraction of its level, with no progress")
    loss_progress: float = _f(0.05, "loss progress", "log", 1e-4, 0.5,
                              "least improvement of the smoothed loss, as a fraction of the start loss, not a plateau")
    plateau_steps: int = _f(50, "plateau steps", "linear", 5, 1000,
                            "recorded losses needed before the loss can be called flat")
    plateau_exit: float = _f(2.0, "plateau exit", "linear", 0.0, 10.0,
                             "batch-to-batch loss changes, past loss_progress, by which the loss must come down from "
                             "a plateau's level (and go on falling) to have left it", slider=False)
    min_losses: int = _f(10, "fewest losses", "linear", 3, 1000,
                         "recorded losses needed before a run too short for a plateau can be called stalled",
                         slider=False)
    trend_z: float = _f(2.0, "trend z", "linear", 0.5, 5.0,
                        "Mann-Kendall z of a falling loss, in standard deviations of pure noise, that counts as a "
                        "downward trend in a short run", slider=False)
    loss_below_zero: float = _f(1.0, "loss below zero", "log", 0.1, 1e4,
                                "depth below zero, in units of the loss's early scale, past which a loss still falling "
                                "as fast points at targets outside its range", slider=False)
    output_blocked: float = _f(0.5, "output blocked", "linear", 0.05, 1.0,
                               "share of a regression loss's gradient at a bounded output (a final ReLU, sigmoid, "
                               "tanh) on entries held at the bound it pushes past, over the run's second half, "
                               "past which the targets lie out of the outputs' range (with that share's loss at "
                               "least loss_progress of the start's)", slider=False)
    # -- attention ---------------------------------------------------------------------------------
    attention_entropy: float = _f(0.3, "attention entropy", "linear", 0.01, 0.9,
                                  "mean attention entropy, as a fraction of log(keys), below which attention "
                                  "has collapsed onto a few keys")
    attention_logit_growth: float = _f(10.0, "attention logit growth", "log", 2.0, 1e4,
                                       "growth of the largest attention logit since the first sample (counted "
                                       "from one nat at least) that is growth without bound")
    loss_trained: float = _f(0.05, "start trained", "log", 1e-4, 0.5,
                             "share of the chance-level loss (predicting the classes' frequencies) below which a "
                             "loss that starts there is a model trained already: flat, it is at its floor, not on a "
                             "plateau", slider=False)
    above_chance: float = _f(1.1, "start above chance", "log", 1.01, 100.0,
                             "a classification loss that starts this many times above both the loss of predicting "
                             "the classes' frequencies (chance) and that of a uniform guess (where a default init "
                             "starts, within a few percent) counts its progress from chance, not from its start: "
                             "coming down to chance learns nothing of the input", slider=False)
    slow_progress: float = _f(0.25, "slow progress", "log", 0.01, 0.9,
                              "improvement of the loss over a run long enough for a plateau, as a fraction of its "
                              "start, below which it hardly comes down (a failure when a cause explains it, such as "
                              "a collapsed attention)")
    # -- precision ---------------------------------------------------------------------------------
    range_margin: float = _f(10.0, "dtype range margin", "log", 1.5, 1e4,
                             "factor below the largest value of a layer's output dtype (float16: 65504) "
                             "within which the output is about to overflow")
    skipped_steps: int = _f(8, "skipped steps", "linear", 2, 200,
                            "consecutive optimizer steps skipped for NaN/Inf gradients (a GradScaler's) after "
                            "which the skipping is a failure, not the scale's calibration")
    # -- spikes ------------------------------------------------------------------------------------
    spike_factor: float = _f(10.0, "spike", "log", 2.0, 1e4,
                             "a spike: the largest gradient this many times its median over the last steps "
                             "(the next steps are then sampled; fixed when watching starts), a layer's update "
                             "this many times the one at the sample before, or the loss rising this many times "
                             "its usual step-to-step change")
    # -- data --------------------------------------------------------------------------------------
    input_scale: float = _f(20.0, "input scale", "log", 2.0, 1e4,
                            "input mean or spread above which the batch looks unnormalised (e.g. 0-255 pixels)")
    input_tiny: float = _f(1e-3, "input scale, low", "log", 1e-9, 0.1,
                           "input mean and spread both below which the batch is out of scale the other way "
                           "(pixels divided by 255 twice, a unit slip)", slider=False)
    input_flat: float = _f(0.05, "input flatness", "log", 1e-4, 0.5,
                           "the samples of a batch differ on every feature by less than this share of the input's "
                           "largest value: an offset they all share drowns what tells them apart (statistics of "
                           "another scale used to normalise it, a constant added), read as an input with no spread "
                           "(the weights must scale the differences up by its inverse, against an offset that "
                           "scales up with them)", slider=False)
    batch_order: float = _f(4.0, "batch class order", "log", 1.5, 100.0,
                            "a batch's classes this many times further from the run's mix than random batches "
                            "of its size would be (chi-square per degree of freedom, the median of "
                            "batch_order_window distinct sampled batches: one read again counts once): the data "
                            "is read in an order that groups classes (not shuffled)")
    padding_counted: float = _f(0.5, "padding counted", "linear", 0.05, 1.0,
                                "share of the positions a loss reads that are padding (attention_mask 0) from which "
                                "the loss is mostly about predicting the padding (labels that keep the pad token "
                                "instead of -100): a fault of the targets", slider=False)
    next_token_share: float = _f(0.9, "next-token share", "linear", 0.5, 1.0,
                                 "share of the positions read whose target is the next input token (or the one "
                                 "after it) from which a sequence model counts as trained on next tokens, and is "
                                 "replayed once to see whether it reads them (the replay is decided when it is "
                                 "read: fixed when watching starts)", slider=False)
    batch_order_window: int = _f(5, "batch order window", "linear", 1, 50,
                                 "distinct sampled batches whose median class order is read (fewer read, none)",
                                 slider=False)
    one_class_targets: int = _f(300, "one-class targets", "log", 30, 100000,
                                "targets read off the output's gradient, every one of the same class, before the data "
                                "is named (after n of one class, the others' share is below 3/n at 95%: 1% at 300)",
                                slider=False)
    one_class_fit: float = _f(0.1, "one-class fit", "log", 1e-4, 0.5,
                              "share of its first value the loss falls below when the targets hold one class: the "
                              "model fits a constant (a contrastive loss whose positive is always class 0 stays far "
                              "above it)", slider=False)
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
    # -- learning rate -----------------------------------------------------------------------------
    lr_jump: float = _f(2.0, "lr jump", "log", 1.2, 100.0,
                        "factor by which the learning rate rises between sampled steps, from a steady rate, "
                        "that counts as a jump", slider=False)
    lr_steady: float = _f(0.1, "lr steadiness", "linear", 0.0, 1.0,
                          "relative change between the two samples before a rise under which the rate held steady "
                          "(a warm-up ramp is no jump)", slider=False)
    lr_decayed: float = _f(1e3, "lr decayed", "log", 2.0, 1e9,
                           "factor by which the learning rate falls below its peak that ends learning (a schedule "
                           "decaying that far while the loss has not come down: a scheduler stepped per batch with "
                           "a step size meant in epochs)", slider=False)
    dropout_high: float = _f(0.8, "dropout high", "linear", 0.3, 0.99,
                             "share of its input a dropout drops in training from which the plateau's fix names it "
                             "first, and from which a schedule of p rising to 1 harms (0.1-0.5 is usual; a keep "
                             "probability passed as p drops the rest)",
                             slider=False)
    norm_values: int = _f(3, "norm values", "linear", 1, 64,
                          "values per channel (batch rows x positions) a batch normalisation's statistics are taken "
                          "over, at or below which its output keeps little of its input (at 2: the sign of a "
                          "difference, +-1)", slider=False)
    lr_held: float = _f(10.0, "lr held", "log", 1.5, 1e6,
                        "factor below the optimizer's base learning rate (the one its schedule scales, or a "
                        "one-cycle's max_lr) that the rate "
                        "stays under for the whole run, its peak included, for a schedule to hold it down (a warm-up "
                        "longer than the run)", slider=False)
    lr_jump_window: int = _f(16, "lr jump window", "linear", 1, 1000,
                             "steps after a jump of the learning rate within which a failure is blamed on it",
                             slider=False)
    loss_shrunk: float = _f(0.1, "loss divided", "log", 1e-6, 0.9,
                            "the loss's gradient at a classifier's output, against a mean's, at or below which the "
                            "loss is read as divided before backward (under SGD that divides every step)",
                            slider=False)
    usual_lr: float = _f(1e-2, "usual lr", "log", 1e-6, 10.0,
                         "a learning rate at least this large is not what makes updates negligible: the gradient is",
                         slider=False)
    eps_damps: float = _f(10.0, "eps over gradient", "log", 1.0, 1e6,
                          "an adaptive optimizer's eps at least this many times the gradients' RMS per entry "
                          "divides the updates by eps rather than by the gradient's scale", slider=False)
    momentum_high: float = _f(0.99, "high momentum", "linear", 0.5, 1.0,
                              "an optimizer momentum at least this high (a step summing ~100 gradients or more; 0.9 is "
                              "usual) is named in a learning rate too high's fix", slider=False)
    gradients_carried: float = _f(0.5, "gradients carried over", "linear", 0.05, 1.0,
                                  "share of optimizer steps after which the next backward pass starts on the "
                                  "gradients already there (no zero_grad) for the run to be one that never zeroes "
                                  "them: each update then holds every earlier gradient", slider=False)
    input_reach: int = _f(3, "input reach", "linear", 1, 20,
                          "layers from the input that an input out of scale harms directly (at least: every layer "
                          "before the first normalisation layer too)", slider=False)
    # -- the evidence model: one logistic function turns a hypothesis's evidence into its confidence
    evidence_bias: float = _f(-3.0, "evidence: bias", "linear", -10.0, 10.0,
                              "log-odds of a hypothesis with no evidence past its thresholds", slider=False)
    evidence_severity: float = _f(2.0, "evidence: severity", "linear", 0.0, 10.0,
                                  "weight of how far past its threshold the defining measurement is (0..1)",
                                  slider=False)
    evidence_persistence: float = _f(1.0, "evidence: persistence", "linear", 0.0, 10.0,
                                     "weight of how long the defining state holds, as a share of the run (0..1)",
                                     slider=False)
    evidence_impact: float = _f(2.5, "evidence: impact", "linear", 0.0, 10.0,
                                "weight of explaining the loss's failure (1; 0.5 when no loss is recorded)",
                                slider=False)
    evidence_floor: float = _f(0.25, "evidence: floor", "linear", 0.0, 1.0,
                               "share of a loss failure a share of a layer's units (dead, saturated) just past its "
                               "threshold explains (all of it from 1 - floor past it)", slider=False)
    evidence_consequence: float = _f(1.5, "evidence: consequence", "linear", 0.0, 10.0,
                                     "weight of explaining other abnormal events (blocked gradients, NaN)",
                                     slider=False)
    evidence_unknown_loss: float = _f(0.5, "evidence: unknown loss", "linear", 0.0, 1.0,
                                      "impact counted when no loss is recorded", slider=False)
    evidence_unharmed: float = _f(0.5, "evidence: unharmed", "linear", 0.0, 1.0,
                                  "share of severity and persistence counted for a cause that is no failure by "
                                  "itself (a weight scale) while it explains no loss failure or other event",
                                  slider=False)
    evidence_partial_loss: float = _f(0.5, "evidence: partial loss failure", "linear", 0.0, 1.0,
                                      "how much of a failure a partial one is: the loss spiking for a step, or a short "
                                      "run's loss that came down, but not beyond its batch noise", slider=False)
    evidence_nan_consequence: float = _f(2.0, "evidence: NaN consequence", "linear", 1.0, 5.0,
                                         "consequence counted for explaining a NaN/Inf (1 for other events)",
                                         slider=False)
    evidence_certain: float = _f(4.0, "evidence: certainty", "linear", 0.0, 10.0,
                                 "weight of a fact that is a failure by itself (NaN/Inf produced)", slider=False)
    # -- warnings: the bands between a signal's healthy state and its failure state ------------------
    drift_fraction: float = _f(0.2, "drifting share", "linear", 0.01, 1.0,
                               "share of a ReLU layer's units dead, or of a bounded layer's outputs saturated, from "
                               "which a share that keeps rising is drifting toward dead_fraction or "
                               "saturated_fraction", slider=False, group="warnings")
    firing_drop: float = _f(0.5, "firing dropping", "linear", 0.01, 1.0,
                            "share of its early level below which the share of a ReLU layer's outputs that fire, "
                            "if it keeps falling, is drifting toward dead: a layer whose units are all silenced "
                            "together, whose dead share jumps from none to all between two samples",
                            slider=False, group="warnings")
    update_creeping: float = _f(0.03, "update creeping", "log", 1e-6, 10.0,
                                "largest update-to-weight ratio from which updates that keep growing are creeping "
                                "toward update_too_large", slider=False, group="warnings")
    attention_narrowing: float = _f(0.6, "attention narrowing", "linear", 0.01, 1.0,
                                    "attention entropy (fraction of log(keys)) below which an entropy that keeps "
                                    "falling is narrowing toward attention_entropy", slider=False, group="warnings")
    input_drift: float = _f(5.0, "input drift", "log", 1.0, 1e4,
                            "input mean or spread from which a scale that keeps growing is drifting toward "
                            "input_scale", slider=False, group="warnings")
    weight_shrinking: float = _f(3.0, "weights shrinking", "log", 1.01, 1e6,
                                 "factor by which the weights (their median layer) have shrunk from their start, from "
                                 "which weights that keep shrinking are on their way to weight_collapse",
                                 slider=False, group="warnings")
    scale_falling: int = _f(4, "loss scale falling", "linear", 1, 60,
                            "halvings of a GradScaler's loss scale below its peak from which a scale that keeps "
                            "halving is falling (its calibration at the start does not keep falling)",
                            slider=False, group="warnings")
    warning_z: float = _f(2.0, "warning trend z", "linear", 0.5, 5.0,
                          "Mann-Kendall z, in standard deviations of pure noise, of a signal's recent samples moving "
                          "toward its failure threshold for a signal in its band to be a warning; a forecast's range "
                          "is its slope's confidence interval at the same z", slider=False, group="warnings")
    warning_settle: int = _f(20, "warning settle", "linear", 0, 100000,
                             "steps at the start of a run whose samples no warning's trend is measured on: "
                             "optimizers build up their momentum there, and updates that grow ten-fold over the "
                             "first tens of steps are that, not a drift", slider=False, group="warnings")
    warning_horizon: float = _f(4.0, "warning horizon", "log", 0.1, 1e4,
                                "how far ahead a warning looks, in spans of its window: a trend that would take "
                                "longer than this many times the steps its samples span to reach the failure is "
                                "not warned of (yet)", slider=False, group="warnings")
    warning_window: int = _f(12, "warning window", "linear", 5, 200,
                             "recent samples a warning's trend and forecast are measured over", slider=False,
                             group="warnings")
    warning_persist: int = _f(1, "warning persistence", "linear", 1, 20,
                              "consecutive samples a warning's conditions must hold before it shows (and not hold "
                              "before it ends): its trend test already reads warning_window samples, so one is "
                              "enough", slider=False, group="warnings")
    # -- events ------------------------------------------------------------------------------------
    persist: int = _f(2, "persistence", "linear", 1, 20,
                      "consecutive samples a state must hold before it becomes an event (hysteresis)")

    def __init__(self, **values: float) -> None:
        self.check_names(values)
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _checked(f, values.get(f.name, f.default)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def check_names(cls, names) -> None:
        """Raise one ``ValueError`` naming the unknown ones, the closest valid name and all valid names."""
        valid = cls.names()
        unknown = [n for n in names if n not in valid]
        if not unknown:
            return
        hints = []
        for n in unknown:
            close = difflib.get_close_matches(str(n), valid, n=1, cutoff=0.5)
            hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"unknown threshold{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"valid names: {', '.join(valid)}")

    @classmethod
    def range_of(cls, name: str) -> tuple[float, float]:
        """The documented range of a threshold (both ends allowed)."""
        cls.check_names([name])
        md = next(f.metadata for f in dataclasses.fields(cls) if f.name == name)
        return md["min"], md["max"]

    def replace(self, **changes: float) -> "Thresholds":
        self.check_names(changes)
        return Thresholds(**{**self.to_dict(), **changes})

    def changed(self) -> dict[str, float]:
        """The thresholds that differ from the defaults, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Thresholds":
        """From a saved dict: names this version does not know (a file from another version) are left out;
        a known name with a value out of its range raises ``ValueError``."""
        names = set(cls.names())
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        """One line per threshold: its name (as ``reanalyze``, ``%%neuraldbg --name`` and the sliders spell
        it), value, documented range and meaning."""
        lines = []
        for f in dataclasses.fields(self):
            md = f.metadata
            lines.append(f"  {f.name} = {getattr(self, f.name)!r}   # {md['min']:g}..{md['max']:g}: {md['doc']}")
        return "\n".join(lines)


def _checked(f: dataclasses.Field, value: Any) -> float:
    """``value`` as the field's type, within its documented range; else one ``ValueError``."""
    md = f.metadata
    lo, hi = md["min"], md["max"]
    whole = isinstance(f.default, int)
    what = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{f.name} must be {what} from {lo:g} to {hi:g}, got {value!r}")
    v = float(value)
    if whole and v.is_integer():
        v = int(v)
    elif whole or not math.isfinite(v):
        raise ValueError(f"{f.name} must be {what} from {lo:g} to {hi:g}, got {value!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{f.name} must be from {lo:g} to {hi:g} ({md['doc']}), got {value!r}")
    return v
