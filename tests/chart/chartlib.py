"""Helpers for the chart tests: find helm/kubeconform, render the chart, split and query manifests,
and turn the test API server's OpenAPI document into offline JSON schemas for kubeconform.

helm and kubeconform are built by ``e2e/controlplane/build.sh`` next to the control plane binaries.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "anarchon"
CRDS = REPO / "crds"
EXAMPLES = REPO / "examples"
CONTROLPLANE_DIR = REPO / "e2e" / "controlplane"

Manifest = dict[str, Any]


@functools.cache
def _bin_dir() -> Path:
    """The control plane's bin dir (asked of build.sh once; retried, since other work may be touching it)."""
    import sys

    if str(CONTROLPLANE_DIR) not in sys.path:
        sys.path.insert(0, str(CONTROLPLANE_DIR))
    from controlplane import bin_dir

    for attempt in range(3):
        try:
            return bin_dir()
        except subprocess.CalledProcessError:
            if attempt == 2:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def tool(name: str) -> Path:
    """Path of ``helm`` or ``kubeconform`` in the control plane's bin dir; FAILS the test if missing.

    Why fail, not skip: these checks are CI's only guard on the chart; a skipped check is no check.
    """
    path = _bin_dir() / name
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{name} is missing in {path.parent}: build it with `bash e2e/controlplane/build.sh` "
            "(it builds helm and kubeconform with the control plane)",
            pytrace=False,
        )
    return path


def run(cmd: list[str], *, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, input=input)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stderr}\n{res.stdout}")
    return res


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([str(tool("helm")), *args], check=check)


def render(
    values: Mapping[str, Any] | None = None,
    *,
    values_files: Iterable[Path] = (),
    release: str = "anarchon",
    namespace: str = "anarchon-system",
    include_crds: bool = False,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``helm template`` the chart with extra values; returns the process (stdout: the manifests)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if include_crds:
        args.append("--include-crds")
    for f in values_files:
        args += ["--values", str(f)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(dict(values or {}), fh)
        extra = fh.name
    try:
        return helm(*args, "--values", extra, check=check)
    finally:
        os.unlink(extra)


def manifests(text: str) -> list[Manifest]:
    """The non-empty YAML documents of a multi-document stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def rendered(values: Mapping[str, Any] | None = None, **kw: Any) -> list[Manifest]:
    return manifests(render(values, **kw).stdout)


def find(docs: Iterable[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def container(deployment: Manifest, name: str = "operator") -> dict[str, Any]:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name} in {deployment['metadata']['name']}")


def env_of(c: Mapping[str, Any]) -> dict[str, Any]:
    """name -> value (a string) or valueFrom (a dict)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# ---------------------------------------------------------------------------------------------- kubeconform


_SCHEMA_MAPS = ("properties", "patternProperties", "definitions")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONE = ("items", "additionalProperties", "not")


def _convert(node: Any, *, strict: bool) -> Any:
    """OpenAPI v2 schema node -> JSON schema node, as kubeconform's openapi2jsonschema does.

    int-or-string becomes ``oneOf`` string/integer; refs stay local (``#/definitions/...``); with
    ``strict``, objects that list their properties reject unknown ones (unless the API server keeps
    unknown fields there). Walks schema keywords only: under ``properties`` the keys are field names
    (JSONSchemaProps has fields called ``format`` or ``x-kubernetes-int-or-string``).
    """
    if not isinstance(node, dict):
        return node
    if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string") is True:
        out = {k: v for k, v in node.items() if k not in ("type", "format")}
        out["oneOf"] = [{"type": "string"}, {"type": "integer"}]
        return out
    out = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _convert(v, strict=strict) for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_convert(v, strict=strict) for v in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = _convert(value, strict=strict)
        else:
            out[key] = value
    if (
        strict
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref.removeprefix("#/definitions/")
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def kubeconform_schemas(openapi_v2: Mapping[str, Any], dest: Path, *, strict: bool = True) -> list[str]:
    """Write one standalone JSON schema per kind of the API server's OpenAPI v2 document into ``dest``.

    File names follow kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json``
    (``deployment-apps-v1.json``, ``pod-v1.json``, ``anarchonjob-anarchon-v1alpha1.json``), so
    kubeconform can validate offline against exactly the API (and CRDs) of the test control plane.
    Returns the file names written.
    """
    defs: dict[str, Any] = dict(openapi_v2["definitions"])
    quantity = "io.k8s.apimachinery.pkg.api.resource.Quantity"
    if quantity in defs:
        defs[quantity] = {"oneOf": [{"type": "string"}, {"type": "number"}]}
    dest.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name, definition in defs.items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            group, version, kind = gvk.get("group", ""), gvk["version"], gvk["kind"]
            suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
            filename = f"{kind.lower()}{suffix}.json"
            if filename in written:
                continue
            needed: dict[str, Any] = {}
            todo = [name]
            while todo:
                n = todo.pop()
                if n in needed or n not in defs:
                    continue
                needed[n] = defs[n]
                todo.extend(_refs(defs[n]))
            schema = _convert(copy.deepcopy(definition), strict=strict)
            schema["definitions"] = {n: _convert(copy.deepcopy(d), strict=strict) for n, d in needed.items()}
            schema["$schema"] = "http://json-schema.org/draft-07/schema#"
            (dest / filename).write_text(json.dumps(schema))
            written.append(filename)
    return written


def kubeconform(
    manifest_files: Iterable[Path], schema_dir: Path, *, extra: Iterable[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run kubeconform strictly against the schemas in ``schema_dir`` only (no download, no missing schema)."""
    location = str(schema_dir / "{{ .ResourceKind }}{{ .KindSuffix }}.json")
    return run(
        [
            str(tool("kubeconform")),
            "-strict",
            "-summary",
            "-output",
            "text",
            "-schema-location",
            location,
            *extra,
            *[str(f) for f in manifest_files],
        ],
        check=False,
    )


# ------------------------------------------------------------------------------------------- operator


@contextlib.contextmanager
def operator_process(kubeconfig: Path, log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m anarchon operator`` authenticated with ``kubeconfig``; stopped (SIGTERM, then SIGKILL) after."""
    from controlplane import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
    env["KUBECONFIG"] = str(kubeconfig)  # the operator's client reads it
    cmd = [
        sys.executable,
        "-m",
        "anarchon",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={free_port()}",
        f"--health-port={free_port()}",
        "--log-format=plain",
        *args,
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
