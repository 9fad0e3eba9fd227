"""Data-parallel training watched on every rank: each rank leaves its trace in a run directory.

    torchrun --nproc_per_node=2 train_ddp.py run_dir [--fault FAULT] [--steps N] [--backend gloo|nccl]

or, without torchrun, ``python train_ddp.py run_dir`` starts two local CPU processes itself. Then, in a
notebook: ``%load_ext ndbg_jupyter`` and ``%neuraldbg load run_dir``: the ranks merged, one verdict.

FAULT injects one of the failures only a multi-process run has: ``blank_record`` (rank 1's shard holds an
all-constant sample that the per-sample standardisation divides by a zero spread), ``bad_shard`` (rank 1's
shard stored unnormalised, 0-255), ``no_sampler`` (every rank shuffles the whole data set alike).
From a notebook, ``launch(run_dir, fault=...)`` runs the same training on local processes.
"""
from __future__ import annotations

import argparse
import os
import socket
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from neuraldbg import NeuralDbg

FAULTS = ("none", "blank_record", "bad_shard", "no_sampler")


class Standardize(nn.Module):
    """Each sample to zero mean and unit spread (no eps: a constant sample gives 0 / 0)."""

    def forward(self, x):
        return (x - x.mean(dim=1, keepdim=True)) / x.std(dim=1, keepdim=True)


def make_model() -> nn.Module:
    return nn.Sequential(OrderedDict(norm=Standardize(), fc1=nn.Linear(20, 64), act1=nn.ReLU(),
                                     fc2=nn.Linear(64, 64), act2=nn.ReLU(), head=nn.Linear(64, 2)))


def train(run_dir: str, fault: str = "none", steps: int = 60, device: str = "cpu") -> NeuralDbg:
    """The training loop of one rank (the process group exists already)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4096, 20, generator=g)
    y = (X @ torch.randn(20, generator=g) > 0).long()
    data = TensorDataset(X, y)
    if fault == "no_sampler":
        # every rank shuffles the whole data set alike: the same batches everywhere
        sampler = None
        loader = DataLoader(data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    else:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=32, sampler=sampler)

    torch.manual_seed(0)
    model = make_model().to(device)
    ddp = DDP(model, device_ids=[torch.device(device).index] if device.startswith("cuda") else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    step = 0
    with NeuralDbg(ddp, optimizer=opt, run_dir=run_dir) as dbg:
        for epoch in range(1 + steps // max(len(loader), 1)):
            if sampler is not None:
                sampler.set_epoch(epoch)
            for x, target in loader:
                if step == steps:
                    break
                if rank == 1 and fault == "bad_shard":
                    x = (x * 40 + 128).clamp(0, 255)  # this shard was stored as raw 0-255 values
                if rank == 1 and fault == "blank_record" and step == 40:
                    x = x.clone()
                    x[5] = 0.5  # a blank record: every feature the same
                x, target = x.to(device), target.to(device)
                opt.zero_grad()
                loss = F.cross_entropy(ddp(x), target)
                loss.backward()
                opt.step()
                dbg.record_loss(loss)
                step += 1
    if rank == 0:
        print(f"rank 0 of {world}: {dbg.step} steps, last loss {loss.item():.4g}; traces in {run_dir}")
    return dbg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, run_dir: str, fault: str, steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(run_dir, fault, steps)
    finally:
        dist.destroy_process_group()


def launch(run_dir: str, nprocs: int = 2, fault: str = "none", steps: int = 60) -> None:
    """Run ``train`` on ``nprocs`` local CPU processes in a gloo group (what torchrun would start)."""
    mp.spawn(_worker, args=(nprocs, _free_port(), run_dir, fault, steps), nprocs=nprocs, join=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--fault", choices=FAULTS, default="none")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # not under torchrun: start two local processes
        launch(args.run_dir, 2, args.fault, args.steps)
        return
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if args.backend == "nccl" else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    try:
        train(args.run_dir, args.fault, args.steps, device)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
