"""AnarchonJobs read from YAML (or JSON) files, for the verbs that work offline (``lint``, ``next FILE``).

A file may hold several documents (``---``) and ``kind: List`` objects, as ``kubectl apply``
takes them; documents of other kinds are not ours and are passed over. A job without a
namespace gets the one ``kubectl apply`` would give it, so that the operator's own parser,
which requires one, judges the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from ..kube.constants import API_VERSION, JOB_KIND
from .common import Failure


@dataclass
class Manifest:
    """What one file holds: its AnarchonJobs, each with a label saying where, and what could not be read."""

    path: str
    jobs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _objects(doc: Any) -> list[Any]:
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        return list(doc["items"])
    return [doc]


def read(path: str, namespace: str) -> Manifest:
    """The AnarchonJobs of ``path``; a file that cannot be opened is bad usage (exit 2)."""
    try:
        text = _text(path)
    except OSError as exc:
        raise Failure(f"cannot read {path}: {exc.strerror}", 2) from None
    except UnicodeDecodeError as exc:
        raise Failure(f"cannot read {path}: {exc}", 2) from None
    return parse(path, text, namespace)


def _text(path: str) -> str:
    """The text of ``path``, or of stdin for ``-``."""
    if path == "-":
        import sys

        return sys.stdin.buffer.read().decode("utf-8")
    with open(path, encoding="utf-8") as f:
        return f.read()


#: The files ``lint DIR`` reads, as ``kubectl apply -f DIR`` does.
EXTENSIONS: Final = (".yaml", ".yml", ".json")


def read_all(paths: list[str], namespace: str) -> list[Manifest]:
    """Each of ``paths`` (``-`` is stdin; a directory, its *.yaml, *.yml and *.json files, in its
    subdirectories too), each file read on its own: one that cannot be read is a problem of its
    own, and the others are still read."""
    import os

    manifests: list[Manifest] = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            files = sorted(
                os.path.join(root, name)
                for root, _, names in os.walk(path)
                for name in names
                if name.endswith(EXTENSIONS)
            )
            if not files:
                manifests.append(Manifest(path, problems=[f"no {', '.join('*' + e for e in EXTENSIONS)} file in it"]))
            manifests.extend(_read_one(f, namespace) for f in files)
        else:
            manifests.append(_read_one(path, namespace))
    return manifests


def _read_one(path: str, namespace: str) -> Manifest:
    try:
        text = _text(path)
    except OSError as exc:
        return Manifest(path, problems=[f"cannot read: {exc.strerror}"])
    except UnicodeDecodeError:
        return Manifest(path, problems=["cannot read: not UTF-8 text"])
    return parse(path, text, namespace)


def parse(path: str, text: str, namespace: str) -> Manifest:
    """The AnarchonJobs of the YAML (or JSON) ``text``, read from ``path``."""
    import yaml

    found = Manifest(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        found.problems.append(f"not YAML: {' '.join(str(exc).split())}")
        return found
    for number, doc in enumerate(docs, start=1):
        for obj in _objects(doc):
            if not isinstance(obj, dict):
                found.problems.append(f"document {number}: not a Kubernetes object")
            elif obj.get("kind") == JOB_KIND:
                meta = obj.get("metadata")
                if isinstance(meta, dict) and not meta.get("namespace"):
                    obj = {**obj, "metadata": {**meta, "namespace": namespace}}
                name = meta.get("name") if isinstance(meta, dict) else None
                label = f"{JOB_KIND} {name}" if isinstance(name, str) else f"document {number}"
                if obj.get("apiVersion") != API_VERSION:
                    found.problems.append(f"{label}: apiVersion: must be {API_VERSION}, got {obj.get('apiVersion')!r}")
                found.jobs.append((label, obj))
    if not found.jobs and not found.problems:
        found.problems.append(f"no {JOB_KIND} in it")
    return found
