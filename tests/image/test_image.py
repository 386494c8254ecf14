"""The operator image as users run it: built by the suite from the repo's Dockerfile (conftest.py), then
run with a real Docker engine the way the chart runs it: uid 10001, read-only root, /tmp on a tmpfs,
no network (none of these checks needs one)."""

from __future__ import annotations

import json

from tests.image.imagelib import docker

#: How the chart runs the container (values.yaml: runAsUser 10001, readOnlyRootFilesystem, /tmp volume).
LOCKED_DOWN = ("run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp")


def run_in(image: str, *args: str, entrypoint: str | None = None, check: bool = True) -> tuple[int, str, str]:
    ep = ("--entrypoint", entrypoint) if entrypoint else ()
    res = docker(*LOCKED_DOWN, *ep, image, *args, timeout=120, check=check)
    return res.returncode, res.stdout, res.stderr


def test_entrypoint_user_and_volumes_are_what_the_chart_expects(operator_image: str) -> None:
    config = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", operator_image).stdout)
    assert config["Entrypoint"] == ["anarchon"]
    assert config["Cmd"] == ["operator"]
    assert config["User"] == "10001:10001"
    assert set(config["Volumes"]) == {"/tmp", "/var/lib/anarchon"}
    _, out, _ = run_in(
        operator_image, "-c", "import os; print(os.getuid(), os.getgid(), os.getcwd())", entrypoint="python"
    )
    assert out.split() == ["10001", "10001", "/var/lib/anarchon"]


def test_cli_answers_on_a_read_only_root(operator_image: str) -> None:
    _, out, _ = run_in(operator_image, "--help")
    assert "operator" in out and "trigger" in out
    _, out, _ = run_in(operator_image, "operator", "--help")
    assert "--store" in out and "--kubeconfig" in out


def test_read_only_root_allows_what_the_operator_writes_and_nothing_else(operator_image: str) -> None:
    """Every module the operator loads imports without writing bytecode; /tmp (a tmpfs here, a volume in
    the chart) and the SQLite store's directory (a volume) are writable; the install and / are not."""
    probe = """
import errno, os, sqlite3
import anarchon.kube.main, kubernetes_asyncio, redis, psycopg, nats, aio_pika, prometheus_client
open("/tmp/probe", "w").write("x")
sqlite3.connect("/var/lib/anarchon/probe.db").execute("create table t (x)")
for path in ("/opt/anarchon/probe", "/probe"):
    try:
        open(path, "w")
    except OSError as exc:
        assert exc.errno == errno.EROFS, (path, exc)
    else:
        raise AssertionError(path + " is writable")
print("ok")
"""
    _, out, err = run_in(operator_image, "-c", probe, entrypoint="python")
    assert out.strip() == "ok", err


def test_no_pip_or_setuptools_left_in_the_venv(operator_image: str) -> None:
    probe = """
import importlib.util, pathlib
print([m for m in ("pip", "setuptools", "pkg_resources", "_distutils_hack") if importlib.util.find_spec(m)])
print(sorted(p.name for p in pathlib.Path("/opt/anarchon").rglob("*")
             if p.name.split("-")[0] in ("pip", "pip3", "setuptools", "pkg_resources")))
"""
    _, out, _ = run_in(operator_image, "-c", probe, entrypoint="/opt/anarchon/bin/python")
    assert out.split("\n")[:2] == ["[]", "[]"], out


def test_zone_data_resolves_current_and_legacy_names(operator_image: str) -> None:
    """Cron schedules name zones; the image must know them whatever the base ships in /usr/share/zoneinfo."""
    probe = """
from datetime import datetime
from zoneinfo import ZoneInfo
for name in ("Europe/Paris", "US/Central", "America/Chicago", "UTC"):
    print(name, datetime(2026, 7, 1, 12, tzinfo=ZoneInfo(name)).utcoffset().total_seconds() / 3600)
"""
    _, out, _ = run_in(operator_image, "-c", probe, entrypoint="python")
    assert out.split("\n")[:4] == ["Europe/Paris 2.0", "US/Central -5.0", "America/Chicago -5.0", "UTC 0.0"], out


def test_without_credentials_the_operator_says_so_in_one_line(operator_image: str) -> None:
    """The image's default command with no kubeconfig and no service account, outside and inside a Pod."""
    for env in ((), ("-e", "KUBERNETES_SERVICE_HOST=127.0.0.1", "-e", "KUBERNETES_SERVICE_PORT=6443")):
        res = docker(*LOCKED_DOWN, *env, operator_image, check=False)
        output = (res.stdout + res.stderr).strip()
        assert res.returncode == 2, output
        assert "Traceback" not in output and len(output.splitlines()) == 1, output
        assert output.startswith("anarchon operator: no ") and "credentials" in output, output
