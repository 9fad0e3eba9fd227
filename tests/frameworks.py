"""The same small training runs three ways: a plain loop, PyTorch Lightning, Hugging Face Trainer.

Each case is a model built from a seed, a learning rate and at most one injected fault. The plain loop
here is the reference the framework runs are compared with: same weights, same batches in the same
order, same optimizer (SGD at a constant learning rate), same loss, same accumulation and autocast.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    lr: float = 0.1
    dead: bool = False          # the second hidden layer's bias far below zero: its ReLU never fires
    nan_loss: bool = False      # a loss whose value and gradient are NaN
    softmax: bool = False       # the classifier ends with nn.Softmax and its loss is cross_entropy of that
    accumulate: int = 1
    bf16: bool = False
    steps: int = 40
    batch: int = 16
    seed: int = 0
    expect: tuple = ()          # (cause, layer) of the plain loop's top verdict; () for a healthy run


CASES = [
    Case("healthy"),
    Case("lr_too_high", lr=5.0, expect=("learning_rate_too_high", "")),
    Case("dead_units", dead=True, expect=("dead_units", "net.3")),
    Case("nan_loss", nan_loss=True, expect=("non_finite", "")),
    Case("accumulation_4", dead=True, accumulate=4, steps=12, batch=8, expect=("dead_units", "net.3")),
    Case("bf16_autocast", bf16=True),
    Case("bf16_dead_units", bf16=True, dead=True, expect=("dead_units", "net.3")),
    Case("softmax_twice", softmax=True, expect=("loss_plateau", "")),
]


def _nan_root(logits, labels):
    return torch.sqrt(logits[:, 0] - 50.0).mean()  # the root of a negative number


class Classifier(nn.Module):
    """An MLP that returns its loss, as Hugging Face models do: ``{"loss": ..., "logits": ...}``."""

    def __init__(self, case: Case):
        super().__init__()
        torch.manual_seed(case.seed)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3),
                                 *([nn.Softmax(dim=1)] if case.softmax else []))
        if case.dead:
            with torch.no_grad():
                self.net[2].bias.fill_(-20.0)
        self.nan_loss = case.nan_loss

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = _nan_root(logits, labels) if self.nan_loss else F.cross_entropy(logits, labels)
        return out


class Teacher(torch.utils.data.Dataset):
    """A learnable task: labels from a fixed random linear map of the inputs."""

    def __init__(self, n: int, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.labels = (self.x @ torch.randn(8, 3, generator=g)).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.labels[i]}


def dataset(case: Case) -> Teacher:
    return Teacher(case.steps * case.batch * case.accumulate)


def loader(case: Case):
    return torch.utils.data.DataLoader(dataset(case), batch_size=case.batch, shuffle=False)


def plain_run(case: Case, **options) -> NeuralDbg:
    """The reference: the case trained by hand, the mean loss of each window recorded."""
    model = Classifier(case)
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    batches = iter(loader(case))
    with NeuralDbg(model, opt, every=1, **options) as dbg:
        for _ in range(case.steps):
            opt.zero_grad()
            losses = []
            for _ in range(case.accumulate):
                batch = next(batches)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=case.bf16):
                    loss = model(**batch)["loss"]
                (loss / case.accumulate).backward()
                losses.append(loss.detach().float())
            opt.step()
            dbg.record_loss(torch.stack(losses).mean())
    return dbg


def verdict(dbg: NeuralDbg, prefix: str = "") -> list[tuple[str, str, int]]:
    """(cause, layer, onset) of every confident hypothesis. With ``prefix`` (``"model."``: the plain
    loop's model is the submodule ``model`` of the one watched), names are the plain loop's: the prefix
    is taken off, and the submodule itself is the plain loop's whole model, ``""``."""
    out = []
    for h in dbg.explain():
        if h.confidence >= 0.5:
            layer = h.layer
            if prefix and layer == prefix[:-1]:
                layer = ""
            elif prefix and layer.startswith(prefix):
                layer = layer[len(prefix):]
            out.append((h.cause.value, layer, h.step))
    return out


def hooks_left(model: nn.Module, optimizer=None) -> int:
    """Hooks of any kind still registered on ``model``'s modules (and ``optimizer``)."""
    n = 0
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            n += len(getattr(m, attr, {}) or {})
    if optimizer is not None:
        n += len(optimizer._optimizer_step_pre_hooks) + len(optimizer._optimizer_step_post_hooks)
    return n


def finite(x: float) -> bool:
    return not math.isnan(x) and not math.isinf(x)
