"""A real node beside the KWOK ones: a kubelet and a containerd of its own, everything on 127.0.0.1.

Why: KWOK plays every kubelet, so no test ever ran a container. This node runs Pods for real, for the
tests that need it (:meth:`ControlPlane.add_real_node`); KWOK stays the default for speed.

How it is kept apart from everything else on the machine:

- containerd is a second instance (Debian's package; Docker's own one has CRI disabled) with its own
  config, socket, root and state under the control plane's run dir. This sandbox lacks
  CAP_SYS_RESOURCE, hence ``restrict_oom_score_adj``.
- No registry answers here: the images Pods use are imported into it from Docker (``images``). Its
  sandbox ("pause") image is one of them. Any other image is pulled from 127.0.0.1, where nothing
  answers: the Pod shows ErrImagePull / ImagePullBackOff, as with an image that does not exist.
- Network: a loopback-only CNI config makes the runtime network-ready; Pods must use the host network
  (there is no bridge and no kube-proxy; in-cluster clients need KUBERNETES_SERVICE_HOST=127.0.0.1).
- The node carries a taint and a label (:data:`REAL_NODE_TAINT`, :data:`REAL_NODE_LABEL`): ordinary test
  Pods stay on KWOK, a Pod that wants a real container tolerates the taint and selects the label.
- The kubelet authenticates with a client certificate from the test CA (system:node:<name>); it
  listens on 127.0.0.1 only, and the API server reaches it by its name, ``localhost``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane import ControlPlaneError, free_port

if TYPE_CHECKING:
    from controlplane import ControlPlane

#: The API server reaches a kubelet by its node name (controlplane.py: preferred address type Hostname),
#: so the name must resolve to 127.0.0.1 on any machine; a kubelet refuses a loopback node IP.
NODE_NAME = "localhost"
#: Key of the NoSchedule taint that keeps ordinary Pods off the real node, and of its label (value "true").
REAL_NODE_TAINT = "anarchon.io/real-node"
REAL_NODE_LABEL = "anarchon.io/real-node"
CONTAINERD = "/usr/bin/containerd"
#: A port nothing listens on (TCP port 1, tcpmux, is unassigned in practice): where image pulls go.
CLOSED_PORT = 1
CTR = "/usr/bin/ctr"


def pod_spec_for_real_node() -> dict[str, Any]:
    """What a Pod spec needs to run on the real node (merge it into the spec)."""
    return {
        "hostNetwork": True,
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }


class RealNode:
    """containerd + kubelet for one control plane; started by :meth:`ControlPlane.add_real_node`."""

    def __init__(self, cp: ControlPlane, kubelet: Path, pause_image: str, images: Sequence[str]) -> None:
        self.cp = cp
        self.kubelet = kubelet
        self.pause_image = pause_image
        self.images = list(dict.fromkeys([pause_image, *images]))
        self.dir = cp.run_dir / "real-node"
        self.socket = self.dir / "containerd.sock"
        self.name = NODE_NAME
        self.start_seconds = 0.0

    def start(self, deadline: float) -> None:
        t0 = time.monotonic()
        for sub in ("cni-conf", "cni-bin", "kubelet", "pod-logs", "certs"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._start_containerd(deadline)
        self.import_images(self.images)
        self._write_kubelet_files()
        kubelet = self.cp._spawn(
            "kubelet",
            [
                str(self.kubelet),
                f"--config={self.dir / 'kubelet.json'}",
                f"--kubeconfig={self.dir / 'kubeconfig-kubelet'}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={self.dir / 'certs'}",
                f"--hostname-override={self.name}",
                f"--node-labels={REAL_NODE_LABEL}=true,type=real",
                "--v=1",
            ],
        )
        self.cp._poll(deadline, kubelet, f"node {self.name} Ready", self._ready)
        self.start_seconds = time.monotonic() - t0

    def _start_containerd(self, deadline: float) -> None:
        (self.dir / "cni-conf" / "10-loopback.conflist").write_text(
            json.dumps({"cniVersion": "0.4.0", "name": "loopback", "plugins": [{"type": "loopback"}]})
        )
        config = f"""version = 2
root = "{self.dir / "root"}"
state = "{self.dir / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.pause_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.dir / "cni-bin"}"
    conf_dir = "{self.dir / "cni-conf"}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{self.dir / "registries"}"
"""
        # An image that was not imported is pulled from docker.io: send that to a closed port on
        # loopback, so the pull fails here (ErrImagePull) without any traffic leaving the machine.
        hosts = self.dir / "registries" / "docker.io"
        hosts.mkdir(parents=True, exist_ok=True)
        # (containerd 1.6 refuses a hosts.toml without a host table: "invalid `host` tree".)
        closed = f"http://127.0.0.1:{CLOSED_PORT}"
        (hosts / "hosts.toml").write_text(
            f'server = "{closed}"\n\n[host."{closed}"]\n  capabilities = ["pull", "resolve"]\n'
        )
        (self.dir / "containerd.toml").write_text(config)
        comp = self.cp._spawn("containerd", [CONTAINERD, f"--config={self.dir / 'containerd.toml'}"])
        self.cp._poll(deadline, comp, "containerd's socket", self._containerd_answers)

    def _ctr(self, *args: str, input_path: Path | None = None, timeout: float = 300) -> str:
        cmd = [CTR, "--address", str(self.socket), "--namespace", "k8s.io", *args]
        stdin = input_path.open("rb") if input_path else subprocess.DEVNULL
        try:
            res = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, timeout=timeout)
        finally:
            if input_path and not isinstance(stdin, int):
                stdin.close()
        if res.returncode != 0:
            raise ControlPlaneError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    def _containerd_answers(self) -> bool:
        try:
            self._ctr("version", timeout=10)
        except (ControlPlaneError, subprocess.TimeoutExpired):
            return False
        return True

    def import_images(self, images: Sequence[str]) -> None:
        """``docker save`` → ``ctr images import``: no registry is needed, and none is asked."""
        archive = self.dir / "images.tar"
        res = subprocess.run(
            ["/usr/bin/docker", "save", "-o", str(archive), *images], capture_output=True, text=True, timeout=600
        )
        if res.returncode != 0:
            raise ControlPlaneError(f"docker save {' '.join(images)} failed: {res.stderr.strip()}")
        self._ctr("images", "import", str(archive))
        archive.unlink()

    def _write_kubelet_files(self) -> None:
        pki = self.cp.run_dir / "pki"
        key, csr, crt = (self.dir / f"kubelet-client.{ext}" for ext in ("key", "csr", "crt"))
        self.cp._openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/O=system:nodes/CN=system:node:{self.name}",
        )  # fmt: skip
        ext = pki / "client.ext"  # written by the control plane's own PKI: a client certificate's uses
        self.cp._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-days", "7", "-out", str(crt), "-extfile", str(ext),
        )  # fmt: skip
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "anarchon-test",
                    "cluster": {"server": self.cp.server, "certificate-authority": str(pki / "ca.crt")},
                }
            ],
            "users": [{"name": "kubelet", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "kubelet", "context": {"cluster": "anarchon-test", "user": "kubelet"}}],
            "current-context": "kubelet",
        }
        (self.dir / "kubeconfig-kubelet").write_text(json.dumps(kubeconfig, indent=2))
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "registerWithTaints": [{"key": REAL_NODE_TAINT, "value": "true", "effect": "NoSchedule"}],
            # This sandbox: cgroup v1 with cgroupfs, no QoS cgroup tree, swap may be on, no kernel tuning.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "protectKernelDefaults": False,
            "localStorageCapacityIsolation": False,
            # A shared CI disk must not make the node evict test Pods or collect their images.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.dir / "pod-logs"),
            "resolvConf": "",
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "2s",
            "nodeStatusReportFrequency": "10s",
        }
        (self.dir / "kubelet.json").write_text(json.dumps(config, indent=2))

    def _ready(self) -> bool:
        try:
            node = self.cp.api("GET", f"/api/v1/nodes/{self.name}")
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return False
            raise
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    def cleanup(self) -> None:
        """After kubelet and containerd stopped: kill the containers and their shims (each shim runs in a
        session of its own, so the components' process groups do not hold them), then unmount what they
        mounted under the run dir, so that it can be removed."""
        marker = str(self.dir)
        parents: dict[int, int] = {}
        shims = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    shims.add(int(proc.name))
        # A container's first process is a shim's child; its death ends the container's PID namespace.
        for pid in [p for p, ppid in parents.items() if ppid in shims] + sorted(shims):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        mounts = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4]
                if point.startswith(marker):
                    mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
