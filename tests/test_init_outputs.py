"""A classifier whose outputs start far out of scale, in weights no module hook sees (held by the model and
applied in its forward): the loss at the first step, before any update, says it."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from zoo import teacher_classes


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


def train(model, seed, steps=200):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = teacher_classes(16, 4, seed=seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


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
