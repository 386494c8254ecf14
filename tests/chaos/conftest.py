"""The operator tests' fixtures (cluster, replicas), shared with the soak."""

from tests.operator.conftest import cluster, crds, replicas_factory  # noqa: F401
