"""What every test directory shares (see README.md here): the control plane, the cluster and the
replicas, one way to wait, the helpers of the CLI and runner tests, and the pytest hooks that spread
the tests over workers.

Importing the package makes e2e/controlplane's modules (``controlplane``, ``realnode``) importable.
"""

import sys
from pathlib import Path

_CONTROLPLANE_DIR = str(Path(__file__).resolve().parents[2] / "e2e" / "controlplane")
if _CONTROLPLANE_DIR not in sys.path:
    sys.path.insert(0, _CONTROLPLANE_DIR)
