"""RabbitMQ claims (declare a one-message queue, confirmed publish) against a confirmed publish.

The raw round trip is a persistent, confirmed publish into one existing durable queue: the
cheapest acknowledged write RabbitMQ has. A claim also declares a new durable queue per run,
which the broker must create (a queue process and a metadata transaction), so the ratio says
what the one-queue-per-run design costs.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from anarchon.engine.backends.rabbitmq import RabbitMQBackend
from bench.cases import BenchCase, local_server

DESCRIPTION = "RabbitMQBackend (claim-only: x-max-length=1 reject-publish queue per run) on a local rabbitmq-server"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    import aio_pika
    from tests.servers.rabbitmq import RabbitMQServer

    with local_server(RabbitMQServer) as server:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        backend = RabbitMQBackend(server.url, queue_prefix=prefix)
        await backend.setup()
        channel = await backend.connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(f"bench-raw-{uuid.uuid4().hex[:8]}", durable=True)
        body = b'{"raw": true}'

        async def raw(i: int) -> object:
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            return await channel.default_exchange.publish(message, routing_key=queue.name)

        try:
            yield BenchCase(
                backend=backend,
                raw=raw,
                raw_label="confirmed publish",
                make_backend=lambda: RabbitMQBackend(server.url, queue_prefix=prefix),
            )
        finally:
            await channel.close()
            await backend.close()
