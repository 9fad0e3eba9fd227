"""Early warnings: each warning band on a real model whose fault grows slowly, the forecast made at the
first warning against the step the failure really came, healthy runs that stay quiet, the trend
statistics against a plain computation, and warnings that never change a verdict."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

import gradual
from neuraldbg import (ActState, EarlyWarning, Forecast, GradState, NeuralDbg, Thresholds, Trend, bands, health,
                       watch)
from neuraldbg.states import AttnState, InputState, ScalerState, Signal, UpdateState, WeightState
from neuraldbg.trend import rising_z, rolling_rising_z, theil_sen
from zoo import Run, SeqClassifier, TransformerBlock, mlp, sequences, teacher_classes, tokens


@dataclass(frozen=True)
class Band:
    signal: Signal
    state: object
    failure: object
    layer: str


BANDS = {
    "bias_walks_down": Band(Signal.ACTIVATION, ActState.DRIFTING, ActState.DEAD, "3"),
    "bias_walks_up": Band(Signal.ACTIVATION, ActState.DRIFTING, ActState.SATURATED, "3"),
    "gradient_fades": Band(Signal.GRADIENT, GradState.DIMINISHING, GradState.VANISHING, "0"),
    "warmup_never_ends": Band(Signal.UPDATE, UpdateState.CREEPING, UpdateState.TOO_LARGE, ""),
    "attention_sharpens": Band(Signal.ATTENTION, AttnState.NARROWING, AttnState.COLLAPSED,
                               "(model):scaled_dot_product_attention"),
    "inputs_grow": Band(Signal.INPUT, InputState.DRIFTING, InputState.UNSCALED, "input"),
    "weights_decay": Band(Signal.WEIGHTS, WeightState.SHRINKING, WeightState.COLLAPSING, ""),
}


@pytest.mark.parametrize("name", sorted(BANDS))
def test_a_slowly_failing_run_is_warned_of_and_its_forecast_comes_true(name):
    """The band's warning shows during training, before the failure, with a forecast whose range holds the
    step the failure really began; the first failure of the run is that signal's."""
    band = BANDS[name]
    live: list[tuple[int, EarlyWarning]] = []

    def seen(dbg):
        live.extend((dbg.step, w) for w in dbg.warnings() if (w.signal, w.layer) == (band.signal, band.layer))

    dbg = gradual.train(getattr(gradual, name)(), seen, look=gradual.EVERY)
    th = dbg.thresholds
    crossing = watch.crossings(dbg.trace, th)[0]
    assert crossing[:3] == (band.signal, band.layer, band.failure), crossing
    failed_at = crossing[3]
    first = next(e for e in watch.episodes(dbg.trace, th) if (e.warning.signal, e.warning.layer) ==
                 (band.signal, band.layer))
    w = first.warning
    assert (w.state, w.failure) == (band.state, band.failure)
    assert first.shown_at < failed_at and first.crossed == failed_at
    assert w.forecast is not None and first.forecast_right, (w.describe(), failed_at)
    assert w.forecast.made_at == first.shown_at >= w.step and w.forecast.low <= w.forecast.step
    # shown live, from the samples recorded so far, before the failure came
    assert live and live[0][0] < failed_at and live[0][1].state == band.state
    assert any(x.forecast is not None for _, x in live)


@pytest.mark.parametrize("seed", [0, 2])
def test_a_layer_silenced_together_is_warned_of_by_the_share_of_its_outputs_firing(seed, tmp_path):
    """A BatchNorm shift walked down silences every channel of the ReLU after it at the same rate: its share of
    dead channels jumps from none to all within a few samples, too late to warn. The share of its outputs
    firing falls from the start: its warning shows about a hundred steps before the channels die, shown live,
    with a forecast (to the share at which a channel of that many outputs shows none > 0) that comes true."""
    from neuraldbg.bands import silent_level
    live: list[EarlyWarning] = []
    dbg = gradual.train(gradual.shift_walks_down(seed), lambda d: live.extend(
        w for w in d.warnings() if w.layer == "5"), look=gradual.EVERY)
    th = dbg.thresholds
    signal, layer, failure, failed_at, _ = watch.crossings(dbg.trace, th)[0]
    assert (signal, layer, failure) == (Signal.ACTIVATION, "5", ActState.DEAD)
    eps = [e for e in watch.episodes(dbg.trace, th) if e.warning.layer == "5"]
    by_share = [e for e in eps if e.warning.quantity == "dead units" and e.shown_at < failed_at - 10]
    assert not by_share, [e.warning.describe() for e in by_share]
    first = min(eps, key=lambda e: e.shown_at)
    w = first.warning
    assert w.quantity == "outputs firing" and (w.state, w.failure) == (ActState.DRIFTING, ActState.DEAD)
    assert first.shown_at <= failed_at - 60 and first.crossed == failed_at
    assert first.forecast_right and w.forecast.low < failed_at < w.forecast.step * 3, w.describe()
    positions = dbg.trace.layer("5").extra["positions"]
    assert positions == 16 * 8 * 8 and w.threshold == pytest.approx(silent_level(np.array([positions]),
                                                                                 th.dead_fraction)[0])
    assert w.value < th.firing_drop * w.trend.start and "outputs firing" in w.describe()
    assert live and live[0].quantity == "outputs firing"
    # read back from a file, the run warns the same way (the outputs per unit travel with the layer)
    dbg.save(tmp_path / "run.ndbg")
    loaded = NeuralDbg.load(tmp_path / "run.ndbg")
    assert ([e.warning.describe() for e in watch.episodes(loaded.trace, th)]
            == [e.warning.describe() for e in watch.episodes(dbg.trace, th)])


def test_the_firing_band_lies_between_its_start_and_the_level_it_is_forecast_to_reach():
    """A unit with eight outputs in a batch shows none > 0 in 60% of batches at a share of ~6% firing: a layer
    whose share falls slowly from 20% to 2% (its units alive) is in its band from 10% (half its early level)
    down to that level only, and warns at no sample below it. With four outputs a unit the level (12%) lies
    above the start: no band. With a thousand, it is near 0."""
    import dataclasses

    from neuraldbg.bands import activation_bands, silent_level
    from neuraldbg.watch import _scan
    th = Thresholds()
    f = health.features(gradual.train(gradual.shift_walks_down(), every=50).trace)
    steps = np.arange(0, 2000, 10)
    share = 0.2 - 0.00009 * steps + np.random.default_rng(0).normal(0, 0.002, len(steps))
    start = th.firing_drop * np.median(share[steps >= th.warning_settle][:5])
    for positions in (4.0, 8.0, 1024.0):
        fake = dataclasses.replace(f, steps=steps, names=["x"], ri=np.array([0]),
                                   firing=share[:, None].astype(np.float32),
                                   dead=np.zeros((len(steps), 1), dtype=np.float32), positions=np.array([positions]))
        band = next(b for b in activation_bands(fake, th) if b.quantity == "outputs firing")
        level = silent_level(np.array([positions]), th.dead_fraction)[0]
        assert level == pytest.approx(1 - th.dead_fraction ** (1 / positions)) and band.level(0) == level
        expected = (share.astype(np.float32) < start) & (share.astype(np.float32) > level)
        assert np.array_equal(band.in_band[:, 0], expected) and expected.any() == (level < start)
        scan = _scan(band, th)
        assert scan is None or (share[scan.on[:, 0]] > level).all()


def test_a_share_past_its_failure_for_one_sample_is_still_heading_there():
    """A share climbing through its band that pokes past the failure level for one sample (not yet a failure:
    that takes ``persist`` samples) between two that qualify, then fails: that sample counts toward its
    warning, which shows at the two around it (none shows at a sample past the level, nor once the failure
    holds). Read as breaking the run off, no two qualifying samples would be consecutive: no warning."""
    from neuraldbg.bands import Scale, _series
    from neuraldbg.watch import _scan
    th = Thresholds()
    steps = np.arange(20, 20 + 5 * 16, 5)

    def share(values):
        return _series(Signal.ACTIVATION, ActState.DRIFTING, ActState.DEAD, "dead units", ["3"], steps, values,
                       th.drift_fraction, th.dead_fraction, rising=True, scale=Scale.LOGIT, percent=True,
                       reached=True)
    rising = np.linspace(0.22, 0.58, len(steps))
    a = int(np.nonzero(_scan(share(rising), th).on[:, 0])[0][0])
    poked = rising.copy()
    poked[a + 1] = poked[a + 3:] = th.dead_fraction + 0.03
    blip = share(poked)
    failed = watch._failed(blip, th)[:, 0]
    assert not failed[a + 1] and failed[a + 3:].all()
    scan = _scan(blip, th)
    assert scan is not None, "the sample past the level broke the warning off"
    assert list(np.nonzero(scan.on[:, 0])[0]) == [a, a + 2]


def test_the_warning_reads_as_a_sentence_with_its_forecast():
    run = gradual.inputs_grow()
    run.steps = 80
    dbg = gradual.train(run)
    th = dbg.thresholds
    (w,) = [w for w in dbg.warnings() if w.signal == Signal.INPUT]
    assert isinstance(w.trend, Trend) and isinstance(w.forecast, Forecast)
    assert w.trend.since < w.trend.until == dbg.trace.stats.steps[-1] and w.trend.z >= th.warning_z
    assert th.input_drift <= w.value < th.input_scale and w.value > w.trend.start and w.trend.slope > 0
    assert w.forecast.step > w.trend.until and w.threshold == th.input_scale
    text = w.describe()
    assert text.startswith("the input drifting toward unscaled: input scale ")
    assert f"over {w.trend.until - w.trend.since} steps" in text
    high = "..." if w.forecast.high is None else w.forecast.high
    assert f"it reaches {w.reads(th.input_scale)} near step {w.forecast.step} ({w.forecast.low}-{high})" in text
    # the report lists it apart from the verdict, which it does not change: the run is still healthy
    report = dbg.report()
    assert report.index("Verdict: healthy") < report.index("Watch (early warnings, not verdicts):")
    assert text in report
    assert dbg.explain().healthy
    panel = dbg.explain().html(warnings=dbg.warnings())
    assert "heading toward one" in panel and panel.index("ndbg-healthy") < panel.index("ndbg-watch")


def test_a_falling_loss_scale_is_a_warning_with_no_level_to_forecast():
    scaler = torch.amp.GradScaler("cpu")
    falling = []
    dbg = gradual.train(gradual.loss_grows(), lambda d: falling.extend(
        w for w in d.warnings() if w.state == ScalerState.FALLING), scaler=scaler)
    assert dbg.trace.skipped.n > 10
    assert falling and all(w.forecast is None and w.threshold is None for w in falling)
    w = falling[0]
    assert w.layer == "" and w.value <= w.trend.start / 2 ** dbg.thresholds.scale_falling
    assert "the loss scale falling" in w.describe() and "no forecast" in w.describe()


def test_warnings_never_change_a_verdict():
    """Whatever the warning thresholds, and whether the warnings were asked for or not, the hypotheses are
    the same (cause, layer, step, confidence, chain)."""
    dbg = gradual.train(gradual.bias_walks_down())

    def verdict():
        return [(h.cause, h.layer, h.step, h.confidence, tuple(h.chain)) for h in dbg.explain()]

    before = verdict()
    assert before and dbg.warnings() == [] and watch.episodes(dbg.trace, dbg.thresholds)
    assert verdict() == before
    for change in ({"warning_z": 0.5, "warning_settle": 0, "drift_fraction": 0.01},
                   {"warning_window": 200, "update_creeping": 1e-6, "attention_narrowing": 1.0}):
        assert [(h.cause, h.layer, h.step, h.confidence, tuple(h.chain))
                for h in dbg.reanalyze(**change)] == before


def test_band_failures_are_the_health_states():
    """A band's failure samples are exactly those the health states call failed, for every signal that has
    a failure level (same features, same thresholds)."""
    dbg = gradual.train(gradual.inputs_grow())
    th = dbg.thresholds
    f = health.features(dbg.trace)
    table = health.compute(dbg.trace, th)
    checked = set()
    for b in bands.compute(dbg.trace, f, th):
        if b.threshold is None:
            continue
        s = next(x for x in table.series if x.signal == b.signal and set(b.names) <= set(x.names))
        codes = s.codes[:, [s.names.index(n) for n in b.names]]
        failed = codes == b.failure.code
        other = (codes != 0) & ~failed  # another failure (anomalous, exploding) is decided first there
        assert np.array_equal(failed, b.failed & ~other), (b.signal, b.failure)
        checked.add(b.signal)
    assert checked >= {Signal.ACTIVATION, Signal.GRADIENT, Signal.UPDATE, Signal.INPUT, Signal.WEIGHTS}


# -- healthy runs stay quiet ---------------------------------------------------------------------------

def _reseeded(builder, seed: int, steps: int) -> Run:
    run = builder()
    torch.manual_seed(seed)
    for m in run.model.modules():
        if hasattr(m, "reset_parameters") and m is not run.model:
            m.reset_parameters()
    run.steps = steps
    return run


def _healthy_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 64), nn.ReLU(),
                          nn.Dropout(0.5), nn.Linear(64, 3))
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), teacher_classes(8, 3))


def _healthy_deep_relu():
    torch.manual_seed(0)
    model = mlp([10] + [16] * 6 + [4])
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), teacher_classes(10, 4, batch=32))


def _healthy_sgd_mlp():
    torch.manual_seed(0)
    model = mlp([8, 32, 32, 3], act=nn.Tanh)
    return Run(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), teacher_classes(8, 3))


def _healthy_lstm():
    torch.manual_seed(0)
    model = SeqClassifier(nn.LSTM(4, 16, batch_first=True), 16)
    return Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), sequences())


def _healthy_transformer():
    torch.manual_seed(0)
    model = TransformerBlock()
    return Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), tokens())


HEALTHY = {"dropout_mlp": _healthy_mlp, "deep_narrow_relu": _healthy_deep_relu, "sgd_momentum_tanh": _healthy_sgd_mlp,
           "lstm": _healthy_lstm, "transformer": _healthy_transformer}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_runs_stay_quiet_across_seeds(name, seed):
    """Healthy runs of the zoo, initialised at other seeds and trained longer, sampled densely: no warning at
    any sample of the run, and no hypothesis at 0.5."""
    dbg = gradual.train(_reseeded(HEALTHY[name], seed, 150))
    assert dbg.explain().healthy, dbg.explain()
    episodes = watch.episodes(dbg.trace, dbg.thresholds)
    assert not episodes, [e.warning.describe() for e in episodes]
    assert "Watch" not in dbg.report()


# -- the statistics ------------------------------------------------------------------------------------

def _mann_kendall(v):
    n = len(v)
    s = sum(np.sign(v[j] - v[i]) for i in range(n) for j in range(i + 1, n))
    return s / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)


def test_trend_statistics_match_a_plain_computation():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(40, 3)).cumsum(axis=0)
    v[5, 1] = np.nan
    assert rising_z(v[:, 0]) == pytest.approx(_mann_kendall(v[:, 0]))
    rows = np.array([3, 11, 39, 20])
    cols = np.array([0, 1, 2, 1])
    got = rolling_rising_z(v, rows, cols, 12)
    for (r, c), z in zip(zip(rows, cols), got):
        window = v[max(0, r - 11):r + 1, c]
        window = window[np.isfinite(window)]
        expected = _mann_kendall(window) if len(window) >= 5 else np.nan
        assert z == pytest.approx(expected, nan_ok=True)
    # Theil-Sen: a noiseless line exactly; its interval holds the true slope of noisy ones ~95% of the time
    x = np.arange(0.0, 60.0, 3.0)
    fit = theil_sen(x, 2.0 - 0.5 * x, 2.0)
    assert fit.slope == pytest.approx(-0.5) and fit.level == pytest.approx(2.0 - 0.5 * x[-1])
    held = 0
    for _ in range(200):
        f = theil_sen(x, 0.1 * x + rng.normal(size=len(x)), 1.96)
        held += f.low <= 0.1 <= f.high
    assert 0.88 <= held / 200 <= 0.99


def test_forecast_range_and_outcome():
    fc = Forecast(step=100, low=80, high=130, threshold=0.6, made_at=50)
    assert fc.covers(101, 105) and fc.covers(70, 80) and not fc.covers(131, 140) and not fc.covers(60, 79)
    assert Forecast(step=100, low=80, high=None, threshold=0.6, made_at=50).covers(10_000)
    assert fc.describe() == "near step 100 (80-130)"


def test_thresholds_of_the_warnings_are_documented_and_checked():
    for name in ("drift_fraction", "update_creeping", "attention_narrowing", "input_drift", "weight_shrinking",
                 "scale_falling", "warning_z", "warning_window", "warning_settle"):
        lo, hi = Thresholds.range_of(name)
        assert lo <= getattr(Thresholds(), name) <= hi
        with pytest.raises(ValueError, match=name):
            Thresholds(**{name: hi * 10 + 1})
    assert Thresholds().drift_fraction < Thresholds().dead_fraction
    assert Thresholds().update_creeping < Thresholds().update_too_large
    assert Thresholds().attention_narrowing > Thresholds().attention_entropy
    assert Thresholds().input_drift < Thresholds().input_scale


def test_a_loaded_or_empty_session_has_no_warnings(tmp_path):
    model = nn.Linear(4, 2)
    dbg = NeuralDbg(model)
    assert dbg.warnings() == []
    run = gradual.inputs_grow()
    run.steps = 80
    dbg = gradual.train(run)
    now = dbg.warnings()
    assert [w.state for w in now] and all(isinstance(w, EarlyWarning) for w in now)
    dbg.save(tmp_path / "run.ndbg")
    loaded = NeuralDbg.load(tmp_path / "run.ndbg")
    assert [w.describe() for w in loaded.warnings()] == [w.describe() for w in now]


def test_a_ratio_warns_at_its_first_qualifying_sample_and_a_share_of_units_one_later():
    """Sampling thins out as a run goes on, so a signal may cross its band in a sample or two: a ratio (a
    continuous quantity, its trend read on the last samples) warns at the first sample that meets the
    conditions; a share of units moves by whole units and waits for as many samples as a state takes to
    become an event."""
    import dataclasses

    from neuraldbg.bands import Scale, _series
    from neuraldbg.watch import _scan
    th = Thresholds()
    steps = np.arange(20, 20 + 5 * 16, 5)
    ratio = 0.01 * 1.15 ** np.arange(len(steps))          # climbing through update_creeping .. update_too_large
    upd = _series(Signal.UPDATE, UpdateState.CREEPING, UpdateState.TOO_LARGE, "largest update/weight", [""], steps,
                  ratio, th.update_creeping, th.update_too_large, rising=True, scale=Scale.LOG)
    scan = _scan(upd, th)
    assert scan is not None
    on = int(np.nonzero(scan.on[:, 0])[0][0])
    # the first sample in the band with five climbing samples behind it
    assert on == max(int(np.nonzero(upd.in_band[:, 0])[0][0]), 4) + th.warning_persist - 1
    share = np.linspace(0.05, 0.58, len(steps))            # climbing through drift_fraction .. dead_fraction
    dead = _series(Signal.ACTIVATION, ActState.DRIFTING, ActState.DEAD, "dead units", ["3"], steps, share,
                   th.drift_fraction, th.dead_fraction, rising=True, scale=Scale.LOGIT, percent=True, reached=True)
    assert watch.warning_persistence(upd, th) == th.warning_persist == 1
    assert watch.warning_persistence(dead, th) == th.persist == 2
    # a share whose conditions hold at one sample only, the last: no warning yet; as a ratio, one
    one = dataclasses.replace(dead, in_band=dead.in_band & (np.arange(len(steps)) == len(steps) - 1)[:, None])
    assert _scan(one, th) is None and _scan(dataclasses.replace(one, percent=False), th) is not None


def test_updates_entering_their_warning_band_start_a_burst_of_samples():
    """With NeuralDbg's own sampling, a warm-up that never ends lifts the updates into their warning band
    between two sparse samples: the first sample past ``update_creeping``, higher than the one before,
    starts a burst (the next steps are sampled), so the trend in the band is read on dense samples."""
    from neuraldbg.stats import Stat
    dbg = gradual.train(gradual.warmup_never_ends(steps=300), every=None)
    th = dbg.thresholds
    steps = dbg.trace.stats.steps
    data = dbg.trace.stats.data
    with np.errstate(all="ignore"):
        ratio = np.nanmax(data[:, :, int(Stat.W_UPDATE_NORM)] / data[:, :, int(Stat.W_NORM)], axis=1)
    entered = [i for i in range(1, len(steps)) if ratio[i] >= th.update_creeping and ratio[i] > ratio[i - 1]
               and steps[i] >= 30]
    assert entered, ratio
    i = entered[0]
    assert list(steps[i + 1:i + 5]) == [steps[i] + 1, steps[i] + 2, steps[i] + 3, steps[i] + 4]

