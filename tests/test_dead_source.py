"""A whole ReLU layer that reads nothing above 0: named where it is, and its fix says where the zeros come from
(weights at 0, an output multiplied by 0, or values above 0 taken away between a layer and what reads it)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


def classes(step, seed=0, batch=32):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(batch, 10, generator=g)
    w = torch.randn(10, 4, generator=torch.Generator().manual_seed(seed))
    return x, (x @ w).argmax(dim=1)


def train(model, steps=80, seed=0, **options):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with NeuralDbg(model, optimizer=opt, **options) as dbg:
        for step in range(steps):
            x, y = classes(step, seed)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def stack():
    """Linear, BatchNorm, ReLU twice, then a head: `4` is the second norm, `5` the ReLU after it."""
    return nn.Sequential(nn.Linear(10, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64), nn.BatchNorm1d(64),
                         nn.ReLU(), nn.Linear(64, 4))


class Gated(nn.Module):
    """ReLUs written as functions; the second reads its norm's output through ``how`` (a mask, a shift, a
    reshape) or a learned scale."""

    def __init__(self, how: str):
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(10, 32), nn.BatchNorm1d(32)
        self.fc2, self.bn2 = nn.Linear(32, 32), nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 4)
        self.how = how
        self.register_buffer("mask", torch.zeros(32) if how == "mask" else torch.ones(32))
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        x = F.relu(self.bn1(self.fc1(x)))
        h = self.bn2(self.fc2(x))
        if self.how in ("mask", "ones"):
            h = h * self.mask
        elif self.how == "shift":
            h = (h - 30.0).reshape(h.shape[0], 2, -1).reshape(h.shape)
        elif self.how == "learned":
            h = h * self.scale
        return self.head(F.relu(h))


@pytest.mark.parametrize("how", ["mask", "ones", "shift", "learned"])
def test_a_functional_relu_reading_a_module_output_through_one_input_ops_is_named_after_it(how):
    torch.manual_seed(0)
    dbg = train(Gated(how), steps=2, every=1)
    where = {l.name: l.where() for l in dbg.trace.layers if l.is_site}
    # a mask, a shift or a reshape keeps the module it reads; a learned scale is a computation of its own
    second = "F.relu in the model's forward" if how == "learned" else "F.relu after `bn2`"
    assert sorted(where.values()) == sorted(["F.relu after `bn1`", second])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_mask_of_zeros_after_a_functional_norm_is_named_there_with_a_fix_that_looks_between(seed, tmp_path):
    torch.manual_seed(seed)
    dbg = train(Gated("mask"), seed=seed)
    top = dbg.explain()[0]
    assert (str(top.cause), top.layer, top.step) == ("dead_units", "bn2", 0) and top.confidence >= 0.5
    assert "`bn2`'s output before" in top.suggestion and "re-initialise" not in top.suggestion
    chain = " ".join(top.chain)
    assert "values above 0" in chain and "non-positive values" not in chain
    dbg.save(tmp_path / "run.ndbg")  # what each layer reads is kept in the file
    assert NeuralDbg.load(tmp_path / "run.ndbg").explain()[0].suggestion == top.suggestion
    torch.manual_seed(seed)
    healthy = train(Gated("ones"), seed=seed).explain()
    assert not [h for h in healthy if h.confidence >= 0.5]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fix_for_a_dead_layer_says_where_its_zeros_come_from(seed):
    def run(fault):
        torch.manual_seed(seed)
        model = stack()
        if fault == "mask":    # a hook multiplies the second Linear's output by 0: the norm after it outputs 0
            model[3].register_forward_hook(lambda m, i, out: out * torch.zeros(out.shape[1]))
        elif fault == "shift":  # a hook shifts the norm's output far below 0
            model[4].register_forward_hook(lambda m, i, out: out - 30.0)
        elif fault == "zero_init":
            nn.init.zeros_(model[4].weight)
        elif fault == "bias":
            with torch.no_grad():
                model[4].bias.fill_(-20.0)
        top = train(model, seed=seed).explain()[0]
        assert (str(top.cause), top.layer, top.step) == ("dead_units", "5", 0) and top.confidence >= 0.5
        return top.suggestion

    mask = run("mask")
    assert "`3`'s output before `4`" in mask and "re-initialise" not in mask
    shift = run("shift")
    assert "`4`'s output before `5`" in shift and "re-initialise" not in shift
    zero = run("zero_init")
    assert "`4`'s weights" in zero and "they are all 0" in zero
    bias = run("bias")  # the norm's own output is far below 0: its bias, no mask
    assert "re-initialise `4`" in bias and "output before" not in bias and "all 0" not in bias


@pytest.mark.parametrize("seed", [0, 1])
def test_a_relu_reading_its_layer_as_it_is_gets_no_fix_that_looks_between(seed):
    """Biases spread far below 0 (a mean above minus one spread, no value above 0), read by the ReLU as they
    are; and a ReLU after a dead one: neither is told to look for a mask or for weights at 0."""
    torch.manual_seed(seed)
    spread = nn.Sequential(nn.Linear(10, 256), nn.ReLU(), nn.Linear(256, 4))
    with torch.no_grad():
        spread[0].weight.mul_(0.01)
        spread[0].bias.copy_(torch.where(torch.arange(256) < 128, -30.0, -0.5))
    top = train(spread, seed=seed).explain()[0]
    assert (str(top.cause), top.layer) == ("dead_units", "1")
    assert "output before" not in top.suggestion and "re-initialise `0`" in top.suggestion
    torch.manual_seed(seed)
    chain = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 4))
    with torch.no_grad():
        chain[0].bias.fill_(-20.0)
    hyps = train(chain, seed=seed).explain()
    assert (str(hyps[0].cause), hyps[0].layer) == ("dead_units", "1")
    assert not [h for h in hyps if "multiplies" in h.suggestion or "output before" in h.suggestion]
