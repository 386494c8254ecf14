"""Chart, examples, RBAC and packaging tests. The control plane launcher lives outside any package
(e2e/controlplane/controlplane.py): put its folder on sys.path before the test modules import it."""

import sys
from pathlib import Path

_CONTROLPLANE_DIR = str(Path(__file__).resolve().parents[2] / "e2e" / "controlplane")
if _CONTROLPLANE_DIR not in sys.path:
    sys.path.insert(0, _CONTROLPLANE_DIR)
