"""PyTorch Lightning: ``Trainer(callbacks=[NeuralDbgCallback()])`` reaches the verdicts of a plain loop."""
import numpy as np
import pytest
import pytorch_lightning as pl  # the real framework: `make venv` installs the [lightning] extra
import torch

from neuraldbg import Stat
from neuraldbg.integrations.lightning import NeuralDbgCallback

from frameworks import CASES, Case, Classifier, Teacher, hooks_left, loader, plain_run, verdict

PREFIX = "model."  # the LightningModule holds the classifier as `model`


class Lit(pl.LightningModule):
    """Trains through ``training_step``, which calls the classifier, never the module's own forward."""

    def __init__(self, case: Case, fail_at: int | None = None):
        super().__init__()
        self.model = Classifier(case)
        self.lr = case.lr
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("a bug in the training step")
        loss = self.model(**batch)["loss"]
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def trainer(case: Case, callbacks, **kwargs) -> pl.Trainer:
    return pl.Trainer(max_steps=case.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=case.accumulate,
                      precision="bf16-mixed" if case.bf16 else "32-true", callbacks=callbacks, **kwargs)


def fit(case: Case, fail_at=None, trainer_kwargs=None, **options):
    lit = Lit(case, fail_at)
    cb = NeuralDbgCallback(every=1, report=False, **options)
    tr = trainer(case, [cb], **(trainer_kwargs or {}))
    tr.fit(lit, loader(case))
    return lit, cb, tr


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verdict_steps_and_loss_equal_those_of_the_plain_loop(case):
    plain = plain_run(case)
    lit, cb, tr = fit(case)
    dbg = cb.session
    assert dbg.step == tr.global_step == plain.step == case.steps  # optimizer steps, once per window
    assert verdict(dbg, PREFIX) == verdict(plain)
    assert verdict(plain)[:1] == [(*case.expect, 0)] if case.expect else verdict(plain) == []
    np.testing.assert_allclose(dbg.trace.loss.data, plain.trace.loss.data, rtol=1e-5)
    np.testing.assert_array_equal(dbg.trace.loss.steps, plain.trace.loss.steps)
    assert not dbg.watching and hooks_left(lit, tr.optimizers[0]) == 0


def test_gradients_are_read_before_clipping_and_for_the_whole_window():
    case = Case("clipped", accumulate=4, steps=3, batch=8)
    plain = plain_run(case)
    _, cb, _ = fit(case, trainer_kwargs={"gradient_clip_val": 1e-3})
    for name in ("0", "2", "4"):
        seen = cb.session.trace.stats.data[0, cb.session.trace.layer(PREFIX + "net." + name).index, Stat.W_GRAD_NORM]
        assert seen == pytest.approx(plain.trace.stats.data[0, plain.trace.layer("net." + name).index,
                                                             Stat.W_GRAD_NORM], rel=1e-4)
        assert seen > 1e-2  # far above what clipping left


def test_no_hook_outlives_a_fit_that_raises_and_the_verdict_is_printed(capsys):
    case = Case("dead_then_bug", dead=True)
    lit = Lit(case, fail_at=12)
    cb = NeuralDbgCallback(every=1)
    tr = trainer(case, [cb])
    with pytest.raises(RuntimeError, match="a bug in the training step"):
        tr.fit(lit, loader(case))
    assert cb.session.step == 12 and not cb.session.watching
    assert hooks_left(lit, tr.optimizers[0]) == 0
    out = capsys.readouterr().out
    assert "training failed after 12 steps" in out and "dead_units in `model.net.3`" in out


def test_stop_on_non_finite_stops_fit_after_the_first_nan_step(capsys):
    case = Case("nan", nan_loss=True)
    lit, cb, tr = fit(case, stop_on=("non_finite",))
    assert cb.stopped_by == "non_finite"
    assert tr.global_step == cb.session.step == 1
    assert "stopping training after step 1: non_finite" in capsys.readouterr().out


def test_rank_zero_writes_the_trace_and_the_report(tmp_path, capsys):
    case = Case("dead", dead=True, steps=10)
    path = tmp_path / "lit.ndbg"
    lit = Lit(case)
    cb = NeuralDbgCallback(every=1, save=path)
    tr = trainer(case, [cb])
    tr.fit(lit, loader(case))
    assert tr.is_global_zero and path.exists()
    from neuraldbg import NeuralDbg

    assert verdict(NeuralDbg.load(path)) == verdict(cb.session)
    assert "training finished after 10 steps" in capsys.readouterr().out


def test_a_second_fit_gets_a_new_session_and_the_new_optimizer():
    case = Case("healthy", steps=5)
    lit = Lit(case)
    cb = NeuralDbgCallback(every=1, report=False)
    trainer(case, [cb]).fit(lit, loader(case))
    first = cb.session
    tr = trainer(Case("healthy", steps=7), [cb])
    tr.fit(lit, loader(case))
    assert cb.session is not first and cb.session.step == 7 and first.step == 5
    assert cb.session.optimizer is tr.optimizers[0]
    assert hooks_left(lit, tr.optimizers[0]) == 0


def test_bad_options_fail_at_construction_with_one_clear_message():
    with pytest.raises(ValueError, match="stop_on takes causes among"):
        NeuralDbgCallback(stop_on=("nan",))
    with pytest.raises(TypeError, match="neuraldbg.NeuralDbg"):
        NeuralDbgCallback(session="dbg")
    with pytest.raises(ValueError, match="does not exist"):
        NeuralDbgCallback(save="/no/such/folder/run.ndbg")


class HandBCE(pl.LightningModule):
    """A binary cross-entropy written by hand on a sigmoid: under a 16-bit autocast the sigmoid of a confident
    logit rounds to 1, and log(1 - p) is -inf."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                       torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)[:, 0]

    def training_step(self, batch, _):
        x, y = batch
        p = torch.sigmoid(self(x))
        t = (y == 0).float()
        return -(t * torch.log(p) + (1 - t) * torch.log(1 - p)).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_a_nan_under_the_trainers_16_bit_autocast_is_found_in_the_loss():
    """Lightning opens its precision's autocast after the callback begins the pass (on the CPU it runs
    "16-mixed" as bfloat16): the replay that finds the operation ran without it, in float32, where the
    sigmoid does not round to 1, and the NaN was placed in the model with a generic fix."""
    g = torch.Generator().manual_seed(1234)
    w1, w2 = torch.randn(16, 32, generator=g), torch.randn(32, 4, generator=g)
    x = torch.randn(2048, 16, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(1)
    cb = NeuralDbgCallback(report=False)
    pl.seed_everything(0, verbose=False)
    pl.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, precision="16-mixed", callbacks=[cb]).fit(
        HandBCE(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True))
    top = cb.session.explain()[0]
    assert (top.cause, top.confidence >= 0.5) == ("non_finite", True)
    assert "the loss's torch.log" in top.chain[0]


class _Rewrapped(Lit):
    """The usual workaround for "element 0 of tensors does not require grad": the loss rebuilt from its
    value with requires_grad=True. Its backward reaches no weight of the model."""

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch)["loss"]
        return torch.tensor(loss.item(), requires_grad=True)


def test_a_loss_rebuilt_from_its_value_reaches_no_weight_and_is_named():
    """The trainer's backward runs on the rebuilt loss and ends; the optimizer steps on weights no gradient
    reached. Named as the weights never learning (as in a plain loop), with the fix about .item(), not a
    learning rate to raise a thousandfold."""
    case = Case("rebuilt", steps=60)
    cb = NeuralDbgCallback(report=False)
    trainer(case, [cb]).fit(_Rewrapped(case), loader(case))
    top = cb.session.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= 0.5, cb.session.report()
    assert ".item()" in top.suggestion and "raise the learning rate" not in top.suggestion
    assert cb.session.trace.meta.get("steps_unreached", 0) >= 50


class _WarmedUp(Lit):
    """A linear warm-up over 200 scheduler steps, written per batch, returned with ``interval`` given or left
    to Lightning's default ('epoch')."""

    def __init__(self, case: Case, interval: str | None):
        super().__init__(case)
        self.interval = interval

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, **({"interval": self.interval}
                                                                          if self.interval else {})}}


@pytest.mark.parametrize("interval", [None, "step"], ids=["default_interval", "interval_step"])
def test_a_warmup_stepped_once_per_epoch_is_named_with_the_interval(interval):
    """A warm-up over 200 batches left at Lightning's default interval, stepped once per 100-batch epoch:
    over 300 steps the rate reaches 1.5% of its base and the loss hardly moves. The schedule is named,
    and the fix steps it every batch ('interval': 'step'), not a shorter warm-up or a larger base rate. Given
    'interval': 'step', it trains."""
    case = Case("warmed_up", steps=300)
    cb = NeuralDbgCallback(report=False)
    data = torch.utils.data.DataLoader(Teacher(1600), batch_size=16, shuffle=False)  # 100 batches an epoch
    trainer(case, [cb], max_epochs=-1).fit(_WarmedUp(case, interval), data)
    hyps = [h for h in cb.session.explain() if h.confidence >= 0.5]
    if interval == "step":
        assert not hyps, cb.session.report()
        return
    assert hyps and (hyps[0].cause, hyps[0].layer) == ("learning_rate_too_low", ""), cb.session.report()
    assert "'interval': 'step'" in hyps[0].suggestion and "raise the learning rate" not in hyps[0].suggestion
