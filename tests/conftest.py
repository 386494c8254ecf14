"""Shared fixtures: real servers (see tests/servers/README.md) and the lease-backend matrix."""

from __future__ import annotations

import importlib
import importlib.util

# Server fixtures are defined next to their launchers; importing them here makes them
# available to every test. A module not written yet is simply not offered.
for _name, _fixture in (
    ("redis", "redis_url"),
    ("postgres", "postgres_url"),
    ("nats", "nats_url"),
    ("rabbitmq", "amqp_url"),
):
    if importlib.util.find_spec(f"tests.servers.{_name}") is not None:
        globals()[_fixture] = getattr(importlib.import_module(f"tests.servers.{_name}"), _fixture)

# TCP faults in front of the stores (tests/faults/toxiproxy.py): toxiproxy and the proxied servers.
if importlib.util.find_spec("tests.faults.toxiproxy") is not None:
    _faults = importlib.import_module("tests.faults.toxiproxy")
    for _fixture in ("toxiproxy", "redis_behind_proxy", "proxied_postgres_server", "postgres_behind_proxy"):
        globals()[_fixture] = getattr(_faults, _fixture)

# The control plane (etcd, kube-apiserver, KWOK...) is one per session for every test dir.
from tests.k8s.fixtures import control_plane, kube, namespace, real_node  # noqa: E402, F401

# How tests are spread over pytest-xdist workers, and the run's end report (tests/harness/plugin.py).
pytest_plugins = ["tests.harness.plugin"]
