"""A dropout that drops all of its input in training (``p=1.0``: a keep probability passed as the share to
drop, or a schedule of ``p`` run up to 1) is dead units at the dropout, whose chain holds the gradients that
vanish before it; one that drops most of it (0.9) is the plateau's reason. Read from nn.Dropout modules and
from functional dropouts alike (the function mode sees ``F.dropout``), and named where the dropout is: the
module it follows, or is. Usual rates, and a dropout off outside training, stay quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


class Mlp(nn.Module):
    """ReLU MLP with a dropout after its first layer, as a module or a function."""

    def __init__(self, p, functional: bool, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)
        self.p, self.functional = p, functional
        self.drop = nn.Dropout(p if isinstance(p, float) else 0.0)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = F.dropout(h, self.p, self.training) if self.functional else self.drop(h)
        return self.fc3(F.relu(self.fc2(h)))


class Cnn(nn.Module):
    """Conv-BatchNorm blocks written with functions, a dropout on the second norm's output."""

    def __init__(self, p: float, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.conv1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)
        self.p = p

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(F.dropout(self.bn2(self.conv2(h)), self.p, self.training))
        return self.head(h.mean(dim=(2, 3)))


def _mlp(p, functional: bool, seed: int = 0, steps: int = 300, schedule=None):
    model = Mlp(p, functional, seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def before(step, _):
        if schedule is not None:
            model.p = model.drop.p = schedule(step)
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), steps=steps, before_step=before)).explain()


@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_dropout_of_everything_is_dead_units_at_the_dropout(functional, seed):
    hs = _mlp(1.0, functional, seed)
    top = hs[0]
    assert top.cause == "dead_units" and top.confidence >= CONFIDENT
    assert top.layer == ("fc1" if functional else "drop")  # where it drops: after fc1's activation, or the module
    assert top.suggestion.startswith("give the dropout")
    assert "1 - keep_prob" in top.suggestion
    # what it blocks is in its chain, not a verdict of its own
    assert not [h for h in hs if h.confidence >= CONFIDENT and h.cause == "vanishing_gradients"]
    assert any("vanishing" in line and "fc1" in line for line in top.chain)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_functional_dropout_of_a_norms_output_is_named_at_the_norm(seed):
    """``F.relu(F.dropout(self.bn2(...), 1.0))``: the ReLU reads the dropout, which drops bn2's output."""
    model = Cnn(1.0, seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def data(step):
        x, y = teacher_classes(64, 4, seed=seed)(step)
        return x.view(-1, 1, 8, 8), y
    top = train(Run(model, opt, data, steps=200)).explain()[0]
    assert top.cause == "dead_units" and top.confidence >= CONFIDENT and top.layer == "bn2"
    assert top.suggestion.startswith("give the dropout after `bn2`")


def test_a_dropout_schedule_run_up_to_one_is_named_from_where_it_rose():
    """p from 0 to 1 by step 180 of 300: the loss gives way as fewer elements pass, before none do."""
    hs = _mlp(0.0, True, schedule=lambda step: min(1.0, step / 180))
    top = hs[0]
    assert top.cause == "dead_units" and top.confidence >= CONFIDENT and top.layer == "fc1"
    assert top.suggestion.startswith("keep the dropout after `fc1` at p=0.5 or below")
    assert not [h for h in hs if h.confidence >= CONFIDENT and h.cause.startswith("learning_rate")]


@pytest.mark.parametrize("p", [0.9, 0.95])
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_dropout_of_most_of_the_input_comes_first_in_the_plateaus_fix(p, functional, seed):
    """A plateau under a dropout of 0.9 or more names it first, as the likely reason, and keeps the general
    checks after it (a loss flat for another reason, random labels, would be so with any dropout). At 0.95
    the loss stays flat at every seed; at 0.9 one seed's comes down 5% over the run, no plateau."""
    hs = _mlp(p, functional, seed)
    plateaus = [h for h in hs if h.cause == "loss_plateau"]
    if p == 0.95:
        assert hs and hs[0] is plateaus[0] and hs[0].confidence >= CONFIDENT
    where = "after `fc1`" if functional else "`drop`"
    for h in plateaus:
        assert h.suggestion.startswith(f"lower the dropout {where} from p={p:g} if it is not meant that strong")
        assert "check that the model can learn at all" in h.suggestion
    assert not [h for h in hs if h.confidence >= CONFIDENT and h.cause != "loss_plateau"]


def test_a_jump_of_the_rate_to_one_is_no_schedule():
    """p held at 0.1, then set to 1.0 at once at step 150: dated there, with the keep probability's fix."""
    hs = _mlp(0.1, True, schedule=lambda step: 0.1 if step < 150 else 1.0)
    top = hs[0]
    assert top.cause == "dead_units" and top.confidence >= CONFIDENT and top.layer == "fc1"
    assert 150 <= top.step <= 200
    assert top.suggestion.startswith("give the dropout after `fc1` the share to drop")


def test_two_dropouts_of_one_place_read_as_the_one_that_drops_most():
    """A place with a dropout that drops nothing beside one that drops everything: the rate read per pass is
    the larger (the two no longer take turns in the record)."""
    class Two(Mlp):
        def forward(self, x):
            h = F.relu(self.fc1(x))
            h = F.dropout(F.dropout(h, 0.0, self.training), 1.0, self.training)
            return self.fc3(F.relu(self.fc2(h)))
    model = Two(0.0, True, 0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    dbg = train(Run(model, opt, teacher_classes(16, 4), steps=300))
    assert [r[1] for r in dbg.trace.meta["dropout"]["fc1"]] == [1.0]
    assert dbg.explain()[0].cause == "dead_units"


def test_a_dropout_called_inside_a_modules_forward_is_placed_in_it():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 64)

        def forward(self, x):
            return F.dropout(F.relu(self.fc(x)) * 1.0, 1.0, self.training)
    torch.manual_seed(0)
    model = nn.Sequential(Block(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    top = train(Run(model, opt, teacher_classes(16, 4), steps=300)).explain()[0]
    assert top.cause == "dead_units" and top.layer == "0"
    assert top.suggestion.startswith("give the dropout in `0` the share to drop")


@pytest.mark.parametrize("p,functional", [(0.1, False), (0.5, True), (0.5, False)])
def test_usual_dropout_rates_stay_quiet(p, functional):
    assert not [h for h in _mlp(p, functional) if h.confidence >= CONFIDENT]


def test_a_dropout_of_one_outside_training_stays_quiet():
    """``F.dropout(h, 1.0, training=False)`` (a model evaluated, or a dropout switched off) drops nothing."""
    class Off(Mlp):
        def forward(self, x):
            h = F.dropout(F.relu(self.fc1(x)), 1.0, training=False)
            return self.fc3(F.relu(self.fc2(h)))
    model = Off(0.0, True, 0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    hs = train(Run(model, opt, teacher_classes(16, 4), steps=300)).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]


class Attend(nn.Module):
    """Tokens and their positions -> one attention layer (``nn.MultiheadAttention``, or
    ``F.scaled_dot_product_attention`` with its own dropout) -> the first position's output -> classes; the
    task needs the attention and the positions (the class of the token the first one points at)."""

    def __init__(self, p: float, sdpa: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head, self.p, self.sdpa = nn.Embedding(8, 32), nn.Linear(32, 4), p, sdpa
        self.mha = nn.MultiheadAttention(32, 2, dropout=p, batch_first=True)
        self.qkv = nn.Linear(32, 96)
        self.pos = nn.Embedding(6, 32)

    def forward(self, x):
        h = self.emb(x) + self.pos(torch.arange(x.shape[1]))
        if self.sdpa:
            q, k, v = self.qkv(h).chunk(3, dim=-1)
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        else:
            a = self.mha(h, h, h, need_weights=False)[0]
        return self.head(a[:, 0])


def _tokens(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, 8, (64, 6), generator=g)
    x[:, 0] = torch.randint(1, 6, (64,), generator=g)
    return x, x.gather(1, x[:, :1]).squeeze(1) % 4


@pytest.mark.parametrize("sdpa", [False, True], ids=["multihead", "sdpa"])
def test_an_attention_that_drops_all_its_weights_is_read(sdpa):
    """``nn.MultiheadAttention(dropout=1.0)``: dead units in it. ``F.scaled_dot_product_attention`` with
    ``dropout_p=1.0`` in the model's own forward: its rate is read and its consequence is in the top
    hypothesis's chain (the head's shrunk scale, which the dropout makes, is named first there)."""
    model = Attend(1.0, sdpa)
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=3e-3), _tokens, steps=200))
    assert dbg.trace.meta["dropout"] == {("" if sdpa else "mha"): [[0, 1.0]]}
    top = dbg.explain()[0]
    assert top.confidence >= CONFIDENT and top.cause == "dead_units" and top.layer == ("" if sdpa else "mha")
    if not sdpa:
        assert top.suggestion.startswith("give the dropout in `mha` the share to drop")
    assert any("drops 100% of its input" in line for line in top.chain)
    healthy = Attend(0.1, sdpa)
    assert not [h for h in train(Run(healthy, torch.optim.Adam(healthy.parameters(), lr=3e-3), _tokens,
                                     steps=200)).explain() if h.confidence >= CONFIDENT]
