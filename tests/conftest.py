"""Every fixture shared across test directories, registered once for the whole suite.

The harness (tests/harness/README.md): the control plane, the cluster, the replicas, the pytest
hooks. The real servers (tests/servers/README.md) and the TCP fault layer in front of them
(tests/faults/toxiproxy.py) are session fixtures next to their launchers.
"""

pytest_plugins = [
    "tests.harness.plugin",
    "tests.harness.controlplane",
    "tests.harness.cluster",
    "tests.servers.redis",
    "tests.servers.postgres",
    "tests.servers.nats",
    "tests.servers.rabbitmq",
    "tests.faults.toxiproxy",
]
