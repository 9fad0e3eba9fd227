"""The notebooks in a real browser: JupyterLab 4 and Notebook 7 in headless Chromium.

Each test opens its own copy of a notebook (the same path would share a kernel), runs all cells
from the menu and checks what a user sees: the dashboard's health grid, explanation panel and
chart, no error output, and a threshold slider that re-analyses the run.
"""
from __future__ import annotations

import pytest

from jupyter import ARTIFACTS, error_outputs, run_all, screenshot, wait_all_executed, wait_kernel_ready

pytestmark = pytest.mark.browser

# What the quickstart's first (failing) run is expected to conclude.
QUICKSTART_CAUSE, QUICKSTART_LAYER = "dead_units", "3"


def open_and_run(page, server, source: str, name: str, ui: str, after_load_ext: str = "") -> None:
    server.add_notebook(source, name, after_load_ext)
    page.goto(server.lab_url(name) if ui == "lab" else server.notebook_url(name))
    wait_kernel_ready(page)
    run_all(page)
    wait_all_executed(page)
    page.wait_for_selector(".ndbg-dashboard .ndbg-panel .ndbg-hyp, .ndbg-dashboard .ndbg-panel .ndbg-healthy")


def assert_no_errors(page) -> None:
    errors = error_outputs(page)
    assert not errors, "error output in the notebook:\n" + "\n---\n".join(errors)


def assert_chart_rendered(dashboard) -> None:
    chart = dashboard.locator("img.ndbg-chart, .ndbg-chart img").first
    chart.wait_for(state="visible")
    width = chart.evaluate("img => img.complete ? img.naturalWidth : 0")
    assert width > 0, "the chart image did not render"


def first_hypothesis(dashboard) -> tuple[str, str]:
    hyp = dashboard.locator(".ndbg-panel .ndbg-hyp").first
    return hyp.get_attribute("data-cause"), hyp.get_attribute("data-layer")


@pytest.mark.parametrize("ui", ["lab", "notebook"])
def test_quickstart_dashboard(jupyter_server, nb_page, ui):
    page = nb_page
    open_and_run(page, jupyter_server, "01_quickstart.ipynb", f"quickstart_{ui}.ipynb", ui)
    dashboards = page.locator(".ndbg-dashboard")
    assert dashboards.count() == 2  # the failing run and the healthy rerun
    failing, healthy = dashboards.nth(0), dashboards.nth(1)

    # the health grid: the dead layer's row in its failing state
    row = failing.locator(f'.ndbg-grid .ndbg-row[data-layer="{QUICKSTART_LAYER}"]')
    assert row.count() == 1
    assert row.get_attribute("data-act") == "dead"
    assert failing.locator(".ndbg-grid .ndbg-row").count() == 5

    # the explanation panel: the cause and the layer, ranked first
    assert first_hypothesis(failing) == (QUICKSTART_CAUSE, QUICKSTART_LAYER)
    assert "dead units" in failing.locator(".ndbg-panel").inner_text()
    assert_chart_rendered(failing)
    assert "finished" in failing.locator(".ndbg-progress").inner_text()

    # the rerun with the fix applied is healthy
    assert healthy.locator(".ndbg-panel .ndbg-healthy").count() == 1
    assert healthy.locator('.ndbg-grid .ndbg-row[data-act="dead"]').count() == 0
    assert_chart_rendered(healthy)
    assert_no_errors(page)
    screenshot(page, f"quickstart-{ui}")
    if ui == "lab":  # the dashboard alone, for the README
        failing.scroll_into_view_if_needed()
        failing.screenshot(path=str(ARTIFACTS / "dashboard-lab.png"))

    # a threshold slider re-analyses the recorded run: with "update/weight low" at its maximum, the
    # updates of this run count as negligible and a (weak) learning-rate hypothesis joins the panel
    panel = failing.locator(".ndbg-panel")
    before = panel.inner_html()
    handle = failing.locator(".ndbg-slider-update_negligible .noUi-handle")
    handle.scroll_into_view_if_needed()
    handle.focus()
    page.keyboard.press("End")
    page.wait_for_function("([el, old]) => el.innerHTML !== old", arg=[panel.element_handle(), before],
                           timeout=15_000)
    assert panel.locator('.ndbg-hyp[data-cause="learning_rate_too_low"]').count() == 1
    assert first_hypothesis(failing) == (QUICKSTART_CAUSE, QUICKSTART_LAYER)  # still the root cause
    assert_no_errors(page)
    screenshot(page, f"quickstart-{ui}-slider")

    # the reset button brings the default thresholds and the first verdict back
    failing.locator(".ndbg-reset").click()
    page.wait_for_function("([el, old]) => el.innerHTML === old", arg=[panel.element_handle(), before],
                           timeout=15_000)


def test_nan_hunt_in_lab(jupyter_server, nb_page):
    # one live dashboard at a time: the first run's is replaced by its static copy when the second
    # run starts, and must still show what it found, with no widget left to fail
    page = nb_page
    open_and_run(page, jupyter_server, "02_nan_hunt.ipynb", "nan_hunt_lab.ipynb", "lab",
                 after_load_ext="%config NeuralDbgMagics.live_dashboards = 1")
    dashboards = page.locator(".ndbg-dashboard")
    assert dashboards.count() == 2
    failing, fixed = dashboards.nth(0), dashboards.nth(1)
    assert "ndbg-archived" in failing.get_attribute("class")
    assert "ndbg-archived" not in fixed.get_attribute("class") and fixed.locator(".ndbg-slider").count() > 0
    assert first_hypothesis(failing) == ("non_finite", "log")
    # the grid shows the latest state: the layers after `log` carry NaN from the poisoned weights
    assert failing.locator('.ndbg-grid .ndbg-row[data-nonfinite="true"]').count() >= 1
    assert "step 40" in failing.locator(".ndbg-panel").inner_text()
    assert_chart_rendered(failing)
    assert fixed.locator(".ndbg-panel .ndbg-healthy").count() == 1
    assert_no_errors(page)
    screenshot(page, "nan-hunt-lab")
