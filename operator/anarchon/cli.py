"""``anarchon``: the operator process and a few commands around it."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime

DEFAULT_STORE = "sqlite:///var/lib/anarchon/anarchon.db"


def _instance_id() -> str:
    from .engine import default_instance_id

    return os.environ.get("ANARCHON_INSTANCE_ID") or os.environ.get("POD_NAME") or default_instance_id()


def _resync_ms(value: str) -> int:
    """``--resync``: a duration of at least 1 s (each pass lists every job's runs)."""
    from .engine.durations import parse_duration
    from .engine.errors import ScheduleError

    try:
        ms = parse_duration(value, what="--resync")
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if ms < 1000:
        raise argparse.ArgumentTypeError(f"must be at least 1s (each pass lists every job's runs), got {value}")
    return ms


def cmd_operator(args: argparse.Namespace) -> int:
    from .engine import ConfigError
    from .kube.client import CredentialsError
    from .kube.main import OperatorConfig, run_operator
    from .logs import setup_logging

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
    )
    try:
        asyncio.run(run_operator(cfg))
    except (ConfigError, CredentialsError) as exc:
        # A setting that cannot work: one line saying which, no traceback, no retry (exit 2,
        # like a usage error), so that a crash-looping Pod shows the cause in its last log line.
        print(f"anarchon operator: {exc}", file=sys.stderr)
        return 2
    return 0


def _default_namespace(kubeconfig: str | None) -> str:
    """The kubeconfig context's namespace, or the Pod's own in a cluster, else "default"."""
    from kubernetes_asyncio.config import ConfigException, list_kube_config_contexts

    in_cluster = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    if not (kubeconfig or os.environ.get("KUBECONFIG")) and os.path.exists(in_cluster):
        with open(in_cluster) as f:
            return f.read().strip() or "default"
    try:
        _, active = list_kube_config_contexts(config_file=kubeconfig)
    except (ConfigException, OSError):
        return "default"
    return str(((active or {}).get("context") or {}).get("namespace") or "default")


def cmd_trigger(args: argparse.Namespace) -> int:
    """Ask for a run now (or at ``--at``) by annotating the job; the replicas claim it like any slot.

    Through the API (no kubectl needed, so it also works from the operator's image).
    """
    from .kube.client import ApiException, CredentialsError, connect
    from .kube.constants import ANNOTATION_TRIGGER
    from .kube.triggers import parse_trigger

    at = args.at or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if parse_trigger(at) is None:
        print(
            f"anarchon trigger: --at {at!r} is not a time between 1970 and 9999 (RFC3339, or ms since the epoch)",
            file=sys.stderr,
        )
        return 2
    namespace = args.namespace or _default_namespace(args.kubeconfig)

    async def annotate() -> int:
        try:
            kube = await connect(args.kubeconfig)
        except CredentialsError as exc:
            print(f"anarchon trigger: {exc}", file=sys.stderr)
            return 2
        try:
            await kube.annotate_job(namespace, args.job, {ANNOTATION_TRIGGER: at})
        except ApiException as exc:
            what = f"no AnarchonJob {args.job!r} in namespace {namespace!r}" if exc.status == 404 else exc.reason
            print(f"anarchon trigger: {what} (HTTP {exc.status})", file=sys.stderr)
            return 1
        finally:
            await kube.close()
        print(f"anarchonjob {namespace}/{args.job}: run of {at} requested")
        return 0

    return asyncio.run(annotate())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="anarchon", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    op = sub.add_parser("operator", help="run one operator replica (all replicas are active)")
    op.add_argument("--store", help=f"store URL (env ANARCHON_STORE; default {DEFAULT_STORE})")
    op.add_argument("--namespace", "-n", action="append", help="watch this namespace (repeatable)")
    op.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)")
    op.add_argument("--instance-id", help="this replica's name in history (env ANARCHON_INSTANCE_ID or POD_NAME)")
    op.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    op.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics port (0: off)")
    op.add_argument(
        "--health-port", type=int, default=8081, help="liveness /healthz and readiness /readyz port (0: off)"
    )
    op.add_argument(
        "--resync",
        type=_resync_ms,
        default="30s",
        help="how often every job is looked over: history limits of quiet jobs, old store records (default 30s)",
    )
    op.add_argument(
        "--log-format",
        choices=["plain", "json"],
        default="plain",
        help="plain text lines (default), or JSON lines with job, slot, attempt and instance fields",
    )
    op.add_argument("--log-level", default=os.environ.get("ANARCHON_LOG_LEVEL", "INFO"))
    op.set_defaults(func=cmd_operator)
    tr = sub.add_parser("trigger", help="run a job now, outside its schedule")
    tr.add_argument("job")
    tr.add_argument("--namespace", "-n", help="the job's namespace (default: the kubeconfig context's)")
    tr.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    tr.add_argument("--at", help="the run's slot: an RFC3339 time or ms since the epoch (default: now)")
    tr.set_defaults(func=cmd_trigger)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
