"""Batched extraction: the statistics a sampled step reduces together (outputs stacked by shape, parameters
grouped by shape, gradients retained and reduced at step end) equal the ones computed layer by layer in
plain torch, on a model of repeated blocks, at every step (the first, whose outputs are copied, and the
later ones, whose outputs are kept as they are)."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.stats import PARAM_SAMPLE, SATURATION_MARGIN


def blocks_model():
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()]
    # a tanh (saturation), a weight above PARAM_SAMPLE elements (read through a strided subset), a ReLU
    layers += [nn.Linear(32, 300), nn.Tanh(), nn.Linear(300, 300), nn.ReLU(), nn.Linear(300, 5)]
    return nn.Sequential(*layers)


def _sq_norm(t: torch.Tensor) -> float:
    """The squared norm as the extraction estimates it: whole up to PARAM_SAMPLE elements, else every
    ``stride``-th element scaled up to the whole."""
    flat = t.detach().reshape(-1).double()
    if flat.numel() <= PARAM_SAMPLE:
        return float(flat.dot(flat))
    stride = -(-flat.numel() // PARAM_SAMPLE)
    sub = flat[::stride]
    return float(sub.dot(sub)) * flat.numel() / sub.numel()


def reference(model, x, y, lr):
    """Per layer, in plain torch on a copy: output stats, output-gradient RMS, weight/grad/update norms."""
    ref = copy.deepcopy(model)
    outs, h = [], x
    for m in ref:
        h = m(h)
        h.retain_grad()
        outs.append(h)
    F.cross_entropy(h, y).backward()
    rows = []
    for m, o in zip(ref, outs):
        v, g = o.detach(), o.grad
        ps = list(m.parameters())
        r = {Stat.ACT_MEAN: v.mean().item(), Stat.ACT_STD: v.std().item(), Stat.ACT_ABSMAX: v.abs().max().item(),
             Stat.ACT_DEAD: (v.amax(0) <= 0).float().mean().item(), Stat.ACT_FIRING: (v > 0).float().mean().item(),
             Stat.ACT_SATURATED: ((v.abs() >= 1 - 2 * SATURATION_MARGIN).float().mean().item()),
             Stat.GRAD_RMS: g.pow(2).mean().sqrt().item()}
        if ps:
            r[Stat.W_NORM] = math.sqrt(sum(_sq_norm(p) for p in ps))
            r[Stat.W_GRAD_NORM] = math.sqrt(sum(_sq_norm(p.grad) for p in ps))
        rows.append(r)
    return rows


def test_batched_statistics_equal_per_layer_ones_at_every_step():
    model = blocks_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)) for _ in range(4)]
    refs, before, after = [], [], []
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for x, y in data:
            refs.append(reference(model, x, y, 0.05))
            before.append([p.detach().clone() for p in model.parameters()])
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            after.append([p.detach().clone() for p in model.parameters()])
    assert list(dbg.trace.stats.steps) == [0, 1, 2, 3]
    names = [n for n, _ in model.named_children()]
    owner = [n.split(".")[0] for n, _ in model.named_parameters()]
    for step, (ref, b, a) in enumerate(zip(refs, before, after)):
        row = dbg.trace.stats.data[step]
        for name, r in zip(names, ref):
            i = dbg.trace.layer(name).index
            kind = type(model[int(name)])
            for stat in (Stat.ACT_MEAN, Stat.ACT_STD, Stat.ACT_ABSMAX, Stat.GRAD_RMS):
                assert row[i, stat] == pytest.approx(r[stat], rel=1e-4, abs=1e-6), (step, name, stat)
            if kind in (nn.GELU, nn.ReLU):
                assert row[i, Stat.ACT_DEAD] == pytest.approx(r[Stat.ACT_DEAD]), (step, name)
                assert row[i, Stat.ACT_FIRING] == pytest.approx(r[Stat.ACT_FIRING]), (step, name)
            else:
                assert math.isnan(row[i, Stat.ACT_DEAD]) and math.isnan(row[i, Stat.ACT_FIRING])
            if kind is nn.Tanh:
                assert row[i, Stat.ACT_SATURATED] == pytest.approx(r[Stat.ACT_SATURATED]), (step, name)
            else:
                assert math.isnan(row[i, Stat.ACT_SATURATED])
            assert row[i, Stat.ACT_NONFINITE] == 0 and row[i, Stat.GRAD_NONFINITE] == 0
            if Stat.W_NORM in r:
                upd = math.sqrt(sum(_sq_norm(q - p) for q, p, o in zip(a, b, owner) if o == name))
                assert row[i, Stat.W_NORM] == pytest.approx(r[Stat.W_NORM], rel=1e-5), (step, name)
                assert row[i, Stat.W_GRAD_NORM] == pytest.approx(r[Stat.W_GRAD_NORM], rel=1e-5), (step, name)
                assert row[i, Stat.W_UPDATE_NORM] == pytest.approx(upd, rel=1e-4), (step, name)
            else:
                assert math.isnan(row[i, Stat.W_NORM]) and math.isnan(row[i, Stat.W_GRAD_NORM])
        x = data[step][0]
        assert dbg.trace.global_column("input_absmax")[step] == pytest.approx(x.abs().max().item())


def test_parameters_of_several_dtypes_are_reduced_each_in_its_own():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8).double(), nn.ReLU(), nn.Linear(8, 2).double())

    class Cast(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner[4](self.inner[3](self.inner[2](self.inner[1](self.inner[0](x)).double())))

    wrapped = Cast(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 0, 1])
    w = {n: math.sqrt(sum(_sq_norm(p) for p in m.parameters())) for n, m in model.named_children() if n in "024"}
    with NeuralDbg(wrapped, optimizer=opt, every=1) as dbg:
        F.cross_entropy(wrapped(x), y).backward()
        opt.step()
    row = dbg.trace.stats.data[0]
    for n, v in w.items():
        assert row[dbg.trace.layer(f"inner.{n}").index, Stat.W_NORM] == pytest.approx(v, rel=1e-5)


def test_an_output_changed_in_place_after_its_layer_is_measured_as_the_layer_made_it():
    """A layer whose output a later op changes in place: from the start (a ReLU(inplace=True) after it),
    or only from some step on (the pass changes: the output kept as it is was overwritten, that step's
    row is left unmeasured and the output is copied from then on)."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 16)
            self.act = nn.ReLU(inplace=True)
            self.b = nn.Linear(16, 16)
            self.head = nn.Linear(16, 3)
            self.scale_from = 3  # from this step on, b's output is doubled in place

        def forward(self, x, step):
            h = self.b(self.act(self.a(x)))
            if step >= self.scale_from:
                h.mul_(2.0)
            return self.head(h)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(10, 8, generator=g) for _ in range(6)]
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    pre_a, out_b = [], []
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for step, x in enumerate(xs):
            with torch.no_grad():
                pre_a.append(model.a(x).mean().item())
                out_b.append(model.b(torch.relu(model.a(x))).mean().item())
            opt.zero_grad()
            F.cross_entropy(model(x, step), y).backward()
            opt.step()
    data = dbg.trace.stats.data
    ia, ib = dbg.trace.layer("a").index, dbg.trace.layer("b").index
    for step in range(6):
        assert data[step, ia, Stat.ACT_MEAN] == pytest.approx(pre_a[step], abs=1e-6)  # before the ReLU
        if step == model.scale_from:
            assert math.isnan(data[step, ib, Stat.ACT_MEAN])  # kept as it was, then overwritten: dropped
        else:
            assert data[step, ib, Stat.ACT_MEAN] == pytest.approx(out_b[step], abs=1e-6), step
