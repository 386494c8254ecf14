"""What the verbs that talk to the API server share: their flags, the namespace, the connection, one-line errors.

Kubernetes modules are imported inside the functions, so that ``--help`` and ``lint`` (offline)
do not wait for the API client to load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..kube.client import Kube


class Failure(Exception):
    """A verb cannot do what it was asked: one line on stderr, and the exit code (2: bad usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_kube_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", help="the job's namespace (default: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")


def default_namespace(kubeconfig: str | None) -> str:
    """The kubeconfig context's namespace, or the Pod's own in a cluster, else "default"."""
    from ..kube.kubeconfig import current_namespace

    return current_namespace(kubeconfig) or "default"


def report(verb: str, failure: Failure) -> int:
    print(f"anarchon {verb}: {failure}", file=sys.stderr)
    return failure.code


def with_kube(verb: str, args: argparse.Namespace, body: Callable[[Kube, str], Awaitable[int]]) -> int:
    """Connect, run ``body(kube, namespace)`` and close; every failure is one line on stderr.

    Missing credentials are a usage error (exit 2, as for ``anarchon operator``); an API error
    is exit 1 with its HTTP status.
    """
    from ..kube.client import ApiException, CredentialsError, connect

    namespace = args.namespace or default_namespace(args.kubeconfig)

    async def go() -> int:
        try:
            kube = await connect(args.kubeconfig)
        except CredentialsError as exc:
            raise Failure(str(exc), 2) from None
        try:
            return await body(kube, namespace)
        except ApiException as exc:
            raise Failure(f"{exc.reason} (HTTP {exc.status})") from None
        finally:
            await kube.close()

    try:
        return asyncio.run(go())
    except Failure as failure:
        return report(verb, failure)


def time_arg(flag: str, value: str) -> int:
    """A time flag (``--at``, ``--after``, ``--from``, ``--to``) as ms since the epoch: the values
    a trigger takes (:func:`anarchon.kube.triggers.parse_trigger`), so one spelling works everywhere."""
    from ..kube.triggers import parse_trigger

    slot = parse_trigger(value)
    if slot is None:
        raise Failure(f"{flag} {value!r} is not a time between 1970 and 9999 (RFC3339, or ms since the epoch)", 2)
    return slot


def job_not_found(namespace: str, name: str) -> Failure:
    return Failure(f"no AnarchonJob {name!r} in namespace {namespace!r} (HTTP 404)")


async def read_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The AnarchonJob object; a missing one is the one-line error every verb gives."""
    from ..kube.client import ApiException

    try:
        return await kube.get_job(namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            raise job_not_found(namespace, name) from None
        raise
