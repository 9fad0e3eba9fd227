"""The pieces of multi-rank watching, in this process: the merge cadence, the agreed schedule, batch
fingerprints, and one rank's recording on a real one-process gloo group (checked against plain torch)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddp_workers import free_port
from neuraldbg import NeuralDbg
from neuraldbg.distributed import AgreedSchedule, merge_step
from neuraldbg.rankstats import _signs, fingerprint, rank_view
from neuraldbg.ranktrace import RankLayout


def test_merge_steps_depend_on_the_step_alone():
    assert [s for s in range(70) if merge_step(s, 25)] == [0, 1, 2, 4, 8, 16, 25, 50]
    assert [s for s in range(40) if merge_step(s, 10)] == [0, 1, 2, 4, 8, 10, 20, 30]


class Clock:
    def __init__(self, sampled_cost: float):
        self.t, self.cost, self.sampled = 0.0, sampled_cost, False

    def __call__(self):
        self.t += self.cost if self.sampled else 1.0
        return self.t


def test_agreed_schedule_samples_the_same_steps_whatever_each_rank_measures():
    clocks = [Clock(1.05), Clock(3.0)]  # sampling is cheap on one rank, expensive on the other
    scheds = [AgreedSchedule(clock=c) for c in clocks]
    sampled = [[], []]
    for step in range(400):
        for i, (s, c) in enumerate(zip(scheds, clocks)):
            c.sampled = s.should_sample(step)
            if c.sampled:
                sampled[i].append(step)
            s.step_done(step, c.sampled)
        if merge_step(step, 25):  # what the all-reduce does: the largest proposal wins
            agreed = max(s.proposal for s in scheds)
            for s in scheds:
                s.agree(agreed)
    assert sampled[0] == sampled[1]
    assert scheds[0].proposal < scheds[1].proposal  # the timings did differ
    assert len(sampled[0]) < 400 / 4  # and the interval follows the slower rank's budget


def test_fingerprints_name_the_same_batch_and_tell_others_apart():
    x, ids = torch.randn(32, 8), torch.randint(0, 100, (32, 12))
    same = fingerprint((x[torch.randperm(32)],), {})  # the same samples in another order
    assert fingerprint((x,), {})[0] == pytest.approx(same[0], rel=1e-6)
    assert fingerprint((x,), {})[0] != pytest.approx(fingerprint((x + 1e-2,), {})[0], rel=1e-5)
    mask = torch.ones(32, 12, dtype=torch.long)  # a constant mask next to varying token ids
    a = fingerprint((), {"input_ids": ids, "attention_mask": mask})
    b = fingerprint((), {"input_ids": torch.randint(0, 100, (32, 12)), "attention_mask": mask})
    assert a[0] != b[0] and np.isnan(a[1])  # no floating-point tensor first: no RMS
    assert fingerprint((x,), {})[1] == pytest.approx(float(x.pow(2).mean().sqrt()), rel=1e-6)
    assert fingerprint((), {}) is None


@pytest.fixture()
def group(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(dbg_kwargs, steps: int = 30, nan_at: int | None = None, spike_at: int | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    with NeuralDbg(ddp, optimizer=opt, **dbg_kwargs) as dbg:
        for step in range(steps):
            x = torch.randn(16, 6)
            if step == nan_at:
                x[0, 0] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), torch.randint(0, 2, (16,)))
            loss.backward()
            opt.step()
            dbg.record_loss(loss * (1e3 if step == spike_at else 1.0))
    return dbg, model


def test_one_rank_records_its_rows_batches_and_file(group, tmp_path):
    dbg, model = _train(dict(distributed=True, run_dir=tmp_path, merge_every=10, checkpoint_interval=0.0),
                        steps=21, spike_at=15)  # the last row, at step 20, sees the final weights
    assert dbg.rank == 0 and dbg.trace.layer_names == ["0", "1", "2", "3"]  # the DDP wrapper, unwrapped
    series = dbg.trace.ranks
    assert list(series.rows.steps) == [0, 1, 2, 4, 8, 10, 20]
    assert list(series.batches.steps) == list(range(21)) and np.isfinite(series.batches.data).all()
    assert dbg.trace.meta["flagged_at"] == 20  # the loss spike at step 15, raised at the next merge
    assert dbg._ranks.merges == 7 and "merge_failure" not in dbg.trace.meta
    saved = NeuralDbg.load(tmp_path / "rank00000.ndbg")
    assert saved.step == 21 and saved.trace.meta["world_size"] == 1
    np.testing.assert_array_equal(saved.trace.ranks.rows.data, series.rows.data)
    np.testing.assert_array_equal(saved.trace.ranks.batches.data, series.batches.data)
    # the last row, against plain torch: weight checksums and norms, BatchNorm running statistics
    lay: RankLayout = series.layout
    row = series.rows.data[-1, 0]
    signs = _signs(torch.device("cpu"))
    for i, layer in [(0, model[0]), (3, model[3])]:
        views = [rank_view(p).double() for p in layer.parameters()]
        checksum = sum(float((v * signs[0, :v.numel()]).sum()) for v in views)
        assert lay.block(row, "checksum")[i] == pytest.approx(checksum)
        assert lay.block(row, "wnorm")[i] == pytest.approx(float(torch.cat(views).norm()))
    np.testing.assert_allclose(lay.bn_block(row, "mean")[0], model[1].running_mean.double().numpy())
    np.testing.assert_allclose(lay.bn_block(row, "var")[0], model[1].running_var.double().numpy())
    # in a world of one the all-reduce changes nothing: the gradient after it is the rank's own
    np.testing.assert_allclose(lay.block(row, "grad_reduced"), lay.block(row, "grad_local"), rtol=1e-6)
    assert np.isnan(lay.block(row, "checksum")[2])  # the ReLU holds no weights
    assert all(h.confidence < 0.5 for h in dbg.explain())


def test_a_nan_raises_the_flag_and_writes_the_file_at_once(group, tmp_path):
    dbg, _ = _train(dict(distributed=True, run_dir=tmp_path, merge_every=10, checkpoint_interval=1e9), nan_at=12)
    assert dbg.trace.meta["flag_written"] == 20
    lay, rows = dbg.trace.ranks.layout, dbg.trace.ranks.rows
    assert lay.tail(rows.data[-1, 0], "nonfinite_step") == 12
    assert (tmp_path / "rank00000.ndbg").exists()


def test_distributed_options_are_checked():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="process group"):
        NeuralDbg(model, distributed=True)
    assert NeuralDbg(model).rank is None and NeuralDbg(model).ranks == []


def test_merge_every_must_be_positive(group):
    with pytest.raises(ValueError, match="merge_every"):
        NeuralDbg(nn.Linear(2, 2), distributed=True, merge_every=0)


def test_a_compiled_model_records_as_a_rank_without_recompiling(group, tmp_path):
    import torch._dynamo

    torch.manual_seed(0)
    torch._dynamo.reset()
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    model = torch.compile(net, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    graphs = []
    with NeuralDbg(model, optimizer=opt, distributed=True, run_dir=tmp_path, merge_every=4) as dbg:
        for _ in range(24):
            opt.zero_grad()
            F.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 2, (8,))).backward()
            opt.step()
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[3] > 0
    series = dbg.trace.ranks
    assert list(series.batches.steps) == list(range(24)) and dbg.trace.layer_names == ["0", "1", "2"]
    row = series.rows.data[-1, 0]
    assert np.isfinite(series.layout.block(row, "grad_local")[..., [0, 2]]).all()  # the hooks fired
    assert "rank_stats_error" not in dbg.trace.meta


def test_the_rank_section_of_a_file_is_checked_or_skipped(group, tmp_path, monkeypatch):
    import neuraldbg.ranktrace as ranktrace
    from neuraldbg import fileformat

    dbg, _ = _train(dict(distributed=True, merge_every=10), steps=12)
    trace = dbg.trace
    monkeypatch.setattr(ranktrace, "LAYOUT_VERSION", 2)  # a later version's rank statistics
    fileformat.save(trace, tmp_path / "later.ndbg")
    monkeypatch.undo()
    later, _ = fileformat.load(tmp_path / "later.ndbg")
    assert later.ranks is None and "ranks_skipped" in later.meta and later.stats.n == trace.stats.n
    good = trace.ranks
    trace.ranks = ranktrace.RankSeries(ranktrace.RankLayout(n_layers=3), good.world, good.rank)
    fileformat.save(trace, tmp_path / "bad.ndbg")  # a layout that does not match the layers
    with pytest.raises(ValueError, match="not a readable NeuralDbg trace.*rank layout"):
        fileformat.load(tmp_path / "bad.ndbg")
    trace.ranks = good


def test_a_pass_begun_by_hand_fingerprints_its_batch(group):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [torch.randn(8, 6) for _ in range(3)]
    with NeuralDbg(model, optimizer=opt, distributed=True) as dbg:
        for step in range(9):
            x = data[step % 3]  # three batches, again and again
            dbg.begin_pass(x)
            loss = model[2](model[1](model[0](x))).pow(2).mean()  # submodules, not the model's forward
            dbg.end_forward(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
    fp = dbg.trace.ranks.batches.data[:, 0, 0]
    assert list(dbg.trace.ranks.batches.steps) == list(range(9))
    assert fp[0] == fp[3] == fp[6] and fp[0] != fp[1]
