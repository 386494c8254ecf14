"""Redis (and Valkey), lease strategy: every run is a hash, every change one Lua script.

Why Lua and not MULTI/WATCH: a claim must read (does the run exist? which runs of the job
are active?) and then write, atomically with respect to every other claim of the job. With
WATCH that is at least three round trips (WATCH, reads, MULTI/EXEC) and, under contention
(every instance claims the same slot at the same moment, which is the normal case here),
all losers' EXECs abort and must retry. A script runs to completion inside the server, so
each operation is one round trip and there is no retry loop: the first script wins, the
others see its write. Scripts are registered once (``register_script``) and called by
SHA (EVALSHA); after a ``SCRIPT FLUSH`` or a failover to a server that never saw them,
redis-py gets NOSCRIPT and loads them again transparently.

The rules are those of :mod:`anarchon.engine.transitions`, re-implemented in Lua; the
conformance suite holds both to the same outcomes.

Key layout (``P`` is the prefix, ``J`` the job name with ``%``, ``{`` and ``}``
percent-encoded so that it is always exactly the hash tag)::

    P:{J}:run:<slot>   hash   one run: job, slot, state, attempt, instance, token,
                              lease_until, created, updated, error (absent when None),
                              attempts (a JSON array, edited with cjson in Lua)
    P:{J}:active       zset   slots of the runs in Claimed or Running, score = slot
    P:{J}:runs         zset   slots of all runs, score = slot (last_slot, history, prune)
    P:{J}:schedule     hash   fingerprint, since
    P:{J}:shared       hash   per cluster of a shared job: ``<since> <seen> <fingerprint>``
                              (the fingerprint last: it may hold spaces)
    P:{J}:expiring     zset   only with retention_ms: slots of final runs, score = when
                              their hash expires (so claims can trim the runs index)
    P:leases           zset   the keys of every job's active runs, score = lease_until
    P:served           zset   every job an instance noted it serves, score = when last noted

Scripts compute the keys of other runs of the same job from the ``P:{J}:run:`` base they are
given. ``P:leases`` is what makes the backups' sweep one query for all jobs (see
:meth:`LeaseStore.expired_runs`); every script that changes a lease changes it in the same
step. Because of it a script touches two hash slots, so the store needs one Redis primary
(one server, or a primary with replicas behind one address), not Redis Cluster
(:meth:`RedisBackend.setup` refuses one).

During a rolling upgrade from a version without ``P:leases``, the old instances' runs are
indexed when an instance of this version starts (it notes every job's schedule) or loses a
claim to one of them, and an entry behind its run's lease (an old instance heartbeats
without moving it) is moved when the sweep meets it.

Times are the caller's ``now_ms`` (see :mod:`anarchon.engine.backend`), never the server's
clock, so every backend runs on the same injectable clock.

What "one winner" rests on: a script is atomic on the one primary that runs it. Redis
replication is asynchronous, so a failover to a replica that had not yet received a claim
forgets it, and another instance can win that run again; the same holds for a restart
without persistence. Use ``appendonly yes`` (``appendfsync everysec`` loses at most about a
second); where running a run twice is costly, a store that commits synchronously
(PostgreSQL) is the safer choice. Jobs should survive that rare case anyway.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

from .. import transitions
from ..backend import Capabilities, ClaimRequest, LeaseBackend, TakeoverRequest
from ..batch import Coalescer
from ..errors import ConfigError, StoreError, StoreLostState
from ..model import REPLACED_BY, Attempt, ClaimOutcome, ClaimResult, Run, RunState, token_hash
from ..shared import SharedSide
from . import _redis_presence as _presence

T = TypeVar("T")

# Shared by every state-changing script: the state test and closing the current attempt
# exactly as transitions._close_attempt does (only if it is still open).
_LUA_COMMON = """
local function is_active(state)
  return state == 'Claimed' or state == 'Running'
end

local function close_attempt(attempts_json, now, outcome, has_err, err)
  local attempts = cjson.decode(attempts_json)
  local n = #attempts
  if n == 0 then
    return '[]'
  end
  local last = attempts[n]
  if last['ended_ms'] == nil or last['ended_ms'] == cjson.null then
    last['ended_ms'] = tonumber(now)
    last['outcome'] = outcome
    if has_err == '1' then
      last['error'] = err
    else
      last['error'] = cjson.null
    end
  end
  return cjson.encode(attempts)
end

local function set_error(key, has_err, err)
  if has_err == '1' then
    redis.call('HSET', key, 'error', err)
  else
    redis.call('HDEL', key, 'error')
  end
end

-- With a retention, a final run's hash expires by itself; its slot is also noted in the
-- job's expiring index (score = when it expires) so claims can drop it from the runs
-- index afterwards: zset members cannot expire.
local function expire_final(key, member, expiring_key, retention, now)
  if retention ~= '' then
    redis.call('PEXPIRE', key, retention)
    redis.call('ZADD', expiring_key, tonumber(now) + tonumber(retention), member)
  end
end
"""

# KEYS: run, active, runs, expiring, epoch, leases.  ARGV: run_base, job, slot, instance, token, now,
# lease_until, overlap, attempts_json, retention, replace_reason, expected_epoch, fresh_epoch.
# Returns {'lost', epoch} (nothing done) | {'taken', hgetall, epoch} | {'skipped', other_slot, epoch}
# | {'won', {hgetall of replaced}..., epoch}.
_CLAIM = (
    _LUA_COMMON
    + """
local run_key, active_key, runs_key, expiring_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base, job, slot, instance, token = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local now, lease_until, overlap, attempts_json = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local retention, reason = ARGV[10], ARGV[11]

-- The job's epoch: written by its first claim, gone only with all its keys. A caller that
-- knew another one talks to a store that lost its state since: nothing is claimed then.
local epoch = redis.call('GET', KEYS[5])
if not epoch then
  epoch = ARGV[13]
  redis.call('SET', KEYS[5], epoch)
end
if ARGV[12] ~= '' and epoch ~= ARGV[12] then
  return {'lost', epoch}
end

if redis.call('EXISTS', run_key) == 1 then
  local held = redis.call('HMGET', run_key, 'state', 'lease_until')
  if is_active(held[1]) then
    redis.call('ZADD', KEYS[6], 'NX', held[2], run_key)  -- claimed by an earlier version: index it
  end
  return {'taken', redis.call('HGETALL', run_key), epoch}
end

-- The job's other active runs, oldest first; Allow does not need them at all.
local others = {}
if overlap ~= 'Allow' then
  for _, m in ipairs(redis.call('ZRANGE', active_key, 0, -1)) do
    if m ~= slot then
      if redis.call('EXISTS', base .. m) == 1 then
        table.insert(others, m)
        if overlap == 'Skip' then
          break
        end
      else
        redis.call('ZREM', active_key, m)  -- defensive: never left behind by these scripts
      end
    end
  end
end

if #others > 0 and overlap == 'Skip' then
  redis.call('HSET', run_key, 'job', job, 'slot', slot, 'state', 'Skipped', 'attempt', '0',
    'instance', instance, 'token', '', 'lease_until', '0', 'created', now, 'updated', now,
    'error', 'skipped: the run of slot ' .. others[1] .. ' is still active', 'attempts', '[]')
  redis.call('ZADD', runs_key, slot, slot)
  expire_final(run_key, slot, expiring_key, retention, now)
  return {'skipped', others[1], epoch}
end

local replaced = {}
if overlap == 'Replace' then
  for _, m in ipairs(others) do
    local key = base .. m
    local attempts = redis.call('HGET', key, 'attempts')
    redis.call('HSET', key, 'attempts', close_attempt(attempts, now, 'Interrupted', '1', reason),
      'state', 'Interrupted', 'error', reason, 'lease_until', '0', 'updated', now)
    redis.call('ZREM', active_key, m)
    redis.call('ZREM', KEYS[6], key)
    expire_final(key, m, expiring_key, retention, now)
    table.insert(replaced, redis.call('HGETALL', key))
  end
end

redis.call('HSET', run_key, 'job', job, 'slot', slot, 'state', 'Claimed', 'attempt', '1',
  'instance', instance, 'token', token, 'lease_until', lease_until, 'created', now,
  'updated', now, 'attempts', attempts_json)
redis.call('ZADD', active_key, slot, slot)
redis.call('ZADD', runs_key, slot, slot)
redis.call('ZADD', KEYS[6], lease_until, run_key)

-- With a retention: drop from the runs index up to four runs whose hash has expired, so
-- the index shrinks as fast as it grows (one claim adds one). The newest entry is kept,
-- so last_slot (the base of catch-up) survives the expiry of the job's last run.
if retention ~= '' then
  local newest = redis.call('ZRANGE', runs_key, -1, -1)[1]
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', expiring_key, '-inf', now, 'LIMIT', 0, 4)) do
    if m ~= newest and redis.call('EXISTS', base .. m) == 0 then
      redis.call('ZREM', runs_key, m)
      redis.call('ZREM', expiring_key, m)
    end
  end
end

return {'won', replaced, epoch}
"""
)

# KEYS: run, leases.  ARGV: token, now, now + lease_ms.  Returns 1, or 0 when fenced off.
_HEARTBEAT = """
local st = redis.call('HMGET', KEYS[1], 'state', 'token', 'lease_until')
if not st[1] or (st[1] ~= 'Claimed' and st[1] ~= 'Running') or st[2] ~= ARGV[1] then
  return 0
end
local lease = st[3]
if tonumber(ARGV[3]) > tonumber(lease) then
  lease = ARGV[3]
end
redis.call('HSET', KEYS[1], 'state', 'Running', 'lease_until', lease, 'updated', ARGV[2])
redis.call('ZADD', KEYS[2], lease, KEYS[1])
return 1
"""

# The start of a script that changes the run KEYS[1] for the holder of token ARGV[1] only:
# it returns 0 unless the run is active with that token; st is {state, token, attempts}.
_LUA_FENCED = (
    _LUA_COMMON
    + """
local st = redis.call('HMGET', KEYS[1], 'state', 'token', 'attempts')
if not st[1] or not is_active(st[1]) or st[2] ~= ARGV[1] then
  return 0
end"""
)

# KEYS: run, active, expiring, leases.  ARGV: token, now, outcome, has_err, err, retention, slot.
_FINISH = (
    _LUA_FENCED
    + """
redis.call('HSET', KEYS[1], 'attempts', close_attempt(st[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5]),
  'state', ARGV[3], 'lease_until', '0', 'updated', ARGV[2])
set_error(KEYS[1], ARGV[4], ARGV[5])
redis.call('ZREM', KEYS[2], ARGV[7])
redis.call('ZREM', KEYS[4], KEYS[1])
expire_final(KEYS[1], ARGV[7], KEYS[3], ARGV[6], ARGV[2])
return 1
"""
)

# KEYS: run, leases.  ARGV: token, now, reason.  The run stays active with an expired lease and no
# token: a late heartbeat of the released attempt is refused.
_RELEASE = (
    _LUA_FENCED
    + """
redis.call('HSET', KEYS[1], 'attempts', close_attempt(st[3], ARGV[2], 'Interrupted', '1', ARGV[3]),
  'lease_until', ARGV[2], 'error', ARGV[3], 'updated', ARGV[2], 'token', '')
redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
return 1
"""
)

# KEYS: run, active, expiring, leases.  ARGV: now, max_attempts, instance, token, lease_until, token_hash,
# retention, slot.  Returns {'taken'} | {'taken', hgetall} | {'won', hgetall}.
_TAKEOVER = (
    _LUA_COMMON
    + """
local key = KEYS[1]
local now = ARGV[1]
local st = redis.call('HMGET', key, 'state', 'lease_until', 'attempt', 'attempts', 'error')
if not st[1] then
  redis.call('ZREM', KEYS[4], key)  -- defensive: never left behind by these scripts
  return {'taken'}
end
if not is_active(st[1]) or tonumber(st[2]) > tonumber(now) then
  return {'taken', redis.call('HGETALL', key)}
end
local attempts = close_attempt(st[4], now, 'Interrupted', '1', 'lease expired')
if tonumber(st[3]) >= tonumber(ARGV[2]) then
  local last_error = st[5]
  if not last_error or last_error == '' then
    last_error = 'lease expired'
  end
  local counted = ''
  local handed = 0
  for _, a in ipairs(cjson.decode(st[4])) do
    if type(a.error) == 'string' and string.sub(a.error, 1, 11) == 'handed over' then
      handed = handed + 1
    end
  end
  if handed > 0 then
    counted = ' (' .. handed .. ' handed over, not counted)'
  end
  redis.call('HSET', key, 'attempts', attempts, 'updated', now, 'state', 'Interrupted',
    'error', 'gave up after attempt ' .. st[3] .. ' of ' .. ARGV[2] .. counted .. ': ' .. last_error,
    'lease_until', '0')
  redis.call('ZREM', KEYS[2], ARGV[8])
  redis.call('ZREM', KEYS[4], key)
  expire_final(key, ARGV[8], KEYS[3], ARGV[7], now)
  return {'taken', redis.call('HGETALL', key)}
end
local list = cjson.decode(attempts)
local nxt = tonumber(st[3]) + 1
table.insert(list, {attempt = nxt, instance = ARGV[3], token_hash = ARGV[6], started_ms = tonumber(now),
  ended_ms = cjson.null, outcome = 'Running', error = cjson.null})
redis.call('HSET', key, 'attempts', cjson.encode(list), 'updated', now, 'attempt', tostring(nxt),
  'state', 'Claimed', 'instance', ARGV[3], 'token', ARGV[4], 'lease_until', ARGV[5])
redis.call('HDEL', key, 'error')
redis.call('ZADD', KEYS[4], ARGV[5], key)
return {'won', redis.call('HGETALL', key)}
"""
)

# KEYS: schedule, active, leases.  ARGV: fingerprint, now, run_base.  Returns since.
# Every instance calls it once per job when it starts: it also indexes the job's active runs
# that an earlier version (without the leases index) claimed, so that backups see them.
_SCHEDULE_SINCE = """
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local lease = redis.call('HGET', ARGV[3] .. m, 'lease_until')
  if lease then
    redis.call('ZADD', KEYS[3], 'NX', lease, ARGV[3] .. m)
  end
end
local st = redis.call('HMGET', KEYS[1], 'fingerprint', 'since')
if st[1] == ARGV[1] then
  return st[2]
end
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'since', ARGV[2])
return ARGV[2]
"""

# KEYS: shared.  ARGV: cluster, fingerprint, now, oldest (notes of others seen before it go).
# Returns the live notes as {cluster, "since seen fingerprint", ...}; see shared.note_side.
_SHARED_NOTE = """
local since = nil
local last = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local s, seen, f = string.match(all[i + 1], '^(%d+) (%d+) (.*)$')
  if all[i] == ARGV[1] then
    if f == ARGV[2] then
      since = s
    end
  elseif tonumber(seen) < tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[1], all[i])
  end
  if tonumber(s) > last then
    last = tonumber(s)
  end
end
since = since or tostring(last + 1)
redis.call('HSET', KEYS[1], ARGV[1], since .. ' ' .. ARGV[3] .. ' ' .. ARGV[2])
return redis.call('HGETALL', KEYS[1])
"""

# KEYS: runs, expiring.  ARGV: run_base, before_slot, batch.  Returns {deleted, index entries removed, examined}.
# Batched so that pruning a long history never blocks the server for long. The newest
# entry stays, whatever its slot: it is last_slot, the base of catch-up.
_PRUNE = """
local before = tonumber(ARGV[2])
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest == 0 then
  return {0, 0, 0}
end
if tonumber(newest[2]) < before then
  before = tonumber(newest[2])
end
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. before, 'LIMIT', 0, tonumber(ARGV[3]))
local deleted = 0
local removed = 0
for _, m in ipairs(members) do
  local key = ARGV[1] .. m
  local state = redis.call('HGET', key, 'state')
  if not state then
    redis.call('ZREM', KEYS[1], m)  -- expired by retention: only the index entries were left
    redis.call('ZREM', KEYS[2], m)
    removed = removed + 1
  elseif state ~= 'Claimed' and state ~= 'Running' then
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], m)
    deleted = deleted + 1
    removed = removed + 1
  end
end
return {deleted, removed, #members}
"""

# KEYS: runs, active, expiring, schedule, epoch, leases.  ARGV: run_base, batch.  Returns how many runs remain indexed.
# Batched like prune (every run, active ones too, is in the runs index); the other index
# keys and the fingerprint go with the last batch.
_FORGET = """
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
for _, m in ipairs(members) do
  redis.call('DEL', ARGV[1] .. m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[6], ARGV[1] .. m)
end
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
end
return left
"""

# KEYS: active.  ARGV: run_base.  One consistent snapshot in one round trip.
_ACTIVE_RUNS = """
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local h = redis.call('HGETALL', ARGV[1] .. m)
  if #h > 0 then
    table.insert(out, h)
  end
end
return out
"""

# KEYS: leases.  ARGV: now, limit.  The most recently expired first. An entry whose run is
# gone or final is dropped on the way, and one behind its run's lease (a run an earlier
# version heartbeats) is moved to it: these scripts leave neither behind.
_EXPIRED_RUNS = """
local out = {}
for _, key in ipairs(redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[1], '-inf', 'LIMIT', 0, tonumber(ARGV[2]))) do
  local h = redis.call('HGETALL', key)
  local run = {}
  for i = 1, #h, 2 do
    run[h[i]] = h[i + 1]
  end
  if run['state'] ~= 'Claimed' and run['state'] ~= 'Running' then
    redis.call('ZREM', KEYS[1], key)
  elseif tonumber(run['lease_until']) > tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[1], run['lease_until'], key)
  else
    table.insert(out, h)
  end
end
return out
"""

# KEYS: runs.  ARGV: run_base, limit.  Newest first, skipping index entries whose hash expired.
_HISTORY = """
local limit = tonumber(ARGV[2])
local out = {}
local start = 0
while #out < limit do
  local members = redis.call('ZREVRANGE', KEYS[1], start, start + limit - 1)
  if #members == 0 then
    break
  end
  for _, m in ipairs(members) do
    local h = redis.call('HGETALL', ARGV[1] .. m)
    if #h > 0 then
      table.insert(out, h)
      if #out >= limit then
        break
      end
    end
  end
  start = start + limit
end
return out
"""

_PRUNE_BATCH = 500


def _text(value: object) -> str:
    """A reply item as text, whether or not the client decodes responses."""
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _pairs(flat: object) -> dict[str, str]:
    """An HGETALL reply (a dict from redis-py, a flat list from a script) as a dict."""
    if isinstance(flat, Mapping):
        return {_text(k): _text(v) for k, v in flat.items()}
    if not isinstance(flat, Sequence):
        raise StoreError(f"redis: unexpected reply {flat!r}")
    items = [_text(v) for v in flat]
    return dict(zip(items[0::2], items[1::2], strict=True))


def _run_from_hash(fields: Mapping[str, str]) -> Run:
    error = fields.get("error")
    return Run(
        job=fields["job"],
        slot=int(fields["slot"]),
        state=RunState(fields["state"]),
        attempt=int(fields["attempt"]),
        instance=fields["instance"],
        token=fields["token"],
        lease_until_ms=int(fields["lease_until"]),
        created_ms=int(fields["created"]),
        updated_ms=int(fields["updated"]),
        error=error,
        attempts=[Attempt.from_json(a) for a in json.loads(fields["attempts"])],
    )


def _first_attempt_json(attempt: Attempt) -> str:
    """``json.dumps([attempt.to_json()])`` of a just-started attempt, in a fifth of the time.

    It is on the path of every claim; the differential test against SQLite checks that it
    parses back to the same Attempt.
    """
    return (
        f'[{{"attempt": {attempt.attempt}, "instance": {json.dumps(attempt.instance)}, '
        f'"token_hash": {json.dumps(attempt.token_hash)}, "started_ms": {attempt.started_ms}, '
        f'"ended_ms": null, "outcome": "{attempt.outcome}", "error": null}}]'
    )


def _tag(job: str) -> str:
    """The job name as a hash tag: exactly the text between the braces, never empty.

    Redis Cluster hashes the text between the first ``{`` and the next ``}``; a job name
    with braces of its own would change that, and ``{}`` (an empty name) would make Redis
    hash the whole key, scattering the job's keys over several slots.
    """
    if not job:
        return "%"  # not the encoding of any non-empty name: '%' is always followed by 2 hex digits
    return job.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def redact_url(url: str) -> str:
    """The URL without password or query (which may carry ``password=``), for messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        if parts.username:
            host = f"{parts.username}@{host}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return "<unparsable redis URL>"


class RedisBackend(LeaseBackend):
    """Lease store on Redis or Valkey: one primary (one server, or behind a proxy; not Cluster).

    ``retention_ms``: when set, every run that becomes final (Succeeded, Failed, Interrupted,
    Skipped, Cancelled) gets a PEXPIRE of that many ms, so a job that runs every second does not grow
    the store forever even if nobody calls :meth:`prune`. It must be far longer than any
    window in which an instance could still claim that slot (catch-up, clock skew): once a
    run's hash has expired, its slot could be claimed, and run, again. Active runs never
    expire. Index entries (zset members cannot expire) are trimmed by later claims of the
    job, a few per claim, and by :meth:`prune`; the newest entry is kept so that
    :meth:`last_slot` (the base of catch-up) survives the expiry of the job's last run.
    Expiry is the server's clock, trimming the callers': they should agree within seconds.

    ``client``: pass an existing ``redis.asyncio.Redis`` to share its pool; it is then not
    closed by :meth:`close`. Otherwise one is made from ``url`` with short socket timeouts
    and no automatic command retry: a store that does not answer within a few seconds should
    surface as :class:`StoreError` to the scheduler, which decides what to retry, rather than
    block a claim past its slot. Retrying a script whose reply was lost could also turn a won
    claim into ``taken`` (the run then exists, with our own token), so it is not done blindly.
    The writes of attempts that hold a lease (heartbeat, finish, release) have a pool of their
    own, ``lease_connections``: under a burst of claims they never wait for a connection
    behind the claims, or a busy instance would lose the leases of the runs it already runs.
    Heartbeats made while others are out go together in one pipeline: with a round trip each,
    thousands of runs per instance need more than a pool carries on a busy event loop
    (heartbeats failed, "No connection available", backups took over; bench/README.md).
    """

    capabilities = Capabilities(name="redis", leases=True)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "anarchon",
        client: aioredis.Redis | None = None,
        retention_ms: int | None = None,
        socket_timeout_s: float = 5.0,
        max_connections: int = 100,
        lease_connections: int = 10,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ConfigError(f"redis prefix {prefix!r}: braces are reserved for the job's hash tag")
        if retention_ms is not None and retention_ms <= 0:
            raise ConfigError(f"redis retention_ms must be positive, got {retention_ms}")
        self.url = url
        self.prefix = prefix
        self.retention_ms = retention_ms
        self._safe_url = redact_url(url)
        self._owns_client = client is None
        lease_client = client
        if client is None:
            # A blocking pool: under load a call waits (up to the socket timeout) for one of
            # the connections instead of failing at once with "Too many connections", which
            # turned overload into failed heartbeats, takeovers and duplicate runs.
            def pool(size: int) -> aioredis.Redis:
                return aioredis.Redis.from_pool(
                    aioredis.BlockingConnectionPool.from_url(
                        url,
                        max_connections=size,
                        timeout=socket_timeout_s,
                        decode_responses=True,
                        socket_timeout=socket_timeout_s,
                        socket_connect_timeout=socket_timeout_s,
                        retry=Retry(NoBackoff(), 0),
                    )
                )

            client, lease_client = pool(max_connections), pool(lease_connections)
        self._client: aioredis.Redis = client
        #: The lease writes' own connections (the same client when one was passed in).
        self._lease_client: aioredis.Redis = lease_client or client
        self._claim = client.register_script(_CLAIM)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._finish = client.register_script(_FINISH)
        self._release = client.register_script(_RELEASE)
        self._takeover = client.register_script(_TAKEOVER)
        self._schedule_since = client.register_script(_SCHEDULE_SINCE)
        self._prune = client.register_script(_PRUNE)
        self._forget = client.register_script(_FORGET)
        self._active_runs = client.register_script(_ACTIVE_RUNS)
        self._expired_runs = client.register_script(_EXPIRED_RUNS)
        self._history = client.register_script(_HISTORY)
        self._shared_note = client.register_script(_SHARED_NOTE)
        #: Heartbeats of many runs at once go out together (one round trip, one connection).
        self._beats = Coalescer(self._heartbeat_many)
        self._scripts: list[AsyncScript] = [
            self._claim,
            self._heartbeat,
            self._finish,
            self._release,
            self._takeover,
            self._schedule_since,
            self._prune,
            self._forget,
            self._active_runs,
            self._expired_runs,
            self._history,
            self._shared_note,
        ]
        self._retention = "" if retention_ms is None else str(retention_ms)
        #: The epoch of each job this instance has claimed for (see :meth:`epoch_key`).
        self._epochs: dict[str, str] = {}
        #: When each job's records began again, for jobs whose epoch changed under us.
        self._lost_since: dict[str, int] = {}

    # -- keys ---------------------------------------------------------------------------

    def job_prefix(self, job: str) -> str:
        """``P:{J}:``, the start of every key of ``job``; ``{J}`` is its hash tag."""
        return f"{self.prefix}:{{{_tag(job)}}}:"

    def run_key(self, job: str, slot: int) -> str:
        return f"{self.job_prefix(job)}run:{slot}"

    def active_key(self, job: str) -> str:
        return f"{self.job_prefix(job)}active"

    def runs_key(self, job: str) -> str:
        return f"{self.job_prefix(job)}runs"

    def expiring_key(self, job: str) -> str:
        return f"{self.job_prefix(job)}expiring"

    def schedule_key(self, job: str) -> str:
        return f"{self.job_prefix(job)}schedule"

    def shared_key(self, job: str) -> str:
        return f"{self.job_prefix(job)}shared"

    def served_key(self) -> str:
        """``P:served``: when each job was last noted served (see :meth:`forget_unserved`)."""
        return f"{self.prefix}:served"

    def presence_key(self) -> str:
        """``P:presence``: the instances using this store, by when their record runs out."""
        return f"{self.prefix}:presence"

    def leases_key(self) -> str:
        """``P:leases``: every job's active runs by when their lease ends (the backups' sweep)."""
        return f"{self.prefix}:leases"

    def lost_since(self, job: str) -> int | None:
        return self._lost_since.get(job)

    def epoch_key(self, job: str) -> str:
        """``<id> <ms>``: written by the job's first claim; a different one means the store lost state."""
        return f"{self.job_prefix(job)}epoch"

    # -- plumbing -----------------------------------------------------------------------

    @property
    def client(self) -> aioredis.Redis:
        return self._client

    async def _call(self, what: Callable[[], Awaitable[T]]) -> T:
        try:
            return await what()
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis {self._safe_url}: {type(exc).__name__}: {exc}") from exc

    async def setup(self) -> None:
        """Check the server answers and load the scripts, so the first claim is one EVALSHA."""

        async def work() -> None:
            await self._client.ping()
            try:
                cluster = (await self._client.info("cluster")).get("cluster_enabled")
            except ResponseError:
                cluster = None  # a proxy that does not pass INFO on: it fronts one primary
            if str(cluster) == "1":
                raise ConfigError(
                    f"redis {self._safe_url} is a Redis Cluster node: the redis:// lease store needs one primary"
                    " (one server or one primary address), because its index of every job's leases (one query"
                    " a heartbeat for all backups) is updated in the same script as each run; the claim-only"
                    " redis+ strategies work on a Cluster"
                )
            for script in self._scripts:
                script.sha = await self._client.script_load(script.script)

        await self._call(work)

    async def ping(self) -> None:
        await self._call(self._client.ping)

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()
            await self._lease_client.aclose()

    # -- operations ---------------------------------------------------------------------

    def _claim_call(self, request: ClaimRequest) -> tuple[list[str], list[str]]:
        """The claim script's keys and arguments for ``request``."""
        job, slot = request.job, request.slot
        keys = [
            self.run_key(job, slot),
            self.active_key(job),
            self.runs_key(job),
            self.expiring_key(job),
            self.epoch_key(job),
            self.leases_key(),
        ]
        args = [
            f"{self.job_prefix(job)}run:",
            job,
            str(slot),
            request.instance,
            request.token,
            str(request.now_ms),
            str(request.now_ms + request.lease_ms),
            str(request.overlap),
            _first_attempt_json(request.started(1)),
            self._retention,
            f"{REPLACED_BY} {slot}",
            self._epochs.get(job, ""),
            f"{secrets.token_hex(8)} {request.now_ms}",
        ]
        return keys, args

    def _claim_result(self, request: ClaimRequest, reply: Sequence[object]) -> ClaimResult:
        """The claim script's reply as a result; StoreLostState if the store lost the job's records."""
        job = request.job
        outcome = _text(reply[0])
        epoch = _text(reply[-1])
        known, self._epochs[job] = self._epochs.get(job), epoch
        if outcome == "lost":
            self._lost_since[job] = since = int(epoch.split()[1])
            raise StoreLostState(
                f"redis {self._safe_url}: the store lost the records of {job} (epoch {known} is now {epoch})",
                since_ms=since,
            )
        if outcome == "taken":
            return ClaimResult(ClaimOutcome.TAKEN, _run_from_hash(_pairs(reply[1])))
        if outcome == "skipped":
            return ClaimResult(ClaimOutcome.SKIPPED, request.skipped(int(_text(reply[1]))))
        replaced = [_run_from_hash(_pairs(flat)) for flat in reply[1]]  # type: ignore[attr-defined]
        return ClaimResult(ClaimOutcome.WON, request.claimed(lease=True), replaced)

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        keys, args = self._claim_call(request)
        reply = await self._call(lambda: self._claim(keys=keys, args=args))
        return self._claim_result(request, reply)

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        """Every claim script in one pipeline: one round trip, each script atomic on its own.

        A pipeline is not a transaction: the server runs the scripts one after the other, in
        order, and another instance's script may run in between, as between separate calls.
        """
        if len(requests) <= 1:
            return await super().claim_many(requests)
        replies = await self._pipeline(self._claim, self._client, [self._claim_call(r) for r in requests])
        answers: list[ClaimResult | BaseException] = []
        for request, reply in zip(requests, replies, strict=True):
            if isinstance(reply, StoreError):
                answers.append(reply)
                continue
            try:
                answers.append(self._claim_result(request, reply))  # type: ignore[arg-type]
            except StoreError as exc:
                answers.append(exc)
        return answers

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        return await self._beats((self.run_key(job, slot), token, now_ms, now_ms + lease_ms))

    async def _heartbeat_many(self, beats: list[tuple[str, str, int, int]]) -> list[bool | BaseException]:
        """The heartbeats out together (:class:`~anarchon.engine.batch.Coalescer`): one script
        call, or one pipeline of them on one lease connection, each script atomic on its own."""
        if len(beats) == 1:
            run_key, token, now_ms, until_ms = beats[0]
            args = [token, str(now_ms), str(until_ms)]
            reply = await self._call(
                lambda: self._heartbeat(keys=[run_key, self.leases_key()], args=args, client=self._lease_client)
            )
            return [int(reply) == 1]
        calls = [([run_key, self.leases_key()], [token, str(now), str(until)]) for run_key, token, now, until in beats]
        replies = await self._pipeline(self._heartbeat, self._lease_client, calls)
        return [reply if isinstance(reply, StoreError) else int(reply) == 1 for reply in replies]  # type: ignore[call-overload]

    async def _pipeline(
        self, script: AsyncScript, client: aioredis.Redis, calls: Sequence[tuple[list[str], list[str]]]
    ) -> list[object]:
        """Every call (keys, arguments) of ``script`` in one pipeline on ``client``: one round
        trip; each reply, or the StoreError of a call the server refused.

        EVALSHA itself, not the script object, which would add a SCRIPT EXISTS round trip. If
        the server forgot the script (a restart, a failover), those calls were not run: it is
        loaded again for their retry.
        """

        async def send() -> list[object]:
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(str(script.sha), len(keys), *keys, *args)
            replies = list(await pipe.execute(raise_on_error=False))
            if any(isinstance(reply, NoScriptError) for reply in replies):
                script.sha = await client.script_load(script.script)
            return replies

        replies = await self._call(send)
        return [
            StoreError(f"redis {self._safe_url}: {type(reply).__name__}: {reply}")
            if isinstance(reply, BaseException)
            else reply
            for reply in replies
        ]

    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        if outcome.active:
            # The same refusal as transitions.finish, before touching the store.
            transitions.finish(None, token, now_ms, outcome, error)
        reply = await self._call(
            lambda: self._finish(
                keys=[self.run_key(job, slot), self.active_key(job), self.expiring_key(job), self.leases_key()],
                args=[
                    token,
                    str(now_ms),
                    str(outcome),
                    "0" if error is None else "1",
                    error or "",
                    self._retention,
                    str(slot),
                ],
                client=self._lease_client,
            )
        )
        return int(reply) == 1

    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        reply = await self._call(
            lambda: self._release(
                keys=[self.run_key(job, slot), self.leases_key()],
                args=[token, str(now_ms), reason],
                client=self._lease_client,
            )
        )
        return int(reply) == 1

    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        job, slot = request.job, request.slot
        reply = await self._call(
            lambda: self._takeover(
                keys=[self.run_key(job, slot), self.active_key(job), self.expiring_key(job), self.leases_key()],
                args=[
                    str(request.now_ms),
                    str(request.max_attempts),
                    request.instance,
                    request.token,
                    str(request.now_ms + request.lease_ms),
                    token_hash(request.token),
                    self._retention,
                    str(slot),
                ],
            )
        )
        outcome = ClaimOutcome.WON if _text(reply[0]) == "won" else ClaimOutcome.TAKEN
        run = _run_from_hash(_pairs(reply[1])) if len(reply) > 1 else None
        return ClaimResult(outcome, run)

    async def get_run(self, job: str, slot: int) -> Run | None:
        fields = await self._call(lambda: self._client.hgetall(self.run_key(job, slot)))
        return _run_from_hash(_pairs(fields)) if fields else None

    async def active_runs(self, job: str) -> list[Run]:
        reply = await self._call(
            lambda: self._active_runs(keys=[self.active_key(job)], args=[f"{self.job_prefix(job)}run:"])
        )
        return [_run_from_hash(_pairs(flat)) for flat in reply]

    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        reply = await self._call(lambda: self._expired_runs(keys=[self.leases_key()], args=[str(now_ms), str(limit)]))
        return [_run_from_hash(_pairs(flat)) for flat in reply]

    async def last_slot(self, job: str) -> int | None:
        newest = await self._call(lambda: self._client.zrange(self.runs_key(job), 0, 0, desc=True))
        return int(_text(newest[0])) if newest else None

    async def history(self, job: str, limit: int = 50) -> list[Run]:
        if limit <= 0:
            return []
        reply = await self._call(
            lambda: self._history(keys=[self.runs_key(job)], args=[f"{self.job_prefix(job)}run:", str(limit)])
        )
        runs = [_run_from_hash(_pairs(flat)) for flat in reply]
        for run in runs:
            run.token = ""
        return runs

    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        reply = await self._call(
            lambda: self._schedule_since(
                keys=[self.schedule_key(job), self.active_key(job), self.leases_key()],
                args=[fingerprint, str(now_ms), f"{self.job_prefix(job)}run:"],
            )
        )
        return int(_text(reply))

    async def prune(self, job: str, before_slot: int) -> int:
        total = 0
        while True:
            reply = await self._call(
                lambda: self._prune(
                    keys=[self.runs_key(job), self.expiring_key(job)],
                    args=[f"{self.job_prefix(job)}run:", str(before_slot), str(_PRUNE_BATCH)],
                )
            )
            deleted, removed, examined = int(reply[0]), int(reply[1]), int(reply[2])
            total += deleted
            # A short batch was the last one. Active runs stay in the index and are seen
            # again by the next batch, so a batch that removed nothing would loop forever.
            if examined < _PRUNE_BATCH or removed == 0:
                return total

    async def forget_job(self, job: str) -> None:
        keys = [
            self.runs_key(job),
            self.active_key(job),
            self.expiring_key(job),
            self.schedule_key(job),
            self.epoch_key(job),
            self.leases_key(),
        ]
        self._epochs.pop(job, None)
        self._lost_since.pop(job, None)
        while True:
            left = await self._call(
                lambda: self._forget(keys=keys, args=[f"{self.job_prefix(job)}run:", str(_PRUNE_BATCH)])
            )
            if int(left) == 0:
                break
        await self._call(lambda: self._client.delete(self.shared_key(job)))
        await self._call(lambda: self._client.zrem(self.served_key(), job))

    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        if jobs:
            await self._call(lambda: self._client.zadd(self.served_key(), dict.fromkeys(jobs, now_ms), gt=True))

    async def forget_unserved(self, before_ms: int) -> list[str]:
        stale = await self._call(lambda: self._client.zrangebyscore(self.served_key(), "-inf", f"({before_ms}"))
        gone = [_text(job) for job in stale]
        for job in gone:
            await self.forget_job(job)
        return gone

    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        reply = await self._call(
            lambda: self._shared_note(
                keys=[self.shared_key(job)], args=[cluster, fingerprint, str(now_ms), str(now_ms - ttl_ms)]
            )
        )
        sides = []
        for name, value in _pairs(reply).items():
            since, seen, fp = value.split(" ", 2)
            sides.append(SharedSide(name, fp, int(since), int(seen)))
        return sides

    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        await self._call(lambda: self._client.hdel(self.shared_key(job), cluster))

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        await self._call(lambda: _presence.note(self._client, self.presence_key(), instance, now_ms, ttl_ms))

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        return await self._call(lambda: _presence.present(self._client, self.presence_key(), instances, now_ms))
