"""The chart's ``helm test`` hook (templates/tests/readyz.yaml): what it renders, and that its script
passes on a ready replica and fails on an unready or absent one.

The script is run here against real operator processes (their /readyz), not in a Pod: the test
control plane's nodes are KWOK's, whose containers never run, so a Pod there would "pass" whatever
its script does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from controlplane import ControlPlane, free_port

from tests.chart.chartlib import Manifest, container, env_of, find, one, operator_process, rendered

HOOK = "anarchon-test-readyz"


def hook_pod(docs: list[Manifest]) -> Manifest:
    return one(docs, "Pod", HOOK)


def hook_container(pod: Manifest) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    assert c["name"] == "readyz"
    return dict(c)


def test_hook_checks_readyz_through_the_service() -> None:
    docs = rendered()
    pod = hook_pod(docs)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False, "it needs no API access"

    url = urlsplit(env_of(hook_container(pod))["READYZ_URL"])
    svc = one(docs, "Service", "anarchon-metrics")
    assert url.hostname == f"{svc['metadata']['name']}.anarchon-system.svc"
    assert url.path == "/readyz"
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    deployment = one(docs, "Deployment", "anarchon")
    operator_ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    assert operator_ports[port["targetPort"]] == url.port, "the Service port leads to the operator's health port"
    assert svc["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert not svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "the Service must not pick it"

    # The operator's image and security context: no other image to pull, nothing a restricted namespace refuses.
    assert hook_container(pod)["image"] == container(deployment)["image"]
    assert hook_container(pod)["securityContext"] == container(deployment)["securityContext"]
    assert pod["spec"]["securityContext"] == deployment["spec"]["template"]["spec"]["securityContext"]


def test_hook_follows_the_health_port_and_goes_with_the_service() -> None:
    pod = hook_pod(rendered({"health": {"port": 9999}}, namespace="ops"))
    assert env_of(hook_container(pod))["READYZ_URL"] == "http://anarchon-metrics.ops.svc:9999/readyz"
    assert not find(rendered({"metrics": {"service": {"enabled": False}}}), "Pod")


def check(url: str) -> subprocess.CompletedProcess[str]:
    """The hook container's command, run here with its READYZ_URL pointed at ``url``."""
    c = hook_container(hook_pod(rendered()))
    assert c["command"][:2] == ["python", "-c"]
    env = {**os.environ, "READYZ_URL": url}
    return subprocess.run([sys.executable, *c["command"][1:]], env=env, capture_output=True, text=True, timeout=60)


def test_hook_script_passes_only_on_a_ready_replica(crds_installed: ControlPlane, tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/readyz"
    res = check(nobody)
    assert res.returncode != 0 and "refused" in res.stderr.lower(), res.stderr

    ready_port, unready_port = free_port(), free_port()
    store_down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the replica waits, unready
    with (
        operator_process(
            crds_installed.kubeconfig,
            tmp_path / "ready.log",
            "--all-namespaces",
            f"--store=sqlite:///{tmp_path}/h.db",
            "--instance-id=hook-ready",
            f"--health-port={ready_port}",
        ),
        operator_process(
            crds_installed.kubeconfig,
            tmp_path / "unready.log",
            "--all-namespaces",
            f"--store={store_down}",
            "--instance-id=hook-unready",
            f"--health-port={unready_port}",
        ),
    ):
        ready = f"http://127.0.0.1:{ready_port}/readyz"
        deadline = time.monotonic() + 90
        while (res := check(ready)).returncode != 0:
            assert time.monotonic() < deadline, f"never ready: {res.stderr}\n{(tmp_path / 'ready.log').read_text()}"
            time.sleep(1)
        assert '200 {"ready": true' in res.stdout, res.stdout

        unready = f"http://127.0.0.1:{unready_port}/readyz"
        deadline = time.monotonic() + 60
        while "refused" in (res := check(unready)).stderr.lower():  # until its health server listens
            assert time.monotonic() < deadline, res.stderr
            time.sleep(1)
        assert res.returncode != 0 and '503 {"ready": false' in res.stderr, res.stderr
