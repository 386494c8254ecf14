"""``anarchon ui`` in a real browser: Debian's chromium, headless, driven by Selenium through Debian's
chromedriver (never a driver or browser fetched by Selenium Manager), against the real control
plane with an operator replica running the jobs.

Everything is per module, shared by its tests: one namespace, one replica, one ``anarchon ui``
process per user, one browser session. Screenshots go under the pytest temporary directory
(their paths printed).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.fixtures import fresh_namespace
from tests.operator.conftest import REPO, Cluster, Replicas, crds  # noqa: F401 - the CRDs, for the namespace

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def ui_namespace(control_plane: Any, crds: None) -> Iterator[str]:  # noqa: F811 - the fixture, used
    """A namespace for the whole module (the ``namespace`` fixture is per test)."""
    with fresh_namespace(control_plane, "ui") as name:
        yield name


@pytest.fixture(scope="module")
def ui_cluster(control_plane: Any, ui_namespace: str) -> Cluster:
    return Cluster(control_plane, ui_namespace)


@pytest.fixture(scope="module")
def ui_replicas(control_plane: Any, ui_namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    logs = tmp_path_factory.mktemp("replicas")
    replicas = Replicas(control_plane, ui_namespace, f"sqlite://{logs / 'store.db'}", logs)
    yield replicas
    replicas.stop_all()


class UiServer:
    """One ``anarchon ui`` process (``python -m anarchon ui``, as a user starts it) and its URL."""

    def __init__(self, kubeconfig: Path, *scope: str) -> None:
        """``scope``: ``-n NS`` or ``-A``."""
        env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
        env.pop("KUBECONFIG", None)
        args = ["ui", *scope, "--kubeconfig", str(kubeconfig), "--port", "0"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "anarchon", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("anarchon ui: http://127.0.0.1:"):
            self.stop()
            pytest.fail(f"anarchon ui did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url = line.split()[2].rstrip("/")

    def stop(self) -> str:
        """Ctrl-C, as a user stops it; what it wrote on stderr."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stderr.read() if self.proc.stderr else ""


def chromium() -> Any:
    """Debian's chromium, headless, through Debian's chromedriver (never one Selenium Manager
    fetches), its console log kept (``driver.get_log("browser")``). Raises RuntimeError, saying
    what to install, if either is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        raise RuntimeError(f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000", "--lang=en"):
        opts.add_argument(arg)  # --no-sandbox: the tests run as root
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module."""
    try:
        driver = chromium()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (kept by pytest with its temporary directories)."""
    return tmp_path_factory.mktemp("ui-screenshots")
