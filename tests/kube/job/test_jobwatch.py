"""JobWatch against the real API server: each job's changes handed over one at a time, newest last,
and a job deleted while nobody watched noticed at the next listing."""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane import ControlPlane

from anarchon.kube.api.client import Kube
from anarchon.kube.constants import API_VERSION, GROUP, JOB_KIND, JOBS, VERSION
from anarchon.kube.job.jobwatch import JobWatch
from tests.harness.until import until_async


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": JOB_KIND,
        "metadata": {"name": name},
        "spec": {
            "every": "1h",
            "suspend": True,
            "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
        },
    }


class Recorder:
    """A handler that records (kind, name, label "n") and can hold each call until released."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.running = 0
        self.most_at_once = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, kind: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.seen.append((kind, meta["name"], (meta.get("labels") or {}).get("n")))
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.running -= 1

    def of(self, name: str) -> list[tuple[str, str | None]]:
        return [(kind, n) for kind, job, n in self.seen if job == name]


async def _label(kube: Kube, namespace: str, name: str, n: int) -> None:
    await kube.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        JOBS,
        name,
        {"metadata": {"labels": {"n": str(n)}}},
        _content_type="application/merge-patch+json",
    )  # type: ignore[call-arg]


async def test_changes_are_handed_over_one_at_a_time_the_newest_last(
    crds: ControlPlane, kube: Kube, namespace: str
) -> None:
    """While a job's change is being handled, three more come: the handler then gets only the
    newest, once, and never two of the same job at once."""
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, _job("one"))
    handler = Recorder()
    handler.gate = asyncio.Event()
    watch = JobWatch(kube, handler, [namespace])
    watch.start()
    try:
        await until_async("the listed job handed over", lambda: handler.running == 1)
        for n in (1, 2, 3):
            await _label(kube, namespace, "one", n)
        await asyncio.sleep(1)  # the three events arrive while the first is still being handled
        handler.gate.set()
        await until_async("the newest change", lambda: handler.of("one")[-1:] == [("MODIFIED", "3")])
        await watch.idle()
        assert handler.of("one") == [("ADDED", None), ("MODIFIED", "3")]
        assert handler.most_at_once == 1
        await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, "one")
        await until_async("the deletion", lambda: handler.of("one")[-1][0] == "DELETED")
    finally:
        await watch.stop()


async def test_a_job_deleted_while_nobody_watched_is_handed_over_as_deleted(
    crds: ControlPlane, kube: Kube, namespace: str
) -> None:
    for name in ("kept", "gone"):
        await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, _job(name))
    handler = Recorder()
    watch = JobWatch(kube, handler, [namespace])
    watch.start()
    await until_async("both jobs", lambda: bool(handler.of("kept") and handler.of("gone")))
    await watch.stop()
    await kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, "gone")
    watch.start()  # lists again: "gone" is not there any more
    try:
        gone = [("DELETED", None)]
        await until_async("the deletion noticed at the listing", lambda: handler.of("gone")[-1:] == gone)
        await until_async("the kept job listed again", lambda: len(handler.of("kept")) == 2)
        assert handler.of("kept") == [("ADDED", None), ("ADDED", None)]
    finally:
        await watch.stop()


async def test_a_change_whose_handling_failed_is_tried_again_without_a_new_change(
    crds: ControlPlane, kube: Kube, namespace: str
) -> None:
    """Before, a change whose handling failed (the API server down for longer than a request's
    retries, say) waited for the job's next change, which may come in an hour, or never."""
    await kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, JOBS, _job("flaky"))
    handler = Recorder()
    calls: list[str] = []

    async def flaky(kind: str, body: dict[str, Any]) -> None:
        calls.append(kind)
        if len(calls) <= 2:
            raise RuntimeError("the API server is down")
        await handler(kind, body)

    watch = JobWatch(kube, flaky, [namespace])
    watch.start()
    try:
        await until_async("the change handled in the end", lambda: bool(handler.of("flaky")))
        assert calls == ["ADDED"] * 3 and handler.of("flaky") == [("ADDED", None)]
    finally:
        await watch.stop()
