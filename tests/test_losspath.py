"""The operations between the model's output and the loss, read from the autograd graph: what no module hook
sees. Each misuse on a real graph, its correct counterparts, and the verdict on a real training loop."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.losspath import LossMisuse, misuse, paths

CONFIDENT = 0.5


def _read(make_loss, out_dim: int = 3):
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, out_dim, (8,))
    out = nn.Linear(4, out_dim)(x)
    loss = make_loss(out, y)
    loss.backward()
    return misuse(paths(loss.grad_fn, [out.grad_fn]))


@pytest.mark.parametrize("make_loss, expected", [
    (lambda o, y: F.cross_entropy(F.softmax(o, 1), y), LossMisuse.SOFTMAX_TWICE),
    (lambda o, y: F.cross_entropy(torch.softmax(o, 1).view(8, 3), y) + 0.01 * o.pow(2).mean(),
     LossMisuse.SOFTMAX_TWICE),
    (lambda o, y: F.nll_loss(F.softmax(o, 1), y), LossMisuse.NLL_OF_PROBABILITIES),
    (lambda o, y: F.binary_cross_entropy_with_logits(torch.sigmoid(o[:, 0]), (y > 0).float()),
     LossMisuse.LOGITS_LOSS_ON_PROBABILITIES),
    (lambda o, y: F.mse_loss(o[:, :1], y.float()), LossMisuse.BROADCAST),
])
def test_each_misuse_is_read_from_the_graph(make_loss, expected):
    assert _read(make_loss) == expected


@pytest.mark.parametrize("make_loss", [
    lambda o, y: F.cross_entropy(o, y),
    lambda o, y: F.cross_entropy(o, y, label_smoothing=0.1),
    lambda o, y: F.nll_loss(F.log_softmax(o, 1), y),
    lambda o, y: F.nll_loss(torch.log(F.softmax(o, 1)), y),
    lambda o, y: F.binary_cross_entropy(torch.sigmoid(o[:, 0]), (y > 0).float()),
    lambda o, y: F.binary_cross_entropy_with_logits(o[:, 0], (y > 0).float()),
    lambda o, y: F.mse_loss(o[:, 0], y.float()),
    lambda o, y: F.mse_loss(o[:, :1], y.float()[:, None]),
])
def test_a_loss_computed_as_intended_says_nothing(make_loss):
    assert _read(make_loss) is None


def _train(make_loss, final: nn.Module | None = None, steps: int = 60):
    torch.manual_seed(0)
    layers = [nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)] + ([final] if final is not None else [])
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 10, generator=g)
    y = (x[:, :3]).argmax(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            i = (step * 32) % 1024
            loss = make_loss(model(x[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_a_softmax_module_before_cross_entropy_is_named_with_its_fix():
    """The classic: ``nn.Softmax`` at the end of the model and ``F.cross_entropy`` on its output. The loss still
    comes down a little, so nothing else would say it; the graph does, from the first step."""
    dbg = _train(F.cross_entropy, final=nn.Softmax(dim=1))
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT and top.step == 0, dbg.report()
    assert "softmax applied twice" in top.chain[0] and "logits" in top.suggestion
    reloaded = NeuralDbg.load(_saved(dbg))
    assert reloaded.explain()[0].chain[0] == top.chain[0]


def test_outputs_broadcast_against_targets_of_another_shape_are_the_targets():
    dbg = _train(lambda out, y: F.mse_loss(out[:, :1], y.float()))
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("data", "input") and top.confidence >= CONFIDENT, dbg.report()
    assert "same shape" in top.suggestion


def test_the_same_model_trained_right_is_quiet():
    dbg = _train(F.cross_entropy)
    assert dbg.trace.meta.get("loss_paths") and not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def _saved(dbg) -> str:
    import tempfile
    path = tempfile.mkdtemp() + "/run.ndbg"
    dbg.save(path)
    return path


def test_a_watched_model_can_be_copied_while_its_output_nodes_are_held():
    """Until a loss is recorded the recorder holds the output's autograd nodes (a loop that records none holds
    them for good); ``copy.deepcopy(model)`` after a step (an EMA, a best checkpoint) copies the watcher too and
    must not fail on them."""
    import copy
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(3):
            loss = F.cross_entropy(model(torch.randn(5, 4)), torch.zeros(5, dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 1:  # the nodes of this step's output are held, not yet read
                twin = copy.deepcopy(model)
            dbg.record_loss(loss)
    assert isinstance(twin, nn.Sequential) and dbg.trace.meta["loss_paths"]
