"""Shared cells and an in-process IPython shell for the notebook-spoke tests."""
from __future__ import annotations

import pytest
from IPython.testing import globalipapp

# A two-layer MLP whose ReLU units are all dead from step 0 (a large negative bias):
# the expected verdict is dead_units at the ReLU, "1".
DEAD_SETUP = """
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
with torch.no_grad():
    model[0].bias.fill_(-50.0)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
"""

TRAIN = """
for step in range({n}):
    x = torch.randn(32, 4); y = torch.randint(0, 2, (32,))
    opt.zero_grad(); loss = nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
"""


def train(n: int = 12, extra: str = "") -> str:
    return TRAIN.format(n=n) + extra


_INITIAL: set[str] = set()


def _clean(shell) -> None:
    """Drop what earlier tests defined (faster than %reset, which collects garbage and history)."""
    if not _INITIAL:
        _INITIAL.update(shell.user_ns)
    for name in [k for k in shell.user_ns if k not in _INITIAL]:
        del shell.user_ns[name]


@pytest.fixture
def ip():
    """A clean in-process shell with the extension loaded, in text mode unless a test says otherwise."""
    globalipapp.start_ipython()  # once per process; later calls do nothing
    shell = globalipapp.get_ipython()
    _clean(shell)
    shell.run_line_magic("load_ext", "ndbg_jupyter")
    magics = shell.magics_manager.registry["NeuralDbgMagics"]
    for name, trait in magics.traits(config=True).items():
        setattr(magics, name, trait.default())
    magics.frontend = "text"
    magics.session = magics.dashboard = None
    yield shell
    magics.close()
    _clean(shell)


def magics_of(shell):
    return shell.magics_manager.registry["NeuralDbgMagics"]


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def no_hooks(model, optimizer=None) -> bool:
    """True when neither the model, any submodule nor the optimizer has a hook left."""
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or getattr(m, "_backward_pre_hooks", {}):
            return False
    if optimizer is not None and (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks):
        return False
    return True


def synthetic_session(path, n_layers: int = 50, n_steps: int = 2000, dead: int | None = None):
    """A saved-and-loaded session with ``n_layers`` layers sampled at every one of ``n_steps`` steps:
    gradients shrinking toward the input, and, if ``dead`` is given, that ReLU layer dead throughout."""
    import numpy as np

    from neuraldbg import NeuralDbg, Stat, fileformat
    from neuraldbg.layers import Kind, LayerInfo
    from neuraldbg.stats import N_STATS
    from neuraldbg.trace import GLOBAL_COLUMNS, Trace

    layers = []
    for i in range(n_layers):
        relu = i % 2 == 1
        layers.append(LayerInfo(index=i, name=f"blocks.{i // 10}.{i % 10}", type_name="ReLU" if relu else "Linear",
                                kind=Kind.RELU if relu else Kind.LINEAR, n_params=0 if relu else 72,
                                n_trainable=0 if relu else 72, order=i))
    trace = Trace(layers, capacity=max(2048, n_steps))
    rng = np.random.default_rng(0)
    depth_scale = np.logspace(-1, 0, n_layers, dtype=np.float32)  # smaller gradients toward the input
    for step in range(n_steps):
        row = np.full((n_layers, N_STATS), np.nan, dtype=np.float32)
        row[:, Stat.ACT_MEAN] = rng.normal(0, 0.1, n_layers)
        row[:, Stat.ACT_STD] = 1.0
        row[:, Stat.ACT_ABSMAX] = 3.0
        row[:, Stat.ACT_NONFINITE] = 0.0
        row[1::2, Stat.ACT_DEAD] = 0.1
        row[:, Stat.GRAD_RMS] = depth_scale * 1e-2 * (1 + 0.1 * rng.random(n_layers))
        row[:, Stat.GRAD_NONFINITE] = 0.0
        row[0::2, Stat.W_NORM] = 3.0
        row[0::2, Stat.W_GRAD_NORM] = row[0::2, Stat.GRAD_RMS] * 10
        row[0::2, Stat.W_UPDATE_NORM] = 3e-3
        if dead is not None:
            row[dead, Stat.ACT_DEAD] = 1.0
            row[:dead + 1, Stat.GRAD_RMS] = 0.0
        g = np.array([0.01, 0.0, 1.0, 4.0, 0.0][:len(GLOBAL_COLUMNS)], dtype=np.float32)
        trace.add_sample(step, row, g)
        trace.add_loss(step, 2.0 - 1e-4 * step)
    fileformat.save(trace, path, extra_meta={"step": n_steps})
    return NeuralDbg.load(path)
