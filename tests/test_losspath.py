"""The operations between the model's output and the loss, read from the autograd graph: what no module hook
sees. Each misuse on a real graph, its correct counterparts, and the verdict on a real training loop."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, losspath
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
    (lambda o, y: F.nll_loss(F.log_softmax(o, dim=0), y), LossMisuse.NORMALISED_OVER_BATCH),
    (lambda o, y: F.cross_entropy(F.softmax(o, dim=0), y), LossMisuse.SOFTMAX_TWICE),
    (lambda o, y: F.cross_entropy(F.relu(o), y), LossMisuse.LOGITS_BOUNDED),
    (lambda o, y: F.cross_entropy(torch.tanh(o), y), LossMisuse.LOGITS_BOUNDED),
    (lambda o, y: F.binary_cross_entropy_with_logits(F.relu6(o[:, 0]), (y > 0).float()), LossMisuse.LOGITS_BOUNDED),
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
    lambda o, y: F.nll_loss(F.log_softmax(o, dim=-1), y),
    lambda o, y: F.cross_entropy(o.clamp(-20, 20), y),                     # clamped for stability: no loss
    lambda o, y: F.cross_entropy(30 * torch.tanh(o / 30), y),             # soft-capped logits
    lambda o, y: F.mse_loss(F.relu(o[:, 0]), y.float()),                   # a non-negative regression
    # a sequence model's (batch, time, classes) log-probabilities, transposed for NLL: classes on dim 1 again
    lambda o, y: F.nll_loss(F.log_softmax(o.view(2, 4, 3), dim=2).transpose(1, 2), y.view(2, 4)),
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


@pytest.mark.parametrize("seed", [0, 1])
def test_the_small_updates_a_softmax_applied_twice_leaves_are_in_its_chain(seed):
    """Under SGD the doubled softmax's faded gradient moves the weights a few percent of their norm over the
    run: that is the loss's doing, in its chain, not a learning rate of its own to look at."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10),
                          nn.Softmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 64, generator=g)
    y = (x[:, :10]).argmax(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(200):
            i = (step * 64) % 2048
            loss = F.cross_entropy(model(x[i:i + 64]), y[i:i + 64])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    hyps = dbg.explain()
    assert hyps[0].cause == "loss_plateau" and "softmax applied twice" in hyps[0].chain[0]
    assert not [h for h in hyps[1:] if h.confidence >= CONFIDENT], dbg.report()


def test_a_sigmoid_before_cross_entropy_is_named_with_a_fix_for_cross_entropy():
    """``F.cross_entropy`` (a softmax inside) on sigmoid outputs: the fix removes the sigmoid; it does not
    send a multi-class loss to a binary one."""
    dbg = _train(F.cross_entropy, final=nn.Sigmoid(), steps=120)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT and top.step == 0, dbg.report()
    assert top.suggestion.startswith("remove the sigmoid or softmax before the loss")
    assert "cross_entropy" in top.suggestion.split(":")[1]


def test_a_log_softmax_over_the_batch_is_named_with_its_fix():
    dbg = _train(lambda out, y: F.nll_loss(F.log_softmax(out, dim=0), y), steps=120)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT, dbg.report()
    assert "over another dimension than the classes" in top.chain[0] and "dim=1" in top.suggestion
    assert "larger learning rate" not in top.suggestion


@pytest.mark.parametrize("final", [nn.ReLU(), nn.Tanh()])
def test_an_activation_after_the_last_layer_before_cross_entropy_is_named_with_its_fix(final):
    """A ReLU (or tanh) left after the classifier's last layer: logits cut at 0 (or held in [-1, 1]) before a
    loss that applies its own softmax. The loss comes down some way, so the layers say nothing; the graph does."""
    dbg = _train(F.cross_entropy, final=final, steps=120)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= CONFIDENT, dbg.report()
    assert "after the last layer" in top.chain[0] and "raw output" in top.suggestion
    assert "learning rate" not in top.suggestion


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


def _game(steps: int = 300, g_lr: float = 2e-4, d_trained: bool = True, d_in_g_optimizer: bool = False,
          break_g=None, watch_optimizer: bool = True):
    """A small GAN on binary vectors, the generator watched: its loss is read through the discriminator."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    data = (torch.rand(2048, 32, generator=gen) < torch.rand(1, 32, generator=gen)).float()
    G = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32), nn.Sigmoid())
    D = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    if break_g is not None:
        break_g(G)
    params = list(G.parameters()) + (list(D.parameters()) if d_in_g_optimizer else [])
    opt_g = torch.optim.Adam(params, g_lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    with NeuralDbg(G, optimizer=opt_g if watch_optimizer else None) as dbg:
        for step in range(steps):
            i = (step * 64) % 2048
            fake = G(torch.randn(64, 8))
            if d_trained:
                loss_d = (F.binary_cross_entropy_with_logits(D(data[i:i + 64]), ones)
                          + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros))
                opt_d.zero_grad()
                loss_d.backward()
                opt_d.step()
            loss_g = F.binary_cross_entropy_with_logits(D(fake), ones)
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            dbg.record_loss(loss_g)
    return dbg


def test_a_generator_loss_read_through_a_trained_discriminator_is_a_moving_objective():
    """The generator's loss hovers as the discriminator keeps up: a game, not a plateau to fix with a larger
    learning rate. The discriminator's weights are on the loss's path and another optimizer moves them."""
    dbg = _game()
    assert dbg.trace.meta.get("loss_outside", 0) > 0 and dbg.trace.meta.get("loss_moving")
    assert not [h for h in dbg.explain() if h.confidence >= 0.5], dbg.report()


@pytest.mark.parametrize("case", ["frozen", "same_optimizer"])
def test_weights_outside_the_model_that_do_not_move_against_it_keep_the_loss_an_objective(case):
    """A discriminator nobody trains (a fixed feature net left requires_grad=True), or one the watched
    optimizer steps with the model: the loss is an objective, and its plateau is read as one."""
    dbg = _game(steps=120, d_trained=False, d_in_g_optimizer=case == "same_optimizer")
    assert not dbg.trace.meta.get("loss_moving")
    assert case != "frozen" or dbg.trace.meta.get("loss_outside", 0) > 0


def test_a_game_whose_optimizers_the_loop_makes_is_a_moving_objective_too():
    """No optimizer given: the generator's, the first to step on its weights, is found; the discriminator's
    steps on other weights beside it, so the loss is a game's as when the optimizer is given."""
    dbg = _game(steps=120, watch_optimizer=False)
    assert dbg.trace.meta.get("optimizer_adopted") and dbg.trace.meta.get("loss_moving")


def test_a_broken_generator_is_still_named_in_a_game():
    """The game does not hide a fault of the generator itself: zero weights in both its layers."""
    def zero(G):
        for m in G:
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.weight)
                nn.init.zeros_(m.bias)
    dbg = _game(steps=150, break_g=zero)
    top = dbg.explain()[0]
    assert top.cause == "bad_initialization" and top.confidence >= 0.7, dbg.report()


class _ReturnsLoss(nn.Module):
    """A model that computes its loss in its forward and returns it with its outputs (Hugging Face style);
    ``aux``: it returns an auxiliary scalar (a balance penalty on its hidden units) instead of the loss."""

    def __init__(self, softmax: bool, aux: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3), *([nn.Softmax(dim=1)] if softmax
                                                                                    else []))
        self.aux = aux

    def forward(self, x, y):
        h = self.net[1](self.net[0](x))
        out = self.net[3](self.net[2](h)) if len(self.net) > 3 else self.net[2](h)
        if self.aux:
            return out, 0.01 * h.mean() ** 2
        return {"logits": out, "loss": F.cross_entropy(out, y)}


def _loop(model, loss_of, steps: int = 40, as_float: bool = True):
    """``as_float``: the loop records ``loss.item()``, no graph to read from it."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 10, generator=g)
    y = x[:, :3].argmax(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            i = (step * 32) % 512
            loss = loss_of(model(x[i:i + 32], y[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss.item() if as_float else loss)
    return dbg


def test_a_loss_the_model_returns_is_read_at_once_whatever_the_loop_records():
    dbg = _loop(_ReturnsLoss(softmax=True), lambda out, y: out["loss"])
    assert misuse(dbg.trace.meta.get("loss_paths")) == LossMisuse.SOFTMAX_TWICE
    assert misuse(_loop(_ReturnsLoss(softmax=False), lambda out, y: out["loss"]).trace.meta.get("loss_paths")) is None


def test_an_auxiliary_scalar_among_the_outputs_leaves_the_recorded_loss_its_reading():
    """The model returns (outputs, an auxiliary penalty): the penalty does not lead to the outputs, and the
    loss the loop records as a tensor is read as usual."""
    dbg = _loop(_ReturnsLoss(softmax=True, aux=True), lambda out, y: F.cross_entropy(out[0], y) + out[1],
                as_float=False)
    assert misuse(dbg.trace.meta.get("loss_paths")) == LossMisuse.SOFTMAX_TWICE


# -- terms of the loss on a hidden layer's output (an activity penalty) --------------------------------------

def _penalised(weight_at, steps: int = 300, seed: int = 0):
    """An MLP classifier whose loss adds an L1 penalty on its second ReLU's output, weighted by
    ``weight_at(step)``."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    held = {}
    model[3].register_forward_hook(lambda m, i, out: held.__setitem__("h", out))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 10, generator=g)
    y = (x[:, :4] + 0.3 * torch.randn(2048, 4, generator=g)).argmax(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            i = (step * 64) % 2048
            loss = F.cross_entropy(model(x[i:i + 64]), y[i:i + 64]) + weight_at(step) * held["h"].abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_a_penalty_on_a_hidden_layers_output_is_read_as_a_term_of_the_loss():
    terms = _penalised(lambda s: 1e-3, steps=20).trace.meta.get("loss_terms")
    assert terms and terms[0][0] == "3" and {"Abs", "Mean"} <= set(terms[0][1:]), terms
    # a loss of the outputs alone has none; nor a penalty on what the model returns (a VAE's KL term)
    assert _train(F.cross_entropy).trace.meta.get("loss_terms") is None
    dbg = _loop(_ReturnsLoss(softmax=False, aux=True), lambda out, y: F.cross_entropy(out[0], y) + out[1],
                as_float=False)
    assert dbg.trace.meta.get("loss_terms") is None
    # nor a loss over two passes' outputs (a consistency term): the first pass's output is no hidden layer's
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(20):
            x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
            first = model(x)
            loss = F.cross_entropy(first, y) + 0.1 * F.mse_loss(first, model(x + 0.1 * torch.randn_like(x)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.trace.meta.get("loss_paths") and dbg.trace.meta.get("loss_terms") is None


@pytest.mark.parametrize("decade", [50, 60])
def test_units_a_growing_penalty_kills_are_named_with_the_penalty_not_the_learning_rate(decade):
    """The penalty's weight grows tenfold every ``decade`` steps: the loss rises with it before the units die,
    which read as a divergence (the learning rate) until the loss's graph shows the term on that layer's
    output; growing slower, the units die late and the loss gives back most of what it had gained."""
    dbg = _penalised(lambda s: 1e-3 * 10 ** (s / decade))
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("dead_units", "3") and top.confidence >= CONFIDENT, dbg.report()
    assert "penalty" in top.suggestion and "learning rate" not in top.suggestion
    assert not [h for h in dbg.explain() if h.cause == "learning_rate_too_high" and h.confidence >= CONFIDENT]


def test_a_small_constant_penalty_trains_quietly():
    dbg = _penalised(lambda s: 1e-3)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_a_loss_summed_over_the_batch_is_read_and_named_in_the_learning_rates_fix():
    """reduction='sum' under SGD: the steps grow with the batch and the run diverges. The learning rate is
    too high for that gradient; the fix says to average the loss first."""
    from neuraldbg.losspath import summed
    assert summed(paths(*_graph(lambda o, y: F.cross_entropy(o, y, reduction="sum"))))
    assert summed(paths(*_graph(lambda o, y: F.cross_entropy(o, y, reduction="none").sum())))
    assert not summed(paths(*_graph(F.cross_entropy)))
    assert not summed(paths(*_graph(lambda o, y: F.cross_entropy(o, y, reduction="none").mean())))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 10, generator=g)
    y = x[:, :3].argmax(1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(150):
            i = (step * 64) % 2048
            loss = F.cross_entropy(model(x[i:i + 64]), y[i:i + 64], reduction="sum")
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    top = dbg.explain()[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT, dbg.report()
    assert "reduction='mean'" in top.suggestion and any("sums over the batch" in line for line in top.chain)


def _graph(make_loss):
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    out = nn.Linear(4, 3)(x)
    loss = make_loss(out, y)
    loss.backward()
    return loss.grad_fn, [out.grad_fn]


def test_the_classification_term_is_read_off_the_gradient_only_when_asked():
    out = torch.randn(32, 5, requires_grad=True)
    y = torch.randint(0, 5, (32,), generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad(F.cross_entropy(out, y) + 0.0 * out.sum(), out)
    cls, _, term = losspath.classes_from_gradient("classes", g, out, term=True)
    assert torch.equal(cls, y)
    assert abs(float(term) - float(F.cross_entropy(out, y))) < 1e-5
    assert math.isnan(float(losspath.classes_from_gradient("classes", g, out)[2]))
