"""Redis and Valkey, claim-only: three ways to name one winner per run without a lease.

These strategies only answer "who runs ``(job, slot)``". They keep no lease, so a run whose
winner dies is not taken over, and the scheduler refuses backups, overlap protection,
catch-up and hand-over on them (``capabilities.leases`` is False). Use ``redis://`` (the
lease strategy in :mod:`.redis`) for those.

Pick a strategy with the URL scheme; everything after the ``+`` part is a normal redis-py
URL (``redis+script://host:6379/0`` -> ``redis://host:6379/0``, ``rediss+...`` for TLS):

``redis+script://``
    A Lua script ``SET key token NX PX ttl``. Redis runs a script atomically, so of N
    concurrent scripts on one key exactly one finds it absent. The script also answers "won"
    when the key already holds the caller's own token, so a claim retried after a lost reply
    is idempotent instead of losing the run.

``redis+stream://``
    ``XADD <key> <slot>-1`` with an explicit entry ID. Redis refuses an ID that is equal to
    or smaller than the stream's top entry, so only the first XADD of that ID succeeds; every
    later one fails with "equal or smaller". There is one stream per ``(job, slot)`` rather
    than one per job: with one stream per job, IDs must grow, so the late first claim of an
    *older* slot (two close slots and a long jitter) would fail although nobody won it, and
    that run would be lost. A key per slot has no ordering constraint and gets a TTL. XADD and
    PEXPIRE run in one MULTI/EXEC (no scripting needed, for servers where EVAL is disabled).
    A loser then reads the first entry: if it holds the caller's token the claim was a retry
    of its own, so retries are idempotent like the script's.

``redis+idmp://``
    Idempotent XADD (``XADD key IDMP <producer> <iid> * ...``), new in Redis 8.6: the server
    remembers each ``(producer, iid)`` for the stream's IDMP duration and answers a repeat with
    the ID of the first entry instead of adding one. With ``iid = <slot>`` on one stream per
    job, every contender gets the ID of the same, first entry; the entry's token says who
    won. The whole claim is one Lua script so that the stream's IDMP settings are applied
    (``XCFGSET``, which clears the IDMP map) only when the stream is created, never under a
    running claim. :meth:`RedisIdmpBackend.setup` detects the feature from ``COMMAND DOCS
    XADD`` and raises :class:`ConfigError` on older servers (Debian 12 ships Redis 7.0).
    Detection reads the command's documentation rather than the version number because
    Valkey reports ``redis_version:7.2.4`` whatever its own version is.

Valkey: script and stream behave the same (Valkey keeps EVAL, MULTI and XADD semantics of
Redis 7.2). Valkey has no IDMP, so ``redis+idmp://`` is refused there with the same error.

Every claim key expires after ``ttl_ms`` (default one day): that is the claim window. A
contender arriving after it would find no key and win a second time, so the window must
exceed the longest delay between the first and the last claim of one slot: jitter, clock
skew between instances and claim latency. :meth:`require_window` lets the scheduler check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..backend import Backend, Capabilities, ClaimRequest, claim_only_win
from ..errors import ConfigError, StoreError
from ..model import ClaimOutcome, ClaimResult
from . import _redis_presence as _presence
from ._urls import redact

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

DEFAULT_TTL_MS = 24 * 3600 * 1000
# Redis caps IDMP-DURATION at one day and IDMP-MAXSIZE at 10 000 ids per producer.
IDMP_MAX_DURATION_MS = 86_400 * 1000
IDMP_MAX_SIZE = 10_000

_SCRIPT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return 1
end
return 0
"""

# KEYS[1] the job's stream. ARGV: producer, iid (the slot), token, instance, duration s,
# maxsize, ttl ms. Returns the token stored in the winning entry.
_IDMP_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('XADD', KEYS[1], '0-1', 'init', '1')
    redis.call('XCFGSET', KEYS[1], 'IDMP-DURATION', ARGV[5], 'IDMP-MAXSIZE', ARGV[6])
end
local id = redis.call('XADD', KEYS[1], 'IDMP', ARGV[1], ARGV[2], 'MAXLEN', '~', ARGV[6], '*',
                      'slot', ARGV[2], 'token', ARGV[3], 'instance', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
local entry = redis.call('XRANGE', KEYS[1], id, id)
if #entry == 0 then
    return false
end
local fields = entry[1][2]
for i = 1, #fields, 2 do
    if fields[i] == 'token' then
        return fields[i + 1]
    end
end
return false
"""


TAKEN = ClaimOutcome.TAKEN


def _as_str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _plain_url(url: str) -> str:
    """``redis+script://h:1/0`` -> ``redis://h:1/0``: what redis-py understands."""
    scheme, sep, rest = url.partition(":")
    return scheme.split("+", 1)[0] + sep + rest


def _mentions(tree: object, word: str) -> bool:
    """Whether ``word`` appears anywhere in a nested Redis reply (COMMAND DOCS output)."""
    if isinstance(tree, bytes | str):
        return _as_str(tree).upper() == word
    if isinstance(tree, dict):
        return any(_mentions(k, word) or _mentions(v, word) for k, v in tree.items())
    if isinstance(tree, Sequence):
        return any(_mentions(item, word) for item in tree)
    return False


class _RedisClaimBackend(Backend):
    """What the three strategies share: the connection, key naming, the claim window."""

    capabilities: ClassVar[Capabilities]
    scheme: ClassVar[str]

    def __init__(
        self,
        url: str,
        *,
        ttl_ms: int = DEFAULT_TTL_MS,
        prefix: str = "anarchon",
        max_connections: int = 16,
        timeout_s: float = 5.0,
        **client: Any,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ConfigError(f"{self.scheme}: prefix {prefix!r}: braces are reserved for the job's hash tag")
        if ttl_ms <= 0:
            raise ConfigError(f"ttl_ms must be positive, got {ttl_ms}")
        self.url = url
        self.ttl_ms = int(ttl_ms)
        self.prefix = prefix
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._client_options = client
        self._redis: Redis | None = None
        self._script: AsyncScript | None = None

    @property
    def claim_window_ms(self) -> int:
        """How long a claim is remembered; a later contender for the same slot would win again."""
        return self.ttl_ms

    def require_window(self, needed_ms: int) -> None:
        """Refuse when claims are forgotten before the last contender of a slot may arrive.

        ``needed_ms`` is the longest delay between the first and the last claim of one slot
        (jitter + clock skew + claim latency); the scheduler passes it.
        """
        if needed_ms >= self.claim_window_ms:
            raise ConfigError(
                f"{self.scheme}: claims are remembered for {self.claim_window_ms} ms but contenders may"
                f" arrive up to {needed_ms} ms apart; raise ttl_ms above that or lower the jitter"
            )

    def _key(self, kind: str, job: str, slot: int | None = None) -> str:
        base = f"{self.prefix}:{kind}:{{{job}}}"  # hash tag: a job's keys share a cluster slot
        return base if slot is None else f"{base}:{slot}"

    @property
    def redis(self) -> Redis:
        if self._redis is None:
            raise StoreError(f"{self.scheme} backend used before setup()")
        return self._redis

    async def setup(self) -> None:
        if self._redis is not None:
            return
        from redis.asyncio import BlockingConnectionPool, Redis
        from redis.exceptions import RedisError

        plain = _plain_url(self.url)
        # A blocking pool: a burst of claims waits for a free connection instead of failing.
        pool = BlockingConnectionPool.from_url(
            plain,
            max_connections=self.max_connections,
            timeout=self.timeout_s,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            **self._client_options,
        )
        self._redis = Redis.from_pool(pool)
        try:
            await self._redis.ping()
            await self._check_server()
        except RedisError as exc:
            await self.close()
            raise StoreError(f"{self.scheme}: cannot reach Redis at {redact(plain)}: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def _check_server(self) -> None:
        """Strategy-specific checks that the server can honour the strategy."""

    async def _run_script(self, keys: list[str], args: list[str | int]) -> Any:
        if self._script is None:
            raise StoreError(f"{self.scheme} backend used before setup()")
        return await self._script(keys=keys, args=args)

    async def ping(self) -> None:
        from redis.exceptions import RedisError

        try:
            await self.redis.ping()
        except RedisError as exc:
            raise StoreError(f"{self.scheme}: Redis does not answer: {exc}") from exc

    async def close(self) -> None:
        if self._redis is not None:
            redis, self._redis = self._redis, None
            await redis.aclose()

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        from redis.exceptions import RedisError

        try:
            return await self._claim(request)
        except RedisError as exc:
            raise StoreError(f"{self.scheme}: claim of {request.job}@{request.slot} failed: {exc}") from exc

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        raise NotImplementedError

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        from redis.exceptions import RedisError

        try:
            await _presence.note(self.redis, f"{self.prefix}:presence", instance, now_ms, ttl_ms)
        except RedisError as exc:
            raise StoreError(f"{self.scheme}: noting {instance} present failed: {exc}") from exc

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        from redis.exceptions import RedisError

        try:
            return await _presence.present(self.redis, f"{self.prefix}:presence", instances, now_ms)
        except RedisError as exc:
            raise StoreError(f"{self.scheme}: reading presence failed: {exc}") from exc


class RedisScriptBackend(_RedisClaimBackend):
    """``redis+script://``: a Lua ``SET NX PX``; see the module docstring."""

    capabilities = Capabilities(name="redis+script", leases=False)
    scheme = "redis+script"

    async def _check_server(self) -> None:
        self._script = self.redis.register_script(_SCRIPT)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        key = self._key("claim", request.job, request.slot)
        won = await self._run_script([key], [request.token, self.ttl_ms])
        return claim_only_win(request) if int(won) == 1 else ClaimResult(TAKEN, None)


class RedisStreamBackend(_RedisClaimBackend):
    """``redis+stream://``: ``XADD`` with the explicit ID ``<slot>-1``; see the module docstring."""

    capabilities = Capabilities(name="redis+stream", leases=False)
    scheme = "redis+stream"

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        from redis.exceptions import ResponseError

        if request.slot < 0:
            raise ConfigError(f"redis+stream needs a slot >= 0 (stream IDs are unsigned), got {request.slot}")
        key = self._key("stream", request.job, request.slot)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(key, {"token": request.token, "instance": request.instance}, id=f"{request.slot}-1")
            pipe.pexpire(key, self.ttl_ms)
            added, _ = await pipe.execute(raise_on_error=False)
        if not isinstance(added, Exception):
            return claim_only_win(request)
        if not isinstance(added, ResponseError) or "equal or smaller" not in str(added):
            raise added
        # Someone's XADD came first; it is ours only when this is a retry of our own claim.
        # Only losers pay this second round trip.
        first = await self.redis.xrange(key, "-", "+", count=1)
        fields = (first[0][1] if first else None) or {}
        if _as_str(fields.get(b"token", fields.get("token", b""))) == request.token:
            return claim_only_win(request)
        return ClaimResult(TAKEN, None)


class RedisIdmpBackend(_RedisClaimBackend):
    """``redis+idmp://``: idempotent XADD (Redis 8.6+); see the module docstring.

    The IDMP duration (at most a day on Redis) is the claim window, so ``ttl_ms`` is capped
    at 86 400 000. Redis also evicts the oldest ids beyond IDMP-MAXSIZE (at most 10 000) per
    producer; the producer is the job, so the effective window is the shorter of ``ttl_ms``
    and 10 000 periods of the job (2.8 hours for a job every second), far above any jitter.
    """

    capabilities = Capabilities(name="redis+idmp", leases=False)
    scheme = "redis+idmp"

    def __init__(self, url: str, *, ttl_ms: int = IDMP_MAX_DURATION_MS, **options: Any) -> None:
        super().__init__(url, ttl_ms=ttl_ms, **options)
        if not 1000 <= self.ttl_ms <= IDMP_MAX_DURATION_MS:
            raise ConfigError(f"redis+idmp: ttl_ms must be between 1000 and {IDMP_MAX_DURATION_MS}, got {ttl_ms}")

    async def _check_server(self) -> None:
        docs = await self.redis.execute_command("COMMAND DOCS", "XADD")  # type: ignore[no-untyped-call]
        if not _mentions(docs, "IDMP"):
            info = await self.redis.info("server")
            version = info.get("valkey_version") or info.get("redis_version", "?")
            server = "Valkey" if "valkey_version" in info else "Redis"
            raise ConfigError(
                f"redis+idmp needs idempotent XADD (XADD ... IDMP), added in Redis 8.6; the server is"
                f" {server} {version}, which does not offer it. Use redis+script:// or redis+stream://"
                " (same guarantees, any Redis or Valkey) or upgrade Redis."
            )
        self._script = self.redis.register_script(_IDMP_SCRIPT)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        key = self._key("idmp", request.job)
        winner = await self._run_script(
            [key],
            [
                "anarchon",
                str(request.slot),
                request.token,
                request.instance,
                max(1, self.ttl_ms // 1000),
                IDMP_MAX_SIZE,
                self.ttl_ms,
            ],
        )
        if winner is not None and _as_str(winner) == request.token:
            return claim_only_win(request)
        return ClaimResult(TAKEN, None)


_STRATEGIES: dict[str, type[_RedisClaimBackend]] = {
    "script": RedisScriptBackend,
    "stream": RedisStreamBackend,
    "idmp": RedisIdmpBackend,
}


def redis_claim_backend(url: str, **options: object) -> Backend:
    """Make the claim-only Redis backend the URL's scheme names (``redis+<strategy>://``)."""
    scheme = url.split(":", 1)[0].lower()
    base, _, strategy = scheme.partition("+")
    cls = _STRATEGIES.get(strategy)
    if base not in ("redis", "rediss") or cls is None:
        raise ConfigError(
            f"unknown Redis claim strategy in {scheme!r}; use redis+script://, redis+stream:// or redis+idmp://"
        )
    return cls(url, **options)  # type: ignore[arg-type]
