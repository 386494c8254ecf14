"""NATS JetStream, claim-only: the stream's message de-duplication names one winner per run.

A claim publishes one message into a JetStream stream with the header
``Nats-Msg-Id: <job>:<slot>``. JetStream remembers every message id it stored during the
stream's ``duplicate_window`` and does not store a second message with the same id: it
acknowledges it with ``duplicate: true`` and the sequence number of the first one. The
stream leader handles publishes one at a time, so of N concurrent publishes of one id exactly
one is stored; its publisher is the winner, everyone else reads ``duplicate``.

A duplicate ack is not always a loss: when a publish is retried after its ack was lost (a
timeout, a reconnect), the first message may be the caller's own. The backend then reads the
stored message by the sequence number in the ack and answers "won" if it carries the caller's
token, so retries are idempotent and no run is lost to a lost ack.

The window is the claim-only contract: a contender that publishes after the window has
passed is not recognised as a duplicate and wins a second time. The window must therefore
exceed the longest delay between the first and the last claim of a slot: jitter + clock
skew between instances + claim latency (including client retries). ``duplicate_window_ms``
sets it (default one hour; the stream's ``max_age`` is the same, because JetStream rebuilds
the id table from stored messages after a restart and refuses a window longer than
``max_age``). :meth:`NatsBackend.require_window` lets the scheduler check the jitter
against it. When the stream already exists with a shorter window, setup widens it (never
narrows it: other instances may need the longer one).

Like every claim-only store there is no lease, so no backups, takeover, overlap protection,
catch-up or hand-over (``capabilities.leases`` is False). Needs nats-server with JetStream
enabled (``-js``), 2.2 or newer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..backend import Backend, Capabilities, ClaimRequest, claim_only_win
from ..errors import ConfigError, StoreError
from ..model import ClaimOutcome, ClaimResult
from ._urls import redact

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

DEFAULT_WINDOW_MS = 3600 * 1000
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _subject_token(job: str) -> str:
    """The job as one subject token: as is when it is safe, else a hash.

    Only for reading the stream by job; the message id, not the subject, decides the winner,
    so a (practically impossible) hash collision would not matter.
    """
    return job if _SAFE_TOKEN.match(job) else "h" + hashlib.sha256(job.encode()).hexdigest()[:32]


class NatsBackend(Backend):
    """Claim-only backend on NATS JetStream message de-duplication; see the module docstring."""

    capabilities = Capabilities(name="nats", leases=False)

    def __init__(
        self,
        url: str,
        *,
        stream: str = "ANARCHON_CLAIMS",
        subject_prefix: str = "anarchon.claims",
        duplicate_window_ms: int = DEFAULT_WINDOW_MS,
        timeout_s: float = 10.0,
        replicas: int = 1,
        **connect_options: Any,
    ) -> None:
        if duplicate_window_ms < 1000:
            raise ConfigError(f"nats: duplicate_window_ms must be at least 1000, got {duplicate_window_ms}")
        if not re.match(r"^[A-Za-z0-9_-]+$", stream):
            raise ConfigError(f"nats: invalid stream name {stream!r}")
        self.url = url
        self.stream = stream
        self.subject_prefix = subject_prefix
        self.duplicate_window_ms = int(duplicate_window_ms)
        self.timeout_s = timeout_s
        self.replicas = replicas
        self._connect_options = connect_options
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._window_ms: int | None = None
        self._lock = asyncio.Lock()

    @property
    def claim_window_ms(self) -> int:
        """The stream's actual duplicate window (known after setup; may exceed the requested one)."""
        return self._window_ms if self._window_ms is not None else self.duplicate_window_ms

    def require_window(self, needed_ms: int) -> None:
        """Refuse when contenders of one slot may arrive further apart than the window.

        ``needed_ms`` is jitter + clock skew + claim latency, from the scheduler.
        """
        if needed_ms >= self.claim_window_ms:
            raise ConfigError(
                f"nats: the stream {self.stream} de-duplicates claims for {self.claim_window_ms} ms but"
                f" contenders may arrive up to {needed_ms} ms apart; raise duplicate_window_ms above that"
                " or lower the jitter"
            )

    async def setup(self) -> None:
        await self._connected()

    async def _connected(self) -> JetStreamContext:
        """The JetStream context, connecting (again) when there is no live connection.

        nats-py gives up for good after ``max_reconnect_attempts``, for the first connection
        as for reconnections. The defaults here (3 attempts, 1 s apart) make an unreachable
        server a prompt StoreError instead of a two-minute wait; a connection that nats-py
        gave up on is replaced at the next claim, so an outage of any length heals.
        """
        import nats
        from nats.errors import Error as NatsError

        async with self._lock:
            if self._nc is not None and self._js is not None and not self._nc.is_closed:
                return self._js
            await self.close()
            options: dict[str, Any] = {
                "max_reconnect_attempts": 3,
                "reconnect_time_wait": 1.0,
                "connect_timeout": min(self.timeout_s, 5.0),
            }
            options.update(self._connect_options)
            try:
                self._nc = await nats.connect(self.url, **options)
                self._js = self._nc.jetstream(timeout=self.timeout_s)
                await self._ensure_stream()
            except (TimeoutError, NatsError, OSError) as exc:
                await self.close()
                raise StoreError(f"nats: cannot set up the claim stream at {redact(self.url)}: {exc}") from exc
            except BaseException:
                await self.close()
                raise
            return self._js

    async def _ensure_stream(self) -> None:
        """Create the stream, or widen its window; record the window actually in force."""
        from nats.js.api import StorageType, StreamConfig
        from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

        js = self._jetstream()
        window_s = self.duplicate_window_ms / 1000
        subjects = [f"{self.subject_prefix}.>"]
        try:
            info = await js.stream_info(self.stream)
        except NotFoundError:
            config = StreamConfig(
                name=self.stream,
                subjects=subjects,
                storage=StorageType.FILE,
                duplicate_window=window_s,
                max_age=window_s,
                num_replicas=self.replicas,
                description="anarchon claims: one message per (job, slot), de-duplicated by Nats-Msg-Id",
            )
            try:
                info = await js.add_stream(config)
            except BadRequestError:  # another instance created it meanwhile
                info = await js.stream_info(self.stream)
        except ServiceUnavailableError as exc:
            raise StoreError(
                f"nats: JetStream is not enabled on {redact(self.url)} (start nats-server with -js)"
            ) from exc
        config = info.config
        if f"{self.subject_prefix}.>" not in (config.subjects or []):
            raise ConfigError(
                f"nats: stream {self.stream} exists but does not take {self.subject_prefix}.>; pick another"
                " stream or subject_prefix"
            )
        if (config.duplicate_window or 0) < window_s:
            config.duplicate_window = window_s
            config.max_age = max(config.max_age or 0, window_s) if config.max_age else 0
            info = await js.update_stream(config)
        self._window_ms = round((info.config.duplicate_window or 0) * 1000)
        if self._window_ms < self.duplicate_window_ms:
            raise ConfigError(
                f"nats: stream {self.stream} keeps a duplicate window of {self._window_ms} ms, shorter than"
                f" the {self.duplicate_window_ms} ms asked for"
            )

    def _jetstream(self) -> JetStreamContext:
        if self._js is None:
            raise StoreError("nats backend used before setup()")
        return self._js

    @property
    def jetstream(self) -> JetStreamContext:
        """The JetStream context of the backend's connection (benchmarks time raw publishes on it)."""
        return self._jetstream()

    async def ping(self) -> None:
        """Reconnect if needed, then a PING/PONG round trip (``flush``) on the connection."""
        from nats.errors import Error as NatsError

        await self._connected()
        nc = self._nc
        if nc is None:
            raise StoreError("nats: the connection was closed")
        try:
            await nc.flush(timeout=max(1, int(self.timeout_s)))
        except (TimeoutError, NatsError, OSError) as exc:
            raise StoreError(f"nats: {redact(self.url)} does not answer: {exc}") from exc

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):  # a connection nats-py is still retrying
                await nc.close()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        from nats.errors import Error as NatsError

        if any(ord(ch) < 0x20 for ch in request.job):
            raise ConfigError(f"nats: job name {request.job!r} contains control characters")
        js = await self._connected()
        msg_id = f"{request.job}:{request.slot}"
        payload = json.dumps(
            {"job": request.job, "slot": request.slot, "instance": request.instance, "token": request.token}
        ).encode()
        try:
            ack = await js.publish(
                f"{self.subject_prefix}.{_subject_token(request.job)}",
                payload,
                timeout=self.timeout_s,
                stream=self.stream,
                headers={"Nats-Msg-Id": msg_id},
            )
            if not ack.duplicate:
                return claim_only_win(request)
            return (
                claim_only_win(request)
                if await self._is_own(ack.seq, msg_id, request.token)
                else ClaimResult(ClaimOutcome.TAKEN, None)
            )
        except (TimeoutError, NatsError, OSError) as exc:
            raise StoreError(f"nats: claim of {request.job}@{request.slot} failed: {exc}") from exc

    async def _is_own(self, seq: int | None, msg_id: str, token: str) -> bool:
        """Whether the message stored first under ``msg_id`` is the caller's (a retried claim)."""
        from nats.js.errors import NotFoundError

        if not seq:
            return False
        try:
            stored = await self._jetstream().get_msg(self.stream, seq)
        except NotFoundError:  # aged out or purged: not ours to claim now
            return False
        headers = stored.headers or {}
        if headers.get("Nats-Msg-Id") != msg_id or stored.data is None:
            return False
        try:
            return bool(json.loads(stored.data).get("token") == token)
        except ValueError:
            return False

    def _presence_subject(self, instance: str) -> str:
        """``<prefix>._presence.<instance>``: two tokens after the prefix, where a job's subject has one."""
        return f"{self.subject_prefix}._presence.{_subject_token(instance)}"

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        """A message on the instance's own subject of the claim stream (aged out with the claims)."""
        from nats.errors import Error as NatsError

        js = await self._connected()
        payload = json.dumps({"instance": instance, "until": now_ms + ttl_ms}).encode()
        try:
            await js.publish(self._presence_subject(instance), payload, timeout=self.timeout_s, stream=self.stream)
        except (TimeoutError, NatsError, OSError) as exc:
            raise StoreError(f"nats: noting {instance} present failed: {exc}") from exc

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        """The newest message of each instance's subject, one read each."""
        from nats.errors import Error as NatsError
        from nats.js.errors import NotFoundError

        js = await self._connected()
        found = set()
        for instance in instances:
            try:
                stored = await js.get_last_msg(self.stream, self._presence_subject(instance))
            except NotFoundError:
                continue
            except (TimeoutError, NatsError, OSError) as exc:
                raise StoreError(f"nats: reading the presence of {instance} failed: {exc}") from exc
            try:
                record = json.loads(stored.data or b"{}")
            except ValueError:
                continue
            if record.get("instance") == instance and int(record.get("until") or 0) > now_ms:
                found.add(instance)
        return found
