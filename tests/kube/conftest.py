"""The real control plane for the CRD tests, shared with tests/k8s.

The fixtures live in tests/k8s/conftest.py. If the root conftest already re-exports them
(one control plane per session for every test dir), they are used from there; importing
them here as well would define a second, separate session fixture and start a second
control plane in a full run.
"""

from __future__ import annotations

import tests.conftest as _root

if not hasattr(_root, "control_plane"):
    from tests.k8s.conftest import control_plane, namespace  # noqa: F401
