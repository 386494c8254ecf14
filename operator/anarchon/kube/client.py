"""The asyncio Kubernetes client the operator uses for its own writes (kopf only watches).

kopf talks to the API for watching; everything the operator creates or patches (runs,
Pods, Events, status) goes through kubernetes_asyncio so the event loop is never blocked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

GROUP = "anarchon.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
JOBS = "anarchonjobs"
RUNS = "anarchonruns"
MERGE = "application/merge-patch+json"

__all__ = ["API_VERSION", "GROUP", "JOBS", "MERGE", "RUNS", "VERSION", "ApiException", "Kube", "connect"]


@dataclass
class Kube:
    """The API groups the operator needs, sharing one connection pool."""

    api: client.ApiClient
    core: client.CoreV1Api
    custom: client.CustomObjectsApi

    async def close(self) -> None:
        await self.api.close()

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, JOBS, name, {"metadata": {"annotations": annotations}}, _content_type=MERGE
        )  # type: ignore[call-arg]

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, JOBS, name, {"status": status}, _content_type=MERGE
        )  # type: ignore[call-arg]


async def connect(kubeconfig: str | None = None) -> Kube:
    """Connect with the given kubeconfig, ``$KUBECONFIG``, or the in-cluster service account."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path:
        await config.load_kube_config(config_file=path, client_configuration=cfg)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    return Kube(api=api, core=client.CoreV1Api(api), custom=client.CustomObjectsApi(api))


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ApiException) and exc.status in codes
