"""``model.eval()`` left on in training (called for a validation pass, never undone): the batch normalisations
normalise with running statistics that eval mode does not update, so nothing in the network is normalised, and
the loss stays near chance. Named as the plateau's reason, with ``model.train()`` as its fix. The same network
trained in train mode, or with its batch normalisations frozen on purpose (``bn.eval()`` under a model in train
mode, as fine-tuning does), says nothing of it; nor does a linear probe over a frozen backbone evaluated in eval
mode on purpose, whose running statistics still hold."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from zoo import Run, train

CONFIDENT = 0.5


def _gratings(n: int = 2048, seed: int = 7):
    """3x12x12 gratings whose spatial frequency is the class (4), at a random angle and phase, around a mean of
    8 with a spread of ~9 (not normalised: the batch normalisations do it)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(12.0), torch.arange(12.0), indexing="ij")
    angle = math.pi * torch.rand(n, generator=g)[:, None, None]
    wave = torch.sin((0.5 + 0.35 * y.float())[:, None, None] * (torch.cos(angle) * xx + torch.sin(angle) * yy)
                     + 6.28 * torch.rand(n, generator=g)[:, None, None])
    x = 8.0 + 12.0 * wave[:, None] + 2.0 * torch.randn(n, 3, 12, 12, generator=g)
    return x, y


def _cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(32, 4))


def _validating(model: nn.Module, x: torch.Tensor, mode: str, every: int):
    """A ``before_step``: a validation pass in eval mode every ``every`` steps. ``mode``: "eval" (never undone),
    "train" (model.train() after it), or "frozen" (train mode, its batch normalisations in eval mode on purpose)."""
    def before(step: int, opt) -> None:
        if step % every:
            return
        model.eval()
        with torch.no_grad():
            model(x)
        if mode != "eval":
            model.train()
        if mode == "frozen":
            for m in model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
    return before


def _batches(x: torch.Tensor, y: torch.Tensor, seed: int):
    g = torch.Generator().manual_seed(seed)

    def batch(step: int):
        j = torch.randint(0, len(x), (64,), generator=g)
        return x[j], y[j]
    return batch


def _train(seed: int, mode: str, steps: int = 250) -> tuple[NeuralDbg, float]:
    x, y = _gratings()
    model = _cnn(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dbg = train(Run(model, opt, _batches(x, y, seed), steps=steps, before_step=_validating(model, x[:256], mode, 50)))
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x[-512:]).argmax(1) == y[-512:]).float().mean())
    return dbg, accuracy


@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_left_in_eval_mode_is_named_with_its_fix(seed):
    dbg, accuracy = _train(seed, "eval")
    assert accuracy < 0.5   # (4 classes)
    top = dbg.explain()[0]
    assert top.cause == "loss_plateau" and top.confidence >= CONFIDENT
    assert top.suggestion.startswith("call model.train()")
    assert any("eval mode" in line for line in top.chain)


@pytest.mark.parametrize("mode", ["train", "frozen"])
def test_train_mode_and_batch_norms_frozen_on_purpose_say_nothing_of_it(mode):
    dbg, accuracy = _train(0, mode)
    assert dbg.trace.meta["eval_mode"]["passes"] == 0
    assert not [h for h in dbg.explain() if "model.train()" in h.suggestion]
    if mode == "train":
        assert accuracy > 0.8
        assert not [h for h in dbg.explain() if h.confidence >= CONFIDENT]


def test_a_linear_probe_over_a_frozen_backbone_in_eval_mode_says_nothing_of_it():
    """The backbone trained first (its running statistics its data's), then frozen; the probe's protocol runs it
    in eval mode while a new head learns. Its labels carry nothing, so the loss stays flat: a plateau, but not
    one of eval mode."""
    x, y = _gratings()
    backbone = _cnn(0)[:-1]
    opt = torch.optim.SGD(backbone.parameters(), lr=0.05, momentum=0.9)
    for step in range(60):
        j = torch.randint(0, len(x), (64,), generator=torch.Generator().manual_seed(step))
        F.cross_entropy(backbone(x[j])[:, :4], y[j]).backward()
        opt.step()
        opt.zero_grad()
    backbone.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(32, 4))
    model.eval()
    g = torch.Generator().manual_seed(1)
    dbg = train(Run(model, torch.optim.SGD(model[1].parameters(), lr=1e-3),
                    lambda step: (x[torch.randint(0, len(x), (64,), generator=g)],
                                  torch.randint(0, 4, (64,), generator=g)), steps=200))
    assert dbg.trace.meta["eval_mode"]["sampled"] > 0 and dbg.trace.meta["eval_mode"]["passes"] == 0
    assert not [h for h in dbg.explain() if "model.train()" in h.suggestion]


def test_updates_too_large_from_the_start_of_an_unnormalised_network_follow_from_eval_mode():
    """An MLP with batch normalisations on features in their own units (~10 +- 10), in eval mode from a
    validation pass at step 0: its updates are ~0.7x its weights from the first step and units die. Its loss
    fails no test of its own; the updates, from the step eval mode began, are its, and the fix is
    ``model.train()``, not a lower learning rate (the same loop in train mode is healthy)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 20, generator=g) * 10 + 10
    y = (x @ torch.randn(20, 5, generator=g)).argmax(1)

    def run(left_in_eval: bool) -> NeuralDbg:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64),
                              nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 5))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        rows = lambda step: (x[(step * 64) % 3584:][:64], y[(step * 64) % 3584:][:64])  # noqa: E731
        return train(Run(model, opt, rows, steps=300,
                         before_step=_validating(model, x[-512:], "eval" if left_in_eval else "train", 100)))
    top = run(True).explain()[0]
    assert top.confidence >= CONFIDENT and top.suggestion.startswith("call model.train()")
    assert any("weights per step" in line for line in top.chain)   # the updates are in its chain
    assert not [h for h in run(False).explain() if h.confidence >= CONFIDENT]
