"""What `make e2e` starts: JupyterLab serving copies of the notebooks, and Debian's headless Chromium.

The browser is Debian's `chromium` driven through Debian's `chromedriver` by selenium (installed by
`make e2e`: scripts/install_browser.sh, then requirements-e2e.txt). Where the browser could not be
installed, every test here is skipped with a sentence saying why and how to install it: a machine
without a browser is not a failing kit.

JupyterLab runs with the kit's own Python (the kernel imports the installed `helpers`), on a free
port with a random token, over a temporary folder holding copies of the committed notebooks, so a
run never edits the repository. It runs offline like a student without internet: the Hub and wandb
are switched off, and the notebooks fall back to the embedded model as they say they will.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "build" / "e2e"
INSTALL_HINT = "run `sudo apt-get install chromium chromium-driver` (Debian/Ubuntu), then `make e2e` again"


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def browser_paths() -> tuple[str, str]:
    """(chromium, chromedriver), or a skip that says what is missing and how to install it."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed: run `make e2e`, which installs requirements-e2e.txt")
    chromium = _find("chromium", "chromium-browser", "/usr/lib/chromium/chromium")
    driver = _find("chromedriver", "/usr/lib/chromium/chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if path is None]
    if missing:
        pytest.skip(f"no {' and no '.join(missing)} on this machine: {INSTALL_HINT}")
    return chromium, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def lab(browser_paths):
    """A JupyterLab server over copies of the notebooks: yields (base URL, token, its folder)."""
    root = Path(tempfile.mkdtemp(prefix="kit-e2e-"))
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(notebook, root / notebook.name)
    port, token = _free_port(), secrets.token_hex(16)
    # a browser shows these kernels: the widgets the root conftest.py turns off for headless runs are wanted here
    env = {k: v for k, v in os.environ.items() if k != "HELPERS_HEADLESS"}
    env.update(
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        WANDB_DIR=str(root),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        env[name] = str(root / ".jupyter" / name.lower())  # no settings of the machine's user leak in
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: the tests run commands as a menu would
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.geteuid() == 0:  # CI containers run as root; JupyterLab refuses that unless told
        command.append("--allow-root")
    settings = {
        # no "get Jupyter news?" toast over the notebook in every screenshot
        "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        # every cell rendered, not only those in view: the tests read what the page shows
        "notebook-extension/tracker": {"windowingMode": "none"},
    }
    for name, values in settings.items():
        path = root / ".jupyter" / "jupyterlab_settings_dir" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    log = (root / "jupyterlab.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not _answers(f"{base}/api/status?token={token}"):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"JupyterLab did not start; its log:\n{(root / 'jupyterlab.log').read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield base, token, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="session")
def driver(browser_paths):
    """Headless Debian Chromium under selenium, at a laptop's window size."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = browser_paths
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)  # no sandbox: CI runs as root, where Chromium's sandbox refuses to start
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    browser.set_script_timeout(60)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """build/e2e/, where every test leaves what the browser showed."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
