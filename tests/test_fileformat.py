"""The .ndbg trace file: round trip, and one-line ValueErrors for anything else."""
import os
import pickle
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg, Stat
from neuraldbg.fileformat import MAGIC
from neuraldbg.trace import GLOBAL_COLUMNS


@pytest.fixture()
def session():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with NeuralDbg(model, optimizer=opt) as dbg:
        for _ in range(12):
            x = torch.randn(8, 4)
            x[0, 0] = float("nan") if _ == 9 else x[0, 0]
            opt.zero_grad()
            loss = F.cross_entropy(model(x), torch.randint(0, 2, (8,)))
            loss.backward()
            opt.step()
            dbg.record_loss(loss)
    return dbg


def test_round_trip_keeps_everything(session, tmp_path):
    path = tmp_path / "run.ndbg"
    session.save(path)
    loaded = NeuralDbg.load(path)
    a, b = session.trace, loaded.trace
    assert loaded.step == session.step == 12
    assert [l.to_dict() for l in a.layers] == [l.to_dict() for l in b.layers]
    assert np.array_equal(a.stats.steps, b.stats.steps)
    np.testing.assert_array_equal(a.stats.data, b.stats.data)
    np.testing.assert_array_equal(a.globals.data, b.globals.data)
    np.testing.assert_array_equal(a.loss.data, b.loss.data)
    assert b.nonfinite == a.nonfinite and b.nonfinite.layer == "input"
    assert loaded.thresholds == session.thresholds


def _bad(path, data: bytes):
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        NeuralDbg.load(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_truncated_foreign_and_hostile_files_raise_value_error(session, tmp_path):
    good = tmp_path / "good.ndbg"
    session.save(good)
    data = good.read_bytes()
    bad = tmp_path / "bad.ndbg"
    assert "too short" in _bad(bad, data[:5])
    assert "truncated" in _bad(bad, data[:-10]) or "beyond" in _bad(bad, data[:-10])
    assert "magic" in _bad(bad, b"PK\x03\x04" + data[4:])
    assert "version" in _bad(bad, data[:8] + struct.pack("<I", 99) + data[12:])
    assert "exceeds" in _bad(bad, data[:12] + struct.pack("<Q", 2 ** 60) + data[20:])
    assert _bad(bad, os.urandom(4096))
    # a pickle that would run code if it were unpickled
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))
    _bad(bad, pickle.dumps(Boom()))
    assert not (tmp_path / "pwned").exists()
    # a header declaring an absurd array: refused before anything is allocated
    import json
    hlen = struct.unpack("<Q", data[12:20])[0]
    header = json.loads(data[20:20 + hlen])
    header["arrays"][1]["shape"] = [10 ** 9, 10 ** 6, 13]
    header["arrays"][1]["nbytes"] = 10 ** 9 * 10 ** 6 * 13 * 4
    blob = json.dumps(header).encode()
    assert "beyond" in _bad(bad, MAGIC + struct.pack("<IQ", 1, len(blob)) + blob + data[20 + hlen:])
    with pytest.raises(ValueError, match="cannot open"):
        NeuralDbg.load(tmp_path / "missing.ndbg")


def test_a_file_of_the_first_format_still_loads_and_explains(tmp_path):
    """tests/data/v1_dead_relu.ndbg was written by the first file format (13 statistics, 5 global
    columns, no skipped steps): a 5-layer MLP whose third layer is dead from step 0."""
    path = os.path.join(os.path.dirname(__file__), "data", "v1_dead_relu.ndbg")
    with open(path, "rb") as f:
        assert struct.unpack("<8sIQ", f.read(20))[1] == 1
    loaded = NeuralDbg.load(path)
    t = loaded.trace
    assert t.stats.data.shape[2] == len(Stat) and t.globals.data.shape[1] == len(GLOBAL_COLUMNS)
    assert np.isfinite(t.stats.data[:, :, Stat.ACT_STD]).any()
    assert np.isnan(t.stats.data[:, :, [Stat.ACT_RANGE, Stat.ATTN_ENTROPY]]).all()  # not in that format
    assert np.isnan(t.global_column("loss_scale")).all() and t.skipped.n == 0 and t.overflow is None
    top = loaded.explain()[0]
    assert (str(top.cause), top.layer, top.step) == ("dead_units", "3", 0)
    loaded.save(tmp_path / "resaved.ndbg")  # written again in today's format, it reads back the same
    np.testing.assert_array_equal(NeuralDbg.load(tmp_path / "resaved.ndbg").trace.stats.data, t.stats.data)


class _FunctionalNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 16), nn.Linear(16, 2)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


def test_new_statistics_skipped_steps_and_overflow_round_trip(tmp_path):
    torch.manual_seed(0)
    model = _FunctionalNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # the first steps overflow and are skipped
    with NeuralDbg(model, optimizer=opt, scaler=scaler) as dbg:
        for _ in range(12):
            x = torch.randn(8, 4)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(x).float(), torch.randint(0, 2, (8,)))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert dbg.trace.skipped.n > 0 and dbg.trace.overflow is not None
    path = tmp_path / "mixed.ndbg"
    dbg.save(path)
    loaded = NeuralDbg.load(path)
    a, b = dbg.trace, loaded.trace
    assert [l.to_dict() for l in a.layers] == [l.to_dict() for l in b.layers]
    assert [l.where() for l in b.layers if l.is_site] == ["F.relu after `a`"]
    np.testing.assert_array_equal(a.stats.data, b.stats.data)
    np.testing.assert_array_equal(a.globals.data, b.globals.data)
    np.testing.assert_array_equal(a.skipped.steps, b.skipped.steps)
    np.testing.assert_array_equal(a.skipped.data, b.skipped.data)
    assert b.overflow == a.overflow
