"""The notebooks in a real browser: JupyterLab 4 and Notebook 7 in headless Chromium.

Each test opens its own copy of a notebook (the same path would share a kernel), runs all cells
from the menu and checks what a user sees: the dashboard's health grid (headers, legend, nothing
clipped), the gradient-flow heatmap with the grid's rows, the explanation panel, the collapsed
thresholds and the note a slider move leaves, no error output, a dark theme that stays readable,
and an exported page that shows the verdict with no network.
"""
from __future__ import annotations

import json
import shutil

import pytest

from jupyter import (ARTIFACTS, KERNELSPEC, REPO, error_outputs, run_all, screenshot, wait_all_executed,
                     wait_kernel_ready)

pytestmark = pytest.mark.browser

# What the quickstart's first (failing) run is expected to conclude.
QUICKSTART_CAUSE, QUICKSTART_LAYER = "dead_units", "3"
HEADINGS = ["layer", "type", "activation", "gradient", "NaN/Inf"]

# Text that does not fit its box: an element that clips must end in an ellipsis and carry its full text
# in a title (shown on hover).
CLIPPED = """(root) => [...root.querySelectorAll('.ndbg-name, .ndbg-type, .ndbg-chip, .ndbg-head span')]
    .filter(e => e.checkVisibility() && e.scrollWidth > e.clientWidth + 1)
    .filter(e => !(getComputedStyle(e).textOverflow === 'ellipsis'
                   && (e.getAttribute('title') || '').includes(e.textContent.trim())))
    .map(e => `${e.className}: "${e.textContent}" needs ${e.scrollWidth}px, has ${e.clientWidth}px`)"""

# Rows of the grid as shown (a closed group is one row), and the labelled lines of the heatmap shown.
# (checkVisibility: the content of a closed <details> keeps a layout box in Chromium.)
GRID_ROWS = """(root) => [...root.querySelectorAll('.ndbg-grid .ndbg-row:not(.ndbg-head)')]
    .filter(e => e.checkVisibility()).map(e => e.getAttribute('data-layer'))"""
FLOW_ROWS = """(root) => [...root.querySelectorAll('.ndbg-flow-label')]
    .filter(e => e.checkVisibility()).map(e => e.getAttribute('data-row'))"""

# WCAG contrast of an element's text against what is behind it (translucent tints composed over the
# first opaque background up the tree; SVG text uses its fill).
CONTRAST = """(el) => {
    const rgba = c => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return [0, 0, 0, 0];
                        const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
                        return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
        const bg = rgba(getComputedStyle(e).backgroundColor);
        if (bg[3] > 0) layers.push(bg);
        if (bg[3] >= 1) break;
    }
    let back = [255, 255, 255];
    for (const l of layers.reverse()) back = back.map((c, i) => l[3] * l[i] + (1 - l[3]) * c);
    const style = getComputedStyle(el);
    const fg = rgba(el instanceof SVGElement ? style.fill : style.color);
    const lum = c => { const v = c.slice(0, 3).map(x => { x /= 255;
        return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
        return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
    const a = lum(fg), b = lum(back);
    return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def open_and_run(page, server, source: str, name: str, ui: str, after_load_ext: str = "") -> None:
    server.add_notebook(source, name, after_load_ext)
    page.goto(server.lab_url(name) if ui == "lab" else server.notebook_url(name))
    wait_kernel_ready(page)
    run_all(page)
    wait_all_executed(page, timeout=300_000)
    page.wait_for_selector(".ndbg-dashboard .ndbg-panel .ndbg-hyp, .ndbg-dashboard .ndbg-panel .ndbg-healthy")


def assert_no_errors(page) -> None:
    errors = error_outputs(page)
    assert not errors, "error output in the notebook:\n" + "\n---\n".join(errors)


def assert_chart_rendered(dashboard) -> None:
    chart = dashboard.locator(".ndbg-chart .ndbg-flow").first
    chart.wait_for(state="visible")
    assert dashboard.locator(".ndbg-chart svg.ndbg-loss").count() == 1
    box = chart.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 80, "the chart did not render"


def assert_reads_well(dashboard) -> None:
    """Headers over the columns, a legend, nothing clipped, columns aligned, the grid clear of the panel,
    heatmap lines that are the grid's rows, each labelled in text of a readable size."""
    heads = dashboard.locator(".ndbg-grid .ndbg-head span").all_text_contents()
    assert heads == HEADINGS
    legend = dashboard.locator(".ndbg-legend .ndbg-legend-chip")
    assert legend.count() >= 9 and all(legend.nth(i).get_attribute("title") for i in range(legend.count()))
    assert dashboard.evaluate(CLIPPED) == []
    lefts = dashboard.locator(".ndbg-grid .ndbg-row").evaluate_all(
        "rows => rows.filter(r => r.checkVisibility())"
        ".map(r => Math.round(r.children[2].getBoundingClientRect().left))")
    assert max(lefts) - min(lefts) <= 1, f"the activation column is not aligned: {sorted(set(lefts))}"
    grid = dashboard.locator(".ndbg-grid").first.bounding_box()
    panel = dashboard.locator(".ndbg-panel").first.bounding_box()
    assert grid["x"] + grid["width"] <= panel["x"] + 1 or panel["y"] >= grid["y"] + grid["height"] - 1
    assert dashboard.evaluate(GRID_ROWS) == dashboard.evaluate(FLOW_ROWS)
    sizes = dashboard.locator(".ndbg-flow-label").evaluate_all(
        "ls => ls.filter(l => l.checkVisibility()).map(l => { const b = l.getBoundingClientRect(),"
        " s = l.closest('.ndbg-flow').getBoundingClientRect(); return [b.height, b.left - s.left]; })")
    assert sizes and all(h >= 10 and left >= 0 for h, left in sizes), sizes  # readable, inside the chart


def first_hypothesis(dashboard) -> tuple[str, str]:
    hyp = dashboard.locator(".ndbg-panel .ndbg-hyp").first
    return hyp.get_attribute("data-cause"), hyp.get_attribute("data-layer")


def open_thresholds(page, dashboard) -> None:
    """The sliders start collapsed under the panel; open the "Thresholds" section."""
    slider = dashboard.locator(".ndbg-slider").first
    assert not slider.is_visible()
    header = dashboard.locator(".ndbg-thresholds").get_by_text("Thresholds", exact=True).first
    header.scroll_into_view_if_needed()
    header.click()
    slider.wait_for(state="visible")


def slide_to_end(page, dashboard, name: str) -> None:
    handle = dashboard.locator(f".ndbg-slider-{name} .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.keyboard.press("End")


def wait_note(page, dashboard, text: str) -> str:
    note = dashboard.locator(".ndbg-reanalysed")
    page.wait_for_function("([el, t]) => el.textContent.includes(t)", arg=[note.element_handle(), text],
                           timeout=20_000)
    assert note.is_visible()
    return note.inner_text()


def assert_static_copies_hidden(page) -> None:
    static = page.locator(".ndbg-static")
    assert static.count() >= 1 and not any(static.nth(i).is_visible() for i in range(static.count()))


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_quickstart_dashboard(jupyter_server, nb_page, ui):
    page = nb_page
    open_and_run(page, jupyter_server, "01_quickstart.ipynb", f"quickstart_{ui}.ipynb", ui)
    dashboards = page.locator(".ndbg-dashboard")
    assert dashboards.count() == 2  # the failing run and the healthy rerun
    failing, healthy = dashboards.nth(0), dashboards.nth(1)
    assert_static_copies_hidden(page)  # the exports' copies: hidden while the live dashboards render

    # the health grid: the dead layer's row in its failing state
    row = failing.locator(f'.ndbg-grid .ndbg-row[data-layer="{QUICKSTART_LAYER}"]')
    assert row.count() == 1
    assert row.get_attribute("data-act") == "dead"
    assert failing.locator(".ndbg-grid .ndbg-row:not(.ndbg-head)").count() == 5

    # the explanation panel: the cause and the layer, ranked first
    assert first_hypothesis(failing) == (QUICKSTART_CAUSE, QUICKSTART_LAYER)
    assert "dead units" in failing.locator(".ndbg-panel").inner_text()
    assert_chart_rendered(failing)
    assert_reads_well(failing)
    assert "finished" in failing.locator(".ndbg-progress").inner_text()

    # the rerun with the fix applied is healthy
    assert healthy.locator(".ndbg-panel .ndbg-healthy").count() == 1
    assert healthy.locator('.ndbg-grid .ndbg-row[data-act="dead"]').count() == 0
    assert_chart_rendered(healthy)
    assert_no_errors(page)
    screenshot(page, f"quickstart-{ui}")

    # a threshold slider re-analyses the recorded run: with update_negligible at its maximum, the updates
    # of this run count as negligible and the panel says so (in the dead layer's chain, whose blocked gradient
    # explains them, or as a weak learning-rate hypothesis); the verdict (the confident hypotheses) stays, and
    # the note says so
    open_thresholds(page, failing)
    labels = failing.locator(".ndbg-slider .widget-label").all_text_contents()
    assert "update_negligible" in labels and "dead_fraction" in labels  # the names users type
    panel = failing.locator(".ndbg-panel")
    before = panel.inner_html()
    assert "negligible" not in panel.inner_text()
    slide_to_end(page, failing, "update_negligible")
    note = wait_note(page, failing, "update_negligible=")
    assert "Re-analysed with update_negligible=0.01" in note and "the verdict did not change" in note
    assert panel.inner_html() != before
    assert "updates are negligible" in panel.inner_text()
    assert first_hypothesis(failing) == (QUICKSTART_CAUSE, QUICKSTART_LAYER)  # still the root cause
    assert_no_errors(page)
    screenshot(page, f"quickstart-{ui}-slider")

    # the reset button brings the default thresholds and the first verdict back
    failing.locator(".ndbg-reset").click()
    page.wait_for_function("([el, old]) => el.innerHTML === old", arg=[panel.element_handle(), before],
                           timeout=15_000)
    assert "Re-analysed with the default thresholds" in wait_note(page, failing, "default thresholds")


def test_transformer_in_lab(jupyter_server, nb_page):
    """A 68-layer Transformer: folded blocks with the worst state, the heatmap row for row with the grid,
    a block unfolded on click, and a dark theme that stays readable. Its screenshot is the README's."""
    page = nb_page
    open_and_run(page, jupyter_server, "11_deep_transformer.ipynb", "transformer_lab.ipynb", "lab")
    dashboards = page.locator(".ndbg-dashboard")
    assert dashboards.count() == 2
    failing = dashboards.nth(0)
    assert first_hypothesis(failing)[0] == "learning_rate_too_high"
    assert_chart_rendered(failing)
    assert_no_errors(page)

    # folded: blocks.0 .. blocks.7 are one row each, with the worst state of their layers
    folds = failing.locator(".ndbg-grid .ndbg-fold")
    keys = [folds.nth(i).get_attribute("data-layer") for i in range(folds.count())]
    assert keys == [f"blocks.{b}" for b in range(8)]
    titles = folds.locator(".ndbg-name").evaluate_all("ns => ns.map(n => n.getAttribute('title'))")
    in_blocks = sum(int(t.split(": ")[1].split(" ")[0]) for t in titles)  # "blocks.0: 8 layers (click ...)"
    singles = failing.locator(".ndbg-grid .ndbg-row:not(.ndbg-head):not(.ndbg-fold):not(.ndbg-group)").count()
    assert in_blocks + singles >= 60
    assert all(folds.nth(i).get_attribute("data-act") == "anomalous" for i in range(folds.count()))
    assert_reads_well(failing)
    failing.scroll_into_view_if_needed()
    failing.screenshot(path=str(ARTIFACTS / "dashboard-lab.png"))  # the README's picture

    # a click unfolds a block: its layers join the grid and the heatmap, in the same order
    flow_before = failing.evaluate(FLOW_ROWS)
    failing.locator(".ndbg-unfold").nth(3).click()
    page.wait_for_function("([root, n]) => [...root.querySelectorAll('.ndbg-flow-label')]"
                           ".filter(e => e.checkVisibility()).length > n",
                           arg=[failing.element_handle(), len(flow_before)], timeout=15_000)
    rows = failing.evaluate(GRID_ROWS)
    assert "blocks.3.self_attn" in rows and rows == failing.evaluate(FLOW_ROWS)
    assert_reads_well(failing)

    # the thresholds: collapsed, then a move that leaves the verdict as it is still says it ran
    open_thresholds(page, failing)
    slide_to_end(page, failing, "dead_fraction")
    assert "the verdict did not change" in wait_note(page, failing, "dead_fraction=")

    # a dark theme: every text keeps a readable contrast
    menu = page.locator('.lm-MenuBar-itemLabel:text-is("Settings")')
    try:
        menu.click()
        page.locator('.lm-Menu-itemLabel:text-is("Theme")').click()
        page.locator('.lm-Menu-itemLabel:text-is("JupyterLab Dark")').click()
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=15_000)
        page.wait_for_timeout(500)
        for sel in (".ndbg-panel .ndbg-hyp", ".ndbg-grid .ndbg-name", ".ndbg-grid .ndbg-chip",
                    ".ndbg-flow-label", ".ndbg-reanalysed .ndbg-note", ".ndbg-progress div"):
            el = failing.locator(sel).first
            ratio = el.evaluate(CONTRAST)
            assert ratio >= 4.5, f"{sel}: contrast {ratio:.2f} in the dark theme"
        failing.scroll_into_view_if_needed()
        screenshot(page, "transformer-lab-dark")
    finally:
        menu.click()
        page.locator('.lm-Menu-itemLabel:text-is("Theme")').click()
        page.locator('.lm-Menu-itemLabel:text-is("JupyterLab Light")').click()


def test_nan_hunt_in_lab(jupyter_server, nb_page):
    # one live dashboard at a time: when the second run starts, the first one's widgets close and its
    # static copy (below its cell) shows what it found, with no widget left to fail
    page = nb_page
    open_and_run(page, jupyter_server, "02_nan_hunt.ipynb", "nan_hunt_lab.ipynb", "lab",
                 after_load_ext="%config NeuralDbgMagics.live_dashboards = 1")
    live = page.locator(".ndbg-dashboard")
    assert live.count() == 1 and live.first.locator(".ndbg-thresholds").count() == 1
    static = page.locator(".ndbg-static")
    shown = [static.nth(i) for i in range(static.count()) if static.nth(i).is_visible()]
    assert len(shown) == 1
    failing = shown[0]
    assert first_hypothesis(failing) == ("non_finite", "log")
    # the grid shows the latest state: the layers after `log` carry NaN from the poisoned weights
    assert failing.locator('.ndbg-grid .ndbg-row[data-nonfinite="true"]').count() >= 1
    assert "step 40" in failing.locator(".ndbg-panel").inner_text()
    assert failing.locator(".ndbg-flow").is_visible()
    assert live.first.locator(".ndbg-panel .ndbg-healthy").count() == 1
    assert_no_errors(page)
    screenshot(page, "nan-hunt-lab")


LIVE_CELLS = ["%load_ext ndbg_jupyter", """\
import time
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)
X, y = torch.randn(2048, 20), torch.randint(0, 2, (2048,))
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
with torch.no_grad():
    model[2].bias.fill_(-6.0)          # the second ReLU's units are dead from the start
opt = torch.optim.SGD(model.parameters(), lr=0.1)""", """\
%%neuraldbg model --optimizer opt
for step in range(400):
    j = (step * 64) % len(X)
    opt.zero_grad()
    loss = F.cross_entropy(model(X[j:j + 64]), y[j:j + 64])
    loss.backward()
    opt.step()
    time.sleep(0.02)                   # a step of ~20 ms: the cell takes ~8 s"""]

# the progress line's step and the grid's state of layer "3", as the page shows them now
LIVE_STATE = """(root) => {
    const p = root.querySelector('.ndbg-progress');
    const row = root.querySelector('.ndbg-grid .ndbg-row[data-layer="3"]');
    const m = p ? p.textContent.match(/step (\\d+)/) : null;
    return [m ? Number(m[1]) : -1, p ? p.textContent : '', row ? row.getAttribute('data-act') : ''];
}"""


def test_dashboard_updates_while_training(jupyter_server, nb_page):
    """While the cell runs, the page shows the step count growing and the dead layer before the end:
    frames drawn off the training thread reach the browser during training, not only at its end."""
    page = nb_page
    cells = [{"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
             for src in LIVE_CELLS]
    nb = {"cells": cells, "metadata": {"kernelspec": KERNELSPEC}, "nbformat": 4, "nbformat_minor": 5}
    (jupyter_server.root / "live_lab.ipynb").write_text(json.dumps(nb, indent=1))
    page.goto(jupyter_server.lab_url("live_lab.ipynb"))
    wait_kernel_ready(page)
    run_all(page)
    dashboard = page.locator(".ndbg-dashboard").first
    dashboard.wait_for(state="visible", timeout=120_000)
    seen = []
    while True:
        step, text, act = dashboard.evaluate(LIVE_STATE)
        if "finished" in text:
            break
        if step >= 0:
            seen.append((step, act))
        page.wait_for_timeout(250)
    steps = sorted({s for s, _ in seen})
    assert len(steps) >= 3 and steps[-1] < 400, f"the progress did not move while training: {seen}"
    assert any(act == "dead" and s < 400 for s, act in seen), f"the dead layer did not show while training: {seen}"
    wait_all_executed(page)
    assert first_hypothesis(dashboard) == ("dead_units", "3"), dashboard.inner_text()
    assert_no_errors(page)


def test_exported_page_shows_the_verdict_with_no_network(chromium, quickstart_html):
    """``jupyter nbconvert --to html --execute`` of the quickstart, opened with every request to a
    network refused: the widgets cannot load, their static copies show the verdict."""
    context = chromium.new_context(viewport={"width": 1200, "height": 1600})
    refused = []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else (refused.append(route.request.url), route.abort()))
    try:
        page = context.new_page()
        page.goto(quickstart_html.as_uri())
        static = page.locator(".ndbg-static")
        static.first.wait_for(state="visible")
        assert static.count() == 2 and all(static.nth(i).is_visible() for i in range(2))
        failing, healthy = static.nth(0), static.nth(1)
        assert first_hypothesis(failing) == (QUICKSTART_CAUSE, QUICKSTART_LAYER)
        assert "Why this run fails" in failing.inner_text() and failing.locator(".ndbg-flow").is_visible()
        assert healthy.locator(".ndbg-healthy").is_visible()
        # folded groups unfold without a kernel: none here (5 layers), so the rows are all there
        assert failing.locator(".ndbg-grid .ndbg-row:not(.ndbg-head)").count() == 5
        assert refused, "the page asked for nothing from a network: the widgets' renderer was not even tried"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "export-offline.png"), full_page=True)
        shutil.copy(quickstart_html, ARTIFACTS / "quickstart-export.html")
    finally:
        context.close()


def test_readme_screenshot_is_the_transformer_dashboard():
    # docs/dashboard.png is the browser test's capture of the Transformer dashboard (copied by hand after
    # looking at it); it exists and is a PNG wide enough to read
    png = (REPO / "docs" / "dashboard.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(png[16:20], "big")
    assert width >= 800
