"""Build the operator image from the repo's Dockerfile with a real Docker engine, for tests.

No registry answers on the test machines, so the Dockerfile's base (``BASE``) is a stand-in made from
Debian's packages (e2e/image/standin-base.sh); nothing else about the Dockerfile changes. pip inside
the build reaches the package index the way this machine's pip does: its effective configuration and
its CA bundle go in as BuildKit secrets, so neither lands in a layer nor in the repository.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / "e2e" / "image"
#: Debian's 20.10 CLI: it drives BuildKit (RUN --mount, secrets) without the buildx plugin.
DOCKER = "/usr/bin/docker"
#: pip settings that decide how the index is reached; host paths (find-links, ...) stay out.
_PIP_KEYS = {"index-url", "extra-index-url", "trusted-host", "proxy", "timeout", "default-timeout", "retries"}
#: Where the Dockerfile's ``pip-ca`` secret is mounted during a RUN.
_CA_IN_BUILD = "/run/secrets/pip-ca"


def engine_or_fail() -> None:
    """Make a Docker engine answer (e2e/image/dockerd.sh starts one as root), or stop the test.

    In CI (CI=true) a machine without Docker fails the image tests; elsewhere they are skipped with
    the reason, so a laptop without root can still run the rest of the suite.
    """
    res = subprocess.run(["bash", str(IMAGE_DIR / "dockerd.sh")], capture_output=True, text=True, timeout=120)
    if res.returncode == 0:
        return
    why = f"no Docker engine: {res.stderr.strip() or res.stdout.strip()} (apt-get install docker.io; run as root)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"docker {shlex.join(args)} -> {res.returncode}\n{res.stdout[-2000:]}{res.stderr[-3000:]}")
    return res


def standin_base() -> str:
    """The stand-in for python:3.11-slim (built once, then cached: see e2e/image/standin-base.sh)."""
    res = subprocess.run(
        ["bash", str(IMAGE_DIR / "standin-base.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    assert res.returncode == 0, f"standin-base.sh failed:\n{res.stderr[-3000:]}"
    return res.stdout.strip().splitlines()[-1]


def host_pip_secrets(dest: Path) -> list[str]:
    """``--secret`` arguments carrying this machine's pip configuration and CA bundle into the build.

    The configuration is pip's own effective view (``pip config list``: files, then PIP_* variables),
    reduced to the keys that decide how the index is reached; its ``cert`` is rewritten to where the
    build mounts the CA bundle.
    """
    listed = subprocess.run(
        ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():
        name, sep, raw = line.partition("=")
        if not sep:
            continue
        key = name.rsplit(".", 1)[-1]
        settings[key] = raw.strip().strip("'\"")  # later lines (PIP_* variables) override files
    ca = settings.get("cert") or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE")
    lines = ["[global]"] + [f"{k} = {v}" for k, v in sorted(settings.items()) if k in _PIP_KEYS]
    args = []
    if ca and Path(ca).is_file():
        lines.append(f"cert = {_CA_IN_BUILD}")
        args += ["--secret", f"id=pip-ca,src={ca}"]
    conf = dest / "pip.conf"
    conf.write_text("\n".join(lines) + "\n")
    return [*args, "--secret", f"id=pip.conf,src={conf}"]


@dataclass(frozen=True)
class Build:
    tag: str
    seconds: float
    #: Build steps BuildKit took from its cache (0 on a cold build).
    cached_steps: int
    log: str


def build_image(tag: str, base: str, secrets_dir: Path) -> Build:
    """``docker build`` of the repo's Dockerfile, unchanged but for ``--build-arg BASE``."""
    cmd = [
        DOCKER,
        "build",
        "--network",
        "host",  # dockerd runs without a bridge (dockerd.sh): RUN steps use the host network
        "--progress",
        "plain",
        "--build-arg",
        f"BASE={base}",
        *host_pip_secrets(secrets_dir),
        "-t",
        tag,
        str(REPO),
    ]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    seconds = time.monotonic() - t0
    assert res.returncode == 0, f"docker build failed:\n{res.stderr[-4000:]}"
    return Build(tag, seconds, sum(1 for ln in res.stderr.splitlines() if ln.endswith(" CACHED")), res.stderr)


def image_size_mb(tag: str) -> float:
    return int(docker("image", "inspect", "--format", "{{.Size}}", tag).stdout) / 1e6


def standin_pause(base: str) -> str:
    """A sandbox ("pause") image for the real node's containerd, on the stand-in base: a shell that
    sleeps until SIGTERM/SIGINT and then exits 0, as registry.k8s.io/pause does (no registry here)."""
    tag = base.replace("/python:", "/pause:", 1)
    if docker("image", "inspect", tag, check=False).returncode == 0:
        return tag
    dockerfile = f'FROM {base}\nCMD ["sh", "-c", "trap \'exit 0\' TERM INT; while :; do sleep 3600 & wait $!; done"]\n'
    res = subprocess.run(
        [DOCKER, "build", "-t", tag, "-"], input=dockerfile, capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0, f"building {tag} failed:\n{res.stderr[-3000:]}"
    return tag
