"""``anarchon operator``: run one operator replica (all replicas are active)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable

DEFAULT_STORE = "sqlite:///var/lib/anarchon/anarchon.db"


def _instance_id() -> str:
    from ..engine import default_instance_id

    return os.environ.get("ANARCHON_INSTANCE_ID") or os.environ.get("POD_NAME") or default_instance_id()


def _duration_ms(flag: str, at_least_ms: int, why: str) -> Callable[[str], int]:
    """A duration flag's parser: at least ``at_least_ms``, for the reason ``why``."""

    def parse(value: str) -> int:
        from ..engine.durations import format_duration, parse_duration
        from ..engine.errors import ScheduleError

        try:
            ms = parse_duration(value, what=flag)
        except ScheduleError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
        if ms < at_least_ms:
            raise argparse.ArgumentTypeError(f"must be at least {format_duration(at_least_ms)} ({why}), got {value}")
        return ms

    return parse


def _api_concurrency(value: str) -> int:
    """``--api-concurrency``: requests in flight toward the API server, 1 to 1,000."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 1 <= n <= 1000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1000, got {n}")
    return n


def _cluster_name(value: str) -> str:
    """``--cluster-name``: a DNS label, as it leads instance ids and label values."""
    from ..engine.shared import check_cluster_name

    try:
        return check_cluster_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from ..engine import ConfigError
    from ..kube.api.client import CredentialsError
    from ..kube.main import OperatorConfig, run_operator
    from ..logs import setup_logging

    setup_logging(args.log_format, args.log_level)
    namespaces = [] if args.all_namespaces else list(args.namespace or [])
    if not namespaces and not args.all_namespaces:
        namespaces = [n for n in os.environ.get("ANARCHON_NAMESPACES", "").split(",") if n.strip()]
    cfg = OperatorConfig(
        store=args.store or os.environ.get("ANARCHON_STORE") or DEFAULT_STORE,
        instance_id=args.instance_id or _instance_id(),
        namespaces=namespaces,
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port or None,
        health_port=args.health_port or None,
        resync_s=args.resync / 1000,
        api_concurrency=args.api_concurrency,
        store_check_s=args.store_check / 1000,
        cluster_name=args.cluster_name,
    )
    try:
        asyncio.run(run_operator(cfg))
    except (ConfigError, CredentialsError) as exc:
        # A setting that cannot work: one line saying which, no traceback, no retry (exit 2,
        # like a usage error), so that a crash-looping Pod shows the cause in its last log line.
        print(f"anarchon operator: {exc}", file=sys.stderr)
        return 2
    return 0


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    op = sub.add_parser("operator", help="run one operator replica (all replicas are active)")
    op.add_argument("--store", help=f"store URL (env ANARCHON_STORE; default {DEFAULT_STORE})")
    op.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    op.add_argument("--instance-id", help="this replica's name in history (env ANARCHON_INSTANCE_ID or POD_NAME)")
    op.add_argument(
        "--cluster-name",
        type=_cluster_name,
        default=os.environ.get("ANARCHON_CLUSTER_NAME") or None,
        help="this cluster's name, the same for every replica here and unique among the clusters sharing the"
        " store; it leads the instance ids and lets jobs with spec.sharedName run (env ANARCHON_CLUSTER_NAME)",
    )
    op.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    op.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    op.add_argument(
        "--health-port", type=int, default=8081, help="liveness /healthz and readiness /readyz port (0: off)"
    )
    op.add_argument(
        "--resync",
        type=_duration_ms("--resync", 1000, "each pass lists every job's runs"),
        default="30s",
        help="how often every job is looked over: history limits of quiet jobs, old store records (default 30s)",
    )
    op.add_argument(
        "--store-check",
        type=_duration_ms("--store-check", 100, "each check writes to the store"),
        default="10s",
        help="how often the replica notes itself in its store and checks that the replicas it sees at work"
        " share it (StoreNotShared when not; default 10s)",
    )
    op.add_argument(
        "--api-concurrency",
        type=_api_concurrency,
        default=16,
        help="API requests in flight at most, watches aside; the rest wait their turn (default 16)",
    )
    op.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default="plain",
        help="plain text lines (default), or JSON lines with job, slot, attempt and instance fields",
    )
    op.add_argument("--log-level", default=os.environ.get("ANARCHON_LOG_LEVEL", "INFO"))
    op.set_defaults(func=run)
