"""torch.compile'd models: statistics still recorded, and no recompiles step after step."""
import math

import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat


def _train_compiled(backend, steps):
    torch.manual_seed(0)
    torch._dynamo.reset()
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))
    model = torch.compile(net, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    graphs = []
    with NeuralDbg(model, optimizer=opt, every=2) as dbg:
        for step in range(steps):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return net, dbg, graphs


def _assert_recorded(net, dbg):
    names = [l.name for l in dbg.trace.layers]
    assert names == ["0", "1", "2", "3", "4"]  # the original module's names, without "_orig_mod."
    last = dbg.trace.stats.data[-1]
    for i in range(5):
        assert not math.isnan(last[i, Stat.ACT_STD])
        assert not math.isnan(last[i, Stat.GRAD_RMS])
    assert last[dbg.trace.layer("3").index, Stat.ACT_SATURATED] >= 0
    assert last[dbg.trace.layer("4").index, Stat.W_UPDATE_NORM] > 0
    assert all(len(m._forward_hooks) == 0 for m in net.modules())


def test_compiled_aot_eager_records_and_does_not_recompile():
    net, dbg, graphs = _train_compiled("aot_eager", 24)
    assert dbg.step == 24
    assert len(dbg.trace.stats.steps) == 12  # every=2
    _assert_recorded(net, dbg)
    # graphs are built during the first steps, then reused: none added in the last 20 steps
    assert graphs[-1] == graphs[3] > 0


def test_compiled_default_backend_records_and_does_not_recompile():
    net, dbg, graphs = _train_compiled("inductor", 8)
    _assert_recorded(net, dbg)
    assert graphs[-1] == graphs[2] > 0
