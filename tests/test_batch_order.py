"""Batches whose classes are grouped (a data set sorted by label, read without shuffling): the classes of a
sampled batch are read off the gradient at the model's output, and a run whose batches each hold one or
two classes of many is named ``data`` with a fix that shuffles."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faultgen.score import contradictions
from neuraldbg import NeuralDbg
from zoo import Run, train

CONFIDENT = 0.5


def _pool(n_in: int, n_out: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_in, n_out, generator=g)
    x = torch.randn(n, n_in, generator=g)
    return x, (x @ w).argmax(1)


def _epochs(x, y, batch: int, order: str):
    """Batches read in a fixed order every epoch: as stored (``"sorted"`` by label) or drawn at random."""
    if order == "sorted":
        idx = torch.sort(y, stable=True).indices
        x, y = x[idx], y[idx]
    per_epoch = len(y) // batch

    def data(step: int):
        if order == "shuffled":
            pick = torch.randperm(len(y), generator=torch.Generator().manual_seed(step))[:batch]
            return x[pick], y[pick]
        i = (step % per_epoch) * batch
        return x[i:i + batch], y[i:i + batch]
    return data


def _mlp(n_in: int, n_out: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_out))


def _classes_run(order: str, seed: int = 0, steps: int = 200, batch: int = 32, lr: float = 0.1,
                 n_out: int = 5) -> NeuralDbg:
    x, y = _pool(16, n_out, 40 * batch)
    model = _mlp(16, n_out, seed)
    return train(Run(model, torch.optim.SGD(model.parameters(), lr=lr), _epochs(x, y, batch, order), steps=steps))


def _ordered(dbg) -> list:
    return [e for e in dbg.analysis().events if e.after == "ordered"]


def test_the_classes_read_off_the_output_gradient_are_the_batches_classes():
    """Every sampled batch's recorded classes are its labels' counts: a cross-entropy's gradient at the
    logits pushes up the sample's class and no other (weighted by class, too)."""
    x, y = _pool(16, 5, 640)
    data = _epochs(x, y, 32, "shuffled")
    weights = torch.tensor([1.0, 3.0, 1.0, 0.5, 2.0])
    for loss in (F.cross_entropy, lambda out, t: F.cross_entropy(out, t, weight=weights)):
        model = _mlp(16, 5, 0)
        dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.05), data, loss=loss, steps=40,
                        options={"every": 3}))
        rows = dbg.trace.meta["batch_classes"]
        assert len(rows) >= 10
        for step, found, counts, *_ in rows:
            truth = torch.bincount(data(step)[1])
            assert found == torch.nonzero(truth).flatten().tolist() and counts == truth[truth > 0].tolist()


@pytest.mark.parametrize("case", ["smoothed", "soft", "ignored", "head_outside"])
def test_targets_that_are_not_one_class_per_read_row_are_left_out(case):
    """Label smoothing, probability targets, an ignored index and a head outside the watched model give the
    output a gradient that is not a hard target's: those rows (or the whole loss) are not read, so no batch
    looks ordered."""
    x, y = _pool(16, 5, 640)
    data = _epochs(x, y, 32, "shuffled")
    model, head = _mlp(16, 5, 0), nn.Linear(5, 5)
    loss = {"smoothed": lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1),
            "soft": lambda o, t: F.cross_entropy(o, F.one_hot(t, 5).float() * 0.6 + 0.08),
            "ignored": lambda o, t: F.cross_entropy(o, torch.where(torch.arange(len(t)) % 2 == 0, t, -100)),
            "head_outside": lambda o, t: F.cross_entropy(head(o), t)}[case]
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.05), data, loss=loss, steps=40,
                    options={"every": 2}))
    rows = dbg.trace.meta.get("batch_classes") or []
    if case == "ignored":  # the rows kept are the samples not ignored, and only they
        assert rows and all(sum(n) == 16 for _, _, n, *_ in rows)
    else:
        assert rows == []
    assert not _ordered(dbg)


def test_a_binary_label_is_read_off_the_sign_of_the_output_gradient():
    x, y = _pool(16, 2, 640)
    data = _epochs(x, y.float(), 32, "shuffled")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.05), data, steps=30,
                    loss=lambda out, t: F.binary_cross_entropy_with_logits(out.squeeze(-1), t),
                    options={"every": 3}))
    rows = dbg.trace.meta["batch_classes"]
    assert rows
    for step, found, counts, *_ in rows:
        ones = int(data(step)[1].sum())
        assert dict(zip(found, counts)) == {c: n for c, n in ((0, 32 - ones), (1, ones)) if n}


def test_a_sequence_models_positions_are_not_read_as_a_batchs_samples():
    """A language model's loss over every position (outputs flattened to (N * T, vocab)): its rows are not
    the input's samples, and their tokens, correlated within a sequence, are no batch of classes."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(12, 16), nn.Linear(16, 12)
    model = nn.Sequential(emb, nn.Tanh(), head)
    tokens = torch.randint(0, 12, (16, 9))
    run = Run(model, torch.optim.Adam(model.parameters(), lr=1e-2), lambda step: (tokens[:, :-1], tokens[:, 1:]),
              loss=lambda out, t: F.cross_entropy(out.reshape(-1, 12), t.reshape(-1)), steps=20)
    assert "batch_classes" not in train(run).trace.meta


@pytest.mark.parametrize("seed", [0, 1])
def test_data_sorted_by_label_is_named_with_a_shuffle(seed):
    """Five classes sorted by label, read in that order every epoch: the loss jumps at each change of class,
    which read as a learning rate too high; now the data, from its first batches, with the fix."""
    dbg = _classes_run("sorted", seed=seed)
    hyps = dbg.explain()
    top = hyps[0]
    assert (top.cause, top.layer) == ("data", "input") and top.confidence >= CONFIDENT, dbg.report()
    assert "shuffle" in top.suggestion.lower() and top.step <= 20
    assert not any(h.cause == "learning_rate_too_high" and h.confidence >= CONFIDENT for h in hyps[1:])
    assert not contradictions(hyps)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_data_shuffled_stays_quiet(seed):
    dbg = _classes_run("shuffled", seed=seed)
    assert not _ordered(dbg) and not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_imbalanced_classes_and_small_batches_drawn_at_random_are_not_ordered():
    """Batches of 8 from classes 90/10 hold one class most of the time by chance: the comparison is with
    what random batches of their size would hold, not with the run's number of classes."""
    x = torch.randn(4000, 16, generator=torch.Generator().manual_seed(3))
    y = (torch.rand(4000, generator=torch.Generator().manual_seed(4)) < 0.1).long()
    model = _mlp(16, 2, 0)
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.05), _epochs(x, y, 8, "shuffled"), steps=150,
                    options={"every": 2}))
    assert len(dbg.trace.meta["batch_classes"]) >= 50 and not _ordered(dbg)


def test_the_order_threshold_moves_the_verdict():
    """``batch_order`` decides: past the batches' measured distance from the run's mix, nothing is ordered."""
    dbg = _classes_run("sorted")
    assert _ordered(dbg)
    assert not any(h.cause == "data" for h in dbg.reanalyze(batch_order=100.0))
    assert not _ordered(dbg)


def test_a_saved_run_keeps_its_batches_classes(tmp_path):
    """The post-mortem of a saved run names the order as the live session did."""
    dbg = _classes_run("sorted")
    dbg.save(tmp_path / "sorted.ndbg")
    loaded = NeuralDbg.load(tmp_path / "sorted.ndbg")
    assert loaded.trace.meta["batch_classes"] == dbg.trace.meta["batch_classes"]
    assert (loaded.explain()[0].cause, loaded.explain()[0].step) == (dbg.explain()[0].cause, dbg.explain()[0].step)


def _chance_run(dropout: float, steps: int = 300, scale: float = 8.0, seed: int = 0) -> NeuralDbg:
    """Ten classes; the last layer's weights x``scale`` (8: a loss that starts far above chance), dropout on
    both hidden layers."""
    x, y = _pool(16, 10, 4096)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(dropout), nn.Linear(128, 128), nn.ReLU(),
                          nn.Dropout(dropout), nn.Linear(128, 10))
    with torch.no_grad():
        model[-1].weight.mul_(scale)
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _epochs(x, y, 64, "shuffled"),
                     steps=steps))


def test_a_loss_that_comes_down_from_far_above_chance_to_it_is_no_progress():
    """Dropout at 0.95 after outputs of a large initial scale: the loss falls from ~18 for the whole run but
    never below what predicting the classes' frequencies gives (their entropy, read from the batches'
    classes). It read as progress; the same model without the dropout learns and stays quiet."""
    from neuraldbg.health import chance_level

    failing = _chance_run(0.95)
    x, y = _pool(16, 10, 4096)
    p = torch.bincount(y).float() / len(y)
    assert chance_level(failing.trace) == pytest.approx(float(-(p[p > 0] * p[p > 0].log()).sum()), rel=0.05)
    top = failing.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT, failing.report()
    assert top.suggestion.startswith("lower the dropout `2` from p=0.95")  # what keeps it there
    assert "chance" in top.chain[0]
    learns = _chance_run(0.0)
    assert not [h for h in learns.explain() if h.confidence >= CONFIDENT], learns.report()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_comes_down_from_a_little_above_chance_to_it_is_no_progress(seed):
    """The same dropout at PyTorch's default init: the dropout's noise starts the loss a little above chance
    (~1.2x), and it comes down to chance and stays there. Coming down to chance learns nothing of the input,
    however far above it the loss starts."""
    top = _chance_run(0.95, scale=1.0, seed=seed).explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("lower the dropout `2` from p=0.95")
    assert "chance" in top.chain[0]
    learns = _chance_run(0.0, scale=1.0, seed=seed)
    assert not [h for h in learns.explain() if h.confidence >= CONFIDENT], learns.report()


@pytest.mark.parametrize("loss", [lambda o, t: F.cross_entropy(o, t, reduction="sum"),
                                  lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1),
                                  lambda o, t: F.cross_entropy(o, t) + 0.1 * o.pow(2).mean()])
def test_chance_is_not_taken_for_a_loss_that_is_not_a_plain_mean_cross_entropy(loss):
    from neuraldbg.health import chance_level

    x, y = _pool(16, 5, 640)
    model = _mlp(16, 5, 0)
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.01), _epochs(x, y, 32, "shuffled"), loss=loss,
                    steps=20, options={"every": 2}))
    assert chance_level(dbg.trace) != chance_level(dbg.trace)  # NaN


@pytest.mark.parametrize("weighted", [lambda o, t: F.cross_entropy(o, t, weight=torch.tensor([1.0, 9.0])),
                                      lambda o, t: F.binary_cross_entropy_with_logits(
                                          o[:, 1] - o[:, 0], t.float(), pos_weight=torch.tensor(9.0))])
def test_a_weighted_loss_has_no_chance_level(weighted):
    """Weights per class move the loss of predicting the classes' frequencies away from their entropy: an
    imbalanced task learnt under class weights is not held against it."""
    from neuraldbg.health import chance_level

    x = torch.randn(2048, 16, generator=torch.Generator().manual_seed(3))
    y = ((x[:, 0] > 1.3) | (x[:, 1] > 2.5)).long()  # ~10% positives
    model = _mlp(16, 2, 0)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _epochs(x, y, 64, "shuffled"),
                    loss=weighted, steps=150))
    assert chance_level(dbg.trace) != chance_level(dbg.trace)  # NaN
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


@pytest.mark.parametrize("case", ["bf16_autocast", "log_softmax_last"])
def test_classes_are_read_under_bfloat16_and_from_a_models_log_probabilities(case):
    """bfloat16 keeps 8 bits: the hard-target check reads as precisely as the gradient was computed. A model
    that ends in nn.LogSoftmax, trained with F.nll_loss (the MNIST example's style), has its classes read
    too."""
    x, y = _pool(16, 5, 640)
    data = _epochs(x, y, 32, "shuffled")
    model = _mlp(16, 5, 0)
    if case == "log_softmax_last":
        model = nn.Sequential(model, nn.LogSoftmax(dim=1))

    def loss(out, t):
        return F.nll_loss(out, t) if case == "log_softmax_last" else F.cross_entropy(out, t)

    class Autocast(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.inner(x)

    run_model = Autocast(model) if case == "bf16_autocast" else model
    dbg = train(Run(run_model, torch.optim.SGD(run_model.parameters(), lr=0.05), data, loss=loss, steps=40,
                    options={"every": 3}))
    rows = dbg.trace.meta["batch_classes"]
    assert len(rows) >= 10
    read = sum(sum(n) for _, _, n, *_ in rows)
    assert read >= 0.8 * 32 * len(rows)  # most rows read
    for step, found, counts, *_ in rows:  # and every row read right
        truth = torch.bincount(data(step)[1], minlength=5).tolist()
        assert all(truth[c] >= k for c, k in zip(found, counts))


def test_an_imbalanced_task_that_starts_at_a_uniform_guess_is_not_held_to_chance():
    """5% positives: a model initialised as usual starts at ln 2, far above the classes' entropy (0.2), and
    learns a weak signal a little below it. That start is where a uniform guess is, not a large scale:
    progress counts from the start, and the run stays quiet."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8192, 16, generator=g)
    y = ((0.4 * x[:, 0] + torch.randn(8192, generator=g)) > 1.9).long()
    model = _mlp(16, 2, 0)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), _epochs(x, y, 128, "shuffled"),
                    steps=400))
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT], dbg.report()


def test_a_batch_handed_over_as_a_dict_has_its_classes_read():
    """``model(batch)`` with the batch a dict of tensors: its rows are the first tensor's."""
    class FromDict(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _mlp(16, 5, 0)

        def forward(self, batch):
            return self.net(batch["x"])

    x, y = _pool(16, 5, 640)
    data = _epochs(x, y, 32, "sorted")
    model = FromDict()
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda s: ({"x": data(s)[0]}, data(s)[1]),
                    steps=200))
    assert dbg.trace.meta["batch_classes"] and dbg.explain()[0].cause == "data"


class _Graph(nn.Module):
    """A graph convolution net written by hand (messages summed with ``index_add_``), run on the whole graph."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(n_in, 64), nn.Linear(64, 64), nn.Linear(64, n_out)])

    def forward(self, x, edges, weights):
        for i, lin in enumerate(self.lins):
            h = lin(x)
            x = torch.zeros_like(h).index_add_(0, edges[1], h[edges[0]] * weights[:, None])
            x = F.relu(x) if i < len(self.lins) - 1 else x
        return x


def _graph(n: int = 400, k: int = 4, seed: int = 1234):
    """Nodes of k classes, linked mostly within a class, with self loops and the symmetric normalisation."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.arange(n) % k)[torch.randperm(n, generator=g)]
    x = 0.35 * torch.randn(k, 16, generator=g)[y] + torch.randn(n, 16, generator=g)
    same = (y[:, None] == y[None, :]).float()
    adj = torch.triu((torch.rand(n, n, generator=g) < same * 0.06 + (1 - same) * 0.006).float(), 1)
    edges = torch.cat([(adj + adj.t()).nonzero().t(), torch.arange(n).repeat(2, 1)], 1)
    deg = torch.zeros(n).index_add_(0, edges[1], torch.ones(edges.shape[1]))
    return x, y, edges, deg[edges[0]].rsqrt() * deg[edges[1]].rsqrt(), torch.randperm(n, generator=g)[:80]


@pytest.mark.parametrize("seed", [0, 1])
def test_nodes_outside_a_graphs_training_mask_are_not_read_as_its_batch(seed):
    """Full-batch training of a graph net on 80 labelled nodes of 400, under Adam at 1.0 (a rate copied from
    an SGD setting): the predictions saturate everywhere, and the classes read off the output's gradient
    change with what the model fits. The one batch is the same every step: no order of the data to read,
    and the rate is named."""
    x, y, edges, weights, train_idx = _graph()
    torch.manual_seed(seed)
    model = _Graph(16, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1.0)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(200):
            opt.zero_grad()
            loss = F.cross_entropy(model(x, edges, weights)[train_idx], y[train_idx])
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    assert not _ordered(dbg)
    top = dbg.explain()[0]
    assert top.cause == "learning_rate_too_high" and top.confidence >= CONFIDENT, dbg.report()


def test_one_hot_inputs_read_in_label_order_are_still_ordered():
    """One-hot inputs have the same mean, spread and largest value in every batch; read sorted by label they
    are still different batches, each of one class: ordered, named with the shuffle."""
    g = torch.Generator().manual_seed(0)
    category = torch.randint(0, 16, (1280,), generator=g)
    x, y = F.one_hot(category, 16).float(), category % 4
    model = _mlp(16, 4, 0)
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.1), _epochs(x, y, 32, "sorted"), steps=200))
    assert _ordered(dbg)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.confidence >= CONFIDENT and "shuffle" in top.suggestion


def test_a_fixed_order_sampled_at_a_multiple_of_its_length_is_a_few_batches_read_again():
    """Batches read in a fixed order (a cycle of 32), their labels drawn at random, sampled every 16 steps:
    the samples read the same two batches again and again, and both happen to hold a class mix far from the
    run's (44 of one class in 64: one class in one, the other in the other). A batch read again is one
    reading of the data's order, not another."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2048, 20, generator=g), torch.randint(0, 2, (2048,), generator=g)
    for b, c in ((0, 1), (16, 0)):
        y[b * 64:(b + 1) * 64] = torch.where(torch.randperm(64, generator=g) < 44, c, 1 - c)

    def data(step: int):
        i = (step * 64) % len(y)
        return x[i:i + 64], y[i:i + 64]

    model = _mlp(20, 2, 0)
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=0.1), data, steps=400, options={"every": 16}))
    prints = {r[3] for r in dbg.trace.meta["batch_classes"]}
    assert len(dbg.trace.meta["batch_classes"]) >= 20 and len(prints) <= 3
    assert not _ordered(dbg) and not any(h.cause == "data" for h in dbg.explain())
