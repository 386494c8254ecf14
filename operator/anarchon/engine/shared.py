"""One job run from several clusters on one store: each cluster's spec, and the one the claims follow.

A job shared between clusters (the operator's ``spec.sharedName``) is one job in the store,
claimed by the instances of every cluster. What decides when and how its slots run (the
schedule, overlap, catch-up...: the operator's fingerprint) must be the same everywhere, or
two clusters would compute different slots of one job. Each cluster notes its fingerprint with
the job (:meth:`.backend.SharedSpecStore.note_shared_spec`), and all of them read every
cluster's note back. They are never merged: the claims follow the fingerprint a live cluster
has held the longest (:func:`agreed`, in the order the store saw the notes), and a cluster with
another one waits (claims nothing new) until it agrees. So editing the spec in one cluster
after the other never leaves a gap: the clusters not yet edited run the old spec, then all
run the new one.

An instance id of a cluster's replica reads ``<cluster>/<replica>`` (:func:`instance_id`), so
a run's record says where it ran (:func:`cluster_of`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

#: A cluster's name: a DNS label (lower case, digits, ``-``), so that it fits a label value.
CLUSTER_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
MAX_CLUSTER_NAME_LENGTH: Final = 40
_CLUSTER_NAME_RE = re.compile(CLUSTER_NAME_PATTERN)


@dataclass(frozen=True)
class SharedSide:
    """One cluster's note of a shared job's spec."""

    cluster: str
    fingerprint: str
    #: The rank of the moment this cluster's fingerprint became this one, among the job's
    #: notes (the store's count, not a clock: clusters' clocks may differ by more than the
    #: time between two notes); kept while the fingerprint stays the same.
    since: int
    #: When one of the cluster's instances last noted it.
    seen_ms: int


def agreed(sides: Sequence[SharedSide]) -> str | None:
    """The fingerprint the claims follow: the one a cluster has held the longest (ties: the smaller).

    None when no cluster noted any. Every cluster computes the same from the same notes.
    """
    if not sides:
        return None
    return min(sides, key=lambda s: (s.since, s.fingerprint)).fingerprint


def note_side(sides: Sequence[SharedSide], cluster: str, fingerprint: str, now_ms: int) -> SharedSide:
    """``cluster``'s note at ``now_ms`` among ``sides``: its ``since`` kept while the fingerprint stays,
    else after every other (the stores' rule)."""
    old = next((s for s in sides if s.cluster == cluster), None)
    if old is not None and old.fingerprint == fingerprint:
        return SharedSide(cluster, fingerprint, old.since, now_ms)
    return SharedSide(cluster, fingerprint, max((s.since for s in sides), default=0) + 1, now_ms)


def check_cluster_name(name: str) -> str:
    """``name`` if it can name a cluster, else ValueError saying what one looks like."""
    if len(name) > MAX_CLUSTER_NAME_LENGTH or not _CLUSTER_NAME_RE.fullmatch(name):
        raise ValueError(
            f"cluster name {name!r}: use at most {MAX_CLUSTER_NAME_LENGTH} lower-case letters, digits and '-',"
            " starting and ending with a letter or digit (it goes into instance ids and label values)"
        )
    return name


def instance_id(cluster: str | None, replica: str) -> str:
    """The id of ``replica`` in ``cluster``: ``<cluster>/<replica>``, or the replica alone without a cluster."""
    return replica if not cluster else f"{cluster}/{replica}"


def cluster_of(instance: str) -> str | None:
    """The cluster an instance id names (:func:`instance_id`); None for an instance of no named cluster."""
    cluster, sep, _ = instance.partition("/")
    return cluster if sep and _CLUSTER_NAME_RE.fullmatch(cluster) else None
