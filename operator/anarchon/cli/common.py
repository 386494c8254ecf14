"""What the verbs that talk to the API server share: their flags, the namespace, the connection, one-line errors.

Kubernetes modules are imported inside the functions, so that ``--help`` and ``lint`` (offline)
do not wait for the API client to load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ..kube.api.client import Kube


class Failure(Exception):
    """A verb cannot do what it was asked: one line on stderr, and the exit code (2: bad usage)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


#: ``--request-timeout``'s default, as kubectl's flag would be set in a script: a command someone
#: waits on says within this that the API server does not answer.
REQUEST_TIMEOUT: Final = "10s"


def request_timeout_arg(value: str) -> float | None:
    """``--request-timeout``, as kubectl spells it: ``10s``, ``1m``, a bare number of seconds, 0 for none."""
    from ..engine.durations import parse_duration
    from ..engine.errors import ScheduleError

    try:
        ms = int(value) * 1000 if value.isascii() and value.isdigit() else parse_duration(value, what="")
    except ScheduleError:
        raise argparse.ArgumentTypeError(f"expected a duration such as 10s or 1m (0: none), got {value!r}") from None
    return ms / 1000 if ms > 0 else None


#: The most times or slots one listing shows (``next -c``, ``why --last``).
MAX_COUNT: Final = 1000


def count_arg(value: str) -> int:
    """A count flag: ASCII digits, from 1 to MAX_COUNT."""
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be a number from 1 to {MAX_COUNT}, got {value!r}")
    return int(value)


#: How long ``--wait`` follows a run by default: a script must not hang for ever on a run that
#: no replica claims (none is running) or that never ends.
WAIT_TIMEOUT: Final = "10m"


def _positive_seconds(value: str) -> float:
    from ..engine.durations import parse_duration
    from ..engine.errors import ScheduleError

    try:
        ms = parse_duration(value, what="--timeout")
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--timeout: ")) from exc
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return ms / 1000


def add_wait_args(parser: argparse.ArgumentParser, what: str) -> None:
    """``--wait`` (follow the run to its end; exit 0 if it ended ``what``) and its ``--timeout``."""
    parser.add_argument(
        "--wait", "-w", action="store_true", help=f"follow the run to its end; exit 0 if it ended {what}"
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=_positive_seconds(WAIT_TIMEOUT),
        help=f"with --wait: give up after this long, exit 1; the run goes on (e.g. 30s; default {WAIT_TIMEOUT})",
    )


def add_kube_args(parser: argparse.ArgumentParser) -> None:
    """The flags of every verb that talks to the API server: ``-n`` is the namespace in each of them."""
    parser.add_argument("--namespace", "-n", help="the job's namespace (default: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    parser.add_argument(
        "--request-timeout",
        type=request_timeout_arg,
        default=request_timeout_arg(REQUEST_TIMEOUT),
        metavar="DURATION",
        help=f"give up on an API request after this long, retries included (default {REQUEST_TIMEOUT}; 0: no limit)",
    )


def default_namespace(kubeconfig: str | None) -> str:
    """The kubeconfig context's namespace, or the Pod's own in a cluster, else "default"."""
    from ..kube.api.kubeconfig import current_namespace

    return current_namespace(kubeconfig) or "default"


def report(verb: str, failure: Failure) -> int:
    print(f"anarchon {verb}: {failure}", file=sys.stderr)
    return failure.code


def with_kube(verb: str, args: argparse.Namespace, body: Callable[[Kube, str], Awaitable[int]]) -> int:
    """Connect, run ``body(kube, namespace)`` and close; every failure is one line on stderr.

    Missing credentials are a usage error (exit 2, as for ``anarchon operator``); an API error
    is exit 1 with the server's own message and its HTTP status. Each request gives up after
    ``--request-timeout``: a server that is down or does not answer is one line in that time,
    not a minute of retries and a traceback.
    """
    import aiohttp

    from ..kube.api.client import ApiException, CredentialsError, connect, request_timeout

    namespace = args.namespace or default_namespace(args.kubeconfig)
    limit: float | None = getattr(args, "request_timeout", None)

    async def go() -> int:
        try:
            kube = await connect(args.kubeconfig)
        except CredentialsError as exc:
            raise Failure(str(exc), 2) from None
        server = kube.endpoint.server
        try:
            with request_timeout(limit):
                return await body(kube, namespace)
        except ApiException as exc:
            raise await api_failure(kube, exc) from None
        except TimeoutError:
            raise Failure(f"the API server at {server} did not answer within {limit:g}s (--request-timeout)") from None
        except aiohttp.ClientConnectorError as exc:
            errno = exc.os_error.errno
            why = os.strerror(errno) if errno else str(exc.os_error)
            raise Failure(f"cannot reach the API server at {server}: {why}; is the cluster up?") from None
        except aiohttp.ClientError as exc:
            raise Failure(f"the connection to the API server at {server} broke: {exc or type(exc).__name__}") from None
        finally:
            await kube.close()

    try:
        return asyncio.run(go())
    except Failure as failure:
        return report(verb, failure)


#: What to do when the cluster has no AnarchonJob CRD.
INSTALL_CRDS: Final = (
    "install them with `kubectl apply -f crds/` (from the Anarchon repository) or the Helm chart (charts/anarchon)"
)


async def crds_missing(kube: Kube) -> bool:
    """Whether the API server does not serve the anarchon.io API at all (the CRDs are not installed).

    A 404 says the same for a missing job and a missing resource type; discovery tells them apart.
    """
    from ..kube.api.client import ApiException, call
    from ..kube.constants import GROUP, VERSION

    try:
        await call("discovery of anarchon.io", lambda: kube.request("GET", f"/apis/{GROUP}/{VERSION}"))
    except ApiException as exc:
        return exc.status == 404
    return False


async def api_failure(kube: Kube, exc: Exception) -> Failure:
    """The one line an API error gives: the server's own message (what a 403 says is missing), and how
    to install the CRDs when it is the missing resource type that is not found."""
    from ..kube.api.client import ApiException
    from ..kube.constants import API_VERSION

    assert isinstance(exc, ApiException)
    if exc.status == 404 and await crds_missing(kube):
        return Failure(f"the API server at {kube.endpoint.server} does not serve {API_VERSION}: {INSTALL_CRDS}")
    text = " ".join(exc.message.split()) or exc.reason
    if exc.status == 401:
        text += f" (the credentials of {kube.endpoint.source} were refused)"
    return Failure(f"{text} (HTTP {exc.status})")


def time_arg(flag: str, value: str) -> int:
    """A time flag (``--at``, ``--after``, ``--from``, ``--to``) as ms since the epoch: the values
    a trigger takes (:func:`anarchon.kube.job.triggers.parse_trigger`), so one spelling works everywhere."""
    from ..kube.job.triggers import parse_trigger

    slot = parse_trigger(value)
    if slot is None:
        raise Failure(f"{flag} {value!r} is not a time between 1970 and 9999 (RFC3339, or ms since the epoch)", 2)
    return slot


def job_not_found(namespace: str, name: str) -> Failure:
    return Failure(f"no AnarchonJob {name!r} in namespace {namespace!r} (HTTP 404)")


async def not_found(kube: Kube, namespace: str, name: str) -> Failure:
    """A 404 on job ``name``: no such job, or no AnarchonJob CRD on the cluster at all."""
    from ..kube.constants import API_VERSION

    if await crds_missing(kube):
        return Failure(f"the API server at {kube.endpoint.server} does not serve {API_VERSION}: {INSTALL_CRDS}")
    return job_not_found(namespace, name)


async def read_job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    """The AnarchonJob object; a missing one is the one-line error every verb gives."""
    from ..kube.api.client import ApiException

    try:
        return await kube.get_job(namespace, name)
    except ApiException as exc:
        if exc.status == 404:
            raise await not_found(kube, namespace, name) from None
        raise
