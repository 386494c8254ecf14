"""The AnarchonJob CRD's own schema, checked offline: what ``kubectl apply`` would refuse, and the typos it would not.

Why here and not only in the operator's parser: the API server prunes a field its schema does not
know (``timezone:``, a container's ``resource:``) when the client does not ask for strict
validation, and the parser never sees it; the job then runs in UTC, or without its limits. So
``lint`` reads the CRD the cluster is given (``crds/anarchonjobs.anarchon.io.yaml``, shipped in
the package as ``anarchon/crds/``, a link to ``crds/`` in the source tree: one source) and checks
each job against its ``openAPIV3Schema``, the generated Pod template included: unknown fields
(with the field meant, CronJob's spellings too), types, enums and bounds. The CEL rules are left
to the operator's parser, which makes the same checks in Python.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from ..kube.constants import JOBS, VERSION
from .common import Failure

#: Where the package keeps the CRDs (``crds/`` of the repository, as package data).
CRDS: Final = Path(__file__).resolve().parents[1] / "crds"

#: A CronJob's fields and what an AnarchonJob calls them (docs/migrating-from-cronjob.md), by path
#: under the job: what someone moving a CronJob over writes first.
CRONJOB_NAMES: Final[Mapping[str, str]] = {
    "spec.schedule": "cron",
    "spec.concurrencyPolicy": "overlap",
    "spec.successfulJobsHistoryLimit": "successfulRunsHistoryLimit",
    "spec.failedJobsHistoryLimit": "failedRunsHistoryLimit",
    "spec.startingDeadlineSeconds": "startingDeadline (a duration such as 5m)",
    "spec.jobTemplate": "template (a Pod template: spec.jobTemplate.spec.template)",
    "spec.backoffLimit": "retries.limit",
    "spec.activeDeadlineSeconds": "timeout (a duration such as 15m)",
}

_TYPES: Final[Mapping[str, tuple[type, ...]]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


@functools.cache
def job_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the AnarchonJob CRD's served version, as shipped with this package."""
    import yaml

    path = CRDS / f"{JOBS}.anarchon.io.yaml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise Failure(f"the AnarchonJob CRD is not in this installation ({path}: {exc.strerror})", 2) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the CRD is large, the Python loader slow
    crd = yaml.load(text, Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    return dict(version["schema"]["openAPIV3Schema"])


def check_job(job: Mapping[str, Any]) -> list[str]:
    """Every way ``job`` breaks the CRD's schema, each as ``path: problem``; metadata is the API server's."""
    schema = job_schema()
    problems: list[str] = []
    for name in ("spec",):
        if name in job:
            problems.extend(_check(job[name], schema["properties"][name], name))
    return problems


def _type_name(value: Any) -> str:
    for name, types in _TYPES.items():
        if isinstance(value, types) and not (name in ("integer", "number") and isinstance(value, bool)):
            return name
    return "null" if value is None else type(value).__name__


def _has_type(value: Any, wanted: str) -> bool:
    if isinstance(value, bool) and wanted in ("integer", "number"):
        return False
    return isinstance(value, _TYPES.get(wanted, object))


def _suggest(path: str, name: str, known: list[str]) -> str:
    """``; did you mean X?`` for an unknown field ``name`` at ``path``: CronJob's name, the same
    letters in another case, or the closest spelling."""
    cronjob = CRONJOB_NAMES.get(f"{path}.{name}")
    if cronjob:
        return f"; did you mean {cronjob}? (CronJob's name)"
    same = [k for k in known if k.lower() == name.lower()]
    close = same or difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _check(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    if value is None:
        if not schema.get("nullable"):
            yield f"{path}: must not be null"
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (_has_type(value, "integer") or _has_type(value, "string")):
            yield f"{path}: must be an integer or a string, got {_type_name(value)}"
            return
    elif "type" in schema and not _has_type(value, schema["type"]):
        article = "an" if schema["type"][0] in "aeio" else "a"
        yield f"{path}: must be {article} {schema['type']}, got {_type_name(value)}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: must be one of {', '.join(str(e) for e in schema['enum'])}, got {value!r}"
    yield from _bounds(value, schema, path)
    if isinstance(value, dict):
        yield from _object(value, schema, path)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _check(item, schema["items"], f"{path}[{i}]")


def _bounds(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{path}: must be at least {schema['minimum']}, got {value}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{path}: must be at most {schema['maximum']}, got {value}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield f"{path}: must be at least {schema['minLength']} characters long, got {value!r}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{path}: must be at most {schema['maxLength']} characters long, got {len(value)}"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{path}: {value!r} does not match the pattern {schema['pattern']}"
    if isinstance(value, list | dict):
        what = "items" if isinstance(value, list) else "fields"
        low, high = ("minItems", "maxItems") if isinstance(value, list) else ("minProperties", "maxProperties")
        if low in schema and len(value) < schema[low]:
            yield f"{path}: must have at least {schema[low]} {what}, got {len(value)}"
        if high in schema and len(value) > schema[high]:
            yield f"{path}: must have at most {schema[high]} {what}, got {len(value)}"


def _object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
    properties: Mapping[str, Any] = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            yield f"{path}.{name}: required"
    extra = schema.get("additionalProperties")
    for name, item in value.items():
        where = f"{path}.{name}"
        if name in properties:
            yield from _check(item, properties[name], where)
        elif isinstance(extra, dict):
            yield from _check(item, extra, where)
        elif not (extra is True or schema.get("x-kubernetes-preserve-unknown-fields")):
            yield f"{where}: unknown field{_suggest(path, str(name), list(properties))}"
