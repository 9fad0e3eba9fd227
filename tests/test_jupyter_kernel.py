"""%%neuraldbg in a real kernel (no browser): widgets are offered, the verdict is the text form,
and a failing training cell fails the notebook run just as it would without the magic."""
from __future__ import annotations

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

SETUP = """
%load_ext ndbg_jupyter
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
with torch.no_grad():
    model[0].bias.fill_(-50.0)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
"""

TRAIN = """%%neuraldbg model --optimizer opt
for step in range(12):
    x = torch.randn(32, 4); y = torch.randint(0, 2, (32,))
    opt.zero_grad(); loss = nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
    if step == {crash}: raise ValueError("crashed in the loop")
step
"""

CHECK = "print(_ndbg.step, _ndbg.watching, [str(h.cause) for h in _ndbg.explain()][:1])"


def _run(cells, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    error = None
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        error = e
    return nb, error


def test_cell_magic_in_a_kernel(tmp_path):
    nb, error = _run([SETUP, TRAIN.format(crash=-1), CHECK, TRAIN.format(crash=4), "print('not reached')"], tmp_path)
    train_out, check_out, crash_out = nb.cells[1].outputs, nb.cells[2].outputs, nb.cells[3].outputs
    # the dashboard is offered as a widget; after the cell's own output comes its final state as text and
    # self-contained HTML (what an export without the widget shows)
    kinds = [("view" if WIDGET_VIEW in o.get("data", {}) else "static" if "ndbg-static" in
              o.get("data", {}).get("text/html", "") else o.output_type) for o in train_out]
    assert kinds == ["view", "execute_result", "static"]  # the cell's last value between them, as in a plain cell
    assert train_out[1].data["text/plain"] == "11"
    static = train_out[2].data
    assert "dead_units" in static["text/plain"] and 'data-cause="dead_units"' in static["text/html"]
    assert check_out[0].text.strip() == "12 False ['dead_units']"
    # a crash in the loop: the user's traceback, the partial verdict, and the run stops there
    assert error is not None and "ValueError" in str(error)
    assert any(o.output_type == "error" and o.ename == "ValueError" for o in crash_out)
    crash_static = [o for o in crash_out if "ndbg-static" in o.get("data", {}).get("text/html", "")]
    assert len(crash_static) == 1 and "dead_units" in crash_static[0].data["text/plain"]
    assert nb.cells[4].outputs == []
