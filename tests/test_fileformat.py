"""The .ndbg trace file: round trip, and one-line ValueErrors for anything else."""
import os
import pickle
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuraldbg import NeuralDbg
from neuraldbg.fileformat import MAGIC


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
