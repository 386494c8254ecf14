"""What the UI's tests and its benchmark (bench/bench_ui.py) share: ``anarchon ui`` as a process, and
Debian's chromium driven by Selenium."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.controlplane import REPO

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


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
                # Generous: under CI's load (three workers and their replicas on two cores) two
                # servers once took over 10 s to exit cleanly; a hang still ends in SIGKILL, -9.
                self.proc.wait(timeout=30)
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
