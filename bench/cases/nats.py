"""NATS JetStream claims (publish with ``Nats-Msg-Id``) against a plain JetStream publish."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from anarchon.engine.backends.nats import NatsBackend
from bench.cases import BenchCase, local_server

DESCRIPTION = "NatsBackend (claim-only: JetStream de-duplication by Nats-Msg-Id) on a local nats-server -js"


@contextlib.asynccontextmanager
async def case() -> AsyncIterator[BenchCase]:
    from tests.servers.nats import NatsServer

    with local_server(NatsServer) as server:
        backend = NatsBackend(server.url)
        await backend.setup()
        js = backend.jetstream
        subject = f"{backend.subject_prefix}.bench-raw"

        async def raw(i: int) -> object:
            # The same stream and connection, no message id: the store's own acknowledged append.
            return await js.publish(subject, b'{"raw": true}', stream=backend.stream)

        try:
            yield BenchCase(
                backend=backend, raw=raw, raw_label="JS publish", make_backend=lambda: NatsBackend(server.url)
            )
        finally:
            await backend.close()
