"""RabbitMQ, claim-only: a one-message queue per run that refuses the second message.

How a claim works
    Every contender declares the same durable classic queue ``<prefix>.<job>.<slot>`` with
    ``x-max-length = 1`` and ``x-overflow = reject-publish``, then publishes one persistent
    message to it with publisher confirms. The queue is a single Erlang process that handles
    publishes one after the other: the first message fills it and is confirmed with
    ``basic.ack``; every later one finds the queue full and is refused with ``basic.nack``.
    Nobody ever consumes from these queues, so the queue never has room again: ack = won,
    nack = taken, for as long as the queue exists.

Why exactly one winner under contention
    Declaring is idempotent (same name, same arguments), so all contenders meet at one queue,
    and the queue process orders the publishes; the length limit admits only the first.

Why exactly one winner under connection loss
    The queue is durable, not exclusive and not auto-delete: it belongs to no connection. When
    the winner's connection (or process) dies, the queue and its message stay, and later
    contenders are still nacked. The message is persistent and confirmed only once written
    to disk, so a broker restart keeps the claim too. The obvious alternatives fail here:

    * an ``exclusive`` queue per run admits one declarer, but RabbitMQ deletes it when that
      connection closes, so a late contender could then declare it and win a second time;
    * ``x-single-active-consumer`` hands the queue to the next consumer when the active one
      goes away, which is a hand-over, not a one-time claim.

    If the connection breaks after the broker stored the message but before the ack arrived,
    the claimer gets a :class:`StoreError` and every later claim, including its own retry,
    is nacked: the run is lost, never duplicated. The claim cannot be made idempotent by
    reading the queue, because a fetched-but-unacknowledged message no longer counts towards
    the length limit and a concurrent publish would then be accepted.

One channel per claim in flight
    AMQP closes a channel at the first error of any operation on it and fails the others in
    flight there. Claims in flight never share a channel (up to ``max_channels`` at once,
    kept open for the next claims), so one claim's error cannot fail another's after its
    publish. A claim that fails before its publish sent nothing that could win, and its
    retry is safe; the error says which side of the publish it failed on.

Clean-up and the claim window
    ``x-expires`` (``expires_ms``, default one hour) deletes a queue that nobody has declared
    for that long. A contender that arrives after the deletion would create the queue anew
    and win a second time, so the window must exceed the longest delay between the first
    and last claim of a slot (jitter + clock skew + claim latency); :meth:`require_window`
    lets the scheduler check. Every instance must use the same ``expires_ms``: a queue
    redeclared with other arguments is refused (PRECONDITION_FAILED), reported as a
    :class:`StoreError` that says so.

Operational limits
    One queue per run: a job every 10 s keeps 360 small queues with the default window. Do
    not apply policies (``max-length``, ``overflow``, ``expires``, queue type) to queues
    matching the prefix and never consume from them. The queue type is set to ``classic``
    explicitly: the guarantee rests on the classic queue process checking the length of
    each publish in turn, and a server-wide default queue type (newer RabbitMQ versions have
    one) must not turn the claim queues into another type. Tested on RabbitMQ 3.10.8. In a
    cluster a classic queue lives on one node: while that node is down, claims of that slot
    fail rather than produce a second winner.

There is no lease (``capabilities.leases`` is False): no backups, takeover, overlap
protection, catch-up or hand-over.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from ..backend import Backend, Capabilities, ClaimRequest, claim_only_win
from ..errors import ConfigError, StoreError
from ..model import ClaimOutcome, ClaimResult
from ._urls import redact

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection

DEFAULT_EXPIRES_MS = 3600 * 1000
_MAX_QUEUE_NAME = 255
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


class RabbitMQBackend(Backend):
    """Claim-only backend on RabbitMQ; see the module docstring for why it has one winner."""

    capabilities = Capabilities(name="rabbitmq", leases=False)

    def __init__(
        self,
        url: str,
        *,
        queue_prefix: str = "anarchon.claim",
        expires_ms: int = DEFAULT_EXPIRES_MS,
        timeout_s: float = 30.0,
        max_channels: int = 64,
        **connect_options: Any,
    ) -> None:
        if not _QUEUE_NAME.match(queue_prefix) or len(queue_prefix) > 100:
            raise ConfigError(f"rabbitmq: queue_prefix {queue_prefix!r} must be up to 100 of [A-Za-z0-9_.:-]")
        if expires_ms < 1000:
            raise ConfigError(f"rabbitmq: expires_ms must be at least 1000, got {expires_ms}")
        self.url = url
        self.queue_prefix = queue_prefix
        self.expires_ms = int(expires_ms)
        self.timeout_s = timeout_s
        self._connect_options = connect_options
        self._connection: AbstractConnection | None = None
        self._idle: list[AbstractChannel] = []  # open, no claim on them
        self._opened: set[AbstractChannel] = set()  # of the current connection
        self._in_flight = asyncio.Semaphore(max_channels)
        self._lock = asyncio.Lock()

    @property
    def claim_window_ms(self) -> int:
        """How long an unused claim queue lives; a later contender would win again."""
        return self.expires_ms

    def require_window(self, needed_ms: int) -> None:
        """Refuse when contenders of one slot may arrive further apart than the queues live.

        ``needed_ms`` is jitter + clock skew + claim latency, from the scheduler.
        """
        if needed_ms >= self.claim_window_ms:
            raise ConfigError(
                f"rabbitmq: claim queues live {self.claim_window_ms} ms but contenders may arrive up to"
                f" {needed_ms} ms apart; raise expires_ms above that or lower the jitter"
            )

    def queue_name(self, job: str, slot: int) -> str:
        """The claim queue of a run: ``<prefix>.<job>.<slot>``, readable in ``rabbitmqctl list_queues``.

        AMQP 0-9-1 allows only ``[A-Za-z0-9_.:-]`` and 255 bytes in queue names; other jobs
        are named by a hash (``h<sha256>``). The slot is the last dot-separated part and has
        no dot, so two different runs never share a queue.
        """
        name = f"{self.queue_prefix}.{job}.{slot}"
        if _QUEUE_NAME.match(name) and len(name) <= _MAX_QUEUE_NAME:
            return name
        return f"{self.queue_prefix}.h{hashlib.sha256(job.encode()).hexdigest()}.{slot}"

    async def setup(self) -> None:
        async with self._channel():
            pass

    async def ping(self) -> None:
        """An open confirming channel, reconnecting if the connection was lost.

        AMQP has no ping the client can send; the connection's heartbeats are the round
        trip, and a connection they found dead is closed, so reopening it here tests the
        broker for real.
        """
        async with self._channel():
            pass

    @property
    def connection(self) -> AbstractConnection:
        """The backend's AMQP connection (benchmarks time raw publishes on their own channel)."""
        if self._connection is None:
            raise StoreError("rabbitmq backend used before setup()")
        return self._connection

    @contextlib.asynccontextmanager
    async def _channel(self) -> AsyncIterator[AbstractChannel]:
        """A confirming channel for one claim alone, kept for the next claim if it is still open.

        AMQP closes a channel on the first error of any of its operations and fails every
        other operation in flight on it. On a shared channel one claim's error (a refused
        declare, a broker race on its queue) would fail the claims of other runs, some
        after their publish, when the outcome is unknown and a retry is nacked: a lost
        run. At most ``max_channels`` claims are in flight; the others wait for a channel.
        """
        async with self._in_flight:
            channel = None
            while self._idle and channel is None:
                kept = self._idle.pop()
                channel = None if kept.is_closed else kept  # closed since: the broker restarted, say
            if channel is None:
                channel = await self._open_channel()
            try:
                yield channel
            except BaseException:
                # Whatever is still pending on it (a late confirm) must not meet the next claim.
                self._opened.discard(channel)
                with contextlib.suppress(Exception):
                    await channel.close()
                raise
            if not channel.is_closed and channel in self._opened:
                self._idle.append(channel)

    async def _open_channel(self) -> AbstractChannel:
        """A new confirming channel, reconnecting when the connection was lost.

        A plain (not robust) connection on purpose: aio-pika's robust channels remember and
        re-declare every queue after a reconnect, which here would be every run ever claimed.
        """
        import aio_pika
        from aio_pika.exceptions import AMQPError

        async with self._lock:
            try:
                if self._connection is not None and not self._connection.is_closed:
                    try:
                        channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
                        self._opened.add(channel)
                        return channel
                    except (AMQPError, RuntimeError):  # the connection died under us: start afresh
                        await self._drop()
                self._connection = await aio_pika.connect(self.url, timeout=self.timeout_s, **self._connect_options)
                channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            except (AMQPError, OSError, RuntimeError, TimeoutError) as exc:
                await self._drop()
                raise StoreError(f"rabbitmq: cannot connect to {redact(self.url)}: {exc}") from exc
            self._opened.add(channel)
            return channel

    async def _drop(self) -> None:
        """Forget the connection and its channels (closing it if it still can be), so the next claim reconnects."""
        connection, self._connection = self._connection, None
        self._idle.clear()
        self._opened.clear()
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    async def close(self) -> None:
        await self._drop()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        name = self.queue_name(request.job, request.slot)
        async with self._channel() as channel:
            return await self._claim_on(channel, name, request)

    async def _claim_on(self, channel: AbstractChannel, name: str, request: ClaimRequest) -> ClaimResult:
        import aio_pika
        from aio_pika.exceptions import AMQPError, ChannelPreconditionFailed, DeliveryError, PublishError
        from pamqp.commands import Basic

        published = False
        try:
            await channel.declare_queue(
                name,
                durable=True,
                arguments={
                    "x-max-length": 1,
                    "x-overflow": "reject-publish",
                    "x-expires": self.expires_ms,
                    "x-queue-type": "classic",
                },
                timeout=self.timeout_s,
            )
            body = json.dumps(
                {"job": request.job, "slot": request.slot, "instance": request.instance, "token": request.token}
            ).encode()
            message = aio_pika.Message(
                body,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                content_type="application/json",
                message_id=name,
            )
            published = True
            await channel.default_exchange.publish(message, routing_key=name, mandatory=True, timeout=self.timeout_s)
        except PublishError as exc:  # returned unroutable: the queue vanished between declare and publish
            raise StoreError(f"rabbitmq: claim queue {name} disappeared during the claim: {exc}") from exc
        except DeliveryError as exc:
            if isinstance(exc.frame, Basic.Nack):
                return ClaimResult(ClaimOutcome.TAKEN, None)
            raise StoreError(f"rabbitmq: claim of {request.job}@{request.slot} refused: {exc}") from exc
        except ChannelPreconditionFailed as exc:
            raise StoreError(
                f"rabbitmq: claim queue {name} exists with other arguments ({exc}); every instance must use"
                " the same expires_ms and no policy may change these queues"
            ) from exc
        except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
            # A broken connection (OSError, or RuntimeError "closed" from aiormq) is dropped so
            # that the next claim reconnects. Before the publish nothing was sent that could
            # win; after it the outcome is unknown (a retry is nacked if the message landed).
            if isinstance(exc, OSError | RuntimeError):
                await self._drop()
            stage = "after its publish, outcome unknown" if published else "before its publish"
            raise StoreError(f"rabbitmq: claim of {request.job}@{request.slot} failed {stage}: {exc}") from exc
        return claim_only_win(request)

    def presence_queue(self, instance: str) -> str:
        """``<prefix>:presence.<instance>``: a colon after the prefix, where a claim queue has a dot."""
        name = f"{self.queue_prefix}:presence.{instance}"
        if _QUEUE_NAME.match(name) and len(name) <= _MAX_QUEUE_NAME:
            return name
        return f"{self.queue_prefix}:presence.h{hashlib.sha256(instance.encode()).hexdigest()}"

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        """An empty queue of the instance's own that the broker deletes ``ttl_ms`` after its last declare.

        AMQP cannot list queues, but it can ask for one by name (:meth:`present`), and a declare
        renews ``x-expires``. The broker's clock times the record: ``now_ms`` is not consulted.
        A queue declared before with another ``ttl_ms`` is refused (PRECONDITION_FAILED): it is
        the instance's own, so it is deleted and declared anew.
        """
        from aio_pika.exceptions import AMQPError, ChannelPreconditionFailed

        name = self.presence_queue(instance)
        arguments: dict[str, Any] = {"x-expires": max(1, int(ttl_ms)), "x-queue-type": "classic"}
        for first in (True, False):
            try:
                async with self._channel() as channel:
                    await channel.declare_queue(name, durable=False, arguments=arguments, timeout=self.timeout_s)
                return
            except ChannelPreconditionFailed:
                if not first:
                    raise StoreError(f"rabbitmq: presence queue {name} keeps other arguments") from None
                async with self._channel() as channel:
                    await channel.queue_delete(name, timeout=self.timeout_s)
            except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
                raise StoreError(f"rabbitmq: noting {instance} present failed: {exc}") from exc

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        """Those whose presence queue exists: a passive declare each (a missing one closes its channel)."""
        from aio_pika.exceptions import AMQPError, ChannelNotFoundEntity

        found = set()
        for instance in instances:
            try:
                async with self._channel() as channel:
                    await channel.declare_queue(self.presence_queue(instance), passive=True, timeout=self.timeout_s)
            except ChannelNotFoundEntity:
                continue
            except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
                raise StoreError(f"rabbitmq: reading the presence of {instance} failed: {exc}") from exc
            found.add(instance)
        return found
