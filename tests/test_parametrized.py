"""A parametrized module (``torch.nn.utils.parametrizations``: a spectral or weight norm) is one layer: the
parameters its parametrizations compute its weight from are its own, and the modules that compute it are not
layers of the forward pass."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations as P

from neuraldbg import Cause, NeuralDbg


def _data():
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(8, 1, generator=g)
    x = torch.randn(2400, 8, generator=g)
    y = torch.sin(x @ w) + 0.3 * x[:, :1] ** 2 + 0.3 * x[:, 1:2] + 0.05 * torch.randn(2400, 1, generator=g)
    return x, (y - y.mean()) / y.std()


class _SpectralMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(P.spectral_norm(nn.Linear(8, 128)), nn.LeakyReLU(0.2),
                                 P.spectral_norm(nn.Linear(128, 128)), nn.LeakyReLU(0.2),
                                 P.spectral_norm(nn.Linear(128, 1)))
        self.scale = nn.Parameter(torch.tensor(1.0))  # the Lipschitz bound's own scale, learnt

    def forward(self, x):
        return self.net(x) * self.scale


def _spectral_mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return _SpectralMLP()


def _train(model: nn.Module, lr: float, steps: int = 300, seed: int = 0) -> NeuralDbg:
    x, y = _data()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            j = torch.randint(0, len(x), (64,), generator=gen)
            opt.zero_grad()
            loss = F.mse_loss(model(x[j]), y[j])
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_a_parametrized_linear_is_one_layer_that_owns_the_weight_it_trains():
    model = nn.Sequential(P.spectral_norm(nn.Linear(8, 16)), nn.ReLU(),
                          P.weight_norm(nn.Linear(16, 1, bias=False)))
    dbg = _train(model, lr=1e-2, steps=5)
    layers = {l.name: l for l in dbg.trace.layers}
    assert not [n for n in layers if "parametrizations" in n]
    # the spectral norm's raw weight (8 x 16) and the bias; the weight norm's gain (1) and direction (1 x 16):
    # a parametrized layer without a bias of its own is still watched
    assert layers["0"].n_trainable == 16 * 8 + 16
    assert layers["2"].n_trainable == 1 + 16
    assert layers["0"].extra.get("weight_scale") is not None


@pytest.mark.parametrize("seed", [0, 1])
def test_spectral_normed_updates_are_read_on_the_weights_they_train(seed):
    """At a rate that trains it well, a spectral-normed MLP's last layer has a one-entry bias whose update is
    several times its own size: read alone, as the layer's whole update, it looked like a rate far too
    high (and its fix, a rate 10x lower, trains 3x worse)."""
    dbg = _train(_spectral_mlp(seed), lr=0.05, seed=seed)
    loss = dbg.trace.loss.data
    assert float(loss[-30:].mean()) < 0.5 * float(loss[:5].mean())  # it learns
    top = dbg.explain()
    assert not [h for h in top if h.confidence >= 0.5], [(h.cause, h.confidence) for h in top]


def test_a_spectral_normed_mlp_at_ten_times_the_rate_still_diverges_for_its_rate():
    dbg = _train(_spectral_mlp(0), lr=0.5)
    top = dbg.explain()[0]
    assert top.cause == Cause.LEARNING_RATE_TOO_HIGH and top.confidence >= 0.5


@pytest.mark.parametrize("wrap", [P.spectral_norm, P.weight_norm], ids=["spectral_norm", "weight_norm"])
def test_nan_in_a_parametrized_weight_is_found_in_its_layer(wrap):
    """The raw weight a parametrization computes the layer's weight from turns NaN: the replay names the layer
    and its weights, not the module that computes the weight."""
    torch.manual_seed(0)
    model = nn.Sequential(wrap(nn.Linear(8, 32)), nn.ReLU(), wrap(nn.Linear(32, 32)), nn.ReLU(), nn.Linear(32, 1))
    x, y = _data()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(30):
            opt.zero_grad()
            loss = F.mse_loss(model(x[:64]), y[:64])
            loss.backward()
            if step == 10:
                with torch.no_grad():
                    raw = [p for n, p in model[2].named_parameters() if "original" in n]
                    raw[-1].view(-1)[0] = float("nan")
            opt.step()
            dbg.record_loss(loss)
    origin = dbg.trace.nonfinite
    assert origin is not None and (origin.layer, origin.phase) == ("2", "weights")
