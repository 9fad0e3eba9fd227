"""Samples of a batch that reach each other's outputs: a recurrence or attention left at batch_first=False
and fed (batch, time, features). One replay of a pass (eval mode) measures how far one sample's output
gradient lands on the other samples' inputs; the module that mixes them is named, with the layout fix."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faultgen.score import contradictions
from neuraldbg import NeuralDbg, mixing
from zoo import Run, train

CONFIDENT = 0.5


class Recurrent(nn.Module):
    def __init__(self, batch_first: bool, cell=nn.LSTM):
        super().__init__()
        torch.manual_seed(0)
        self.rnn = cell(3, 24, batch_first=batch_first)
        self.fc = nn.Linear(24, 2)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


class Attending(nn.Module):
    def __init__(self, batch_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(12, 16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=batch_first)
        self.head = nn.Linear(16, 2)

    def forward(self, tok):
        h = self.emb(tok)
        return self.head((h + self.attn(h, h, h, need_weights=False)[0])[:, 0])


class TwoLayers(nn.Module):
    """Two linear layers; ``before`` applied to the input, ``between`` to the hidden layer (functions, which
    no hook sees)."""

    def __init__(self, n_in: int, before=lambda x: x, between=F.relu):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = nn.Linear(n_in, 32), nn.Linear(32, 3)
        self.before, self.between = before, between

    def forward(self, x):
        return self.l2(self.between(self.l1(self.before(x))))


def hand_normalised() -> nn.Module:
    """A batch normalisation written in functions between two linear layers: a batch statistic, by design."""
    return TwoLayers(8, between=lambda h: F.relu((h - h.mean(0)) / (h.std(0) + 1e-5)))


def _sequences(step: int, n: int = 32):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(n, 12, 3, generator=g)
    return x, (x[:, :, 0].sum(1) > 0).long()


def _tokens(step: int, n: int = 32):
    x = torch.randint(1, 12, (n, 9), generator=torch.Generator().manual_seed(step))
    return x, (x[:, 1:] < 6).float().mean(1).gt(0.5).long()


def _run(model, data, steps: int = 80, lr: float = 3e-3):
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=lr), data, steps=steps))


def _run_args(model, batch, steps: int, lr: float = 1e-2) -> NeuralDbg:
    """Training on passes of several arguments: ``batch(step)`` gives (the model's arguments, targets)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with NeuralDbg(model, optimizer=opt, every=1) as dbg:
        for step in range(steps):
            args, y = batch(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(*args), y)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_a_recurrence_left_at_batch_first_false_is_named_at_the_module(cell):
    dbg = _run(Recurrent(False, cell), _sequences)
    hyps = dbg.explain()
    top = hyps[0]
    assert (top.cause, top.layer) == ("data", "rnn") and top.confidence >= CONFIDENT, dbg.report()
    assert "batch_first=True" in top.suggestion and top.step <= 2
    assert not contradictions(hyps)


def test_attention_left_at_batch_first_false_is_named_at_the_module():
    dbg = _run(Attending(False), _tokens)
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("data", "attn") and top.confidence >= CONFIDENT, dbg.report()
    assert dbg.trace.meta["batch_mixing"]["equivariant"] is True  # attention across the batch ignores its order


@pytest.mark.parametrize("make, data", [(lambda: Recurrent(True), _sequences), (lambda: Attending(True), _tokens)])
def test_the_same_modules_fed_their_layout_stay_quiet(make, data):
    dbg = _run(make(), data)
    assert dbg.trace.meta["batch_mixing"]["spread"] <= mixing.TINY
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_a_batch_statistic_by_design_is_not_a_layout_fault():
    """A hand-written batch normalisation mixes the batch's samples through its statistics, as BatchNorm does
    in training: the replay sees it (the spread is not zero) but the model is a function of the batch as a
    set, between two layers that mix nothing: no verdict."""
    def data(step: int):
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(step))
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    dbg = _run(hand_normalised(), data, lr=1e-2)
    mix = dbg.trace.meta["batch_mixing"]
    assert mix["spread"] > mixing.TINY and mix["equivariant"] is True
    assert not any(h.cause == "data" for h in dbg.explain())


def test_the_replay_leaves_the_users_model_and_random_stream_as_they_were():
    """BatchNorm statistics, dropout's training mode, gradients and the global random stream are what they
    would be without the replay."""
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 3))

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(2))

    def steps(model, watch: bool):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, optimizer=opt, every=1) if watch else torch.autograd.set_grad_enabled(True):
            for _ in range(4):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        return model, torch.rand(1)

    (bare, bare_draw), (watched, watched_draw) = steps(make(), False), steps(make(), True)
    assert torch.equal(bare_draw, watched_draw) and watched.training and watched[3].training
    assert torch.allclose(bare[1].running_mean, watched[1].running_mean)
    for p, q in zip(bare.parameters(), watched.parameters()):
        assert torch.allclose(p, q) and torch.allclose(p.grad, q.grad)


def test_a_model_that_cannot_be_replayed_is_left_alone():
    """A forward that fails in eval mode: nothing is recorded and training goes on."""
    class TrainOnly(nn.Linear):
        def forward(self, x):
            if not self.training:
                raise RuntimeError("this model only trains")
            return super().forward(x)

    torch.manual_seed(0)
    model = TrainOnly(8, 3)
    dbg = _run(model, lambda step: (torch.randn(16, 8), torch.randint(0, 3, (16,))), steps=10)
    assert "batch_mixing" not in dbg.trace.meta and dbg.step == 10


def test_the_replay_runs_on_a_copy_that_neither_counts_nor_prints(capsys):
    """What a forward does besides computing (a call counter, a print) happens on a copy, out of sight: the
    model counts its own passes and the cell shows its own lines."""
    class Counting(Recurrent):
        calls = 0

        def forward(self, x):
            self.calls += 1
            print("pass", self.calls)
            return super().forward(x)

    model = Counting(False)
    dbg = _run(model, _sequences, steps=12)
    assert "batch_mixing" in dbg.trace.meta and model.calls == 12
    assert capsys.readouterr().out.split("\n")[:-1] == [f"pass {i}" for i in range(1, 13)]


def test_a_sample_whose_output_gets_nothing_of_its_own_input_is_mixed(tmp_path):
    """Features stored (features, batch) read back with a view: the middle sample's output can depend on
    other samples only; the most mixed a batch gets, named at the view, and kept through a saved run."""
    def folded(x):  # a view where a transpose was meant
        return x.reshape(len(x), -1).reshape(-1, len(x)).t().reshape(x.shape)

    def data(step: int):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(step))
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    dbg = _run(TwoLayers(16, before=folded), data, steps=40)
    mix = dbg.trace.meta["batch_mixing"]
    assert mix["spread"] == float("inf") and mix["layer"] == "l1"
    top = dbg.explain()[0]
    assert (top.cause, top.layer) == ("data", "l1") and "does not reach it at all" in top.chain[0]
    dbg.save(tmp_path / "folded.ndbg")
    assert NeuralDbg.load(tmp_path / "folded.ndbg").explain()[0].cause == "data"


def test_a_graph_whose_nodes_are_connected_by_design_is_not_replayed():
    """Message passing over ``edge_index`` mixes the rows (nodes) on purpose: no verdict."""
    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x, edge_index):
            h = torch.relu(self.l1(x))
            h = h + torch.zeros_like(h).index_add(0, edge_index[1], h[edge_index[0]])  # neighbours' messages
            return self.l2(h)

    g = torch.Generator().manual_seed(0)
    x, edges = torch.randn(40, 8, generator=g), torch.randint(0, 40, (2, 120), generator=g)
    dbg = _run_args(Graph(), lambda step: ((x, edges), (x[:, 0] > 0).long()), steps=30)
    assert "batch_mixing" not in dbg.trace.meta and not any(h.cause == "data" for h in dbg.explain())


def test_a_padding_mask_goes_in_the_batchs_order_when_it_is_reversed():
    """Attention fed its layout, with a key padding mask per sample: reversing the batch reverses the mask
    too, so the model is equivariant and nothing is said."""
    class Masked(Attending):
        def forward(self, tok, mask):
            h = self.emb(tok)
            return self.head((h + self.attn(h, h, h, key_padding_mask=mask, need_weights=False)[0])[:, 0])

    mask = torch.zeros(32, 9, dtype=torch.bool)
    mask[::3, -3:] = True
    dbg = _run_args(Masked(True), lambda step: ((_tokens(step)[0], mask), _tokens(step)[1]), steps=20, lr=3e-3)
    assert dbg.trace.meta["batch_mixing"]["equivariant"] is True


def test_a_sequence_first_recurrence_fed_its_layout_stays_quiet():
    """nn.LSTM at its default layout fed (time, batch, features), one prediction per step: its rows are time
    steps, and the recurrence runs along them by design."""
    class PerStep(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.rnn, self.fc = nn.LSTM(3, 16), nn.Linear(16, 1)

        def forward(self, x):
            return self.fc(self.rnn(x)[0]).squeeze(-1)

    def data(step: int):
        x = torch.randn(20, 8, 3, generator=torch.Generator().manual_seed(step))
        return x, x[..., 0].cumsum(0) / 5
    dbg = _run(PerStep(), data, steps=40)
    assert "batch_mixing" not in dbg.trace.meta and not any(h.cause == "data" for h in dbg.explain())


def test_batch_statistics_stacked_by_design_are_not_a_layout_fault():
    """Four BatchNorm layers without running statistics (they normalise over the batch in eval mode too, as
    meta-learning code keeps them): the samples mix through the statistics, the model is a function of the
    batch as a set, and nothing is said."""
    torch.manual_seed(0)
    blocks = [m for _ in range(4) for m in (nn.Linear(16, 16), nn.BatchNorm1d(16, track_running_stats=False),
                                            nn.ReLU())]
    model = nn.Sequential(nn.Linear(8, 16), *blocks, nn.Linear(16, 3))

    def data(step: int):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    dbg = _run(model, data, steps=40)
    mix = dbg.trace.meta["batch_mixing"]
    assert mix["spread"] > 1.0 and mix["equivariant"] is True
    assert not any(h.cause == "data" for h in dbg.explain())


def test_the_replay_restores_pythons_and_numpys_random_streams():
    import random

    import numpy as np

    class Noisy(Recurrent):
        def forward(self, x):
            return super().forward(x) + 0.0 * random.random() + 0.0 * float(np.random.rand())

    def draws(watch: bool):
        random.seed(0)
        np.random.seed(0)
        model = Noisy(False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with NeuralDbg(model, optimizer=opt, every=1) if watch else torch.autograd.set_grad_enabled(True):
            for step in range(4):
                x, y = _sequences(step)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        return random.random(), float(np.random.rand())

    assert draws(True) == draws(False)


def test_a_contrastive_models_similarities_are_not_a_layout_fault():
    """Two towers and a (batch, batch) matrix of similarities, each row's target its own column: every row
    depends on every sample by design (the matrix follows the batch's order in both dimensions)."""
    class TwoTowers(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.text, self.image = nn.Embedding(12, 16), nn.Linear(8, 16)

        def forward(self, tok, img):
            t = F.normalize(self.text(tok).mean(1), dim=1)
            return 10.0 * t @ F.normalize(self.image(img), dim=1).t()

    def pairs(step: int):
        tok = _tokens(step, n=16)[0]
        return (tok, F.one_hot(tok[:, 1] % 8, 8).float()), torch.arange(16)
    dbg = _run_args(TwoTowers(), pairs, steps=30)
    assert "batch_mixing" not in dbg.trace.meta and not any(h.cause == "data" for h in dbg.explain())


class _Stored(nn.Module):
    """Feeds its layers the batch it saw first, ever after (a cache meant for something else)."""

    def __init__(self):
        super().__init__()
        self.net = TwoLayers(8)
        self.first = None

    def forward(self, x):
        if self.first is None:
            self.first = x.detach().clone()
        return self.net(self.first)


def _flat_classes(step: int, n: int = 32):
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(step))
    return x, (x[:, :3]).argmax(1)


@pytest.mark.parametrize("make", [lambda: TwoLayers(8, before=torch.zeros_like),
                                  lambda: TwoLayers(8, before=torch.randn_like), _Stored],
                         ids=["zeros_like", "randn_like", "stored-batch"])
def test_a_forward_that_computes_without_its_input_is_named_from_the_replay(make):
    """The model's output is computed without its input (replaced on the way): the replay finds the input
    outside the output's graph. A plateau from the first step with the forward's fix, not a larger lr."""
    dbg = _run(make(), _flat_classes, steps=200)
    assert dbg.trace.meta["batch_mixing"].get("unused") is True
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= 0.5, dbg.report()
    assert "model(x) changes when x does" in top.suggestion and "learning rate" not in top.suggestion
    assert contradictions(dbg.explain()) == []


@pytest.mark.parametrize("before", [lambda x: x, lambda x: torch.from_numpy(x.numpy()), lambda x: x.detach()],
                         ids=["as-is", "numpy-round-trip", "detached"])
def test_a_forward_that_reads_its_input_is_quiet_even_outside_its_graph(before):
    """An input taken out of the graph on the way in (a preprocessing through numpy) is still what the outputs
    are computed from: the batch in reverse order gives them in reverse order."""
    dbg = _run(TwoLayers(8, before=before), _flat_classes, steps=200)
    assert not dbg.trace.meta.get("batch_mixing", {}).get("unused")
    assert not [h for h in dbg.explain() if h.confidence >= 0.5]
