"""A loss whose own code has no floor: a minus sign before a cross-entropy, nll_loss of raw outputs, a
log-likelihood minimised without its minus sign. The loss falls below zero without end (and, under SGD, on to
-Inf and NaN). Named as the loss's (not the targets', not the learning rate's), with a fix on the loss's code,
where targets outside a library loss's range stay the data's and the same losses written right stay quiet."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from faultgen.score import contradictions
from neuraldbg import losspath
from zoo import Run, teacher_classes, train

CONFIDENT = 0.5


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def negated(out, y):
    return -F.cross_entropy(out, y)


def nll_of_logits(out, y):
    return F.nll_loss(out, y)


def log_likelihood(out, y):
    return F.log_softmax(out, dim=1).gather(1, y[:, None]).mean()


def swapped(out, y):
    return F.binary_cross_entropy_with_logits((y == 0).float(), out[:, 0])


def nll(out, y):
    return F.nll_loss(F.log_softmax(out, dim=1), y)


def neg_log_likelihood(out, y):
    return -F.log_softmax(out, dim=1).gather(1, y[:, None]).mean()


def bce_targets_out_of_range(out, y):
    return F.binary_cross_entropy_with_logits(out[:, 0], 5.0 * (y == 0).float())


def _run(loss, seed: int = 0, sgd: bool = True, steps: int = 300):
    model = _mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if sgd else torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(Run(model, opt, teacher_classes(16, 4, seed=seed), loss=loss, steps=steps))


@pytest.mark.parametrize("loss, fix", [(negated, "minus sign"), (nll_of_logits, "log_softmax"),
                                       (log_likelihood, "-log_probs"), (swapped, "(logits, targets)")])
@pytest.mark.parametrize("seed, sgd", [(0, True), (1, False)])
def test_a_loss_without_a_floor_is_named_with_its_fix_on_the_loss(loss, fix, seed, sgd):
    """Under SGD the fall runs on to -Inf and NaN, with updates and gradients that grow with the outputs: the
    learning rate, the growing gradients and the NaN are in its chain, not verdicts of their own."""
    hs = _run(loss, seed, sgd).explain()
    assert hs, "the loss fell without end: a verdict was expected"
    top = hs[0]
    assert (top.cause, top.layer) == ("loss_plateau", "")
    assert top.step < 10  # from where the fall begins
    assert top.confidence >= CONFIDENT
    assert fix in top.suggestion
    if sgd:  # the NaN it runs into is in its chain
        assert any("non_finite" in line for line in top.chain)
    assert not [h for h in hs if h.confidence >= CONFIDENT and h is not top]
    assert not contradictions(hs)


@pytest.mark.parametrize("loss", [nll, neg_log_likelihood])
def test_the_same_losses_written_right_stay_quiet(loss):
    hs = _run(loss).explain()
    assert not [h for h in hs if h.confidence >= CONFIDENT]


def test_targets_outside_a_library_losss_range_stay_the_datas():
    """A with-logits loss against targets of 5: unbounded below by its targets, not by its code. Named the
    data's, above the learning rate (whose divergence it produces)."""
    hs = _run(bce_targets_out_of_range).explain()
    assert (hs[0].cause, hs[0].layer) == ("data", "input")
    assert "targets" in hs[0].suggestion
    assert not [h for h in hs if h.confidence >= CONFIDENT and h.cause == "learning_rate_too_high"]


def hand_bce_targets_out_of_range(out, y):
    """A binary cross-entropy written by hand (no library loss) against targets of 5."""
    t = 5.0 * (y == 0).float()
    return -(t * F.logsigmoid(out[:, 0]) + (1 - t) * F.logsigmoid(-out[:, 0])).mean()


def test_a_hand_written_loss_below_zero_is_not_said_to_be_one_that_cannot_be():
    """The same targets under a cross-entropy written by hand: the fall is still the data's, but the graph
    holds no library loss, so the chain does not say the loss cannot be negative (a density's NLL written by
    hand rightly can); it says what tells the two apart."""
    hs = _run(hand_bce_targets_out_of_range).explain()
    top = hs[0]
    assert (top.cause, top.layer) == ("data", "input")
    assert not any("cannot be negative" in line for line in top.chain)
    assert any("no cross-entropy or squared error is in the loss's graph" in line for line in top.chain)


@pytest.mark.parametrize("path, expected", [
    (["Neg", "NllLoss", "LogSoftmax", "Addmm"], "negated"),
    (["Neg", "Mean", "MseLoss", "Addmm"], "negated"),
    (["NllLoss", "Addmm"], "nll_not_log"),
    (["NllLoss", "View", "Addmm"], "nll_not_log"),
    (["Mean", "Gather", "LogSoftmax", "Addmm"], "log_likelihood"),
    (["Mean", "Log", "Gather", "Softmax", "Addmm"], "log_likelihood"),  # log of the targets' probabilities
    (["Mean", "Log", "Mul", "Softmax", "Addmm"], ""),  # a product between: not read as a log-probability
    (["Mean", "Log", "Softmax", "Addmm"], "log_likelihood"),
    (["NllLoss", "LogSoftmax", "Addmm"], ""),
    (["Neg", "Mean", "Gather", "LogSoftmax", "Addmm"], ""),
    (["BinaryCrossEntropyWithLogits", "Select", "Addmm"], ""),
    (["BinaryCrossEntropyWithLogits@target", "Select", "Addmm"], "swapped"),
    (["BinaryCrossEntropyWithLogits@weighted@target", "Addmm"], "swapped"),
    # a Gaussian NLL: a log of a variance, not of a probability, with other terms added: says nothing
    (["Mean", "Add", "Log", "Exp", "Addmm"], ""),
    (["Neg", "Add", "NllLoss", "LogSoftmax", "Addmm"], ""),
    # a factor before a criterion no target takes below zero (loss * -1, a loss weighted by advantages)
    (["Mul", "NllLoss", "LogSoftmax", "Addmm"], "scaled"),
    (["Mean", "Mul", "MseLoss", "Addmm"], "scaled"),
    (["Mean", "Mul", "BinaryCrossEntropyWithLogits", "Addmm"], ""),  # targets out of [0, 1] could do it too
])
def test_the_form_that_has_no_floor_is_read_from_the_path(path, expected):
    assert losspath.unbounded_form([path]) == expected


def test_a_with_logits_loss_reached_through_its_target_is_marked():
    out = torch.randn(8, requires_grad=True)
    y = torch.rand(8)
    right = F.binary_cross_entropy_with_logits(out * 1, y)
    assert losspath.paths(right.grad_fn, [right.grad_fn.next_functions[0][0]]) == [
        ["BinaryCrossEntropyWithLogits", "Mul"]]
    wrong = F.binary_cross_entropy_with_logits(y, out * 1)
    found = losspath.paths(wrong.grad_fn, [wrong.grad_fn.next_functions[1][0]])
    assert found == [["BinaryCrossEntropyWithLogits@target", "Mul"]]


def bce_masks_0_255(out, y):
    return F.binary_cross_entropy_with_logits(out[:, 0], 255.0 * (y == 0).float())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_library_loss_below_zero_is_its_targets_however_short_the_fall(seed):
    """Masks of 0/255 under BCE with logits, 50 steps: the loss is barely twice its start below zero. A loss
    that cannot be negative for targets in its range went negative: a fact of the targets, not a degree."""
    hs = _run(bce_masks_0_255, seed, sgd=False, steps=50).explain()
    assert (hs[0].cause, hs[0].layer) == ("data", "input") and hs[0].confidence >= CONFIDENT
    assert "targets" in hs[0].suggestion


@pytest.mark.parametrize("paths, expected", [
    ([["BinaryCrossEntropyWithLogits", "Select", "Addmm"]], True),
    ([["Mean", "MseLoss", "Addmm"]], True),
    ([["NllLoss", "LogSoftmax", "Addmm"]], True),
    ([["Neg", "NllLoss", "LogSoftmax", "Addmm"]], False),      # negated: the loss's own code
    ([["Mul", "NllLoss", "LogSoftmax", "Addmm"]], False),      # a factor whose sign the graph no longer holds
    ([["Mean", "Mul", "BinaryCrossEntropyWithLogits", "Addmm"]], False),
    ([["BinaryCrossEntropyWithLogits@target", "Addmm"]], False),
    ([["Mean", "Add", "Log", "Exp", "Addmm"]], False),          # a Gaussian NLL written by hand may go negative
    ([["Add", "NllLoss", "LogSoftmax", "Addmm"], ["Add", "Mean", "Log", "Addmm"]], False),
    (None, False),
])
def test_a_loss_that_cannot_be_negative_is_read_from_every_path(paths, expected):
    assert losspath.non_negative(paths) is expected


def times_minus_one(out, y):
    return F.cross_entropy(out, y) * -1.0


def test_a_loss_times_a_negative_factor_is_the_losss_own_not_its_targets():
    """``loss * -1.0`` records a product, not a negation: no target takes a cross-entropy of class indices
    below zero, so the factor does, and the fix is on it (never "check the targets' range")."""
    hs = _run(times_minus_one, 0, sgd=False).explain()
    top = hs[0]
    assert (top.cause, top.layer) == ("loss_plateau", "") and top.confidence >= CONFIDENT
    assert "sign of the factor" in top.suggestion
    assert not [h for h in hs if h.cause == "data" and h.confidence >= CONFIDENT]


_KL = ["Sub", "Div@constant@scalar", "Mul", "Sum", "Sub", "Exp", "Addmm"]  # a KL term written by hand


@pytest.mark.parametrize("paths, expected", [
    ([_KL, ["Sub", "Div@constant@scalar", "MseLoss@sum", "Addmm"]], "hand_term"),
    ([_KL, ["Add", "L1Loss", "Addmm"]], "hand_term"),
    ([_KL], ""),  # written by hand throughout: a likelihood may rightly go negative
    ([["Mean", "Add", "Log", "Exp", "Addmm"]], ""),
    ([_KL, ["Sub", "BinaryCrossEntropy@sum", "Sigmoid", "Addmm"]], ""),  # targets out of [0, 1] could do it too
    ([["Add", "MseLoss", "Addmm"], ["Add", "MseLoss", "Addmm"]], ""),  # no term by hand
])
def test_a_term_added_by_hand_to_an_error_is_read_from_the_paths(paths, expected):
    assert losspath.unbounded_form(paths) == expected


class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.mu, self.logvar = nn.Linear(64, 4), nn.Linear(64, 4)
        self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        return self.dec(mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)), mu, logvar


@pytest.mark.parametrize("sign", [-1.0, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_kl_subtracted_from_the_reconstruction_is_the_losss_own(sign, seed):
    """A VAE whose KL divergence is subtracted (``recon - kl``): the loss falls below zero without end as the
    latents grow. The data are fine; the loss's code is named, with its fix. Added, it trains quietly."""
    g = torch.Generator().manual_seed(1234)
    x = torch.sigmoid(torch.randn(1200, 4, generator=g) @ torch.randn(4, 32, generator=g))
    torch.manual_seed(seed)
    model = _VAE()
    pick = torch.Generator().manual_seed(seed)

    def data(step):
        xb = x[torch.randint(0, 1000, (64,), generator=pick)]
        return xb, xb

    def elbo(out, xb):
        rec, mu, logvar = out
        kl = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()) / 64
        return F.mse_loss(rec, xb, reduction="sum") / 64 + sign * kl
    dbg = train(Run(model, torch.optim.Adam(model.parameters(), lr=1e-3), data, loss=elbo, steps=300))
    if sign > 0:
        assert not dbg.explain().confident, dbg.report()
        return
    top = dbg.explain()[0]
    assert (top.cause, top.layer, top.step) == ("loss_plateau", "", 0) and top.confidence >= 0.5, dbg.report()
    assert top.suggestion.startswith("check the term added by hand to the error")
    assert not any(h.cause == "data" and h.confidence >= 0.5 for h in dbg.explain())
