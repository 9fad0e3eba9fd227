"""Real multi-process runs for the tests: gloo process groups on the CPU, one scenario after another.

``launch(world, scenarios, root)`` starts ``world`` processes (spawned, so importable from here), puts
them in one gloo process group and runs each named scenario in turn on every rank, each watched by
NeuralDbg with its own run directory ``root/<scenario>``. Start-up dominates a run's time, so one group
serves several scenarios. A scenario that breaks the group (a rank killed) goes last.
"""
from __future__ import annotations

import os
import signal
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from neuraldbg import NeuralDbg

STEPS = 48
BATCH = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RowNorm(nn.Module):
    """Each sample divided by its norm: NaN for a sample of zeros (0 / 0)."""

    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


class Net(nn.Module):
    def __init__(self, d_in: int = 16, width: int = 32, norm: bool = False, bn: bool = False):
        super().__init__()
        self.norm = RowNorm() if norm else nn.Identity()
        self.fc1 = nn.Linear(d_in, width)
        self.bn = nn.BatchNorm1d(width) if bn else nn.Identity()
        self.act1 = nn.ReLU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.ReLU()
        self.head = nn.Linear(width, 2)

    def forward(self, x):
        return self.head(self.act2(self.fc2(self.act1(self.bn(self.fc1(self.norm(x)))))))


def dataset(n: int = 2048, d: int = 16, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def batches(loader, sampler=None):
    """Endless batches, calling ``set_epoch`` on the sampler (when given) at each new epoch."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def train(rank: int, world: int, run_dir: str, *, model: nn.Module | None = None, data=None, steps: int = STEPS,
          lr: float = 1e-2, before_step=None, after_backward=None, ddp_kwargs: dict | None = None,
          dbg_kwargs: dict | None = None) -> NeuralDbg:
    """The usual DDP loop, watched; ``before_step(step, ddp)`` and ``after_backward(step, ddp)`` inject faults."""
    torch.manual_seed(0)
    model = model if model is not None else Net()
    ddp = DDP(model, **(ddp_kwargs or {}))
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    if data is None:
        ds = dataset()
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        data = batches(DataLoader(ds, batch_size=BATCH, sampler=sampler), sampler)
    kwargs = dict(run_dir=run_dir, merge_every=10, checkpoint_interval=0.0)
    kwargs.update(dbg_kwargs or {})
    with NeuralDbg(ddp, optimizer=opt, **kwargs) as dbg:
        for step in range(steps):
            x, y = next(data)
            if before_step is not None:
                x = before_step(step, ddp, x)
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            if after_backward is not None:
                after_backward(step, ddp)
            opt.step()
            dbg.record_loss(loss)
    return dbg


# -- scenarios: (rank, world, run_dir) -> None ----------------------------------------------------

def healthy(rank, world, run_dir):
    train(rank, world, run_dir)


def healthy_bn(rank, world, run_dir):
    """BatchNorm without SyncBatchNorm, DDP's default buffer broadcast, every rank the same kind of data."""
    train(rank, world, run_dir, model=Net(bn=True))


def unsynced_by_design(rank, world, run_dir):
    """A per-rank parameter DDP is told to leave alone: it differs across ranks, by design."""
    model = Net()
    model.fc2.rank_scale = nn.Parameter(torch.full((1,), 1.0 + rank), requires_grad=False)
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["fc2.rank_scale"])
    train(rank, world, run_dir, model=model)


def nan_rank1(rank, world, run_dir):
    """Rank 1 gets a sample of zeros at step 30: `norm` divides 0 by 0 there, on that rank only."""
    def zero_sample(step, ddp, x):
        if rank == 1 and step == 30:
            x = x.clone()
            x[3] = 0.0
        return x
    train(rank, world, run_dir, model=Net(norm=True), before_step=zero_sample, steps=36)


def desync(rank, world, run_dir):
    """Rank 1 scales `fc2`'s weights in place at step 20: outside the synchronised update."""
    def edit(step, ddp, x):
        if rank == 1 and step == 20:
            with torch.no_grad():
                ddp.module.fc2.weight.mul_(1.01)
        return x
    train(rank, world, run_dir, before_step=edit)


def no_sampler(rank, world, run_dir):
    """Every rank shuffles the whole data set with the same seed: the same batches everywhere."""
    ds = dataset()
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    train(rank, world, run_dir, data=batches(loader))


def no_set_epoch(rank, world, run_dir):
    """A DistributedSampler never told the epoch: the same order every epoch (a small data set: 8 batches)."""
    ds = dataset(n=BATCH * 8 * world)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train(rank, world, run_dir, data=batches(DataLoader(ds, batch_size=BATCH, sampler=sampler)))


def bad_shard(rank, world, run_dir):
    """Rank 1's shard is stored unnormalised (x 50)."""
    def scale(step, ddp, x):
        return x * 50.0 if rank == 1 else x
    train(rank, world, run_dir, before_step=scale, lr=1e-3)


def bn_ranks(rank, world, run_dir):
    """BatchNorm without SyncBatchNorm, buffers not broadcast, and each rank reading its own source."""
    def shift(step, ddp, x):
        return x + 1.5 * rank
    train(rank, world, run_dir, model=Net(bn=True), before_step=shift, ddp_kwargs=dict(broadcast_buffers=False))


def summed_grads(rank, world, run_dir):
    """An extra all-reduce of the gradients after DDP's own: summed over the ranks, not averaged."""
    def all_reduce(step, ddp):
        for p in ddp.parameters():
            dist.all_reduce(p.grad)
    train(rank, world, run_dir, after_backward=all_reduce, lr=1e-3)


def timeout(rank, world, run_dir):
    """Rank 1 stalls at merge step 20 for longer than the merge timeout: the merge gives up, training goes on."""
    def stall(step, ddp):
        if rank == 1 and step == 20:
            time.sleep(3.0)
    train(rank, world, run_dir, after_backward=stall, steps=30, dbg_kwargs=dict(merge_timeout=1.5))


def killed(rank, world, run_dir):
    """The last rank is killed outright at step 32; the others fail in their next all-reduce."""
    def kill(step, ddp, x):
        if rank == world - 1 and step == 32:
            os.kill(os.getpid(), signal.SIGKILL)
        return x
    try:
        train(rank, world, run_dir, before_step=kill)
    except RuntimeError:
        pass  # the collective with the dead rank fails; NeuralDbg has written this rank's file


SCENARIOS = {f.__name__: f for f in (healthy, healthy_bn, unsynced_by_design, nan_rank1, desync, no_sampler,
                                     no_set_epoch, bad_shard, bn_ranks, summed_grads, timeout, killed)}


def _group(rank: int, world: int, port: int, scenarios: list[str], root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name in scenarios:
            t0 = time.perf_counter()
            try:
                SCENARIOS[name](rank, world, os.path.join(root, name))
            except Exception:  # noqa: BLE001 - reported to the test through the file, the others go on
                with open(os.path.join(root, f"{name}.error{rank}"), "w") as f:
                    f.write(traceback.format_exc())
            with open(os.path.join(root, f"{name}.time{rank}"), "w") as f:
                f.write(f"{time.perf_counter() - t0:.2f}")
            if name != "killed":
                dist.barrier()
    finally:
        if name != "killed":
            dist.destroy_process_group()


def launch(world: int, scenarios: list[str], root: str, timeout: float = 300.0) -> list[int | None]:
    """Run ``scenarios`` on a new ``world``-process gloo group; returns the processes' exit codes."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_group, args=(r, world, port, scenarios, root)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.1))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]
