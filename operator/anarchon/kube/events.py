"""Kubernetes Events on AnarchonJobs: launches, skips, takeovers, adoptions, failures, bad specs.

Posted with the operator's own client rather than kopf's event queue, because most of them
come from engine tasks that run outside any kopf handler context. Posting is best effort:
an Event that cannot be posted is logged, never allowed to break a run.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime
from typing import Any

from .client import Kube
from .constants import API_VERSION, JOB_KIND
from .spec import JobSpec

log = logging.getLogger("anarchon.kube.events")


class EventPoster:
    def __init__(self, kube: Kube, *, component: str = "anarchon", instance: str = "") -> None:
        self.kube = kube
        self.component = component
        self.instance = instance

    async def about(self, spec: JobSpec, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on the AnarchonJob that ``spec`` was parsed from."""
        await self.post(
            namespace=spec.namespace, name=spec.name, uid=spec.uid, reason=reason, message=message, warning=warning
        )

    async def post(
        self,
        *,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool = False,
        kind: str = JOB_KIND,
    ) -> None:
        now = datetime.now(UTC)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": kind,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": self.component, "host": self.instance},
            "reportingComponent": self.component,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
        }
        try:
            await self.kube.core.create_namespaced_event(namespace, body)  # type: ignore[arg-type]
        except Exception as exc:  # best effort by design
            log.warning("could not post event %s on %s/%s: %s", reason, namespace, name, exc)
