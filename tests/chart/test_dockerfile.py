"""The Dockerfile, statically, and the part of its build that can run without an engine: the wheel, built
from exactly the files the .dockerignore lets into the build context. tests/image builds and runs the image."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.chart.chartlib import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_two_stages_on_python_slim() -> None:
    froms = [args for ins, args in instructions() if ins == "FROM"]
    assert froms == ["${BASE} AS builder", "${BASE}"]
    assert instructions()[0] == ("ARG", "BASE=python:3.11-slim")


def test_no_frontend_is_fetched_from_a_registry() -> None:
    """A `# syntax=` line makes BuildKit pull that frontend image; the built-in one handles RUN --mount."""
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.MULTILINE | re.IGNORECASE)


def test_pip_settings_come_in_as_secrets_in_every_stage() -> None:
    """How pip reaches the index (a proxy, its CA) is the builder's business: a secret, never a layer."""
    runs = [args for ins, args in instructions() if ins == "RUN" and "pip " in args]
    assert len(runs) == 2
    for run in runs:
        assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in run
        assert "--mount=type=secret,id=pip-ca" in run


def test_final_stage_runs_the_operator_as_non_root() -> None:
    final = instructions()[[i for i, (ins, _) in enumerate(instructions()) if ins == "FROM"][1] :]
    assert ("USER", "10001:10001") in final
    assert ("ENTRYPOINT", '["anarchon"]') in final
    assert ("CMD", '["operator"]') in final
    env = " ".join(args for ins, args in final if ins == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env and "PATH=/opt/anarchon/bin:$PATH" in env
    run = " ".join(args for ins, args in final if ins == "RUN")
    assert "[operator]" in run, "the final stage installs the wheel with its operator extras"
    assert "--mount=type=bind,from=builder" in run, "the wheel is not copied into a layer"
    assert "install -d -o 10001 -g 10001" in run and "/var/lib/anarchon" in run
    assert "pip uninstall -y setuptools pip" in run
    # USER comes after everything that needs root.
    kinds = [ins for ins, _ in final]
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")


def test_chart_runs_the_image_user_with_writable_volumes_where_the_image_writes() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert values["podSecurityContext"]["runAsGroup"] == 10001
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    volume = next(args for ins, args in instructions() if ins == "VOLUME")
    assert set(re.findall(r'"([^"]+)"', volume)) == {"/tmp", "/var/lib/anarchon"}


def build_context(dest: Path) -> list[str]:
    """Copy what .dockerignore lets in (it is an allow-list: `*` then `!path` lines) into ``dest``."""
    lines = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", ".dockerignore must start by excluding everything (an allow-list)"
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    for rel in allowed:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / rel)
    return allowed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The builder stage: `pip wheel --no-deps .` in a context holding only what .dockerignore lets in."""
    tmp = tmp_path_factory.mktemp("image")
    ctx = tmp / "context"
    ctx.mkdir()
    allowed = build_context(ctx)
    assert {"pyproject.toml", "README.md", "operator"} <= set(allowed)
    for needed in ("pyproject.toml", "README.md", "operator"):
        assert (ctx / needed).exists(), f"{needed} is missing from the repository: the image build COPYs it"
    wheels = tmp / "wheels"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(ctx)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    (built,) = wheels.glob("anarchon-*.whl")
    return built


def test_wheel_builds_from_the_docker_build_context(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "anarchon = anarchon.cli:main" in entry_points
    assert "kubectl-anarchon = anarchon.cli:main" in entry_points
    for module in ("cli/__init__.py", "cli/operator.py", "kube/main.py", "engine/scheduler.py"):
        assert f"anarchon/{module}" in names
    assert "Provides-Extra: operator" in metadata
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_final_stage_install_gives_a_working_entrypoint(wheel: Path, tmp_path: Path) -> None:
    """The final stage's RUN, in a venv here: the wheel with [operator] extras, bytecode compiled, setuptools
    and pip removed;
    then the ENTRYPOINT (`anarchon`) and CMD (`operator`) answer, with no write to the (read-only) install."""
    venv = tmp_path / "opt-anarchon"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", f"{wheel}[operator]"],
        [str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(venv / "lib")],
        [str(venv / "bin" / "pip"), "uninstall", "--quiet", "-y", "setuptools", "pip"],
    ]
    # Not this checkout's PYTHONPATH: pip would find the source tree's metadata and skip the wheel.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    for cmd in steps:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean)
        assert res.returncode == 0, f"{' '.join(cmd)}:\n{res.stderr[-3000:]}"
    before = {p: p.stat().st_mtime for p in venv.rglob("*") if p.is_file()}
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(venv / "bin" / "anarchon"), "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and "operator" in out.stdout, out.stderr
    out = subprocess.run(
        [str(venv / "bin" / "anarchon"), "operator", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and "--store" in out.stdout, out.stderr
    imp = (
        "import anarchon.kube.main, anarchon.logs,"  # anarchon.logs: python-json-logger
        " kubernetes_asyncio, redis, psycopg, nats, aio_pika, prometheus_client"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", imp], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    after = {p: p.stat().st_mtime for p in venv.rglob("*") if p.is_file()}
    assert after == before, "running the operator wrote into its install dir (read-only in the image)"
    assert not (venv / "bin" / "pip").exists()
    size_mb = _du(venv) / 2**20
    # The venv is what the image adds to python:3.11-slim (~125 MB): keep it small.
    assert size_mb < 150, f"the installed operator takes {size_mb:.0f} MB"
