"""What the CRD tests (test_crds.py, test_podspec_schema.py) share: a valid AnarchonJob to vary, and
``kubectl explain`` once the API server publishes the schema."""

from __future__ import annotations

from typing import Any

from controlplane import ControlPlane

from anarchon.kube import constants as C
from tests.harness.until import until


def job(name: str = "sync", **spec: Any) -> dict[str, Any]:
    """A valid AnarchonJob (every 10s) with ``spec`` merged in; a None value removes the field."""
    body: dict[str, Any] = {
        "apiVersion": C.API_VERSION,
        "kind": C.JOB_KIND,
        "metadata": {"name": name},
        "spec": {
            "every": "10s",
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]}},
        },
    }
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


def explain(cp: ControlPlane, field: str) -> str:
    """``kubectl explain`` once the CRD's OpenAPI is published (asynchronously after Established)."""

    def attempt() -> str | None:
        res = cp.kubectl("explain", field, check=False)
        return res.stdout if res.returncode == 0 else None

    text: str = until(f"kubectl explain {field}", attempt)
    return text
