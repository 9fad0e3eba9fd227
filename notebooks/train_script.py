"""A training script that runs anywhere (a cluster job, a scheduler) and leaves a trace to read later.

    python train_script.py run.ndbg

Then, in a notebook: ``%load_ext ndbg_jupyter`` and ``%neuraldbg load run.ndbg``.
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg


def main(path: str = "run.ndbg") -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    X = torch.randn(4096, 20)
    y = (X @ torch.randn(20) > 0).long()

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.5)  # meant: 5e-4

    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(150):
            j = (step * 64) % len(X)
            x, target = X[j:j + 64], y[j:j + 64]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), target)
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    dbg.save(path)
    print(f"trained {dbg.step} steps, last loss {loss.item():.4g}; trace saved to {path}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
