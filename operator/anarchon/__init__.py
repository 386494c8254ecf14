"""Anarchon: scheduled work with exactly one winner per slot.

The engine (:mod:`anarchon.engine`) stands alone and has no Kubernetes imports; the
Kubernetes operator (:mod:`anarchon.kube`) is its first user.
"""

__version__ = "0.1.0"
