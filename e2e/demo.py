"""Anarchon in one command: a local control plane, three all-active operator replicas, one example job.

Starts the test control plane (etcd, kube-apiserver, controller-manager, scheduler and KWOK fake
nodes; see e2e/controlplane/README.md), installs the CRDs from crds/, starts N ``anarchon operator``
processes that share one SQLite store file (``--instance-id replica-1..N``), applies the example(s)
and prints ``kubectl get anarchonruns -o wide`` every few seconds: each run is claimed by exactly
one replica, and thanks to the jitter different replicas win different runs.

Ctrl-C (or SIGTERM) stops the replicas, then the control plane; nothing is left running. Usually
started through ``bash e2e/demo.sh``, which builds the binaries and installs the package first.

    python e2e/demo.py                                 # examples/every-10s.yaml, 3 replicas
    python e2e/demo.py examples/forbid-overlap.yaml    # any example(s)
    python e2e/demo.py --seconds 60 --check            # stop by itself; exit 1 unless >= 2 replicas ran runs
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e" / "controlplane"))

from controlplane import ControlPlane, ControlPlaneError, _child_setup, free_port, signals_to_exit  # noqa: E402

GROUP_PATH = "/apis/anarchon.io/v1alpha1"
DEFAULT_EXAMPLE = REPO / "examples" / "every-10s.yaml"


def say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


@dataclass
class Replica:
    """One ``anarchon operator`` process."""

    instance: str
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    health_port: int

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_replica(cp: ControlPlane, index: int, store: str, namespace: str | None) -> Replica:
    instance = f"replica-{index}"
    log = cp.run_dir / "logs" / f"{instance}.log"
    metrics_port, health_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["KUBECONFIG"] = str(cp.kubeconfig)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "operator"), env.get("PYTHONPATH", "")) if p)
    scope = [f"--namespace={namespace}"] if namespace else ["--all-namespaces"]
    cmd = [
        sys.executable,
        "-m",
        "anarchon",
        "operator",
        f"--store={store}",
        f"--instance-id={instance}",
        f"--metrics-port={metrics_port}",
        f"--health-port={health_port}",
        "--log-format=plain",
        *scope,
    ]
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the demo only; the demo stops the replicas in order
            preexec_fn=_child_setup,  # and the kernel stops them if the demo is killed outright
        )
    return Replica(instance, proc, log, metrics_port, health_port)


def stop_replicas(replicas: Sequence[Replica], timeout: float = 20.0) -> None:
    """SIGTERM (the replicas hand their running attempts over), then SIGKILL whatever is left."""
    for r in replicas:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for r in replicas:
        try:
            r.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{r.instance} did not stop in {timeout:.0f}s: killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            r.proc.wait(timeout=5)


def healthy(replica: Replica) -> bool:
    """Ready: set up on its store, which answers (``/healthz`` answers before that)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{replica.health_port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def install_crds(cp: ControlPlane) -> None:
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                cp.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
    deadline = time.monotonic() + 60
    for name in ("anarchonjobs.anarchon.io", "anarchonruns.anarchon.io"):
        while True:
            crd = cp.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not Established after 60s")
            time.sleep(0.2)


def apply_example(cp: ControlPlane, path: Path, namespace: str) -> list[str]:
    names = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        doc.setdefault("metadata", {})["namespace"] = namespace
        cp.api("POST", f"{GROUP_PATH}/namespaces/{namespace}/anarchonjobs", doc)
        names.append(doc["metadata"]["name"])
    return names


def list_runs(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.api("GET", f"{GROUP_PATH}/namespaces/{namespace}/anarchonruns")["items"]
    return sorted(items, key=lambda r: (r["spec"].get("slot", 0), r["metadata"]["name"]))


def runs_table(cp: ControlPlane, namespace: str, runs: Sequence[dict[str, Any]]) -> str:
    """``kubectl get anarchonruns -o wide`` if kubectl is here, else the same columns printed by us."""
    if shutil.which("kubectl"):
        res = cp.kubectl("get", "anarchonruns", "-n", namespace, "-o", "wide", "--sort-by=.spec.slot", check=False)
        if res.returncode == 0:
            return res.stdout.rstrip() or "No resources found."
    if not runs:
        return "No resources found."
    rows = [("NAME", "JOB", "SLOT", "PHASE", "ATTEMPT", "INSTANCE", "POD")]
    for r in runs:
        st = r.get("status", {})
        rows.append(
            (
                r["metadata"]["name"],
                r["spec"].get("job", ""),
                r["spec"].get("slotTime", ""),
                st.get("phase", ""),
                str(st.get("attempt", "")),
                st.get("instance", ""),
                st.get("podName", ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("examples", nargs="*", type=Path, help=f"AnarchonJob files (default {DEFAULT_EXAMPLE})")
    parser.add_argument("--replicas", type=int, default=3, help="operator replicas (default 3)")
    parser.add_argument("--namespace", default="default", help="namespace of the jobs (default: default)")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between two tables (default 3)")
    parser.add_argument("--seconds", type=float, default=0, help="stop by itself after this long (default: Ctrl-C)")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless runs succeeded and (with 2+ replicas) 2+ replicas won some"
    )
    parser.add_argument("--dir", type=Path, help="keep the run dir (logs, kubeconfig, store) here")
    args = parser.parse_args(argv)
    examples = [p.resolve() for p in (args.examples or [DEFAULT_EXAMPLE])]
    for p in examples:
        if not p.is_file():
            parser.error(f"no such file: {p}")

    with signals_to_exit() as stop:
        cp = ControlPlane(args.dir, keep_run_dir=args.dir is not None)
        replicas: list[Replica] = []
        try:
            say("starting the control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK)...")
            cp.start()
            say(f"control plane up in {cp.start_seconds:.1f}s; fake nodes {', '.join(cp.nodes)}")
            install_crds(cp)
            store = f"sqlite:///{cp.run_dir / 'anarchon.db'}"
            ns = args.namespace
            if ns != "default":
                namespace_obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                with contextlib.suppress(urllib.error.HTTPError):
                    cp.api("POST", "/api/v1/namespaces", namespace_obj)
            for i in range(1, args.replicas + 1):
                replicas.append(start_replica(cp, i, store, None))
            deadline = time.monotonic() + 120  # a busy 2-core machine can take a while to start 3 replicas
            while not all(healthy(r) for r in replicas):
                for r in replicas:
                    if not r.alive():
                        say(f"{r.instance} exited with {r.proc.returncode}; last lines of {r.log}:\n{r.tail()}")
                        return 1
                if time.monotonic() > deadline or stop.is_set():
                    say("the replicas did not become healthy in 120s" if not stop.is_set() else "stopped")
                    return 1
                time.sleep(0.3)
            for r in replicas:
                say(f"{r.instance}: pid {r.proc.pid}, metrics :{r.metrics_port}/metrics, log {r.log}")
            jobs = [name for p in examples for name in apply_example(cp, p, ns)]
            say(f"store {store}; applied {', '.join(jobs)} in namespace {ns}")
            say(f"in another shell: export KUBECONFIG={cp.kubeconfig}")
            say("kill a replica (kill <pid>) to see another one take over; Ctrl-C stops everything")

            started = time.monotonic()
            seen: dict[str, str] = {}  # every Succeeded run seen (history limits delete old ones), -> instance
            wins: collections.Counter[str] = collections.Counter()
            while not stop.is_set():
                for r in replicas:
                    if not r.alive():
                        say(f"{r.instance} exited with {r.proc.returncode}; last lines of {r.log}:\n{r.tail()}")
                try:
                    runs = list_runs(cp, ns)
                except (urllib.error.URLError, OSError) as e:  # a busy API server (429) or a slow answer
                    say(f"listing runs failed ({e}); retrying")
                    stop.wait(args.interval)
                    continue
                for run in runs:
                    st = run.get("status", {})
                    if st.get("phase") == "Succeeded" and st.get("instance"):
                        seen[run["metadata"]["name"]] = st["instance"]
                wins = collections.Counter(seen.values())
                print(f"\n--- {time.strftime('%H:%M:%S')}  kubectl get anarchonruns -n {ns} -o wide", flush=True)
                print(runs_table(cp, ns, runs), flush=True)
                summary = ", ".join(f"{k}: {v}" for k, v in sorted(wins.items())) or "none yet"
                print(f"succeeded runs by instance: {summary}", flush=True)
                if args.seconds and time.monotonic() - started >= args.seconds:
                    break
                stop.wait(args.interval)
            if args.check:
                need = min(2, args.replicas)
                if sum(wins.values()) == 0 or len(wins) < need:
                    say(f"check failed: succeeded runs by instance {dict(wins)}; wanted runs from {need} replicas")
                    return 1
                say(f"check passed: {sum(wins.values())} runs succeeded, won by {len(wins)} replicas")
            return 0
        except ControlPlaneError as e:
            say(str(e))
            return 1
        finally:
            say("stopping the replicas and the control plane...")
            stop_replicas(replicas)
            cp.stop()
            say("stopped" + (f"; logs kept in {cp.run_dir / 'logs'}" if args.dir else ""))


if __name__ == "__main__":
    sys.exit(main())
