"""Mixed precision on the CPU: float16 autocast with a GradScaler (its skipped steps, its scale, unscaled
gradients, a float16 overflow, a scaler that keeps skipping) and bfloat16 autocast as before."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat


class Energy(nn.Module):
    """exp of a projection: fine in float32, Inf in float16 once the projection passes ~11."""

    def __init__(self, n: int, gain: float):
        super().__init__()
        self.proj = nn.Linear(n, n)
        with torch.no_grad():
            self.proj.weight.mul_(gain)

    def forward(self, x):
        return torch.exp(self.proj(x))


def teacher(seed):
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed + 100))

    def data(step):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, (x @ w).argmax(dim=1)
    return data


def run(model, steps=60, seed=0, dtype=torch.float16, init_scale=2.0 ** 16, reduction="mean", every=None,
        given=True):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=dtype == torch.float16)
    applied, scales, grads = [], [], []
    opt.register_step_post_hook(lambda *_: applied.append(1))
    data = teacher(seed)
    with NeuralDbg(model, optimizer=opt, scaler=scaler if given else None, every=every) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = F.cross_entropy(model(x).float(), y, reduction=reduction)
            scaler.scale(loss).backward()
            scales.append(scaler.get_scale())
            first = list(model[0].parameters()) if isinstance(model, nn.Sequential) else []
            grads.append(float(torch.cat([p.grad.flatten() for p in first]).norm()) if first else float("nan"))
            scaler.step(opt)
            scaler.update()
            dbg.record_loss(loss)
    return dbg, len(applied), scales, grads


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))


@pytest.mark.parametrize("given", [True, False], ids=["given", "found"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_calibrating_grad_scaler_is_not_a_fault_and_its_skipped_steps_are_not_steps(seed, given):
    # a loss summed over the batch: at the default scale its float16 gradients overflow for a few steps; a
    # scaler not given to the session is found calling the optimizer's step
    dbg, applied, scales, _ = run(mlp(seed), seed=seed, reduction="sum", given=given)
    skipped = dbg.trace.skipped
    assert 0 < skipped.n < 16 and dbg.step == applied == 60 - skipped.n
    if given:  # the scale each overflowed at (before a scaler is found calling a step, its scale is unknown)
        assert list(skipped.data) == [2.0 ** 16 / 2 ** i for i in range(skipped.n)]
    assert dbg.trace.overflow is not None and dbg.trace.nonfinite is None
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
    assert f"skipped: {skipped.n} optimizer steps with NaN/Inf gradients" in dbg.report()


def test_the_scale_is_recorded_and_the_gradient_statistics_are_unscaled():
    dbg, _, scales, grads = run(mlp(0), steps=8, every=1)
    t = dbg.trace
    first = t.layer("0").index
    np.testing.assert_allclose(t.global_column("loss_scale"), scales, rtol=0)
    recorded = t.stats.data[:, first, Stat.W_GRAD_NORM]
    np.testing.assert_allclose(recorded, np.array(grads) / np.array(scales), rtol=1e-4)
    # the same loop in float32 without a scaler: gradients of the same size
    fp32, _, _, grads32 = run(mlp(0), steps=1, every=1, dtype=torch.float32)
    assert recorded[0] == pytest.approx(fp32.trace.stats.data[0, first, Stat.W_GRAD_NORM], rel=0.05)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_float16_overflow_is_named_with_its_module_and_the_scaler_that_keeps_skipping(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), Energy(32, 6.0), nn.Linear(32, 4))
    dbg, applied, scales, _ = run(model, seed=seed)
    assert dbg.trace.overflow.dtype == "float16" and dbg.trace.overflow.where() == "torch.exp in `2`"
    assert dbg.step == applied < 40  # most steps skipped, none counted
    top = dbg.explain()[0]
    assert (str(top.cause), top.layer, top.confidence >= 0.5) == ("non_finite", "2", True)
    chain = " ".join(top.chain)
    assert "fp16 overflow" in chain and "torch.exp in `2`" in chain and "loss scaler skips" in chain
    assert "bfloat16" in top.suggestion and "normalisation" in top.suggestion
    # in bfloat16 the same model trains: float32's range, no scaler, nothing skipped
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), Energy(32, 6.0), nn.Linear(32, 4))
    bf16, applied, _, _ = run(model, seed=seed, dtype=torch.bfloat16)
    assert bf16.trace.skipped.n == 0 and bf16.step == applied == 60 and bf16.trace.nonfinite is None


def test_an_output_near_the_float16_limit_is_a_warning_before_it_overflows():
    class Loud(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 16) / 4)

        def forward(self, x):
            return (x @ self.weight) * 2000.0  # float16 values of ~1e4: a few times below 65504

    torch.manual_seed(0)
    model = nn.Sequential(Loud(), nn.LayerNorm(16), nn.Linear(16, 4))
    dbg, applied, _, _ = run(model, steps=20, every=2)
    ranges = dbg.trace.stats.data[:, dbg.trace.layer("0").index, Stat.ACT_RANGE]
    assert (ranges > 1 / 20).all() and (ranges < 1).all()  # within range_margin (10x) of the limit
    hyps = dbg.explain()
    near = [h for h in hyps if str(h.cause) == "non_finite"]
    assert dbg.trace.nonfinite is None and near and near[0].confidence < 0.5, dbg.report()
    assert "of the largest value its dtype holds" in near[0].chain[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_autocast_keeps_working(seed):
    dbg, applied, _, _ = run(mlp(seed), seed=seed, dtype=torch.bfloat16)
    assert dbg.step == applied == 60 and dbg.trace.skipped.n == 0
    assert np.isnan(dbg.trace.global_column("loss_scale")).all()  # a disabled scaler has no scale
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
    assert float(np.nanmax(dbg.trace.stats.data[:, :, Stat.ACT_RANGE])) < 1e-30  # bfloat16: float32's range


def _half_run(eps: float, steps: int = 40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=eps)
    data = teacher(0)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x, y = data(step)
            loss = F.cross_entropy(model(x.half()).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_adam_on_float16_weights_is_a_precision_fault_not_the_learning_rate():
    """model.half() under Adam: eps=1e-8 rounds to 0 in float16 and small squared gradients underflow, so the
    first update divides by zero. The weights turn NaN in the update from finite gradients with no update too
    large before: the update's arithmetic in float16 is the root, and the fix keeps the weights in float32
    (lowering the learning rate would change nothing)."""
    dbg = _half_run(eps=1e-8)
    assert dbg.trace.meta["param_dtype"] == "float16"
    hyps = dbg.explain()
    top = hyps[0]
    assert top.cause == "non_finite" and top.layer == "0" and top.step <= 1, dbg.report()
    assert "float16" in top.chain[0] and "eps" in top.chain[1]
    assert "float32" in top.suggestion and "GradScaler" in top.suggestion
    assert not any(h.cause == "learning_rate_too_high" and h.confidence >= 0.5 for h in hyps)


def test_float16_weights_with_an_eps_float16_holds_train_quietly():
    dbg = _half_run(eps=1e-4, steps=60)
    assert np.isfinite(dbg.trace.loss.data).all()
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()


def _sixteen_bit_run(dtype, opt_kind: str, lr: float, seed: int = 0, steps: int = 300):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4)).to(dtype)
    opt = (torch.optim.SGD(model.parameters(), lr=lr) if opt_kind == "sgd"
           else torch.optim.Adam(model.parameters(), lr=lr))
    data = teacher(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(dtype)).float(), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("opt_kind, lr, seed", [("adam", 1e-4, 0), ("sgd", 1e-2, 1)])
def test_updates_that_round_away_in_bfloat16_weights_are_named_with_float32_weights(opt_kind, lr, seed):
    """``model.bfloat16()`` at a fine-tuning rate: most updates are below half a unit in the last place of
    their weight, so they round away and the loss stays flat. Was a plateau asking for a larger learning rate;
    the share of entries an update leaves exactly as they were says why."""
    dbg = _sixteen_bit_run(torch.bfloat16, opt_kind, lr, seed)
    top = dbg.explain()[0]
    assert top.cause == "learning_rate_too_low" and top.confidence >= 0.5, dbg.report()
    assert "float32" in top.suggestion and "autocast" in top.suggestion
    assert "raise the learning rate" not in top.suggestion
    shares = [r[1] for r in dbg.trace.meta["updates_unchanged"]]
    assert len(shares) >= 10 and float(np.median(shares)) > 0.6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_weights_whose_updates_land_train_quietly(dtype):
    dbg = _sixteen_bit_run(dtype, "sgd", 0.3)
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
    assert float(np.median([r[1] for r in dbg.trace.meta["updates_unchanged"]])) < 0.6


def test_float32_weights_read_no_rounded_updates():
    dbg = _sixteen_bit_run(torch.float32, "adam", 1e-4, steps=60)
    assert "updates_unchanged" not in dbg.trace.meta


def _clipped(seed: int, unscaled_first: bool, steps: int = 200):
    """SGD under float16 autocast and a GradScaler not given to the session, with clip_grad_norm_(1.0) after
    scaler.unscale_, or before it: on gradients 65536 times too large, which the scaler then divides again."""
    model = mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    data = teacher(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            if unscaled_first:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_clip_before_the_scaler_unscales_is_named_with_unscaling_first(seed):
    top = _clipped(seed, unscaled_first=False).explain()[0]
    assert (str(top.cause), top.confidence >= 0.5) == ("learning_rate_too_low", True)
    assert "scaler.unscale_(optimizer)" in top.suggestion and "raise" not in top.suggestion
    assert "65536" in top.chain[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_clip_after_the_scaler_unscales_is_quiet_and_reads_unscaled_gradients(seed):
    dbg = _clipped(seed, unscaled_first=True)
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()
    assert not [h for h in dbg.explain() if h.cause == "learning_rate_too_low"]  # not even a weak clip
    assert np.nanmax(dbg.trace.global_column("loss_scale")) == 2.0 ** 16
