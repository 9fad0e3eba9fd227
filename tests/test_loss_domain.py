"""NaN/Inf made by the loss's own arithmetic: a log taken of a probability that rounded to exactly 0 or 1
(a hand-written binary cross-entropy, ``torch.log(F.softmax(...))``). The model's output is finite; the
targets are fine. Named ``non_finite`` in the loss with a fix that computes the loss from the logits,
where NaN targets under the same loss stay the data's."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faultgen.score import contradictions
from neuraldbg import NeuralDbg, losspath
from neuraldbg.trace import NonFiniteOrigin
from zoo import Run, train

CONFIDENT = 0.5


def _binary(batch: int = 64, seed: int = 0, nan_targets_at: int | None = None):
    """A linearly separable binary task: a model trained on it grows confident logits."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, generator=g)

    def data(step: int):
        gs = torch.Generator().manual_seed(seed * 1000 + step)
        x = torch.randn(batch, 16, generator=gs)
        y = (x @ w > 0).float()
        if nan_targets_at is not None and step >= nan_targets_at:
            y[0] = float("nan")
        return x, y
    return data


def _classes(batch: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 4, generator=g)

    def data(step: int):
        x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(seed * 1000 + step))
        return x, (x @ w).argmax(1)
    return data


def _mlp(n_out: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_out))


def hand_bce(out, y):
    p = torch.sigmoid(out.squeeze(1))
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def bce_logits(out, y):
    return F.binary_cross_entropy_with_logits(out.squeeze(1), y)


def log_of_softmax(out, y):
    return F.nll_loss(torch.log(F.softmax(out, dim=1)), y)


def _run(loss, data, n_out: int, seed: int = 0, steps: int = 300, lr: float = 1e-2) -> NeuralDbg:
    model = _mlp(n_out, seed)
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=lr), data, loss=loss, steps=steps))


def _first_nan(dbg) -> int:
    steps, values = dbg.trace.loss.steps, dbg.trace.loss.data
    bad = [int(s) for s, v in zip(steps, values) if not math.isfinite(v)]
    assert bad, "the run was meant to reach NaN"
    return bad[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_hand_written_binary_cross_entropy_is_named_by_its_log_of_a_sigmoid(seed):
    """The sigmoid of a confident logit (past ~16.6) is exactly 1.0 in float32: log(1 - p) is -inf and the
    loss NaN, at a modest learning rate. Named in the loss, at the loss's first NaN, with the with-logits fix."""
    dbg = _run(hand_bce, _binary(seed=seed), 1, seed=seed)
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.confidence >= CONFIDENT
    assert top.layer == "loss" and top.step == _first_nan(dbg) and "in the loss" in str(top)
    assert "binary_cross_entropy_with_logits" in top.suggestion
    assert any("sigmoid rounds to exactly 0 or 1" in line for line in top.chain)
    assert not any(h.cause == "data" and h.confidence >= CONFIDENT for h in dbg.explain())
    assert contradictions(dbg.explain()) == []


def test_the_same_model_under_the_with_logits_loss_trains_quietly():
    dbg = _run(bce_logits, _binary(), 1)
    assert math.isfinite(float(dbg.trace.loss.data[-1]))
    assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_a_log_of_a_softmax_of_large_logits_is_named_with_log_softmax():
    """Logits 100+ apart: the softmax of the others underflows to 0 and the log of the target's is -inf."""
    model = _mlp(4, 0)
    with torch.no_grad():
        model[-1].weight.mul_(200.0)
    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=1e-2), _classes(), loss=log_of_softmax, steps=40))
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.confidence >= CONFIDENT
    assert top.step == _first_nan(dbg)
    assert "F.cross_entropy" in top.suggestion and "log_softmax" in top.suggestion


def test_a_temperature_before_the_softmax_is_read_through():
    """A contrastive-style loss divides the logits by a small temperature before ``torch.log(F.softmax(...))``:
    the model's own outputs are small, but what the softmax sees is not, and it underflows at once."""
    def tempered(out, y):
        return -(F.one_hot(y, 4) * torch.log(F.softmax(out / 0.001, dim=1))).sum(1).mean()
    dbg = _run(tempered, _classes(), 4, steps=20)
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.confidence >= CONFIDENT and top.step == _first_nan(dbg)
    assert "log_softmax" in top.suggestion and any("before their softmax" in line for line in top.chain)
    assert not any(h.cause == "data" and h.confidence >= CONFIDENT for h in dbg.explain())


@pytest.mark.parametrize("seed", [0, 1])
def test_an_exp_that_overflows_in_a_hand_written_contrastive_loss_is_named(seed):
    """InfoNCE written by hand with ``torch.exp`` of cosine similarities over a temperature of 0.01: exp(100)
    overflows float32 at once, and Inf / Inf is NaN. The exp is named, with a fix in log space; neither the
    temperature's division nor F.normalize's (its denominator clamped) is a division by 0."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(30):
            x = torch.randn(64, 16, generator=g)
            z1 = F.normalize(model(x + 0.1 * torch.randn(64, 16, generator=g)), dim=1)
            z2 = F.normalize(model(x + 0.1 * torch.randn(64, 16, generator=g)), dim=1)
            sim = z1 @ z2.T / 0.01
            loss = (-sim.diag() + torch.log(torch.exp(sim).sum(1))).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.layer == "loss" and top.step == 0 and top.confidence >= CONFIDENT
    assert "exp overflows" in top.chain[0]
    assert "torch.logsumexp" in top.suggestion and "denominator" not in top.suggestion


def _nan_one_hot_targets(from_step: int = 5):
    """The classes as one-hot rows, all NaN from ``from_step`` on."""
    data = _classes()

    def batch(step: int):
        x, y = data(step)
        return x, F.one_hot(y, 4).float() * (float("nan") if step >= from_step else 1.0)
    return batch


@pytest.mark.parametrize("probabilities", [
    lambda out: F.softmax(out / 0.001, dim=1) + 1e-8,                            # a temperature, an eps: no log(0)
    lambda out: F.softmax(out - out.max(1, keepdim=True).values, dim=1),         # a shift: the softmax as it is
], ids=["guarded_temperature", "shifted"])
def test_nan_targets_under_a_hand_written_cross_entropy_stay_the_datas(probabilities):
    dbg = _run(lambda out, t: -(t * torch.log(probabilities(out))).sum(1).mean(), _nan_one_hot_targets(), 4,
               steps=20, lr=1e-3)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.step == 5


def test_nan_targets_under_a_hand_written_loss_stay_the_datas():
    """The outputs are far from saturating the sigmoid when a NaN target arrives: the loss's log did not
    make it, the targets did."""
    dbg = _run(hand_bce, _binary(nan_targets_at=5), 1, steps=20, lr=1e-3)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.step == 5
    assert dbg.trace.nonfinite is not None and dbg.trace.nonfinite.phase == "loss"


@pytest.mark.parametrize("path, expected", [
    (["Neg", "Mean", "Add", "Mul", "Log", "Rsub", "Sigmoid", "Squeeze", "Addmm"], ("Log", "Sigmoid")),
    (["NllLoss", "Log", "Softmax", "Addmm"], ("Log", "Softmax")),
    (["Mean", "Log", "Addmm"], ("Log", "")),
    (["Mean", "Div", "Sub", "Addmm"], ("Div", "")),
    (["Neg", "Mean", "Log", "Add", "Sigmoid", "Addmm"], None),       # log(p + eps)
    (["Neg", "Mean", "Log", "Clamp", "Softmax", "Addmm"], None),     # log(p.clamp(eps, 1))
    (["NllLoss", "LogSoftmax", "Addmm"], None),
    (["MseLoss", "Addmm"], None),
    (["Neg", "Mean", "Log", "Softmax", "Div@constant", "Addmm"], ("Log", "Softmax")),   # softmax(out / tau)
    (["Div@constant", "Sum", "Mul", "NllLoss", "LogSoftmax", "Addmm"], ("Div", "")),   # a masked mean's count
    (["Neg", "Mean", "Log", "Softmax", "Div", "Addmm"], ("Div", "")),                  # out / out.norm()
    (["Mean", "Log", "Sum", "Exp", "Div@constant", "Addmm"], ("Exp", "")),             # exp(out / tau)
    (["Mean", "Div", "Sum", "Exp", "Addmm"], ("Exp", "")),                             # an exp before the division
    (["Mean", "Log", "Sum", "Exp", "Div@constant", "Mm", "Div@guarded", "Addmm"], ("Exp", "")),  # F.normalize
    (["NllLoss", "LogSoftmax", "Div@constant", "Sum", "Mul", "Addmm"], ("Div", "")),   # a masked mean's count
])
def test_the_loss_operation_that_can_leave_its_domain_is_read_from_the_path(path, expected):
    assert losspath.domain_op([path]) == expected


@pytest.mark.parametrize("divide, guarded", [
    (lambda a, b: a / a.norm(dim=1, keepdim=True).clamp_min(1e-12), True),   # F.normalize, written out
    (lambda a, b: F.normalize(a, dim=1), True),
    (lambda a, b: a / (a.abs().sum(1, keepdim=True) + 1e-8), True),          # an eps added
    (lambda a, b: a / torch.maximum(b, torch.full_like(b, 1e-6)), True),
    (lambda a, b: a / (a + b), False),                                        # a sum of two values: no guard
    (lambda a, b: a / b.abs(), False),
])
def test_a_division_whose_denominator_is_kept_off_zero_is_read_off_its_node(divide, guarded):
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    out = a * 2
    loss = torch.log(divide(out, b).abs()).mean()
    ops = [op for path in losspath.paths(loss.grad_fn, [out.grad_fn]) for op in path if op.startswith("Div")]
    assert ops and all(("@guarded" in op) is guarded for op in ops)
    assert (losspath.domain_op(losspath.paths(loss.grad_fn, [out.grad_fn]))[0] == "Div") is not guarded


@pytest.mark.parametrize("path, rescaled", [
    (["Neg", "Mean", "Sum", "Mul", "Log", "Softmax", "Div", "Addmm"], "scaled"),    # softmax(out / tau)
    (["NllLoss", "Log", "Softmax", "Addmm"], ""),
    (["Neg", "Mean", "Mul", "Log", "Sigmoid", "Squeeze", "Addmm"], ""),     # a shape op is no scale
    (["Neg", "Mean", "Log", "Softmax", "Sub", "Addmm"], ""),                # out - out.max(): a shift
    (["Neg", "Mean", "Log", "Sigmoid", "Add", "Addmm"], "scaled"),          # a sigmoid sees a shift
    (["Neg", "Mean", "Sum", "Mul", "Log", "Softmax", "MaskedFill", "Addmm"], "filled"),  # a mask of -1e9
])
def test_a_scale_between_the_outputs_and_the_probability_is_seen(path, rescaled):
    assert losspath.transformed([path], path[path.index("Log") + 1]) == rescaled


def test_a_log_of_a_masked_softmax_in_the_loss_is_the_losss_own_nan_even_if_it_ends_the_loop():
    """A policy's entropy bonus written as -(p * log p) of a softmax whose unavailable actions were filled with
    -1e9: their p is exactly 0, and 0 x log 0 is NaN at the first step. Sampling from the NaN policy then
    raises, so the first step is the only one: its loss is still read, and the NaN is the loss's log, not
    its targets'."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    with NeuralDbg(model, optimizer=opt) as dbg:
        with pytest.raises(RuntimeError):
            for _ in range(20):
                x = torch.randn(64, 6, generator=g)
                masked = F.one_hot(torch.randint(0, 5, (64,), generator=g), 5).bool()
                logits = model(x).masked_fill(masked, -1e9)
                probs = torch.softmax(logits, 1)
                action = torch.multinomial(probs.detach(), 1, generator=g).squeeze(1)
                reward = torch.randn(64, generator=g)
                logp = torch.log_softmax(logits, 1).gather(1, action[:, None]).squeeze(1)
                entropy = -(probs * torch.log(probs)).sum(1).mean()
                loss = -(logp * reward).mean() - 0.01 * entropy
                opt.zero_grad()
                loss.backward()
                opt.step()
                dbg.record_loss(loss)
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("non_finite", "loss", 0) and top.confidence >= 0.5
    assert "mask" in top.chain[0] and "log_softmax" in top.suggestion


def test_a_probability_saturates_where_its_dtype_rounds_it():
    assert losspath.saturates("Sigmoid", 17.0, 0.0, "float32")
    assert not losspath.saturates("Sigmoid", 15.0, 0.0, "float32")
    assert losspath.saturates("Sigmoid", 8.0, 0.0, "float16")
    assert losspath.saturates("Softmax", 0.0, 110.0, "float32")
    assert not losspath.saturates("Softmax", 0.0, 60.0, "float32")
    # the thresholds are where torch rounds
    assert torch.sigmoid(torch.tensor(17.0)).item() == 1.0 and torch.sigmoid(torch.tensor(15.0)).item() < 1.0
    assert torch.softmax(torch.tensor([0.0, -110.0]), 0)[1].item() == 0.0


def test_the_origin_in_the_loss_keeps_what_the_output_reached_through_a_file():
    origin = NonFiniteOrigin(4, "", "loss", "x", dtype="float32", reach=(18.5, 3.0))
    assert NonFiniteOrigin.from_dict(origin.to_dict()) == origin
    assert losspath.nonfinite_op(origin, [["Mean", "Log", "Rsub", "Sigmoid", "Addmm"]]) == "Log of Sigmoid"
    assert losspath.nonfinite_op(origin, [["MseLoss", "Addmm"]]) == ""


def test_the_spread_within_a_row_is_read_over_the_classes_not_over_time():
    """(N, T, C) logits whose classes lie close together and whose time steps do not: a softmax over the
    classes does not round, and the spread says so."""
    from neuraldbg.nanhunt import reach
    logits = torch.zeros(2, 5, 3)
    logits[:, :, 0] = torch.arange(5.0) * 100  # 400 apart over time, 2 apart over the classes
    logits[:, :, 1] = logits[:, :, 0] + 1.0
    logits[:, :, 2] = logits[:, :, 0] + 2.0
    absmax, spread = reach([logits])
    assert absmax == 402.0 and spread == 2.0
    assert reach([torch.tensor([[0.0, 120.0]])])[1] == 120.0


def _nan_rows(rows: tuple[int, ...], from_step: int = 5):
    """One-hot classes, with NaN in the given rows of every batch from ``from_step`` on."""
    data = _classes()

    def batch(step: int):
        x, y = data(step)
        t = F.one_hot(y, 4).float()
        if step >= from_step:
            t[list(rows)] = float("nan")
        return x, t
    return batch


@pytest.mark.parametrize("loss", [
    lambda out, t: F.cross_entropy(out, t),                                        # divides its sum by the batch
    lambda out, t: -(t * torch.log(F.softmax(out / 2, dim=1))).sum(1).mean(),      # a log of a scaled softmax
], ids=["cross_entropy_of_probabilities", "log_of_a_scaled_softmax"])
def test_nan_in_a_few_rows_of_soft_targets_stays_the_datas(loss):
    """NaN in two rows of probability targets: only those rows' gradient is NaN. A division by the batch
    size divides every row alike (a count of 0 would make them all NaN), and a softmax rounds first in the
    rows of the widest outputs, which these are not: neither is the loss's doing."""
    dbg = _run(loss, _nan_rows((3, 17)), 4, steps=20, lr=1e-3)
    top = dbg.explain()[0]
    assert top.cause == "data" and top.step == 5, dbg.report()
    share = dbg.trace.nonfinite.rows[0]
    assert 0 < share < 0.1


def test_a_mean_over_an_empty_mask_is_the_losss_division():
    """A masked mean whose mask selects nothing: 0 / 0 in every row's share, named at the loss's division."""
    def masked(out, y):
        mask = (y >= 0).float() if y[0] != 2 else torch.zeros_like(y, dtype=torch.float)
        return (F.cross_entropy(out, y, reduction="none") * mask).sum() / mask.sum()

    def data(step: int):
        x, y = _classes()(step)
        y[0] = 2 if step >= 5 else (y[0] + 1) % 2  # from step 5 the mask is empty
        return x, y
    dbg = _run(masked, data, 4, steps=20, lr=1e-3)
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.step == 5, dbg.report()
    assert dbg.trace.nonfinite.rows[0] == 1.0


def test_the_rows_a_nan_reached_decide_between_the_loss_and_its_targets():
    """Rows made NaN by a rounding softmax lie among the widest; a NaN in an ordinary row is not its."""
    origin = NonFiniteOrigin(4, "", "loss", "x", dtype="float32", reach=(60.0, 120.0), rows=(0.05, 1.0, 1.0))
    assert NonFiniteOrigin.from_dict(origin.to_dict()) == origin
    path = [["NllLoss", "Log", "Softmax", "Div@constant", "Addmm"]]
    assert losspath.nonfinite_op(origin, path) == "Log of Softmax"
    assert losspath.nonfinite_op(dataclasses.replace(origin, rows=(0.05, 0.0, 1.0)), path) == ""
    divided = [["Div@constant@scalar", "Neg", "Sum", "Mul", "LogSoftmax", "Addmm"]]  # the whole loss, by a count
    assert losspath.nonfinite_op(dataclasses.replace(origin, rows=(1.0, 0.0, 0.0)), divided) == "Div"
    assert losspath.nonfinite_op(dataclasses.replace(origin, rows=(0.05, 0.0, 0.0)), divided) == ""
    per_row = [["Mean", "Div@constant", "Sum", "Mul", "NllLoss", "LogSoftmax", "Addmm"]]  # each row by its own count
    assert losspath.nonfinite_op(dataclasses.replace(origin, rows=(0.05, 0.0, 0.0)), per_row) == "Div"


def test_a_per_sample_mean_over_an_empty_mask_is_the_losss_division_in_one_row():
    """Each sample's loss divided by its own mask's count, one sample's mask empty: 0 / 0 in that row only.
    A division per row can make one row NaN: it stays the loss's, though the other rows are finite."""
    def per_sample(out, y):
        mask = torch.ones(len(y), 1)
        if bool((y == -1).any()):
            y, mask = y.clamp_min(0), (y != -1).float()[:, None]
        per = F.cross_entropy(out, y, reduction="none")[:, None]
        return ((per * mask).sum(1) / mask.sum(1)).mean()

    def data(step: int):
        x, y = _classes()(step)
        if step >= 5:
            y[7] = -1  # sample 7 has nothing to score
        return x, y
    dbg = _run(per_sample, data, 4, steps=20, lr=1e-3)
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.step == 5, dbg.report()
    assert dbg.trace.nonfinite.rows[0] < 0.1


def test_a_log_of_a_sigmoid_that_rounds_to_zero_is_the_losss():
    """``-log(sigmoid(out))`` with no targets at all (a generator's loss): the rows that turn NaN are the
    lowest outputs, past where a sigmoid rounds to 0, not the largest."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    with torch.no_grad():
        model[-1].weight.mul_(400.0)
    def data(step):
        return torch.randn(64, 16, generator=torch.Generator().manual_seed(step)), None

    dbg = train(Run(model, torch.optim.SGD(model.parameters(), lr=1e-4), data,
                    loss=lambda out, _: -torch.log(torch.sigmoid(out)).mean(), steps=20))
    top = dbg.explain()[0]
    assert top.cause == "non_finite" and top.layer == "loss", dbg.report()
    assert "binary_cross_entropy_with_logits" in top.suggestion


class _Heteroscedastic(nn.Module):
    """A regression head that predicts a mean and a variance; ``positive``: the variance through a softplus."""

    def __init__(self, positive: bool):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.mu, self.var, self.positive = nn.Linear(64, 1), nn.Linear(64, 1), positive

    def forward(self, x):
        h = self.body(x)
        var = self.var(h)
        return self.mu(h), F.softplus(var) + 1e-6 if self.positive else var


def _gaussian_nll_run(seed: int, positive: bool) -> NeuralDbg:
    g = torch.Generator().manual_seed(1234)
    x, w = torch.randn(1000, 8, generator=g), torch.randn(8, 1, generator=g)
    y = torch.sin(x @ w) + 0.3 * x[:, :1] ** 2 + 0.05 * torch.randn(1000, 1, generator=g)
    torch.manual_seed(seed)
    model = _Heteroscedastic(positive)
    pick = torch.Generator().manual_seed(seed)

    def data(step):
        j = torch.randint(0, 1000, (64,), generator=pick)
        return x[j], y[j]

    def nll(out, target):
        mu, var = out
        return (0.5 * (torch.log(var) + (target - mu) ** 2 / var)).mean()
    return train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=nll, steps=300))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_loss_that_is_nan_while_its_gradients_are_finite_is_the_losss_own(seed):
    """A variance predicted by a plain linear layer: ``torch.log`` of its negative entries makes the loss NaN
    on the first steps, while the gradient there (1/var) is finite and the weights go on moving. The loss's
    NaN is read as its own domain, from step 0, not as a divergence from a best loss of 0."""
    dbg = _gaussian_nll_run(seed, positive=False)
    assert not math.isfinite(float(dbg.trace.loss.data[0]))
    assert dbg.trace.nonfinite is None  # no gradient was NaN/Inf
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("non_finite", "loss", 0) and top.confidence >= 0.5
    assert "F.softplus" in top.suggestion
    assert not any(h.cause == "learning_rate_too_high" and h.confidence >= 0.5 for h in dbg.explain())


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_head_with_a_positive_variance_trains_quietly(seed):
    dbg = _gaussian_nll_run(seed, positive=True)
    assert not dbg.explain().confident, dbg.report()
