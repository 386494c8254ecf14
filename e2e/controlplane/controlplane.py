"""A real, local Kubernetes control plane for Anarchon's tests.

Starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK
(fake nodes whose Pods follow the lifecycle in ``kwok-stages.yaml``) as child
processes on 127.0.0.1, built by ``build.sh`` from Go modules. Why not a mock:
the operator's behaviour depends on real API semantics (RBAC, status
subresources, watches, resourceVersions, garbage collection), which only the
real API server has.

Stdlib only (plus the ``openssl`` CLI for certificates), so that it runs before
the project's own dependencies are installed and can be used outside pytest::

    python e2e/controlplane/controlplane.py up        # prints `export KUBECONFIG=...`

or from Python::

    with ControlPlane() as cp:
        subprocess.run(["kubectl", "--kubeconfig", str(cp.kubeconfig), "get", "nodes"])
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from realnode import RealNode

HERE = Path(__file__).resolve().parent
BUILD_SH = HERE / "build.sh"
KWOK_STAGES = HERE / "kwok-stages.yaml"

#: Binaries the control plane needs in the bin dir (helm/kubeconform are not needed here).
REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

#: Annotation by which KWOK picks the nodes it manages (see --manage-nodes-with-annotation-selector).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

#: Static users (token file) with no RBAC bindings at all: least-privilege identities for RBAC tests.
STATIC_USERS = ("alice", "bob")

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used; the message carries the failing component's log tail."""


class MissingBinariesError(ControlPlaneError):
    """The binaries are not built yet: the fix is to run build.sh, which the message says."""


def bin_dir() -> Path:
    """Where build.sh puts (or put) the binaries for the current go.mod/go.sum/build.sh.

    ``ANARCHON_CP_BIN_DIR`` overrides it (e.g. binaries built elsewhere). Asking build.sh
    keeps the cache key in one place.
    """
    override = os.environ.get("ANARCHON_CP_BIN_DIR")
    if override:
        return Path(override)
    out = subprocess.run(
        ["bash", str(BUILD_SH), "--print-bin-dir"], check=True, capture_output=True, text=True, timeout=30
    )
    return Path(out.stdout.strip().splitlines()[-1])


def missing_binaries(directory: Path) -> list[str]:
    """Names of required binaries absent from ``directory``."""
    return [b for b in REQUIRED_BINARIES if not os.access(directory / b, os.X_OK)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


_PR_SET_PDEATHSIG = 1


try:  # loaded in the parent: a child between fork and exec should not dlopen
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
except OSError:
    _LIBC = None


def _child_setup() -> None:
    """Run in each child before exec: ask Linux to SIGTERM it when its parent dies.

    Why: if pytest or the CLI is killed with SIGKILL, no teardown runs; without this the
    servers would be orphaned and keep their ports and CPU.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class Component:
    """One child process of the control plane and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self, what: str) -> ControlPlaneError:
        """An error naming the component, its exit status and the tail of its log."""
        rc = self.proc.poll()
        state = "is running" if rc is None else f"exited with {rc}"
        return ControlPlaneError(f"{what}: {self.name} {state}; last lines of {self.log}:\n{_tail(self.log)}")


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK on 127.0.0.1.

    After :meth:`start`: ``kubeconfig`` (admin, system:masters), ``server`` (https URL),
    ``admin_token``, ``ca_file``, ``user_tokens`` (static users with no permissions),
    ``nodes`` (names of the fake nodes). Pods scheduled to those nodes follow the
    annotation contract of ``kwok-stages.yaml`` (Pending → Running → Succeeded by default).
    """

    def __init__(
        self,
        run_dir: Path | str | None = None,
        *,
        binaries: Path | str | None = None,
        node_count: int = 3,
        pods_per_node: int = 110,
        start_timeout: float = 120.0,
        keep_run_dir: bool = False,
        audit: bool = False,
    ) -> None:
        self._own_run_dir = run_dir is None
        # A temp run dir is only named here and made by start(): constructing must not leave litter.
        self.run_dir = (
            Path(run_dir)
            if run_dir is not None
            else Path(tempfile.gettempdir()) / f"anarchon-cp-{os.getpid()}-{secrets.token_hex(4)}"
        )
        self.bin_dir = Path(binaries) if binaries is not None else bin_dir()
        self.node_count = node_count
        #: Each fake node's Pod capacity (a real kubelet's default is 110).
        self.pods_per_node = pods_per_node
        self.start_timeout = start_timeout
        self.keep_run_dir = keep_run_dir
        #: With ``audit=True``, one JSON line per finished request (who, verb, resource), written by
        #: the API server: how bench/bench_scale.py tells each controller's requests apart.
        self.audit_log: Path | None = self.run_dir / "audit.log" if audit else None
        self.components: list[Component] = []
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.ca_file = self.run_dir / "pki" / "ca.crt"
        self.admin_token = secrets.token_hex(16)
        self.user_tokens: dict[str, str] = {u: secrets.token_hex(16) for u in STATIC_USERS}
        self.nodes = [f"kwok-node-{i}" for i in range(node_count)]
        self.server = ""
        self.etcd_url = ""
        self.start_seconds = 0.0
        #: Component versions, recorded at start (``versions()`` needs a running API server).
        self.version_info: dict[str, str] = {}
        self._ssl: ssl.SSLContext | None = None
        self._started = False
        self._component_tokens: dict[str, str] = {}
        self._health: dict[str, str] = {}
        #: The real node, once :meth:`add_real_node` started it.
        self.real_node: RealNode | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start all components and return when a Pod can be scheduled and run on a fake node.

        Raises :class:`MissingBinariesError` if build.sh has not been run, and
        :class:`ControlPlaneError` (with the failing component's log tail) otherwise.
        Stops whatever it started if it fails.

        Call it from a thread that lives as long as the control plane should (e.g. the main
        thread): the components get the kernel's parent-death signal when the thread that
        started them exits, which is what keeps a killed test run from leaving orphans.
        """
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise MissingBinariesError(
                f"control plane binaries missing in {self.bin_dir}: {', '.join(missing)}. "
                "Build them with: bash e2e/controlplane/build.sh (needs Go; the first build takes ~20-30 min)"
            )
        if shutil.which("openssl") is None:
            raise ControlPlaneError("the openssl CLI is needed to make the test CA: apt-get install openssl")
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        for attempt in range(1, 4):
            try:
                self._start_once(deadline)
                break
            except ControlPlaneError as e:
                self.stop()
                # free_port() only probes: another process (e.g. a parallel test session) can take
                # the port before the component binds it. Then start again on new ports.
                if attempt < 3 and "address already in use" in str(e):
                    continue
                raise
            except BaseException:
                self.stop()
                raise
        self._started = True
        self.start_seconds = time.monotonic() - t0
        self.version_info = self.versions()
        return self

    def _start_once(self, deadline: float) -> None:
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=not self._own_run_dir)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        # A reused run dir (``up --dir``) starts from an empty cluster, like a temp one.
        shutil.rmtree(self.run_dir / "etcd", ignore_errors=True)
        self._make_pki()
        self._start_etcd(deadline)
        self._start_apiserver(deadline)
        self._write_kubeconfigs()
        self._start_controllers()
        self._create_nodes()
        self._wait_ready(deadline)

    def stop(self) -> None:
        """Stop every component, newest first (etcd last, so the API server shuts down cleanly).

        Each gets SIGTERM to its process group and SIGKILL after 10 s. A temp run dir is removed.
        """
        for comp in reversed(self.components):
            self._stop_component(comp)
        self.components.clear()
        if self.real_node is not None:
            self.real_node.cleanup()
            self.real_node = None
        self._started = False
        if self._own_run_dir and not self.keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def add_real_node(self, *, pause_image: str, images: Sequence[str] = (), timeout: float = 180.0) -> RealNode:
        """Start a real node (kubelet + containerd, see realnode.py) beside the KWOK ones; return when Ready.

        ``pause_image`` and ``images`` are local Docker images, imported into the node's containerd (no
        registry answers here). The node is tainted: only Pods with :func:`realnode.pod_spec_for_real_node`
        land on it. It stops with the control plane.
        """
        from realnode import RealNode

        kubelet = self.bin_dir / "kubelet"
        if not kubelet.is_file():
            raise MissingBinariesError(
                f"kubelet missing in {self.bin_dir}: build it with bash e2e/controlplane/build.sh"
            )
        node = RealNode(self, kubelet, pause_image, images)
        before = len(self.components)
        try:
            node.start(time.monotonic() + timeout)
        except BaseException:
            # Leave the control plane as it was: the KWOK nodes keep serving the other tests.
            for comp in reversed(self.components[before:]):
                self._stop_component(comp)
            del self.components[before:]
            node.cleanup()
            raise
        self.real_node = node
        return node

    @staticmethod
    def _stop_component(comp: Component) -> None:
        """SIGTERM to its process group, SIGKILL after 10 s."""
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(comp.proc.pid, sig)
            try:
                comp.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # Anything the component started shares its group; make sure nothing survives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(comp.proc.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ helpers for tests

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this control plane (admin unless ``kubeconfig`` is given)."""
        cmd = ["kubectl", "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and res.returncode != 0:
            raise ControlPlaneError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}{res.stdout}")
        return res

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a child process (e.g. the operator under test) that should use this cluster.

        A copy of ``base`` (default: os.environ) with KUBECONFIG set to the admin kubeconfig;
        the test process's own environment is not changed.
        """
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """One JSON request to the API server as admin (or with ``token``); returns the decoded body.

        Raises :class:`urllib.error.HTTPError` on a non-2xx status, so callers can check ``.code``.
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
            req.add_header("Content-Type", ctype)
        with urllib.request.urlopen(req, context=self._ssl_context(), timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def user_kubeconfig(self, user: str) -> Path:
        """A kubeconfig for one of the static least-privilege users (``alice``, ``bob``): no RBAC bindings."""
        return self.token_kubeconfig(user, self.user_tokens[user])

    def token_kubeconfig(self, name: str, token: str) -> Path:
        """Write a kubeconfig that authenticates with ``token``; returns its path."""
        path = self.run_dir / f"kubeconfig-{name}"
        self._write_kubeconfig(path, name, token)
        return path

    def service_account_token(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600, create: bool = True
    ) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API (creates the SA if asked).

        Why: the operator runs in-cluster with such a token; RBAC tests bind Roles to the
        ServiceAccount and use this token to see what it may and may not do.
        """
        if create:
            try:
                self.api(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
                )
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise
        tr = self.api(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": expiration_seconds},
            },
        )
        return str(tr["status"]["token"])

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig for ServiceAccount ``namespace/name`` (created if missing)."""
        return self.token_kubeconfig(f"sa-{namespace}-{name}", self.service_account_token(namespace, name))

    def versions(self) -> dict[str, str]:
        """Versions of the running components (for logs and reports)."""

        def version_of(binary: str) -> str:
            out = subprocess.run([str(self.bin_dir / binary), "--version"], capture_output=True, text=True, timeout=30)
            m = re.search(r"v?\d+\.\d+\.\d+\S*", out.stdout + out.stderr)
            return m.group(0) if m else "?"

        info = self.api("GET", "/version") if self.server else {}
        return {
            "kubernetes": str(info.get("gitVersion", "?")),
            "etcd": version_of("etcd"),
            "kwok": version_of("kwok"),
        }

    # ------------------------------------------------------------------ internals

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def _spawn(self, name: str, args: Sequence[str], env_extra: dict[str, str] | None = None) -> Component:
        log = self.run_dir / "logs" / f"{name}.log"
        # The user's KUBECONFIG / KWOK_* settings must not leak into the components.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "KWOK"))}
        env.update(env_extra or {})
        with log.open("ab") as fh:
            proc = subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=self.run_dir,
                env=env,
                start_new_session=True,  # own process group: stop() kills the whole group
                preexec_fn=_child_setup,  # only prctl: safe after fork
            )
        comp = Component(name, proc, log)
        self.components.append(comp)
        return comp

    def _openssl(self, *args: str) -> None:
        res = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{res.stderr}")

    def _make_pki(self) -> None:
        """CA, apiserver serving cert (127.0.0.1, localhost, kubernetes.default...), service-account key pair."""
        pki = self.run_dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        self._ssl = None  # a retried start makes a new CA: forget the context that trusts the old one
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req", "-x509", *ec, "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"), "-days", "7",
            "-subj", "/CN=anarchon-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        self._openssl(
            "req", *ec, "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"),
            "-subj", "/CN=kube-apiserver",
        )  # fmt: skip
        sans = ",".join(
            [
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        ext = pki / "apiserver.ext"
        ext.write_text(
            f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        self._openssl(
            "x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "7", "-out", str(pki / "apiserver.crt"),
            "-extfile", str(ext),
        )  # fmt: skip
        # The API server's client cert for kubelets (logs, exec on the real node, see realnode.py).
        self._openssl(
            "req", *ec, "-keyout", str(pki / "kubelet-client.key"), "-out", str(pki / "kubelet-client.csr"),
            "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
        )  # fmt: skip
        (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n")
        self._openssl(
            "x509", "-req", "-in", str(pki / "kubelet-client.csr"), "-CA", str(pki / "ca.crt"),
            "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "7", "-out", str(pki / "kubelet-client.crt"),
            "-extfile", str(pki / "client.ext"),
        )  # fmt: skip
        # ECDSA (ES256) keys: RSA key generation takes seconds on a busy 2-core machine.
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(pki / "sa.key"))
        self._openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        # Static tokens: token,user,uid,"group1,group2". Components run as system:masters
        # (a test harness needs no per-controller least privilege; it removes a failure mode).
        self._component_tokens = {
            "kube-controller-manager": secrets.token_hex(16),
            "kube-scheduler": secrets.token_hex(16),
            "kwok": secrets.token_hex(16),
        }
        rows = [f'{self.admin_token},admin,admin,"system:masters"']
        rows += [
            f'{tok},system:{name},{name},"system:masters"' if name != "kwok" else f'{tok},kwok,kwok,"system:masters"'
            for name, tok in self._component_tokens.items()
        ]
        rows += [f"{tok},{user},{user}" for user, tok in self.user_tokens.items()]
        (pki / "tokens.csv").write_text("\n".join(rows) + "\n")

    def _start_etcd(self, deadline: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        comp = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",  # test data: durability is not wanted, speed is
                "--log-level=warn",
            ],
        )
        self._poll(deadline, comp, "etcd health", lambda: self._http_ok(self.etcd_url + "/health", plain=True))

    def _start_apiserver(self, deadline: float) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        pki = self.run_dir / "pki"
        comp = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # 127.0.0.1 is not a valid Endpoints address; nothing needs the `kubernetes` Service's endpoints.
                "--endpoint-reconciler-type=none",
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                # A kubelet is reached by its node name (the real node's is localhost), never at the
                # InternalIP it detects (the machine's own address: traffic must stay on loopback).
                "--kubelet-preferred-address-types=Hostname",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self._audit_args(),
            ],
        )
        self._poll(deadline, comp, "kube-apiserver /readyz", lambda: self._http_ok(self.server + "/readyz"))

    def _audit_args(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.run_dir / "audit-policy.json"
        rules = [{"level": "Metadata", "omitStages": ["RequestReceived", "ResponseStarted"]}]
        policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": rules}))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
        ]

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        """Kubeconfig as JSON (valid YAML), CA embedded so the file is self-contained."""
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "anarchon-test", "cluster": {"server": self.server, "certificate-authority-data": ca}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": f"{user}@anarchon-test", "context": {"cluster": "anarchon-test", "user": user}}],
            "current-context": f"{user}@anarchon-test",
        }
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        path.chmod(0o600)

    def _write_kubeconfigs(self) -> None:
        self._write_kubeconfig(self.kubeconfig, "admin", self.admin_token)
        for name, tok in self._component_tokens.items():
            self._write_kubeconfig(self.run_dir / f"kubeconfig-{name}", name, tok)

    def _start_controllers(self) -> None:
        pki = self.run_dir / "pki"
        kcm_port, sched_port, kwok_port = free_port(), free_port(), free_port()
        self._health = {
            "kube-controller-manager": f"https://127.0.0.1:{kcm_port}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{sched_port}/healthz",
            "kwok": f"http://127.0.0.1:{kwok_port}/healthz",
        }
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.run_dir / 'kubeconfig-kube-controller-manager'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.run_dir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=false",
                # The default controllers: garbage collector, namespace, serviceaccount(-token),
                # node lifecycle (removes the not-ready taint of new nodes), job, ...
                "--controllers=*",
                "--node-monitor-period=1s",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.run_dir / 'kubeconfig-kube-scheduler'}",
                f"--authentication-kubeconfig={self.run_dir / 'kubeconfig-kube-scheduler'}",
                f"--authorization-kubeconfig={self.run_dir / 'kubeconfig-kube-scheduler'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--cert-dir={self.run_dir / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.run_dir / 'kubeconfig-kwok'}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{kwok_port}",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
            ],
            # kwok also reads ~/.kwok/kwok.yaml: a developer's own stages must not change the contract.
            env_extra={"HOME": str(self.run_dir / "kwok-home")},
        )

    def _create_nodes(self) -> None:
        """Fake Nodes managed by KWOK, without taints so ordinary Pods schedule onto them."""
        for name in self.nodes:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/hostname": name,
                        "node-role.kubernetes.io/agent": "",
                        "type": "kwok",
                    },
                },
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": str(self.pods_per_node)},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": str(self.pods_per_node)},
                    "nodeInfo": {
                        "architecture": "amd64",
                        "kubeletVersion": "fake",
                        "kubeProxyVersion": "fake",
                        "operatingSystem": "linux",
                    },
                    "phase": "Running",
                },
            }
            self.api("POST", "/api/v1/nodes", node)

    def _nodes_schedulable(self) -> bool:
        """All fake nodes Ready and without taints (the not-ready taint is removed by node lifecycle)."""
        items = self.api("GET", "/api/v1/nodes")["items"]
        ready = 0
        for n in items:
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True" and not n.get("spec", {}).get("taints"):
                ready += 1
        return ready >= len(self.nodes)

    def _default_service_account(self) -> bool:
        """The serviceaccount controller made `default/default`: kube-controller-manager works."""
        try:
            self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise
        return True

    def _wait_ready(self, deadline: float) -> None:
        by_name = {c.name: c for c in self.components}
        for name, url in self._health.items():
            self._poll(deadline, by_name[name], f"{name} {url}", functools.partial(self._http_ok, url, verify=False))
        self._poll(
            deadline, by_name["kube-controller-manager"], "default ServiceAccount", self._default_service_account
        )
        self._poll(deadline, by_name["kwok"], "fake nodes Ready and untainted", self._nodes_schedulable)

    def _http_ok(self, url: str, *, plain: bool = False, verify: bool = True) -> bool:
        try:
            if plain:
                ctx = None
            elif verify:
                ctx = self._ssl_context()
            else:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            req = urllib.request.Request(url)
            if url.startswith(self.server or "\0"):
                req.add_header("Authorization", f"Bearer {self.admin_token}")
            with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
                return bool(200 <= resp.status < 300)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _poll(self, deadline: float, comp: Component, what: str, check: Callable[[], bool]) -> None:
        """Poll ``check()`` until true; fail fast with the log tail if ``comp`` (or any component) dies."""
        while True:
            for c in self.components:
                if not c.alive():
                    raise c.failure(f"waiting for {what}")
            try:
                if check():
                    return
            except urllib.error.URLError:
                pass
            if time.monotonic() > deadline:
                raise comp.failure(f"timed out after {self.start_timeout:.0f}s waiting for {what}")
            time.sleep(0.1)


# ---------------------------------------------------------------------- CLI


@contextlib.contextmanager
def signals_to_exit() -> Iterator[threading.Event]:
    """Turn SIGINT/SIGTERM into an event so the CLI tears down cleanly instead of dying mid-way.

    The previous handlers are restored on exit. Also used by e2e/demo.py.
    """
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the control plane and stay in the foreground until Ctrl-C")
    up.add_argument("--dir", type=Path, help="run dir (kept); default: a temp dir removed on exit")
    up.add_argument("--nodes", type=int, default=3, help="number of fake KWOK nodes (default 3)")
    sub.add_parser("bin-dir", help="print where build.sh puts the binaries")
    args = parser.parse_args(argv)

    if args.cmd == "bin-dir":
        print(bin_dir())
        return 0

    with signals_to_exit() as stop:
        cp = ControlPlane(args.dir, node_count=args.nodes)
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"controlplane: {e}", file=sys.stderr)
            return 1
        try:
            v = cp.versions()
            print(
                f"control plane up in {cp.start_seconds:.1f}s: kubernetes {v['kubernetes']}, etcd {v['etcd']}, "
                f"kwok {v['kwok']}; server {cp.server}; logs in {cp.run_dir / 'logs'}",
                file=sys.stderr,
            )
            print(f"kubeconfig: {cp.kubeconfig}")
            print(f"export KUBECONFIG={cp.kubeconfig}")
            print("Ctrl-C to stop.", file=sys.stderr)
            sys.stdout.flush()
            while not stop.wait(1.0):
                for c in cp.components:
                    if not c.alive():
                        print(f"controlplane: {c.failure('stopped')}", file=sys.stderr)
                        return 1
        finally:
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
