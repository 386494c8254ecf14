"""Settings that cannot work stop the real entry point at once: exit code 2, one line, no traceback.

Each case runs ``python -m anarchon`` as a subprocess with a bare environment (an empty HOME,
no KUBECONFIG, no in-cluster variables), as a Pod with a typo in its settings would. On main a
bad port was a ValueError traceback after the health server had started (a crash loop), a
relative SQLite path was quietly resolved against the working directory, and missing
credentials were a traceback ending in "Invalid kube-config file. Expected key current-context".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import one_line_error

REPO = Path(__file__).resolve().parents[2]


def anarchon(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO / "operator")}
    return subprocess.run(
        [sys.executable, "-m", "anarchon", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=home,
        timeout=60,
    )


def operator(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return anarchon(home, "operator", "--metrics-port", "0", "--health-port", "0", "-n", "default", *args, **env)


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that loads (nothing is contacted before the store URL is checked)."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        """
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
"""
    )
    return path


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("redis://h:notaport", ["store URL redis://h:notaport", "must be a number from 0 to 65535"]),
        ("redis://:secret@h:99999/0", ["store URL redis://h:99999", "0 to 65535"]),
        ("postgresql://u:secret@h1:5432,h2:x/db", ["'h2:x'", "must be a number"]),
        ("amqp://u:secret@h:amqp/", ["'h:amqp'"]),
        ("sqlite://relative.db", ["'sqlite://relative.db'", "must be absolute", "sqlite:///var/lib"]),
        ("sqlite://", ["must be absolute"]),
        ("mysql://h/db", ["unknown store URL scheme 'mysql'"]),
    ],
)
def test_a_store_url_that_cannot_work(tmp_path: Path, kubeconfig: Path, url: str, fragments: list[str]) -> None:
    line = one_line_error(operator(tmp_path, "--store", url, "--kubeconfig", str(kubeconfig)), 2, *fragments)
    assert line.startswith("anarchon operator: ")
    assert "secret" not in line
    assert not (tmp_path / "relative.db").exists()


def test_the_store_url_is_checked_before_the_credentials(tmp_path: Path) -> None:
    one_line_error(operator(tmp_path, ANARCHON_STORE="redis://h:notaport"), 2, "store URL redis://h:notaport")


@pytest.mark.parametrize(
    ("setup", "fragments"),
    [
        ("none", ["no Kubernetes credentials: kubeconfig ~/.kube/config does not exist", "--kubeconfig"]),
        ("empty", ["no usable Kubernetes credentials in kubeconfig ~/.kube/config (not a kubeconfig)"]),
        ("no-context", ["no usable Kubernetes credentials", "current-context", "KUBECONFIG"]),
        ("missing-file", ["kubeconfig /nonexistent/kubeconfig does not exist"]),
    ],
)
def test_missing_credentials(tmp_path: Path, setup: str, fragments: list[str]) -> None:
    env: dict[str, str] = {}
    if setup in ("empty", "no-context"):
        (tmp_path / ".kube").mkdir()
        (tmp_path / ".kube" / "config").write_text("" if setup == "empty" else "apiVersion: v1\nkind: Config\n")
    if setup == "missing-file":
        env["KUBECONFIG"] = "/nonexistent/kubeconfig"
    one_line_error(operator(tmp_path, "--store", f"sqlite://{tmp_path / 's.db'}", **env), 2, *fragments)
    one_line_error(anarchon(tmp_path, "trigger", "job", "-n", "default", **env), 2, "anarchon trigger: ", *fragments)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("0", "must be between 1 and 1000, got 0"), ("many", "expected a whole number, got 'many'")],
)
def test_an_api_concurrency_that_cannot_work(tmp_path: Path, value: str, fragment: str) -> None:
    one_line_error(operator(tmp_path, "--api-concurrency", value), 2, "--api-concurrency", fragment)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("50ms", "must be at least 100ms (each check writes to the store), got 50ms"), ("often", "--store-check")],
)
def test_a_store_check_period_that_cannot_work(tmp_path: Path, value: str, fragment: str) -> None:
    one_line_error(operator(tmp_path, "--store-check", value), 2, "--store-check", fragment)


@pytest.mark.parametrize("value", ["Europe_West", "east.1", "a" * 41])
def test_a_cluster_name_that_cannot_work(tmp_path: Path, value: str) -> None:
    one_line_error(operator(tmp_path, "--cluster-name", value), 2, "--cluster-name", "lower-case letters, digits")
