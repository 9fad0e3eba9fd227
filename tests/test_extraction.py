"""Extraction: statistics against plain torch, step counting, hook hygiene, bit-identity, NaN origins."""
import math

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.stats import SATURATION_MARGIN


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 3))


def batches(n, seed=1, bs=12):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 6, generator=g), torch.randint(0, 3, (bs,), generator=g)) for _ in range(n)]


def all_hooks(model, opt=None):
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(getattr(m, "_backward_pre_hooks", {}))
    if opt is not None:
        n += len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)
    return n


def row(dbg, step):
    steps = list(dbg.trace.stats.steps)
    return dbg.trace.stats.data[steps.index(step)]


def index(dbg, name):
    return dbg.trace.layer(name).index


def test_statistics_match_a_plain_torch_computation():
    model = mlp()
    model.eval()  # no dropout randomness between the two computations
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    before = [p.detach().clone() for p in model.parameters()]
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
    r = row(dbg, 0)

    # reference: the same pass with retained intermediate outputs, on a copy of the start weights
    ref = mlp()
    ref.eval()
    with torch.no_grad():
        for p, b in zip(ref.parameters(), before):
            p.copy_(b)
    outs = {}
    h = x
    for name, m in ref.named_children():
        h = m(h)
        h.retain_grad()
        outs[name] = h
    F.cross_entropy(h, y).backward()

    # the dropout in eval mode returns its input: not observed, not measured
    assert dbg.trace.unobserved() == {"4": "returns its input unchanged"}
    assert np.isnan(r[index(dbg, "4")]).all()
    for name, o in outs.items():
        if name == "4":
            continue
        i = index(dbg, name)
        v = o.detach()
        assert r[i, Stat.ACT_MEAN] == pytest.approx(v.mean().item(), abs=1e-6)
        assert r[i, Stat.ACT_RANGE] == pytest.approx(v.abs().max().item() / torch.finfo(torch.float32).max, rel=1e-5)
        assert r[i, Stat.ACT_STD] == pytest.approx(v.std().item(), rel=1e-5)
        assert r[i, Stat.ACT_ABSMAX] == pytest.approx(v.abs().max().item(), rel=1e-6)
        assert r[i, Stat.ACT_NONFINITE] == 0
        if name == "1":  # measured on the ReLU, not on the Linear layers' pre-activations
            assert r[i, Stat.ACT_DEAD] == pytest.approx((v.max(0).values <= 0).float().mean().item())
        g = o.grad
        assert r[i, Stat.GRAD_RMS] == pytest.approx(g.pow(2).mean().sqrt().item(), rel=1e-5)
        assert r[i, Stat.GRAD_NONFINITE] == 0
    tanh = outs["3"].detach()
    sat = ((tanh <= -1 + 2 * SATURATION_MARGIN) | (tanh >= 1 - 2 * SATURATION_MARGIN)).float().mean().item()
    assert r[index(dbg, "3"), Stat.ACT_SATURATED] == pytest.approx(sat)
    assert math.isnan(r[index(dbg, "1"), Stat.ACT_SATURATED])  # ReLU is not bounded above

    params = dict(model.named_parameters())
    for name in ("0", "2", "5"):
        i = index(dbg, name)
        w0, b0 = before[[n for n, _ in model.named_parameters()].index(f"{name}.weight")], None
        pw, pb = params[f"{name}.weight"], params[f"{name}.bias"]
        gi = [n for n, _ in model.named_parameters()].index(f"{name}.weight")
        b0 = before[gi + 1]
        assert r[i, Stat.W_NORM] == pytest.approx(torch.cat([w0.flatten(), b0.flatten()]).norm().item(), rel=1e-5)
        assert r[i, Stat.W_GRAD_NORM] == pytest.approx(
            torch.cat([grads[gi].flatten(), grads[gi + 1].flatten()]).norm().item(), rel=1e-5)
        upd = torch.cat([(pw.detach() - w0).flatten(), (pb.detach() - b0).flatten()]).norm().item()
        assert r[i, Stat.W_UPDATE_NORM] == pytest.approx(upd, rel=1e-4)
    assert math.isnan(r[index(dbg, "1"), Stat.W_NORM])  # no parameters
    lr = dbg.trace.global_column("lr")[0]
    assert lr == pytest.approx(0.1)
    assert dbg.trace.global_column("input_absmax")[0] == pytest.approx(x.abs().max().item())


def test_conv_dead_units_are_counted_per_channel():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 4, 3, padding=1)
    with torch.no_grad():
        conv.bias[:2] = -100.0  # channels 0 and 1 never fire
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    with NeuralDbg(model, every=1) as dbg:
        model(torch.randn(5, 2, 8, 8)).sum().backward()
    assert row(dbg, 0)[index(dbg, "1"), Stat.ACT_DEAD] == pytest.approx(0.5)


def test_step_counts_optimizer_steps_and_backward_passes():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = batches(8)
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for i, (x, y) in enumerate(data):  # gradient accumulation: 2 backward passes per step
            F.cross_entropy(model(x), y).backward()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
            with torch.no_grad():
                model(x)  # an evaluation pass: neither a step nor a statistic
    assert dbg.step == 4
    assert list(dbg.trace.stats.steps) == [0, 1, 2, 3]

    model2 = mlp()
    with NeuralDbg(model2) as dbg2:  # no optimizer: backward passes are steps
        for x, y in data[:5]:
            F.cross_entropy(model2(x), y).backward()
    assert dbg2.step == 5


def test_record_loss_takes_tensors_and_floats_and_keeps_the_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for x, y in batches(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)  # after the step: still belongs to the step just done
        dbg.record_loss(1.5)
    assert list(dbg.trace.loss.steps) == [0, 1, 2, 2]
    assert dbg.trace.loss.data[-1] == 1.5
    assert dbg.trace.loss.data[0] > 0


def test_hooks_are_removed_on_every_exit_path():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    baseline = all_hooks(model, opt)
    x, y = batches(1)[0]
    with pytest.raises(ZeroDivisionError):
        with NeuralDbg(model, optimizer=opt, every=1):
            model(x)  # mid-forward state: hooks of a sampled step are live
            1 / 0  # noqa: B018 - the error is the point
    assert all_hooks(model, opt) == baseline
    with pytest.raises(KeyboardInterrupt):
        with NeuralDbg(model, optimizer=opt):
            F.cross_entropy(model(x), y).backward()
            raise KeyboardInterrupt
    assert all_hooks(model, opt) == baseline
    with NeuralDbg(model, optimizer=opt) as dbg:
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert all_hooks(model, opt) == baseline
    assert dbg.step == 1


def test_a_watched_model_cannot_be_watched_twice_and_two_models_can():
    a, b = mlp(0), mlp(1)
    with NeuralDbg(a):
        with pytest.raises(RuntimeError, match="already watched"):
            NeuralDbg(a).start()
        with NeuralDbg(b) as db:
            b(batches(1)[0][0]).sum().backward()
        assert db.step == 1
    with NeuralDbg(a):  # free again after the first session ended
        pass


def _train(model, opt, data, watch):
    outs = []
    torch.manual_seed(123)  # dropout masks
    ctx = NeuralDbg(model, optimizer=opt, every=2) if watch else None
    if ctx:
        ctx.start()
    try:
        for x, y in data:
            opt.zero_grad()
            out = model(x)
            outs.append(out.detach().clone())
            F.cross_entropy(out, y).backward()
            opt.step()
    finally:
        if ctx:
            ctx.stop()
    return outs, [p.detach().clone() for p in model.parameters()], [p.grad.clone() for p in model.parameters()]


def _spectral(seed: int) -> nn.Module:
    """Weights under spectral_norm: reading them in training mode runs a power iteration, which moves the
    vectors it keeps."""
    from torch.nn.utils.parametrizations import spectral_norm
    torch.manual_seed(seed)
    return nn.Sequential(spectral_norm(nn.Linear(6, 16)), nn.ReLU(), spectral_norm(nn.Linear(16, 3)))


@pytest.mark.parametrize("make", [mlp, _spectral], ids=["plain", "spectral_norm"])
def test_training_is_bit_identical_with_and_without_the_monitor(make):
    data = batches(12)
    m1, m2 = make(5), make(5)
    o1, p1, g1 = _train(m1, torch.optim.Adam(m1.parameters(), lr=1e-2), data, watch=False)
    o2, p2, g2 = _train(m2, torch.optim.Adam(m2.parameters(), lr=1e-2), data, watch=True)
    assert all(torch.equal(a, b) for a, b in zip(o1, o2))
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


class SqrtNorm(nn.Module):
    """sqrt(sum x^2): finite forward at x == 0, but an infinite gradient there."""

    def forward(self, x):
        return torch.sqrt((x * x).sum(-1, keepdim=True))


class LogOf(nn.Module):
    def forward(self, x):
        return torch.log(x)


def _run(model, data, lr=0.01, target_fn=None, steps=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            out = model(x)
            yt = target_fn(i, out) if target_fn else torch.zeros_like(out)
            F.mse_loss(out, yt).backward()
            opt.step()
    return dbg


def test_nan_origin_forward_in_a_custom_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), LogOf(), nn.Linear(8, 1))
    dbg = _run(model, [(torch.randn(6, 4), None) for _ in range(5)])
    o = dbg.trace.nonfinite
    assert (o.step, o.layer, o.phase) == (0, "1", "forward")


def test_nan_origin_backward_only():
    torch.manual_seed(0)
    zero = nn.Linear(4, 4)
    nn.init.zeros_(zero.weight)
    nn.init.zeros_(zero.bias)
    model = nn.Sequential(nn.Linear(4, 4), zero, SqrtNorm(), nn.Linear(1, 1))
    dbg = _run(model, [(torch.randn(6, 4), None) for _ in range(3)])
    o = dbg.trace.nonfinite
    assert (o.step, o.layer, o.phase) == (0, "2", "backward")


def test_nan_origin_input_and_targets():
    torch.manual_seed(0)
    data = [(torch.randn(6, 4), None) for _ in range(6)]
    data[3][0][2, 1] = float("nan")
    dbg = _run(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), data)
    assert (dbg.trace.nonfinite.step, dbg.trace.nonfinite.layer, dbg.trace.nonfinite.phase) == (3, "input", "input")

    def targets(i, out):
        y = torch.zeros_like(out)
        if i == 4:
            y[0] = float("inf")
        return y

    data = [(torch.randn(6, 4), None) for _ in range(6)]
    dbg = _run(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), data, target_fn=targets)
    assert (dbg.trace.nonfinite.step, dbg.trace.nonfinite.phase) == (4, "loss")


def test_nan_from_an_oversized_update_is_traced_to_the_weights():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))
    data = [(torch.randn(8, 4) * 10, None) for _ in range(10)]
    dbg = _run(model, data, lr=50, target_fn=lambda i, out: torch.randn_like(out))
    o = dbg.trace.nonfinite
    assert o is not None and o.step in (2, 3)
    assert o.phase in ("weights", "backward", "forward") and o.layer in ("0", "2")


@pytest.mark.parametrize("kind", ["tuple", "dict", "packed"])
def test_structured_outputs_are_handled(kind):
    torch.manual_seed(0)

    class TupleOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return (h, h.sum()) if kind == "tuple" else {"h": h, "aux": None}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = TupleOut()
            self.rnn = nn.GRU(4, 5, batch_first=True)
            self.head = nn.Linear(5, 1)

        def forward(self, x):
            out = self.block(x)
            h = out[0] if kind == "tuple" else out["h"]
            if kind == "packed":
                packed = nn.utils.rnn.pack_padded_sequence(h, [3, 2], batch_first=True)
                seq, _ = self.rnn(packed)
                seq, _ = nn.utils.rnn.pad_packed_sequence(seq, batch_first=True)
            else:
                seq, _ = self.rnn(h)
            return self.head(seq[:, -1])

    model = Model()
    with NeuralDbg(model, every=1) as dbg:
        model(torch.randn(2, 3, 4)).sum().backward()
    r = row(dbg, 0)
    for name in ("block.lin", "rnn", "head"):
        assert not math.isnan(r[index(dbg, name), Stat.ACT_STD]), name
        assert not math.isnan(r[index(dbg, name), Stat.GRAD_RMS]), name
    order = [l.name for l in dbg.trace.execution_order()]
    assert order == ["block.lin", "rnn", "head"]


def test_frozen_layers_have_no_gradient_statistics_but_are_watched():
    model = mlp()
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        x, y = batches(1)[0]
        F.cross_entropy(model(x), y).backward()
        opt.step()
    r = row(dbg, 0)
    assert dbg.trace.layer("0").frozen
    assert math.isnan(r[index(dbg, "0"), Stat.W_GRAD_NORM])
    assert r[index(dbg, "0"), Stat.W_UPDATE_NORM] == 0
    assert r[index(dbg, "2"), Stat.W_GRAD_NORM] > 0


def test_sampling_schedule_records_a_subset_with_every():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with NeuralDbg(model, optimizer=opt, every=3) as dbg:
        for x, y in batches(10):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert list(dbg.trace.stats.steps) == [0, 3, 6, 9]


def test_an_optimizer_that_does_not_own_the_model_is_refused():
    model, other = mlp(0), mlp(1)
    with pytest.raises(ValueError, match="does not own"):
        NeuralDbg(model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="nn.Module"):
        NeuralDbg("not a model")


def test_bfloat16_autocast_and_a_large_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 2))
    x = torch.randn(40, 3, 128, 128)  # the conv output has ~10M values
    with NeuralDbg(model, every=1) as dbg:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().sum().backward()
    r = row(dbg, 0)
    assert r[index(dbg, "0"), Stat.ACT_STD] > 0 and r[index(dbg, "1"), Stat.GRAD_RMS] > 0


def test_recurrent_weight_scale_is_measured_against_the_default_init(tmp_path):
    from neuraldbg.layers import recurrent_scale
    torch.manual_seed(0)
    gru, lstm, rnn = nn.GRU(4, 64), nn.LSTM(4, 64, num_layers=2), nn.RNN(4, 64)
    assert recurrent_scale(gru) == pytest.approx(1.0, rel=0.05)
    assert recurrent_scale(lstm) == pytest.approx(1.0, rel=0.05)
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(30.0)
    assert recurrent_scale(rnn) == pytest.approx(30.0, rel=0.05)
    square = nn.RNN(4, 64)
    nn.init.orthogonal_(square.weight_hh_l0)
    assert recurrent_scale(square) == pytest.approx(3 ** 0.5, rel=0.05)  # orthogonal, square: sqrt(3) x
    assert recurrent_scale(nn.Linear(4, 4)) is None
    dbg = NeuralDbg(nn.Sequential(rnn))
    dbg.save(tmp_path / "r.ndbg")
    (info,) = NeuralDbg.load(tmp_path / "r.ndbg").trace.layers
    assert info.extra["recurrent_scale"] == pytest.approx(30.0, rel=0.05)


def test_output_gradients_are_read_on_every_other_sample_of_the_auto_schedule_and_the_chart_carries_them():
    """No diagnosis reads their size: under the automatic interval every other sampled step retains the
    layers' output gradients; with an interval the user set, every one does. The chart's gradient flow shows
    a sample without them as the one before."""
    from ndbg_jupyter._chart import gradient_flow

    def run(every):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        with NeuralDbg(model, optimizer=opt, every=every) as dbg:
            for _ in range(12):
                opt.zero_grad()
                F.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 2, (32,))).backward()
                opt.step()
        return dbg

    auto, fixed = run(None), run(1)
    i = auto.trace.layer("1").index
    measured = np.isfinite(auto.trace.stats.data[:, i, Stat.GRAD_RMS])
    assert auto.trace.stats.n == 12 and list(measured) == [True, False] * 6
    assert np.isfinite(fixed.trace.stats.data[:, i, Stat.GRAD_RMS]).all()
    flow, _, _ = gradient_flow(auto.view.steps, auto.view.stat(Stat.GRAD_RMS))
    assert np.isfinite(flow[i]).all()
