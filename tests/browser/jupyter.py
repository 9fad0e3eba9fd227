"""A throwaway JupyterLab server and the page actions the browser tests share.

The server runs as the current user (``--allow-root`` for CI, which runs as root) on a free port
of 127.0.0.1 with a random token, in a temporary root directory, with its own config, runtime and
IPython directories, so nothing of the developer's own Jupyter set-up leaks in or out.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "test-artifacts" / "browser"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}

# Lab settings written into the temporary config dir: no news toast, and every cell in the DOM
# (windowing would leave cells outside the viewport unrendered, and their outputs unseen).
_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JupyterServer:
    proc: subprocess.Popen
    port: int
    token: str
    root: Path
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lab_url(self, name: str) -> str:
        return f"{self.base}/lab/tree/{name}?reset&token={self.token}"

    def notebook_url(self, name: str) -> str:
        return f"{self.base}/notebooks/{name}?token={self.token}"

    def api(self, path: str):
        req = urllib.request.Request(f"{self.base}/api/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def add_notebook(self, source: str, name: str, after_load_ext: str = "") -> str:
        """Copy ``notebooks/<source>`` into the server's root as ``name``, outputs cleared and the
        kernelspec set (a notebook without one opens a "Select Kernel" dialog); ``after_load_ext``:
        a code cell to insert after the ``%load_ext ndbg_jupyter`` cell."""
        nb = json.loads((NOTEBOOKS / source).read_text())
        if after_load_ext:
            at = next(i for i, c in enumerate(nb["cells"]) if "%load_ext ndbg_jupyter" in "".join(c["source"]))
            nb["cells"].insert(at + 1, {"cell_type": "code", "metadata": {}, "source": after_load_ext,
                                        "outputs": [], "execution_count": None})
        nb.setdefault("metadata", {})["kernelspec"] = KERNELSPEC
        nb["metadata"].pop("widgets", None)
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        for extra in (NOTEBOOKS / source).parent.glob("*.py"):  # helper scripts a notebook runs
            shutil.copy(extra, self.root / extra.name)
        (self.root / name).write_text(json.dumps(nb, indent=1))
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the server shuts its kernels down
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_server(tmp: Path) -> JupyterServer:
    root, config, runtime, ipython = (tmp / d for d in ("root", "config", "runtime", "ipython"))
    for d in (root, config, runtime, ipython):
        d.mkdir(parents=True)
    for rel, value in _SETTINGS.items():
        path = config / "lab" / "user-settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(config), JUPYTER_RUNTIME_DIR=str(runtime),
               IPYTHONDIR=str(ipython), OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.pop("JUPYTER_TOKEN", None)
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--ServerApp.open_browser=False"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = JupyterServer(proc, port, token, root, log)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.api("status")
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"jupyter lab did not answer in 60 s:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.25)


# -- page actions -----------------------------------------------------------------------------------

_PROMPT_DONE = re.compile(r"^\[\d+\]:$")


def wait_kernel_ready(page, timeout: float = 90_000) -> None:
    """The toolbar names the kernel and the execution indicator reads idle (before the kernel
    exists the indicator already says idle, so both are needed)."""
    page.wait_for_function(
        """() => {
            const name = document.querySelector('.jp-Toolbar-kernelName, .jp-KernelName');
            const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return name && /Python/.test(name.textContent) && ind && ind.getAttribute('data-status') === 'idle';
        }""", timeout=timeout)


def run_all(page) -> None:
    page.locator('.lm-MenuBar-itemLabel:text-is("Run")').click()
    page.locator('.lm-Menu-itemLabel:text-is("Run All Cells")').click()


def wait_all_executed(page, timeout: float = 150_000) -> None:
    """Every code cell shows an execution count and the kernel is idle again."""
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')];
            const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return prompts.length > 0
                && prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim()))
                && ind && ind.getAttribute('data-status') === 'idle';
        }""", timeout=timeout)


def error_outputs(page) -> list[str]:
    """Tracebacks and widget failures shown anywhere in the notebook."""
    found = []
    for el in page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').all():
        text = el.inner_text()
        if re.search(r"Traceback|Error|Exception", text):
            found.append(text[:2000])
    body = page.locator(".jp-Notebook").inner_text()
    for marker in ("Error displaying widget", "Error rendering", "Failed to load model class",
                   "dashboard updates stopped", "re-analysis failed", "could not analyse the run"):
        if marker in body:
            found.append(marker)
    return found


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
