"""Weights the model holds and applies in its own forward, which no module hook sees, initialised out of scale:
a classifier whose outputs start far out of scale (the loss at the first step, before any update, says it),
and a recurrence written by hand whose state saturates its tanh from the first step."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes
from zoo import train as train_run


class Scratch(nn.Module):
    """An MLP written from scratch: weights drawn with torch.randn, scaled by 1/sqrt(fan_in) or not."""

    def __init__(self, scaled: bool, sizes=(16, 64, 64, 64, 4)):
        super().__init__()
        self.ws = nn.ParameterList(nn.Parameter(torch.randn(i, o) / (i ** 0.5 if scaled else 1.0))
                                   for i, o in zip(sizes[:-1], sizes[1:]))
        self.bs = nn.ParameterList(nn.Parameter(torch.zeros(o)) for o in sizes[1:])

    def forward(self, x):
        for k, (w, b) in enumerate(zip(self.ws, self.bs)):
            x = x @ w + b
            if k < len(self.ws) - 1:
                x = F.relu(x)
        return x


def train(model, seed, steps=200, data=None, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train_run(Run(model, opt, data or teacher_classes(16, 4, seed=seed), steps=steps))


@pytest.mark.parametrize("seed", [0, 1])
def test_weights_drawn_at_unit_spread_are_the_init_not_the_learning_rate(seed):
    torch.manual_seed(seed)
    hyps = train(Scratch(scaled=False), seed).explain()
    top = hyps[0]
    assert (str(top.cause), top.layer, top.step) == ("bad_initialization", "", 0) and top.confidence >= 0.5
    assert "1/sqrt(fan_in)" in top.suggestion and "before any update" in top.chain[0]
    # what the outputs' scale does next (updates as out of scale, then NaN) is in its chain, no verdict of its own
    assert not [h for h in hyps[1:] if h.confidence >= 0.5]
    torch.manual_seed(seed)
    assert not [h for h in train(Scratch(scaled=True), seed).explain() if h.confidence >= 0.5]


class ScratchRNN(nn.Module):
    """A tanh RNN written by hand; its state-to-state weights drawn with torch.randn, scaled or not."""

    def __init__(self, scaled: bool, d: int = 4, h: int = 64):
        super().__init__()
        self.wx = nn.Parameter(torch.randn(d, h) / d ** 0.5)
        self.wh = nn.Parameter(torch.randn(h, h) * (0.5 / h ** 0.5 if scaled else 1.0))
        self.b = nn.Parameter(torch.zeros(h))
        self.wo = nn.Parameter(torch.randn(h, 2) / h ** 0.5)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.wh.shape[0])
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ self.wx + h @ self.wh + self.b)
        return h @ self.wo


def sequences(step, seed):
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(32, 12, 4, generator=g)
    return x, (x[:, :, 0].sum(dim=1) > 0).long()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_recurrence_by_hand_that_saturates_from_the_start_is_its_weights_not_the_learning_rate(seed):
    def run(scaled):
        torch.manual_seed(seed)
        model = ScratchRNN(scaled)
        return train(model, seed, data=lambda step: sequences(step, seed),
                     opt=torch.optim.Adam(model.parameters(), lr=3e-3)).explain()
    top = run(False)[0]
    assert (str(top.cause), top.layer, top.step) == ("bad_initialization", "", 0) and top.confidence >= 0.5
    assert "1/sqrt(hidden" in top.suggestion and "raise the learning rate" not in top.suggestion
    assert not [h for h in run(True) if h.confidence >= 0.5]
