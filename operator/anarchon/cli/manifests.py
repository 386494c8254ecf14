"""AnarchonJobs read from YAML files, for the verbs that work offline (``lint``, ``next FILE``).

A file may hold several documents (``---``) and ``kind: List`` objects, as ``kubectl apply``
takes them; documents of other kinds are not ours and are passed over. A job without a
namespace gets the one ``kubectl apply`` would give it, so that the operator's own parser,
which requires one, judges the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise Failure(f"cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}", 2) from None
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
