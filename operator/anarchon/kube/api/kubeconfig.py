"""Where the API server is and how to prove who we are: the Pod's service account or a kubeconfig.

Read here rather than by kubernetes_asyncio, whose loader imports its whole client with it: its
generated models in every replica, which sends JSON and never uses one of them. What a
replica meets (the service account; kubeconfigs with a token, a token file, client
certificates, a CA or none) is read here; a kubeconfig whose user runs an ``exec`` plugin or an
``auth-provider`` is handed to that library's loader, imported for it alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: Where a Pod's service account is mounted.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: How long a token read from a file is used before the file is read again: the kubelet
#: rotates a projected service-account token well before it expires (client-go: one minute).
TOKEN_REREAD_S = 60.0

__all__ = ["ConfigError", "Endpoint", "current_namespace", "in_cluster", "load", "where"]


class ConfigError(Exception):
    """No credentials where they were looked for (``missing``), or unusable ones (the message says why)."""

    def __init__(self, where: str, reason: str, *, missing: bool = False) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason, self.missing = where, reason, missing


@dataclass
class Endpoint:
    """The API server's URL, the TLS to reach it with, and the bearer token to send (if any)."""

    server: str
    #: The TLS to reach an https:// server with (its CA, client certificates); None for plain HTTP.
    ssl: ssl.SSLContext | None = None
    #: The name the server's certificate must carry, when it is not the URL's host.
    server_hostname: str | None = None
    proxy: str | None = None
    #: The Authorization header's value, asked for before each request (it may be refreshed).
    authorization: Callable[[], Awaitable[str | None]] | None = None
    #: Where it came from, for messages: "the Pod's service account" or the kubeconfig's path.
    source: str = ""


class _TokenFile:
    """A bearer token read from a file, read again every TOKEN_REREAD_S (the kubelet rotates it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._token = ""
        self._read_at = -TOKEN_REREAD_S

    async def __call__(self) -> str | None:
        now = time.monotonic()
        if now - self._read_at >= TOKEN_REREAD_S:
            self._token = (await asyncio.to_thread(Path(self.path).read_text)).strip()
            self._read_at = now
        return f"Bearer {self._token}" if self._token else None


def _static(value: str) -> Callable[[], Awaitable[str | None]]:
    async def header() -> str | None:
        return value

    return header


def in_cluster(kubeconfig: str | None) -> bool:
    """No kubeconfig named, in a Pod: the service account is what to use."""
    return not (kubeconfig or os.environ.get("KUBECONFIG")) and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def _service_account() -> Endpoint:
    where = "the Pod's service account"
    for name in ("token", "ca.crt"):
        if not (SERVICE_ACCOUNT / name).is_file():
            raise ConfigError(where, f"no {SERVICE_ACCOUNT / name}")
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return Endpoint(
        server=f"https://{host}:{port}",
        ssl=_tls(str(SERVICE_ACCOUNT / "ca.crt"), verify=True),
        authorization=_TokenFile(str(SERVICE_ACCOUNT / "token")),
        source=where,
    )


def _given(kubeconfig: str | None) -> str:
    """The kubeconfig named, else ``$KUBECONFIG`` (paths joined by os.pathsep), else kubectl's default."""
    return kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"


def _paths(kubeconfig: str | None) -> list[Path]:
    return [Path(p).expanduser() for p in _given(kubeconfig).split(os.pathsep) if p]


def _tls(cafile: str | None, *, verify: bool) -> ssl.SSLContext:
    """TLS trusting ``cafile`` (the system's CAs if None), or checking nothing if not ``verify``."""
    context = ssl.create_default_context(cafile=cafile)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _merged(paths: list[Path]) -> dict[str, Any]:
    """The files merged as kubectl does: the first of each named entry and of current-context wins."""
    merged: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": None, "dirs": {}}
    for path in paths:
        if not path.is_file():
            continue
        doc = yaml.safe_load(path.read_text())
        if not isinstance(doc, dict):
            raise ConfigError(str(path), "not a kubeconfig")
        for kind, inner in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for entry in doc.get(kind) or []:
                name = entry.get("name")
                if name is not None and name not in merged[kind]:
                    merged[kind][name] = entry.get(inner) or {}
                    merged["dirs"][(kind, name)] = path.parent  # relative file paths are relative to it
        merged["current-context"] = merged["current-context"] or doc.get("current-context")
    return merged


def _context(merged: dict[str, Any], where: str) -> dict[str, Any]:
    name = merged["current-context"]
    if not name:
        raise ConfigError(where, "no current-context")
    if name not in merged["contexts"]:
        raise ConfigError(where, f"current-context {name!r} is not among its contexts")
    return dict(merged["contexts"][name])


def current_namespace(kubeconfig: str | None) -> str | None:
    """The namespace of the kubeconfig's current context, the Pod's own in a cluster, or None."""
    if in_cluster(kubeconfig) and (SERVICE_ACCOUNT / "namespace").is_file():
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    try:
        context = _context(_merged(_paths(kubeconfig)), "the kubeconfig")
    except (ConfigError, OSError, yaml.YAMLError, AttributeError, TypeError):
        return None
    return str(context.get("namespace") or "") or None


@contextlib.contextmanager
def _file_of(data: str | None, path: str | None, base: Path) -> Iterator[str | None]:
    """The path of a file holding ``data`` (base64, as kubeconfigs embed it), else ``path``."""
    if data:
        with tempfile.NamedTemporaryFile("wb", suffix=".pem") as f:
            f.write(base64.b64decode(data))
            f.flush()
            yield f.name
    elif path:
        yield str(base / Path(path).expanduser())
    else:
        yield None


def _from_entries(cluster: dict[str, Any], user: dict[str, Any], dirs: tuple[Path, Path], where: str) -> Endpoint:
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(where, "the cluster has no server")
    cluster_dir, user_dir = dirs
    context: ssl.SSLContext | None = None
    if server.startswith("https://"):
        verify = not cluster.get("insecure-skip-tls-verify")
        ca_data, ca_file = cluster.get("certificate-authority-data"), cluster.get("certificate-authority")
        with _file_of(ca_data if verify else None, ca_file if verify else None, cluster_dir) as ca:
            context = _tls(ca, verify=verify)
        with (
            _file_of(user.get("client-certificate-data"), user.get("client-certificate"), user_dir) as cert,
            _file_of(user.get("client-key-data"), user.get("client-key"), user_dir) as key,
        ):
            if cert:
                context.load_cert_chain(cert, key)
    authorization = None
    if user.get("token"):
        authorization = _static(f"Bearer {user['token']}")
    elif user.get("tokenFile"):
        authorization = _TokenFile(str(user_dir / Path(user["tokenFile"]).expanduser()))
    return Endpoint(
        server=server.rstrip("/"),
        ssl=context,
        server_hostname=cluster.get("tls-server-name"),
        proxy=cluster.get("proxy-url"),
        authorization=authorization,
        source=where,
    )


async def _by_the_library(path: str, where: str) -> Endpoint:
    """An ``exec`` plugin or an ``auth-provider``: kubernetes_asyncio's loader runs and refreshes them."""
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=path, client_configuration=cfg)
    host = str(cfg.host or "")
    context: ssl.SSLContext | None = None
    if host.startswith("https://"):
        context = _tls(cfg.ssl_ca_cert, verify=bool(cfg.verify_ssl))
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)

    async def header() -> str | None:
        value = await cfg.get_api_key_with_prefix("BearerToken")
        return str(value) if value else None

    return Endpoint(
        server=host.rstrip("/"),
        ssl=context,
        server_hostname=cfg.tls_server_name,
        proxy=cfg.proxy,
        authorization=header,
        source=where,
    )


def where(kubeconfig: str | None) -> str:
    """Where credentials are looked for, as messages say it."""
    if in_cluster(kubeconfig):
        return "the Pod's service account"
    return f"kubeconfig {_given(kubeconfig)}"


async def load(kubeconfig: str | None) -> Endpoint:
    """The endpoint of ``kubeconfig``, else ``$KUBECONFIG``, else the service account, else ``~/.kube/config``.

    Raises :class:`ConfigError`, saying where it looked and what was wrong.
    """
    place = where(kubeconfig)
    if in_cluster(kubeconfig):
        return _service_account()
    paths = _paths(kubeconfig)
    if not any(p.is_file() for p in paths):
        raise ConfigError(place, "does not exist", missing=True)
    try:
        merged = _merged(paths)
        context = _context(merged, place)
        cluster_name, user_name = context.get("cluster"), context.get("user")
        if cluster_name not in merged["clusters"]:
            raise ConfigError(place, f"cluster {cluster_name!r} of the current context is not among its clusters")
        user = merged["users"].get(user_name) or {}
        if user.get("exec") or user.get("auth-provider"):
            return await _by_the_library(_given(kubeconfig), place)
        if user.get("username") or user.get("password"):
            raise ConfigError(place, "basic authentication (username and password) is not supported")
        dirs = (merged["dirs"][("clusters", cluster_name)], merged["dirs"].get(("users", user_name), paths[0].parent))
        return _from_entries(merged["clusters"][cluster_name], user, dirs, place)
    except ConfigError as exc:
        raise ConfigError(place, exc.reason) from None
    except (OSError, ssl.SSLError, ValueError, yaml.YAMLError, AttributeError, TypeError, KeyError) as exc:
        raise ConfigError(place, f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    except Exception as exc:  # the library's loader raises anything from ConfigException to TypeError
        raise ConfigError(place, " ".join(str(exc).split()) or type(exc).__name__) from None
