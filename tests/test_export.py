"""Exported notebooks keep the verdict: HTML (no network), Markdown in the cell's own output order, and
``%neuraldbg explain`` as text in a text export."""
from __future__ import annotations

from html.parser import HTMLParser

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")
nbconvert = pytest.importorskip("nbconvert")

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
print("training starts")
for step in range(12):
    x = torch.randn(32, 4); y = torch.randint(0, 2, (32,))
    opt.zero_grad(); loss = nn.functional.cross_entropy(model(x), y); loss.backward(); opt.step()
print("training done")
"""


class _Static(HTMLParser):
    """The visible text inside elements of class ``ndbg-static`` (none of it inside a script)."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.script = 0
        self.text: list[str] = []
        self.scripts_inside = 0

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if self.depth:
            self.depth += tag not in ("br", "img", "input", "line", "rect", "path", "image")
            self.scripts_inside += tag == "script"
        elif "ndbg-static" in cls.split():
            self.depth = 1
        self.script += tag == "script"

    def handle_endtag(self, tag):
        self.script -= tag == "script"
        if self.depth and tag not in ("br", "img", "input", "line", "rect", "path", "image"):
            self.depth -= 1
            if self.depth == 0:
                self.text.append("\n")

    def handle_data(self, data):
        if self.depth and not self.script:
            self.text.append(data)


def static_text(page: str) -> tuple[str, int]:
    parser = _Static()
    parser.feed(page)
    return "".join(parser.text), parser.scripts_inside


def test_the_html_export_of_the_quickstart_shows_the_verdict_without_a_network(quickstart_html):
    page = quickstart_html.read_text()
    text, scripts = static_text(page)
    assert scripts == 0  # the copy needs no script (the widgets do, from a CDN)
    assert "Why this run fails (after 150 steps)" in text and "dead units in 3, from step 0" in text
    assert "No training failure detected after 150 steps." in text  # the rerun with the fix
    assert "no gradient flows back through 3" in text and "re-initialise 2" in text


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP, TRAIN, "%neuraldbg explain")]
    path = tmp_path_factory.mktemp("nb")
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path)}})
    client.execute()
    return nb


def test_markdown_keeps_the_cells_order_and_explain_as_text(executed):
    body, _ = nbconvert.MarkdownExporter().from_notebook_node(executed)
    train = body.index("```", body.index("%%neuraldbg model --optimizer opt"))  # the end of the cell's source
    starts, done = body.index("training starts", train), body.index("training done", train)
    verdict = body.index("Why this run fails", train)
    assert train < starts < done < verdict  # the report follows the cell's own prints
    assert body.index("NeuralDbg dashboard (model)", train) < starts  # the live view's place holds its title only
    explain = body[body.index("%neuraldbg explain"):]
    assert "**NeuralDbg:** dead_units in `1`, from step 0" in explain and "**fix:**" in explain
    assert "<div" not in explain and "style=" not in explain


def test_the_html_export_of_a_watched_cell_holds_its_final_state(executed):
    page, _ = nbconvert.HTMLExporter().from_notebook_node(executed)
    text, scripts = static_text(page)
    assert scripts == 0
    assert "training done" in page and "Why this run fails (after 12 steps)" in text
    assert "dead units in 1, from step 0" in text
    # the widget state is saved too, so a viewer that can load widgets shows them (and hides the copy)
    assert executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
