"""One module applied many times in each forward pass, each application reading the one before (a block
shared across depth, as ALBERT does): module hooks see one layer, yet the gradient passes back through every
application. Where it fades there, the place is that layer, not "the forward's own code" between it and the
layer before it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import Cause, NeuralDbg
from neuraldbg.layers import Kind, LayerInfo

CONFIDENT = 0.5


class Shared(nn.Module):
    """``inp``, then ``block`` applied ``times`` times (tanh after each; with ``residual``, inside a residual
    connection and a LayerNorm), then ``head``."""

    def __init__(self, times: int, residual: bool):
        super().__init__()
        self.inp, self.block, self.head = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)
        self.norm = nn.LayerNorm(64)
        self.times, self.residual = times, residual

    def forward(self, x):
        h = self.inp(x)
        for _ in range(self.times):
            h = self.norm(h + torch.tanh(self.block(h))) if self.residual else torch.tanh(self.block(h))
        return self.head(h)


class Siamese(nn.Module):
    """One encoder applied side by side to two inputs; the head reads both codes."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(torch.cat([self.enc(x), self.enc(x.flip(0))], dim=1))


def _train(model: nn.Module, seed: int, steps: int = 300) -> NeuralDbg:
    g = torch.Generator().manual_seed(100 + seed)
    w = torch.randn(16, 4, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(steps):
            x = torch.randn(64, 16, generator=g)
            loss = F.cross_entropy(model(x), (x @ w).argmax(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("seed", [0, 1])
def test_a_gradient_that_fades_through_a_blocks_applications_is_named_at_the_block(seed):
    torch.manual_seed(seed)
    dbg = _train(Shared(times=24, residual=False), seed)
    assert {layer.name: layer.extra.get("applications") for layer in dbg.trace.layers}["block"] == 24
    top = dbg.explain()[0]  # (how confident depends on how far the loss fails: the head still learns)
    assert (top.cause, top.layer, top.step) == (Cause.VANISHING_GRADIENTS, "block", 0), dbg.report()
    assert "applied 24 times" in " ".join(top.chain) and "forward's own code" not in " ".join(top.chain)
    assert "applications of `block`" in top.suggestion


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_block_inside_a_residual_and_a_norm_is_healthy(seed):
    torch.manual_seed(seed)
    dbg = _train(Shared(times=24, residual=True), seed)
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_an_encoder_applied_side_by_side_is_no_chain():
    torch.manual_seed(0)
    dbg = _train(Siamese(), 0, steps=40)
    assert not [layer.name for layer in dbg.trace.layers if "applications" in layer.extra]


class Cells(nn.Module):
    """A recurrent cell stepped by hand over the sequence: its state is its second input (its first, the step's
    own input, is no chain), and an LSTM cell returns a tuple."""

    def __init__(self, cell: nn.Module):
        super().__init__()
        self.cell, self.head = cell, nn.Linear(16, 4)

    def forward(self, x):
        h = c = torch.zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            if isinstance(self.cell, nn.LSTMCell):
                h, c = self.cell(x[:, t], (h, c))
            else:
                h = self.cell(x[:, t], h)
        return self.head(h)


class Albert(nn.Module):
    """One Transformer layer applied six times (its attention returns a tuple; a dozen operations run between
    two applications of each of its parts)."""

    def __init__(self):
        super().__init__()
        self.inp, self.head = nn.Linear(16, 32), nn.Linear(32, 4)
        self.block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)

    def forward(self, x):
        h = self.inp(x)
        for _ in range(6):
            h = self.block(h)
        return self.head(h.mean(1))


def _counted(model: nn.Module, x: torch.Tensor) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(3):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return {layer.name: layer.extra["applications"] for layer in dbg.trace.layers if "applications" in layer.extra}


@pytest.mark.parametrize("cell", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_a_cell_stepped_over_time_is_a_chain_of_its_steps(cell):
    torch.manual_seed(0)
    assert _counted(Cells(cell(8, 16)), torch.randn(8, 10, 8)) == {"cell": 10}


def test_a_transformer_layer_shared_across_depth_counts_each_of_its_parts():
    torch.manual_seed(0)
    counted = _counted(Albert(), torch.randn(8, 10, 16))
    assert counted["block.self_attn"] == counted["block.linear1"] == counted["block.linear2"] == 6
    assert "inp" not in counted and "head" not in counted


def test_the_applications_are_kept_in_a_saved_trace():
    info = LayerInfo(index=0, name="block", type_name="Linear", kind=Kind.LINEAR, extra={"applications": 24})
    assert LayerInfo.from_dict(info.to_dict()).extra["applications"] == 24
