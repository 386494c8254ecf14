"""What the verbs say when they cannot do their work: one line, in time, with what to do about it.

Against the real test API server: down (a port nothing listens on), not answering (a socket that
never replies), without the CRDs, and a user it refuses. Plus the flags every verb shares:
``--version``, ``--help`` in plain text, ``-n`` the namespace everywhere, ``--request-timeout``.
"""

from __future__ import annotations

import argparse
import socket
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.faults.apiproxy import ApiFaultProxy
from tests.harness.cli import ok, one_line_error, run_cli
from tests.harness.cluster import Cluster, job_manifest
from tests.harness.controlplane import REPO

#: One call of every verb that talks to the API server (the operator aside: it retries by design).
VERBS = [
    ("list",),
    ("get", "j"),
    ("runs", "j"),
    ("next", "j"),
    ("suspend", "j"),
    ("resume", "j"),
    ("trigger", "j"),
    ("backfill", "j", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T00:01:00Z"),
    ("cancel", "j-1800000000"),
]


def kubeconfig_for(tmp_path: Path, server: str, token: str = "t") -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_an_api_server_that_is_down_is_one_line_at_once(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port of this machine nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = kubeconfig_for(tmp_path, f"https://127.0.0.1:{port}")
    for verb in VERBS:
        started = time.monotonic()
        line = one_line_error(run_cli(*verb, "--kubeconfig", str(config)), 1, "cannot reach the API server at")
        assert time.monotonic() - started < 8, (verb, "a refused connection is not retried for a minute")
        assert line.startswith(f"anarchon {verb[0]}: ") and "Connection refused" in line, line


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("verb", [VERBS[0], VERBS[1], VERBS[6]], ids=["list", "get", "trigger"])
def test_an_api_server_that_does_not_answer_gives_up_at_the_request_timeout(
    tmp_path: Path, silent_server: int, verb: tuple[str, ...]
) -> None:
    config = kubeconfig_for(tmp_path, f"https://127.0.0.1:{silent_server}")
    started = time.monotonic()
    res = run_cli(*verb, "--kubeconfig", str(config), "--request-timeout", "2s")
    took = time.monotonic() - started
    one_line_error(res, 1, f"the API server at https://127.0.0.1:{silent_server} did not answer within 2s")
    assert 2 <= took < 8, took


def test_request_timeout_is_kubectls_flag_on_every_verb() -> None:
    """Default 10s; kubectl's spellings (1m, a bare number of seconds, 0 for none); every verb takes it."""
    from anarchon.cli import _Parser
    from anarchon.cli.common import add_kube_args

    parser = _Parser(prog="t")
    add_kube_args(parser)
    assert parser.parse_args([]).request_timeout == 10
    assert [parser.parse_args(["--request-timeout", v]).request_timeout for v in ("1m", "3", "0")] == [60, 3, None]
    for verb in VERBS:
        res = run_cli(*verb, "--request-timeout", "soon")
        one_line_error(res, 2, "--request-timeout", "expected a duration such as 10s")


def verbs() -> dict[str, argparse.ArgumentParser]:
    from anarchon.cli import main

    found: dict[str, argparse.ArgumentParser] = {}

    class Stop(Exception):
        pass

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.update(action.choices)
        raise Stop

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        with pytest.raises(Stop):
            main(["list"])
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return found


def test_dash_n_is_the_namespace_in_every_verb(tmp_path: Path) -> None:
    for name, parser in verbs().items():
        (dash_n,) = [a for a in parser._actions if "-n" in a.option_strings]
        assert dash_n.dest == "namespace", (name, dash_n.option_strings)
    # next's count is -c; -n gives a job without a namespace the one it would be applied to.
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(job_manifest("j", every="1h") | {"metadata": {"name": "j"}}))
    out = ok(run_cli("next", str(path), "-n", "team-a", "-c", "2", "--after", "2027-01-01T00:00:00Z"))
    assert out.splitlines()[0] == "team-a/j: every 1h" and len(out.splitlines()) == 4, out


def test_version_and_plain_help() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert ok(run_cli("--version")).strip() == f"anarchon {version}"
    for verb in ["", *verbs()]:
        text = ok(run_cli(*([verb] if verb else []), "--help"))
        for markup in ("``", ":mod:", ":func:", ":class:", ":data:", ":meth:"):
            assert markup not in text, (verb, markup, text)


class WithoutCrds(ApiFaultProxy):
    """The test API server as a cluster without the CRDs: the anarchon.io requests are sent for a
    group no CRD serves, and the real API server answers them (404, its discovery included)."""

    async def _send_upstream(self, session: Any, request: Any, info: Any, fault: Any) -> Any:
        if request.raw_path.startswith("/apis/anarchon.io/") or request.raw_path.startswith("/apis/anarchon.io?"):
            request = request.clone(
                rel_url=request.raw_path.replace("/apis/anarchon.io", "/apis/absent.anarchon.io", 1)
            )
        return await super()._send_upstream(session, request, info, fault)


def test_a_cluster_without_the_crds_says_how_to_install_them(cluster: Cluster, control_plane: Any) -> None:
    cluster.apply(job_manifest("j", every="1h"))  # there, but not to a client of a cluster without the CRDs
    with WithoutCrds(control_plane) as proxy:
        for verb in (VERBS[0], VERBS[1], VERBS[4], VERBS[6]):
            res = run_cli(*verb, "-n", cluster.namespace, "--kubeconfig", str(proxy.kubeconfig))
            line = one_line_error(res, 1, "does not serve anarchon.io/v1alpha1", "kubectl apply -f crds/", "chart")
            assert "no AnarchonJob 'j'" not in line, line


def test_a_refused_user_gets_the_servers_message(cluster: Cluster, control_plane: Any) -> None:
    cluster.apply(job_manifest("j", every="1h"))
    alice = str(control_plane.user_kubeconfig("alice"))  # authenticated, no RBAC binding
    line = one_line_error(run_cli("list", "-n", cluster.namespace, "--kubeconfig", alice), 1, "(HTTP 403)")
    assert 'anarchonjobs.anarchon.io is forbidden: User "alice" cannot list resource "anarchonjobs"' in line, line
    line = one_line_error(run_cli("trigger", "j", "-n", cluster.namespace, "--kubeconfig", alice), 1, "(HTTP 403)")
    assert 'User "alice" cannot get resource "anarchonjobs"' in line, line  # it reads the queue first
    stranger = str(control_plane.token_kubeconfig("stranger", "not-a-token"))
    one_line_error(
        run_cli("get", "j", "-n", cluster.namespace, "--kubeconfig", stranger), 1, "Unauthorized", "were refused", "401"
    )
