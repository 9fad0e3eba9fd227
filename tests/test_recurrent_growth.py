"""Recurrent weights whose scale through time, not their spread, is wrong at the start: a ReLU RNN with its
hidden-to-hidden weights set to 1.3 x the identity (about the spread of an orthogonal init, a spectral
radius of 1.3). The gradient at its first time step is ~30x the one at its last; the first update is many
times the weights and the run ends in NaN. Was `learning_rate_too_high` "lower the learning rate"; named
now at the recurrent layer's init, with the learning rate's reading in its chain. The identity itself (an
IRNN) trains quietly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, train

CONFIDENT = 0.5


class ReluRnn(nn.Module):
    def __init__(self, gain: float, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.rnn = nn.RNN(8, 32, batch_first=True, nonlinearity="relu")
        self.out = nn.Linear(32, 4)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(gain * torch.eye(32))

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1])


def _data(seed: int):
    def data(step: int):
        x = torch.randn(64, 16, 8, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, x[:, -3:, :4].sum(1).argmax(1)
    return data


def _run(gain, seed: int = 0, lr: float = 0.05):
    model = ReluRnn(gain, seed)
    return train(Run(model, torch.optim.SGD(model.parameters(), lr=lr), _data(seed), loss=F.cross_entropy,
                     steps=200))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_state_that_grows_through_time_from_the_start_is_the_recurrent_init(seed):
    hs = _run(1.3, seed).explain()
    top = hs[0]
    assert (top.cause, top.layer, top.step) == ("bad_initialization", "rnn", 0) and top.confidence >= CONFIDENT
    assert "orthogonal_" in top.suggestion and "lower the learning rate" not in top.suggestion
    assert any("back through its 16 time steps" in line for line in top.chain)
    assert not [h for h in hs[1:] if h.confidence >= CONFIDENT]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_identity_that_keeps_the_state_trains_quietly(seed):
    hs = _run(1.0, seed, lr=0.01).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]



def _spoken(n: int = 640, seed: int = 1234):
    """Sequences of 32 frames in which 2-5 labels (of 5) each show as a pattern held for 3-4 frames, with
    their label sequences and lengths: a small speech-like task for CTC."""
    g = torch.Generator().manual_seed(seed)
    proto = torch.randn(6, 8, generator=g) * 1.5
    x = 0.3 * torch.randn(n, 32, 8, generator=g)
    targets, target_len, input_len = torch.zeros(n, 5, dtype=torch.long), torch.zeros(n, dtype=torch.long), \
        torch.zeros(n, dtype=torch.long)
    for i in range(n):
        labels, t = torch.randint(1, 6, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g), 1
        for label in labels.tolist():
            d = int(torch.randint(3, 5, (1,), generator=g))
            x[i, t:t + d] += proto[label]
            t += d + 1
        targets[i, :len(labels)], target_len[i], input_len[i] = labels, len(labels), max(t + 1, 20)
        x[i, input_len[i]:] = 0
    return x, targets, target_len, input_len


class Acoustic(nn.Module):
    """A convolution, then a bidirectional GRU at its default init, read at every frame for CTC."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Sequential(nn.Conv1d(8, 32, 3, padding=1), nn.ReLU())
        self.gru = nn.GRU(32, 48, batch_first=True, bidirectional=True)
        self.out = nn.Linear(96, 6)

    def forward(self, x):
        h, _ = self.gru(self.conv(x.transpose(1, 2)).transpose(1, 2))
        return self.out(h)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_bidirectional_layer_read_at_every_frame_is_no_growth_through_time(seed):
    """A CTC model trained right (its loss from ~7.6 to ~0): the gradient its bidirectional GRU's input gets
    at a frame sums both directions (the backward one has read every later frame), so its rise toward the
    first frame says nothing of either's growth. It was `bad_initialization` at the GRU, 0.8, "keep
    PyTorch's default init" of a layer at its default init."""
    from neuraldbg import NeuralDbg
    x, targets, target_len, input_len = _spoken()
    model = Acoustic(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(250):
            pick = torch.randint(0, len(x), (32,), generator=g)
            log_probs = F.log_softmax(model(x[pick]), dim=-1).transpose(0, 1)
            loss = F.ctc_loss(log_probs, targets[pick], input_len[pick], target_len[pick])
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert dbg.trace.meta.get("through_time"), "the GRU's gradient through time is read"
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()
