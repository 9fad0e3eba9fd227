"""Multi-process runs on real gloo process groups on the CPU: every rank watched, the ranks merged, the
verdict naming the rank where a cause starts.

Two groups are started once per module (process start-up dominates): two ranks run a healthy run and
one run per fault, three ranks run faults that need a majority, and a rank killed mid-run.
"""
from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_workers import STEPS, Net, launch
from jupyter_cells import ip  # noqa: F401 - a fixture
from neuraldbg import Cause, NeuralDbg
from neuraldbg.hypothesis import CONFIDENT

TWO = ["healthy", "healthy_bn", "unsynced_by_design", "nan_rank1", "desync", "no_sampler", "no_set_epoch",
       "bad_shard", "bn_ranks", "summed_grads", "timeout"]
THREE = ["desync", "bad_shard", "killed"]


def _run(tmp_path_factory, world: int, scenarios: list[str]):
    root = tmp_path_factory.mktemp(f"ddp{world}")
    codes = launch(world, scenarios, str(root))
    errors = {os.path.basename(f): open(f).read() for f in glob.glob(str(root / "*.error*"))}
    assert not errors, errors
    return root, codes


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root, codes = _run(tmp_path_factory, 2, TWO)
    assert codes == [0, 0]
    return root


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    root, codes = _run(tmp_path_factory, 3, THREE)
    assert codes[2] is not None and codes[2] < 0, "the last rank was killed by a signal"
    return root


def _top(dbg: NeuralDbg):
    hyps = dbg.explain()
    assert hyps and hyps[0].confidence >= CONFIDENT, dbg.report()
    return hyps[0]


# -- two ranks -------------------------------------------------------------------------------------

def test_healthy_run_is_quiet_and_every_rank_records_the_same_steps(two):
    dbg = NeuralDbg.load(two / "healthy")
    assert dbg.ranks == [0, 1] and dbg.step == STEPS
    assert all(h.confidence < CONFIDENT for h in dbg.explain()), dbg.report()
    t0, t1 = (NeuralDbg.load(two / "healthy" / f"rank{r:05d}.ndbg").trace for r in (0, 1))
    assert (t0.meta["rank"], t0.meta["world_size"], t1.meta["rank"]) == (0, 2, 1)
    # the sampling schedule is decided by the global step: the same sampled steps on every rank
    assert len(t0.stats.steps) > 10 and np.array_equal(t0.stats.steps, t1.stats.steps)
    # the DDP wrapper was watched: layer names as in the module inside it, no "module." prefix
    assert t0.layer_names == [n for n, m in Net().named_modules() if n and not list(m.children())]
    assert "ranks: 2 of 2 ranks" in dbg.report()


@pytest.mark.parametrize("name", ["healthy_bn", "unsynced_by_design"])
def test_healthy_runs_of_other_kinds_are_quiet(two, name):
    dbg = NeuralDbg.load(two / name)
    assert dbg.step == STEPS and all(h.confidence < CONFIDENT for h in dbg.explain()), dbg.report()


def test_nan_on_one_rank_is_named_on_that_rank_then_every_rank(two):
    dbg = NeuralDbg.load(two / "nan_rank1")
    top = _top(dbg)
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.NON_FINITE, "norm", 1, 30)
    assert "on rank 1" in str(top)
    assert any("every rank through the all-reduce" in c for c in top.chain)
    own0 = NeuralDbg.load(two / "nan_rank1" / "rank00000.ndbg").trace.nonfinite
    assert own0 is not None and own0.step >= 30  # rank 0 saw it too, through the all-reduce, not first


def test_replicas_that_diverge_name_the_layer_rank_and_step(two):
    top = _top(NeuralDbg.load(two / "desync"))
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.REPLICA_DIVERGENCE, "fc2", 1, 20)
    assert any("outside the synchronised update" in c for c in top.chain)


def test_rank0s_own_file_holds_what_it_gathered_from_the_others(two):
    dbg = NeuralDbg.load(two / "desync" / "rank00000.ndbg")
    assert dbg.trace.ranks.ranks_with_rows() == [0, 1]
    top = _top(dbg)
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.REPLICA_DIVERGENCE, "fc2", 1, 20)


def test_missing_distributed_sampler_is_the_same_data_on_every_rank(two):
    top = _top(NeuralDbg.load(two / "no_sampler"))
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.DUPLICATE_DATA, "input", None, 0)
    assert top.confidence >= 0.75 and "DistributedSampler" in top.suggestion


def test_missing_set_epoch_is_the_same_batches_every_epoch(two):
    top = _top(NeuralDbg.load(two / "no_set_epoch"))
    assert (top.cause, top.layer, top.step) == (Cause.DUPLICATE_DATA, "input", 8)  # 8 batches per epoch
    assert "set_epoch" in top.suggestion


def test_a_bad_shard_is_that_ranks_data(two):
    dbg = NeuralDbg.load(two / "bad_shard")
    top = _top(dbg)
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.RANK_DATA, "input", 1, 0)
    assert not [h for h in dbg.explain() if h.cause == Cause.DATA and h.confidence >= CONFIDENT]


def test_batchnorm_without_syncbatchnorm_differs_across_ranks(two):
    top = _top(NeuralDbg.load(two / "bn_ranks"))
    assert (top.cause, top.layer) == (Cause.BATCHNORM_RANK_MISMATCH, "bn")
    assert "SyncBatchNorm" in top.suggestion


def test_gradients_summed_over_ranks_scale_with_the_world_size(two):
    top = _top(NeuralDbg.load(two / "summed_grads"))
    assert (top.cause, top.layer, top.step) == (Cause.WORLD_SIZE_SCALING, "", 0)
    assert "2x" in top.chain[0]


def test_a_merge_that_times_out_does_not_stop_training(two):
    dbg = NeuralDbg.load(two / "timeout")
    metas = [NeuralDbg.load(two / "timeout" / f"rank{r:05d}.ndbg").trace.meta for r in (0, 1)]
    assert [m["step"] for m in metas] == [30, 30]  # both trained to the end
    assert any("merge_failure" in m for m in metas)
    assert "merging stopped" in dbg.report() and all(h.confidence < CONFIDENT for h in dbg.explain())
    # after the failed merge, each rank's statistics still reach its own file
    series = dbg._run.ranks
    assert series.batches.steps[-1] == 29 and np.isfinite(series.batches.data[-1, :, 0]).all()


def test_dashboard_rank_view(two):
    dbg = NeuralDbg.load(two / "nan_rank1")
    dbg.view_rank(1)
    assert dbg.rank == 1 and dbg.trace.meta["rank"] == 1 and dbg.trace.nonfinite.layer == "norm"
    assert dbg.health()["fc1"].nonfinite  # the layer health shown is rank 1's; the verdict is the run's
    assert (dbg.explain()[0].cause, dbg.explain()[0].rank) == (Cause.NON_FINITE, 1)
    dbg.view_rank(0)
    assert dbg.trace.meta["rank"] == 0 and dbg.trace.nonfinite.step > 30
    with pytest.raises(ValueError):
        dbg.view_rank(5)


# -- three ranks -----------------------------------------------------------------------------------

def test_three_ranks_the_majority_names_the_replica_that_diverged(three):
    top = _top(NeuralDbg.load(three / "desync"))
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.REPLICA_DIVERGENCE, "fc2", 1, 20)


def test_three_ranks_bad_shard(three):
    top = _top(NeuralDbg.load(three / "bad_shard"))
    assert (top.cause, top.rank) == (Cause.RANK_DATA, 1)


def test_a_killed_rank_leaves_a_loadable_partial_run(three):
    dbg = NeuralDbg.load(three / "killed")
    assert dbg.ranks == [0, 1, 2]
    steps = {r: NeuralDbg.load(three / "killed" / f"rank{r:05d}.ndbg").step for r in range(3)}
    # the survivors' files: up to the all-reduce that failed; the killed rank's: its last merge before the kill
    assert steps[0] == steps[1] == 32 and 20 < steps[2] < 32
    assert "rank 2 stopped at step" in dbg.report()
    assert all(h.confidence < CONFIDENT for h in dbg.explain()), dbg.report()


# -- files saved by hand, and bad run directories ---------------------------------------------------

def _session(nan_at: int | None, seed: int) -> NeuralDbg:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for step in range(12):
            x = torch.randn(16, 8)
            if step == nan_at:
                x[0, 0] = float("nan")
            opt.zero_grad()
            loss = F.cross_entropy(model(x), torch.randint(0, 2, (16,)))
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_files_saved_by_hand_under_rank_names_merge(tmp_path):
    _session(None, 0).save(tmp_path / "rank00000.ndbg")
    _session(5, 1).save(tmp_path / "rank00001.ndbg")
    (tmp_path / "notes.txt").write_text("not a trace")
    dbg = NeuralDbg.load(tmp_path)
    assert dbg.ranks == [0, 1]
    top = _top(dbg)
    assert (top.cause, top.layer, top.rank, top.step) == (Cause.DATA, "input", 1, 5)


def test_bad_run_directories_raise_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no rank trace files"):
        NeuralDbg.load(tmp_path)
    _session(None, 0).save(tmp_path / "rank00000.ndbg")
    (tmp_path / "rank00001.ndbg").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="rank00001.ndbg"):
        NeuralDbg.load(tmp_path)
    torch.manual_seed(0)
    other = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
    with NeuralDbg(other) as dbg:
        other(torch.randn(2, 8)).sum().backward()
    dbg.save(tmp_path / "rank00001.ndbg")
    with pytest.raises(ValueError, match="other layers"):
        NeuralDbg.load(tmp_path)
    _session(None, 0).save(tmp_path / "rank00001.ndbg")
    with pytest.raises(ValueError, match="stays in its run directory"):
        NeuralDbg.load(tmp_path).save(tmp_path / "x.ndbg")


# -- the notebook --------------------------------------------------------------------------------

def test_dashboard_of_a_merged_run_selects_ranks(two):
    from ndbg_jupyter._dashboard import Dashboard

    dbg = NeuralDbg.load(two / "nan_rank1")
    dash = Dashboard()
    dash.show(dbg, "loaded")
    sel = dash.ranks.widget
    assert dash.ranks.visible and [v for _, v in sel.options] == [0, 1]
    assert sel.value == 1 and "\u26a0" in dict((v, k) for k, v in sel.options)[1]  # opens where the NaN starts
    assert 'data-cause="non_finite"' in dash.panel.value and 'data-rank="1"' in dash.panel.value
    assert dash.controls.sliders["replica_divergence"].layout.display == ""
    sel.value = 0  # the user picks rank 0: its layers, the same verdict
    assert dbg.rank == 0 and dash.status.value == ""
    static = dash.static_bundle()  # what an exported notebook shows
    assert 'data-rank="1"' in dash.panel.value and "ranks: 2 of 2 ranks" in static["text/plain"]
    assert 'data-rank="1"' in static["text/html"]

    single = Dashboard()
    single.show(NeuralDbg.load(two / "nan_rank1" / "rank00001.ndbg"), "loaded")
    assert not single.ranks.visible and single.controls.sliders["replica_divergence"].layout.display == "none"
    for d in (dash, single):
        d.retire()  # its widgets closed, like a dashboard the notebook no longer shows


def test_magic_loads_a_run_directory(two, ip):
    from IPython.utils.capture import capture_output

    with capture_output() as io:
        ip.run_line_magic("neuraldbg", f'load "{two / "desync"}"')
    loaded = ip.user_ns["_ndbg"]
    assert loaded.ranks == [0, 1]
    assert "replica_divergence in `fc2` on rank 1" in io.stdout
