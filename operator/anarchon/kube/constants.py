"""Every name the operator shares with the API server and with people: API group, kinds, labels, annotations.

Pure constants (no imports beyond typing), so that any module, :mod:`.spec` included, can take
them without pulling in a client. The CRDs (``crds/``) and the chart spell the same names; a
test checks the CRDs against these.
"""

from __future__ import annotations

from typing import Final

# -- the API ---------------------------------------------------------------------------------------

GROUP: Final = "anarchon.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
JOB_KIND: Final = "AnarchonJob"
#: The plural of AnarchonJob: the resource name in API paths.
JOBS: Final = "anarchonjobs"
RUN_KIND: Final = "AnarchonRun"
#: The plural of AnarchonRun: the resource name in API paths.
RUNS: Final = "anarchonruns"
#: The content type of a JSON merge patch (RFC 7386), for the client's patch calls.
MERGE: Final = "application/merge-patch+json"

# -- labels ----------------------------------------------------------------------------------------

#: Labels the operator puts on AnarchonRuns and Pods; users may not set labels under this prefix.
LABEL_PREFIX: Final = f"{GROUP}/"
LABEL_JOB: Final = f"{LABEL_PREFIX}job"
LABEL_RUN: Final = f"{LABEL_PREFIX}run"
LABEL_SLOT: Final = f"{LABEL_PREFIX}slot"
LABEL_ATTEMPT: Final = f"{LABEL_PREFIX}attempt"
#: The try of the run a Pod is (1 for the first; retries after a failed Pod count up).
LABEL_TRY: Final = f"{LABEL_PREFIX}try"
#: On a Pod: the replica whose runner follows it (:func:`.pods.follower_label` of its instance),
#: set at launch and moved by a runner that adopts the Pod. Each replica's Pod watch selects by
#: it, so a replica decodes the events of its own Pods only, not of every replica's.
LABEL_FOLLOWER: Final = f"{LABEL_PREFIX}follower"
#: On every AnarchonRun and Pod the operator creates, with the value :data:`MANAGED_BY`;
#: the Pod watch selects by it.
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "anarchon"

# -- annotations -----------------------------------------------------------------------------------

#: The slot as RFC3339 UTC (see :func:`.spec.slot_time`), on Runs and Pods, for people and for the workload.
ANNOTATION_SCHEDULED_AT: Final = f"{GROUP}/scheduled-at"
#: On a Pod: the instance (operator replica) whose attempt launched it.
ANNOTATION_INSTANCE: Final = f"{GROUP}/instance"
#: On an AnarchonJob: a manual run is asked for, at the slot it names (see :mod:`.triggers`): one
#: request, as ``kubectl annotate`` or a manifest sets it.
ANNOTATION_TRIGGER: Final = f"{GROUP}/trigger"
#: On an AnarchonJob: the value of ``anarchon.io/trigger`` already handled. Kept on the object,
#: not only in memory, and the request left in place: a replica that starts later, or a manifest
#: applied again, must not run an old trigger again once its run has left the store's history.
ANNOTATION_TRIGGER_HANDLED: Final = f"{GROUP}/trigger-handled"
#: On an AnarchonJob: the prefix of a queued trigger request's key, ``anarchon.io/trigger.<id>``.
#: ``anarchon trigger`` adds one with a new id each time, so no request overwrites another;
#: the replicas remove each once handled.
ANNOTATION_TRIGGER_REQUEST: Final = f"{ANNOTATION_TRIGGER}."
#: Most trigger requests a job holds at once; ``anarchon trigger`` refuses another. The replicas
#: handle each within moments of seeing it, so a full queue means none is running: a hundred
#: runs waiting for them is plenty, and each request costs every replica a store claim when
#: they are back.
MAX_PENDING_TRIGGERS: Final = 100
#: On an AnarchonJob: why it is suspended, as ``anarchon suspend --reason`` says; the CLI shows
#: it beside the job, ``anarchon resume`` removes it.
ANNOTATION_SUSPEND_REASON: Final = f"{GROUP}/suspend-reason"
#: On an AnarchonRun: stop the run (delete its Pod, launch nothing more for it); the value is why,
#: as ``anarchon cancel --reason`` says (it may be empty). Set by the CLI or by ``kubectl annotate``.
ANNOTATION_CANCEL: Final = f"{GROUP}/cancel"
#: On an AnarchonRun beside :data:`ANNOTATION_CANCEL`: who asked, as the API server named them to
#: ``anarchon cancel`` (absent when nobody said: a plain ``kubectl annotate``).
ANNOTATION_CANCEL_BY: Final = f"{GROUP}/cancel-by"

#: How many windows of missed slots a job's status keeps (``status.missed``, newest last).
MISSED_WINDOWS_KEPT: Final = 10
