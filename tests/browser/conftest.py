"""Fixtures for the real-browser tests: one JupyterLab server per session, headless Debian Chromium.

In CI (``CI`` set) these tests never skip: a missing Chromium is a failure. Elsewhere they skip
only when Chromium is absent.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from jupyter import CHROMIUM, CHROMIUM_ARGS, screenshot, start_server  # noqa: E402


def _require_chromium() -> None:
    if os.path.exists(CHROMIUM):
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing: CI must run the browser tests "
                    "(apt-get install -y --no-install-recommends chromium)", pytrace=False)
    pytest.skip(f"{CHROMIUM} is missing (install it: apt-get install -y --no-install-recommends chromium)")


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory):
    _require_chromium()
    server = start_server(tmp_path_factory.mktemp("jupyter"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chromium():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def nb_page(chromium, request):
    """A fresh browser context and page per test; a screenshot is kept when the test fails."""
    context = chromium.new_context(viewport={"width": 1400, "height": 2000})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    yield pg
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        try:
            screenshot(pg, f"FAILED-{request.node.name}")
        except Exception:  # noqa: BLE001 - the failure itself is what matters
            pass
    context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
