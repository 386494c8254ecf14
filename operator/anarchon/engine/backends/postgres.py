"""PostgreSQL: a lease store in one table keyed by ``(job, slot)``, with psycopg 3 (async).

Layout. One row per run in ``anarchon_runs`` (primary key ``(job, slot)``, the attempts as
``jsonb``), a partial index over the active runs (Claimed, Running) so that the overlap
check and :meth:`active_runs` read a handful of index entries however long the history, a
second one over the active runs' lease ends so that the backups' :meth:`expired_runs` of all
jobs reads only the few leases that ran out, and
``anarchon_schedules`` for :meth:`schedule_since`, and four PL/pgSQL/SQL functions whose
names carry a version (``anarchon_runs_claim_v1``...). :meth:`setup` looks them up, and only
if something is missing creates it with ``IF NOT EXISTS`` / ``OR REPLACE``, serialized by a
transaction-scoped advisory lock, because two instances starting at once can otherwise
race on the system catalogs (a unique violation on ``pg_type`` is the classic symptom).

Semantics. Every operation does exactly what :mod:`anarchon.engine.transitions` does; the
conformance suite holds this backend to the same tests as the SQLite reference. The logic
lives in the server rather than in Python for speed: a claim is ONE round trip to a
PL/pgSQL function (the claims due together, one call of a function that makes each claim in
turn), the heartbeats out together one ``UPDATE`` (:class:`~anarchon.engine.batch.Coalescer`),
finish and release one ``UPDATE`` each, and a takeover is one call to a function. Claims
must also be atomic *across slots* of a job (overlap Skip: two different slots of the same
job claimed at once must not both run), which a primary key alone cannot give; the claim
function takes a per-job ``pg_advisory_xact_lock``, so claims of one job are serialized
while claims of different jobs never wait for each other. Heartbeat, finish, release and
takeover are ``UPDATE``s whose ``WHERE`` carries the whole precondition of each row (token,
active state, expired lease): PostgreSQL re-checks it on the newest row version after
waiting for a concurrent writer, which makes fencing and exactly-one-takeover hold without
any lock of ours.

Requirements: PostgreSQL 11 or newer (``hashtextextended``), psycopg 3.1 or newer.

Connections. ``psycopg_pool`` is not a dependency, so the backend keeps a tiny pool of its
own: up to ``pool_size`` autocommit connections, opened lazily, each used by one call at a
time, and :data:`LEASE_CONNECTIONS` more for the writes of attempts that hold a lease
(heartbeat, finish, release): under a burst of claims those never queue behind the claims,
or a busy instance would lose the leases of the runs it already runs. Every psycopg error
becomes a :class:`~anarchon.engine.errors.StoreError` (with any password scrubbed from the
message); a connection that broke is thrown away together
with the idle ones (a restarted server has broken all of them), so the call after an
outage reconnects. A call that fails is never retried here: whether a claim that died in
flight was committed is unknowable, and the engine already treats StoreError as
"try again later".
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from ..backend import Capabilities, ClaimRequest, LeaseBackend, TakeoverRequest
from ..batch import Beat, Coalescer
from ..errors import ConfigError, StoreError
from ..model import Attempt, ClaimOutcome, ClaimResult, Overlap, Run, RunState, token_hash
from ..shared import SharedSide, note_side

T = TypeVar("T")

#: After a call's timeout, how long psycopg may try to cancel the statement on the server
#: before the connection is given up: a server that is alive answers a cancel at once.
CANCEL_GRACE_S = 1.0
#: Connections of the lease writes (heartbeat, finish, release), beside ``pool_size``: each is
#: one short single-row UPDATE, so two keep up with hundreds of running attempts.
LEASE_CONNECTIONS = 2
Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# Identifiers are derived from the table name by suffixes (``_takeover_v1``, ``_schedules``...),
# and PostgreSQL truncates identifiers at 63 bytes, so the name leaves room for the longest.
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")
#: Raised whenever a function body changes (v2: a give-up says how many attempts were hand-overs).
_FUNCTIONS_VERSION = "v2"

_COLUMNS = "job, slot, state, attempt, instance, token, lease_until, created, updated, error, attempts"

# Text that _SCHEMA repeats, composed into it like the names (it may use them too).
_SCHEMA_PIECES = {
    # The parameters of the claim and takeover functions but the last, which differs.
    "lease_params": """
    p_job text, p_slot bigint, p_instance text, p_token text, p_token_hash text,
    p_now bigint, p_lease bigint""",
    # Their result: rows of a role (won, taken, skipped, replaced), then a run's columns.
    "returns_role_and_run": """RETURNS TABLE (
    o_role text, o_job text, o_slot bigint, o_state text, o_attempt integer, o_instance text, o_token text,
    o_lease_until bigint, o_created bigint, o_updated bigint, o_error text, o_attempts jsonb)
LANGUAGE plpgsql""",
    # The run of the slot as it stands, for a caller that did not win it.
    "taken": "SELECT 'taken'::text, r.* FROM {runs} AS r WHERE r.job = p_job AND r.slot = p_slot",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS {runs} (
    job text NOT NULL,
    slot bigint NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    instance text NOT NULL,
    token text NOT NULL,
    lease_until bigint NOT NULL,
    created bigint NOT NULL,
    updated bigint NOT NULL,
    error text,
    attempts jsonb NOT NULL,
    PRIMARY KEY (job, slot)
);
CREATE INDEX IF NOT EXISTS {active_index} ON {runs} (job, slot) WHERE state IN ('Claimed', 'Running');
CREATE INDEX IF NOT EXISTS {lease_index} ON {runs} (lease_until) WHERE state IN ('Claimed', 'Running');
CREATE TABLE IF NOT EXISTS {schedules} (
    job text PRIMARY KEY,
    fingerprint text NOT NULL,
    since bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS {served} (
    job text PRIMARY KEY,
    at bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS {served_index} ON {served} (at);
CREATE TABLE IF NOT EXISTS {shared} (
    job text NOT NULL,
    cluster text NOT NULL,
    fingerprint text NOT NULL,
    since bigint NOT NULL,
    seen bigint NOT NULL,
    PRIMARY KEY (job, cluster)
);
CREATE TABLE IF NOT EXISTS {presence} (
    instance text PRIMARY KEY,
    until bigint NOT NULL
);

-- transitions._close_attempt: end the last attempt if it is still open.
CREATE OR REPLACE FUNCTION {close_fn}(p_attempts jsonb, p_now bigint, p_outcome text, p_error text)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN jsonb_array_length(p_attempts) > 0 AND (p_attempts -> -1 ->> 'ended_ms') IS NULL
        THEN jsonb_set(p_attempts, ARRAY['-1'], (p_attempts -> -1)
                       || jsonb_build_object('ended_ms', p_now, 'outcome', p_outcome, 'error', p_error))
        ELSE p_attempts
    END
$fn$;

-- transitions.claim, in one round trip. Rows: the decided run with role won, taken or
-- skipped, plus one row with role replaced per run interrupted by Overlap Replace.
CREATE OR REPLACE FUNCTION {claim_fn}({lease_params}, p_overlap text)
{returns_role_and_run} AS $fn$
DECLARE
    v_other bigint;
    v_reason text;
BEGIN
    -- Fast path without the lock: every instance but the winner finds the run taken.
    RETURN QUERY {taken};
    IF FOUND THEN
        RETURN;
    END IF;
    -- Serialize the claims of this job: the overlap decision reads other slots' rows.
    -- Under this lock only we insert runs of the job, so what we read stays true until
    -- we commit; the existence check is folded into ON CONFLICT where nothing else
    -- depends on it (one index probe less on the winner's path).
    PERFORM pg_advisory_xact_lock(hashtextextended({lock_prefix} || p_job, 0));
    IF p_overlap = 'Replace' THEN
        -- Must know the slot is free before interrupting anything.
        RETURN QUERY {taken};
        IF FOUND THEN
            RETURN;
        END IF;
        v_reason := 'replaced by the run of slot ' || p_slot;
        RETURN QUERY
        WITH upd AS (
            UPDATE {runs} AS r
            SET attempts = {close_fn}(r.attempts, p_now, 'Interrupted', v_reason),
                state = 'Interrupted', error = v_reason, lease_until = 0, updated = p_now
            WHERE r.job = p_job AND r.slot <> p_slot AND r.state IN ('Claimed', 'Running')
            RETURNING r.*)
        SELECT 'replaced'::text, upd.* FROM upd;
    ELSIF p_overlap = 'Skip' THEN
        SELECT min(r.slot) INTO v_other FROM {runs} AS r
        WHERE r.job = p_job AND r.slot <> p_slot AND r.state IN ('Claimed', 'Running');
        IF v_other IS NOT NULL THEN
            RETURN QUERY
            WITH ins AS (
                INSERT INTO {runs} AS r VALUES (
                    p_job, p_slot, 'Skipped', 0, p_instance, '', 0, p_now, p_now,
                    'skipped: the run of slot ' || v_other || ' is still active', '[]'::jsonb)
                ON CONFLICT DO NOTHING
                RETURNING r.*)
            SELECT 'skipped'::text, ins.* FROM ins;
            IF NOT FOUND THEN
                RETURN QUERY {taken};
            END IF;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH ins AS (
        INSERT INTO {runs} AS r VALUES (
            p_job, p_slot, 'Claimed', 1, p_instance, p_token, p_now + p_lease, p_now, p_now, NULL,
            jsonb_build_array(jsonb_build_object(
                'attempt', 1, 'instance', p_instance, 'token_hash', p_token_hash, 'started_ms', p_now,
                'ended_ms', NULL, 'outcome', 'Running', 'error', NULL)))
        ON CONFLICT DO NOTHING
        RETURNING r.*)
    SELECT 'won'::text, ins.* FROM ins;
    IF NOT FOUND THEN
        RETURN QUERY {taken};
    END IF;
END
$fn$;

-- Claims due together, in one round trip: the claim function for each, in order. The
-- statement is one transaction, so the job locks of the whole batch are held until it ends;
-- callers sort a batch by job, so that two instances' batches take them in the same order.
CREATE OR REPLACE FUNCTION {claim_many_fn}(
    p_jobs text[], p_slots bigint[], p_instances text[], p_tokens text[], p_token_hashes text[],
    p_nows bigint[], p_leases bigint[], p_overlaps text[])
RETURNS TABLE (
    o_i integer, o_role text, o_job text, o_slot bigint, o_state text, o_attempt integer, o_instance text,
    o_token text, o_lease_until bigint, o_created bigint, o_updated bigint, o_error text, o_attempts jsonb)
LANGUAGE plpgsql AS $fn$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_jobs, 1), 0) LOOP
        RETURN QUERY SELECT i, c.* FROM {claim_fn}(p_jobs[i], p_slots[i], p_instances[i], p_tokens[i],
            p_token_hashes[i], p_nows[i], p_leases[i], p_overlaps[i]) AS c;
    END LOOP;
END
$fn$;

-- transitions.takeover: one UPDATE whose WHERE is the precondition (active, lease
-- expired), so that of several backups exactly one matches; then the current row if not.
CREATE OR REPLACE FUNCTION {takeover_fn}({lease_params}, p_max integer)
{returns_role_and_run} AS $fn$
BEGIN
    RETURN QUERY
    WITH upd AS (
        UPDATE {runs} AS r
        SET attempts = CASE WHEN r.attempt >= p_max
                THEN {close_fn}(r.attempts, p_now, 'Interrupted', 'lease expired')
                ELSE {close_fn}(r.attempts, p_now, 'Interrupted', 'lease expired')
                     || jsonb_build_array(jsonb_build_object(
                        'attempt', r.attempt + 1, 'instance', p_instance, 'token_hash', p_token_hash,
                        'started_ms', p_now, 'ended_ms', NULL, 'outcome', 'Running', 'error', NULL))
                END,
            state = CASE WHEN r.attempt >= p_max THEN 'Interrupted' ELSE 'Claimed' END,
            error = CASE WHEN r.attempt >= p_max
                THEN 'gave up after attempt ' || r.attempt || ' of ' || p_max
                     || COALESCE(' (' || NULLIF((SELECT count(*) FROM jsonb_array_elements(r.attempts) AS a
                        WHERE a->>'error' LIKE 'handed over%'), 0) || ' handed over, not counted)', '')
                     || ': ' || COALESCE(NULLIF(r.error, ''), 'lease expired') END,
            lease_until = CASE WHEN r.attempt >= p_max THEN 0 ELSE p_now + p_lease END,
            attempt = CASE WHEN r.attempt >= p_max THEN r.attempt ELSE r.attempt + 1 END,
            instance = CASE WHEN r.attempt >= p_max THEN r.instance ELSE p_instance END,
            token = CASE WHEN r.attempt >= p_max THEN r.token ELSE p_token END,
            updated = p_now
        WHERE r.job = p_job AND r.slot = p_slot AND r.state IN ('Claimed', 'Running') AND r.lease_until <= p_now
        RETURNING r.*)
    SELECT CASE WHEN upd.state = 'Interrupted' THEN 'taken' ELSE 'won' END, upd.* FROM upd;
    IF NOT FOUND THEN
        RETURN QUERY {taken};
    END IF;
END
$fn$;
"""

_FENCE = "job = %s AND slot = %s AND token = %s AND state IN ('Claimed', 'Running')"


async def _end(task: asyncio.Future[Any]) -> None:
    """Interrupt a psycopg call, and once more after :data:`CANCEL_GRACE_S`; return once it ended.

    Its outcome is read here: the caller says what happened (a timeout, a cancellation).
    """
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    if not done:
        task.cancel()
        await asyncio.wait({task})


def _claim_result(rows: Sequence[Sequence[Any]]) -> ClaimResult:
    """A claim's answer from the claim function's rows (role, then the run's columns)."""
    decided = [r for r in rows if r[0] != "replaced"]
    replaced = sorted((_row_to_run(r[1:]) for r in rows if r[0] == "replaced"), key=lambda run: run.slot)
    if not decided:
        return ClaimResult(ClaimOutcome.TAKEN, None)
    role, *row = decided[0]
    return ClaimResult(ClaimOutcome(role), _row_to_run(row), replaced)


def _row_to_run(row: Sequence[Any]) -> Run:
    job, slot, state, attempt, instance, token, lease_until, created, updated, error, attempts = row
    return Run(
        job=job,
        slot=int(slot),
        state=RunState(state),
        attempt=int(attempt),
        instance=instance,
        token=token,
        lease_until_ms=int(lease_until),
        created_ms=int(created),
        updated_ms=int(updated),
        error=error,
        attempts=[Attempt.from_json(a) for a in attempts],
    )


class PostgresBackend(LeaseBackend):
    """Lease store in a PostgreSQL database shared by every instance.

    ``url`` is a libpq URL or conninfo string (``postgresql://user:pw@host:5432/db``).
    ``table`` names the runs table; the schedules table and the functions are named after
    it, so that several deployments can share one database. The connecting role needs
    CREATE on the schema (the first of ``search_path``) for :meth:`setup`.

    ``pool_size`` bounds the connections, hence the calls in flight: a scheduler makes few
    calls at once (a claim per due slot, a heartbeat per running attempt), so a handful
    is plenty and keeps the server's connection count low with many instances.
    ``command_timeout_s`` bounds one call; when it hits, psycopg cancels the statement on
    the server, so a claim that timed out cannot commit later behind its caller's back.
    """

    capabilities = Capabilities(name="postgres", leases=True)

    def __init__(
        self,
        url: str,
        *,
        table: str = "anarchon_runs",
        pool_size: int = 4,
        connect_timeout_s: float = 10.0,
        command_timeout_s: float | None = 30.0,
        application_name: str = "anarchon",
        prepare_threshold: int | None = 5,
    ) -> None:
        if not _TABLE_RE.fullmatch(table):
            raise ConfigError(f"postgres table name {table!r}: use letters, digits and _ (at most 48)")
        if pool_size < 1:
            raise ConfigError(f"postgres pool_size must be at least 1, not {pool_size}")
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error:
            raise ConfigError("postgres URL cannot be parsed") from None  # the URL may hold a password
        self._url = url
        self._password = str(params.get("password") or "")
        self._where = f"postgres {params.get('user') or ''}@{params.get('host') or ''}:{params.get('port') or 5432}"
        self._where += f"/{params.get('dbname') or ''}"
        # prepare_threshold=None turns server-side prepared statements off, for poolers
        # that cannot carry them between transactions (PgBouncer before 1.21).
        self._connect_kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": prepare_threshold}
        if "connect_timeout" not in params:
            self._connect_kwargs["connect_timeout"] = max(1, round(connect_timeout_s))
        if "application_name" not in params:
            self._connect_kwargs["application_name"] = application_name
        self._command_timeout_s = command_timeout_s
        self.table = table
        schedules = table.removesuffix("_runs") + "_schedules" if table.endswith("_runs") else f"{table}_schedules"
        self.schedules_table = schedules
        served = table.removesuffix("_runs") + "_served" if table.endswith("_runs") else f"{table}_served"
        presence = table.removesuffix("_runs") + "_presence" if table.endswith("_runs") else f"{table}_presence"
        shared = table.removesuffix("_runs") + "_shared" if table.endswith("_runs") else f"{table}_shared"

        ident = sql.Identifier
        names = {
            "runs": ident(table),
            "schedules": ident(schedules),
            "served": ident(served),
            "served_index": ident(f"{served}_at"),
            "presence": ident(presence),
            "shared": ident(shared),
            "active_index": ident(f"{table}_active"),
            "lease_index": ident(f"{table}_lease"),
            # Versioned, so that during a rolling upgrade old and new instances can call
            # each their own functions on the same table (CREATE OR REPLACE cannot change
            # a signature, and must not change the semantics under the old instances).
            "close_fn": ident(f"{table}_close_{_FUNCTIONS_VERSION}"),
            "claim_fn": ident(f"{table}_claim_{_FUNCTIONS_VERSION}"),
            "claim_many_fn": ident(f"{table}_claim_many_{_FUNCTIONS_VERSION}"),
            "takeover_fn": ident(f"{table}_takeover_{_FUNCTIONS_VERSION}"),
            "lock_prefix": sql.Literal(f"{table}:"),
        }

        # Queries are composed once (the table is the only identifier) and kept as bytes,
        # which psycopg caches and prepares server-side after a few executions.
        def q(text: str) -> bytes:
            return sql.SQL(text).format(**names).as_bytes(None)

        pieces = {key: sql.SQL(text).format(**names) for key, text in _SCHEMA_PIECES.items()}
        self._q_schema = sql.SQL(_SCHEMA).format(**names, **pieces).as_bytes(None)
        # What setup() creates, as text for to_regclass/to_regproc (resolved on search_path
        # like every query here).
        relations = ("runs", "schedules", "active_index", "lease_index", "served", "served_index", "presence", "shared")
        functions = ("close_fn", "claim_fn", "claim_many_fn", "takeover_fn")
        self._schema_objects = tuple(names[key].as_string(None) for key in (*relations, *functions))
        self._q_schema_exists = (
            "SELECT "
            + " AND ".join(
                ["to_regclass(%s) IS NOT NULL"] * len(relations) + ["to_regproc(%s) IS NOT NULL"] * len(functions)
            )
        ).encode()
        self._setup_lock_key = f"anarchon-setup:{table}"
        self._q_claim = q(
            "SELECT * FROM {claim_fn}(%s::text, %s::bigint, %s::text, %s::text, %s::text,"
            " %s::bigint, %s::bigint, %s::text)"
        )
        self._q_claim_many = q(
            "SELECT * FROM {claim_many_fn}(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[],"
            " %s::bigint[], %s::bigint[], %s::text[])"
        )
        self._q_takeover = q(
            "SELECT * FROM {takeover_fn}(%s::text, %s::bigint, %s::text, %s::text, %s::text,"
            " %s::bigint, %s::bigint, %s::integer)"
        )
        # The heartbeats out together, in one statement: each row of the batch pushes its run's
        # lease if its token still holds the run (the same fence as one heartbeat); the runs it
        # pushed come back, and a beat whose run did not was fenced off.
        self._q_heartbeat_many = q(
            "UPDATE {runs} AS r SET state = 'Running', lease_until = GREATEST(r.lease_until, b.until), updated = b.now"
            " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bigint[], %s::bigint[])"
            " AS b(job, slot, token, now, until)"
            " WHERE r.job = b.job AND r.slot = b.slot AND r.token = b.token AND r.state IN ('Claimed', 'Running')"
            " RETURNING r.job, r.slot, r.token"
        )
        self._q_finish = q(
            "UPDATE {runs} SET attempts = {close_fn}(attempts, %s::bigint, %s::text, %s::text),"
            f" state = %s::text, error = %s::text, lease_until = 0, updated = %s::bigint WHERE {_FENCE}"
        )
        self._q_release = q(
            "UPDATE {runs} SET attempts = {close_fn}(attempts, %s::bigint, 'Interrupted', %s::text),"
            f" lease_until = %s::bigint, error = %s::text, updated = %s::bigint, token = '' WHERE {_FENCE}"
        )
        self._q_get = q(f"SELECT {_COLUMNS} FROM {{runs}} WHERE job = %s AND slot = %s")
        self._q_active = q(
            f"SELECT {_COLUMNS} FROM {{runs}} WHERE job = %s AND state IN ('Claimed', 'Running') ORDER BY slot"
        )
        self._q_expired = q(
            f"SELECT {_COLUMNS} FROM {{runs}} WHERE state IN ('Claimed', 'Running') AND lease_until <= %s"
            " ORDER BY lease_until DESC LIMIT %s"
        )
        self._q_last = q("SELECT max(slot) FROM {runs} WHERE job = %s")
        self._q_history = q(f"SELECT {_COLUMNS} FROM {{runs}} WHERE job = %s ORDER BY slot DESC LIMIT %s")
        self._q_prune = q(
            "DELETE FROM {runs} WHERE job = %s AND slot < %s AND state NOT IN ('Claimed', 'Running')"
            " AND slot < (SELECT max(slot) FROM {runs} WHERE job = %s)"
        )
        # One statement, so the runs, the fingerprints and the note of service go together.
        self._q_forget = q(
            "WITH gone AS (DELETE FROM {runs} WHERE job = %s), fp AS (DELETE FROM {schedules} WHERE job = %s),"
            " sh AS (DELETE FROM {shared} WHERE job = %s) DELETE FROM {served} WHERE job = %s"
        )
        self._q_note_served = q(
            "INSERT INTO {served} (job, at) SELECT unnest(%s::text[]), %s"
            " ON CONFLICT (job) DO UPDATE SET at = greatest({served}.at, EXCLUDED.at)"
        )
        self._q_forget_unserved = q(
            "WITH gone AS (DELETE FROM {served} WHERE at < %s RETURNING job),"
            " r AS (DELETE FROM {runs} WHERE job IN (SELECT job FROM gone)),"
            " s AS (DELETE FROM {schedules} WHERE job IN (SELECT job FROM gone)),"
            " sh AS (DELETE FROM {shared} WHERE job IN (SELECT job FROM gone))"
            " SELECT job FROM gone"
        )
        # One statement: the records that ran out go (ours is written anew whatever its age).
        self._q_note_presence = q(
            "WITH gone AS (DELETE FROM {presence} WHERE until < %s AND instance <> %s)"
            " INSERT INTO {presence} (instance, until) VALUES (%s, %s)"
            " ON CONFLICT (instance) DO UPDATE SET until = EXCLUDED.until"
        )
        self._q_present = q("SELECT instance FROM {presence} WHERE instance = ANY(%s::text[]) AND until > %s")
        # Replace the fingerprint only when it changed; the WHERE is re-checked after a
        # concurrent upsert of the same job, so racing instances agree on one ``since``.
        self._q_schedule_upsert = q(
            "INSERT INTO {schedules} AS s (job, fingerprint, since) VALUES (%s, %s, %s)"
            " ON CONFLICT (job) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, since = EXCLUDED.since"
            " WHERE s.fingerprint <> EXCLUDED.fingerprint RETURNING s.since"
        )
        self._q_schedule_get = q("SELECT since FROM {schedules} WHERE job = %s")
        # Under a lock of the job's notes (not its claims'): the notes, then ours written
        # (shared.note_side) and the ones that ran out gone.
        self._q_shared_lock = q("SELECT pg_advisory_xact_lock(hashtextextended({lock_prefix} || 'shared:' || %s, 0))")
        self._q_shared_get = q("SELECT cluster, fingerprint, since, seen FROM {shared} WHERE job = %s")
        self._q_shared_note = q(
            "WITH gone AS (DELETE FROM {shared} WHERE job = %s AND seen < %s AND cluster <> %s)"
            " INSERT INTO {shared} (job, cluster, fingerprint, since, seen) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (job, cluster) DO UPDATE"
            " SET fingerprint = EXCLUDED.fingerprint, since = EXCLUDED.since, seen = EXCLUDED.seen"
        )
        self._q_shared_drop = q("DELETE FROM {shared} WHERE job = %s AND cluster = %s")

        self._slots = asyncio.Semaphore(pool_size)
        self._idle: list[Conn] = []
        self._lease_slots = asyncio.Semaphore(LEASE_CONNECTIONS)
        self._lease_idle: list[Conn] = []
        #: Heartbeats of many runs at once go out together: one statement, one connection.
        self._beats = Coalescer(self._heartbeat_many, in_flight=LEASE_CONNECTIONS)
        self._closed = False

    # -- connections --------------------------------------------------------------------
    def _error(self, exc: BaseException) -> StoreError:
        """A StoreError naming the server but never the password."""
        if isinstance(exc, TimeoutError):
            message = f"no answer within {self._command_timeout_s}s"
        else:
            message = str(exc).strip() or type(exc).__name__
        if self._password:
            message = message.replace(self._password, "***")
        return StoreError(f"{self._where}: {message}")

    async def _connect(self) -> Conn:
        conn: Conn = await psycopg.AsyncConnection.connect(self._url, **self._connect_kwargs)
        return conn

    async def _discard(self, conn: Conn | None, *, idle_too: bool) -> None:
        """Close a connection whose state is unknown; with ``idle_too`` the idle ones as well.

        After a connection broke, the idle ones most likely broke with it (the server
        restarted or the network dropped), and using them would fail one call each.
        """
        doomed = [conn] if conn is not None else []
        if idle_too:
            doomed += self._idle + self._lease_idle
            self._idle.clear()
            self._lease_idle.clear()
        for c in doomed:
            with contextlib.suppress(Exception):  # already broken; closing is best effort
                await c.close()

    async def _run(self, op: Callable[[Conn], Awaitable[T]], *, lease: bool = False) -> T:
        """Run ``op`` on a pooled connection (of the lease writes' own, with ``lease``),
        turning every failure into StoreError."""
        if self._closed:
            raise StoreError(f"{self._where}: backend used after close()")
        slots, idle = (self._lease_slots, self._lease_idle) if lease else (self._slots, self._idle)
        async with slots:
            conn: Conn | None = None
            try:
                conn = idle.pop() if idle else await self._connect()
                result = await self._bounded(op(conn))
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if conn is None or conn.broken or conn.closed:
                    # The server is gone (restart, network): the idle connections most
                    # likely went with it, and each would fail one more call.
                    await self._discard(conn, idle_too=True)
                elif isinstance(exc, TimeoutError) or conn.info.transaction_status != TransactionStatus.IDLE:
                    # psycopg cancelled the statement on the server when the timeout hit;
                    # a connection in an uncertain state is not worth keeping.
                    await self._discard(conn, idle_too=False)
                else:
                    # A query error (e.g. the table is missing before setup()) leaves an
                    # autocommit connection idle and usable.
                    idle.append(conn)
                raise self._error(exc) from exc
            except BaseException:
                # Cancelled mid-query: the connection may be in the middle of a result.
                await self._discard(conn, idle_too=False)
                raise
            if self._closed:
                await self._discard(conn, idle_too=False)
            else:
                idle.append(conn)
            return result

    async def _bounded(self, call: Awaitable[T]) -> T:
        """Await a call on a connection for ``command_timeout_s``, then end it promptly.

        On the timeout psycopg is interrupted; it then asks the server to cancel the statement
        (so that a slow claim cannot commit behind its caller's back) and waits for the
        statement to end, up to 5 s each. A frozen server answers neither, and the call would
        last 10 s past its timeout: after :data:`CANCEL_GRACE_S` it is interrupted once more,
        and psycopg closes the connection (psycopg#1435). Raises TimeoutError.

        A caller that gives up first (a heartbeat whose next one is due) has the call ended the
        same way before its connection is closed: closed under a call still waiting on its
        socket, the descriptor went to the next connection, and the old call's wait broke the
        new connection's next call ("connection socket closed").
        """
        if self._command_timeout_s is None:
            return await call
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self._command_timeout_s)
        except asyncio.CancelledError:
            await _end(task)
            raise
        if task in done:
            return task.result()
        await _end(task)
        raise TimeoutError

    async def _rows(self, query: bytes, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        async def op(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute(query, params)
            return await cur.fetchall()

        return await self._run(op)

    async def _rowcount(self, query: bytes, params: Sequence[Any], *, lease: bool = False) -> int:
        async def op(conn: Conn) -> int:
            cur = await conn.execute(query, params)
            return cur.rowcount

        return await self._run(op, lease=lease)

    # -- life cycle ---------------------------------------------------------------------
    async def setup(self) -> None:
        """Create the tables, index and functions; safe to run from many instances at once.

        When everything exists already (every start but the first), nothing is run but
        one catalog lookup: even ``CREATE INDEX IF NOT EXISTS`` takes a SHARE lock on the
        table before it finds the index, which would stall every claim and heartbeat of
        the cluster behind an instance that merely restarts.
        """
        self._closed = False

        async def op(conn: Conn) -> None:
            cur = await conn.execute(self._q_schema_exists, self._schema_objects)
            row = await cur.fetchone()
            if row is not None and row[0]:
                return
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self._setup_lock_key,))
                await conn.execute(self._q_schema)

        await self._run(op)

    async def ping(self) -> None:
        async def op(conn: Conn) -> None:
            await conn.execute("SELECT 1")

        await self._run(op)

    async def close(self) -> None:
        """Close the idle connections; calls still running close theirs when they end."""
        self._closed = True
        await self._discard(None, idle_too=True)

    # -- claims and leases --------------------------------------------------------------
    async def _call(self, query: bytes, request: ClaimRequest | TakeoverRequest, last: object) -> ClaimResult:
        """Call the claim or takeover function, ``last`` being its last parameter, for a ClaimResult."""
        rows = await self._rows(
            query,
            (
                request.job,
                request.slot,
                request.instance,
                request.token,
                token_hash(request.token),
                request.now_ms,
                request.lease_ms,
                last,
            ),
        )
        return _claim_result(rows)

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._call(self._q_claim, request, str(Overlap(request.overlap)))

    async def claim_many(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | BaseException]:
        """Every claim in one call of the claim-many function: one round trip, in order.

        Sorted by job first (stable: one job's claims keep their order), so that the job locks,
        held until the batch ends, are taken in the same order by every instance: two batches
        wait for each other, never deadlock. A batch that fails fails every claim in it.
        """
        if len(requests) <= 1:
            return await super().claim_many(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].job)
        sent = [requests[i] for i in order]
        params = (
            [r.job for r in sent],
            [r.slot for r in sent],
            [r.instance for r in sent],
            [r.token for r in sent],
            [token_hash(r.token) for r in sent],
            [r.now_ms for r in sent],
            [r.lease_ms for r in sent],
            [str(Overlap(r.overlap)) for r in sent],
        )
        try:
            rows = await self._rows(self._q_claim_many, params)
        except StoreError as exc:
            return [exc] * len(requests)
        by_request: list[list[tuple[Any, ...]]] = [[] for _ in requests]
        for i, *row in rows:
            by_request[order[i - 1]].append(tuple(row))
        return [_claim_result(r) for r in by_request]

    async def takeover(self, request: TakeoverRequest) -> ClaimResult:
        return await self._call(self._q_takeover, request, request.max_attempts)

    async def heartbeat(self, job: str, slot: int, token: str, now_ms: int, lease_ms: int) -> bool:
        return await self._beats((job, slot, token, now_ms, now_ms + lease_ms))

    async def _heartbeat_many(self, beats: list[Beat]) -> list[bool | BaseException]:
        """The heartbeats out together (:class:`~anarchon.engine.batch.Coalescer`): one
        ``UPDATE`` on a lease connection, whatever their number; True for each beat whose
        token still held its run (the others were fenced off, each on its own).

        The beats are sent in ``(job, slot)`` order, so that two batches that meet on rows
        lock them in the same order; a beat twice in a batch is sent once, the latest.
        """
        latest: dict[tuple[str, int, str], Beat] = {}
        for beat in sorted(beats, key=lambda b: (b[0], b[1], b[3])):
            latest[beat[:3]] = beat
        params = tuple([beat[i] for beat in latest.values()] for i in range(5))

        async def op(conn: Conn) -> set[tuple[str, int, str]]:
            cur = await conn.execute(self._q_heartbeat_many, params)
            return {(str(job), int(slot), str(token)) for job, slot, token in await cur.fetchall()}

        pushed = await self._run(op, lease=True)
        return [beat[:3] in pushed for beat in beats]

    async def finish(
        self, job: str, slot: int, token: str, now_ms: int, outcome: RunState, error: str | None = None
    ) -> bool:
        outcome = RunState(outcome)
        if outcome.active:
            raise ValueError(f"finish: {outcome} is not an outcome")
        params = (now_ms, str(outcome), error, str(outcome), error, now_ms, job, slot, token)
        return await self._rowcount(self._q_finish, params, lease=True) == 1

    async def release(self, job: str, slot: int, token: str, now_ms: int, reason: str) -> bool:
        params = (now_ms, reason, now_ms, reason, now_ms, job, slot, token)
        return await self._rowcount(self._q_release, params, lease=True) == 1

    # -- reads and housekeeping ---------------------------------------------------------
    async def get_run(self, job: str, slot: int) -> Run | None:
        rows = await self._rows(self._q_get, (job, slot))
        return _row_to_run(rows[0]) if rows else None

    async def active_runs(self, job: str) -> list[Run]:
        return [_row_to_run(r) for r in await self._rows(self._q_active, (job,))]

    async def expired_runs(self, now_ms: int, limit: int) -> list[Run]:
        return [_row_to_run(r) for r in await self._rows(self._q_expired, (now_ms, limit))]

    async def last_slot(self, job: str) -> int | None:
        rows = await self._rows(self._q_last, (job,))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    async def history(self, job: str, limit: int = 50) -> list[Run]:
        runs = [_row_to_run(r) for r in await self._rows(self._q_history, (job, limit))]
        for run in runs:
            run.token = ""
        return runs

    async def schedule_since(self, job: str, fingerprint: str, now_ms: int) -> int:
        async def op(conn: Conn) -> int:
            # Two statements, not one: the SELECT must take a fresh snapshot to see a row
            # that a concurrent instance committed while our upsert waited for it.
            cur = await conn.execute(self._q_schedule_upsert, (job, fingerprint, now_ms))
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(self._q_schedule_get, (job,))
                row = await cur.fetchone()
            if row is None:  # deleted in between by hand; record this fingerprint now
                return now_ms
            return int(row[0])

        return await self._run(op)

    async def prune(self, job: str, before_slot: int) -> int:
        return await self._rowcount(self._q_prune, (job, before_slot, job))

    async def forget_job(self, job: str) -> None:
        await self._rowcount(self._q_forget, (job, job, job, job))

    async def note_served(self, jobs: Sequence[str], now_ms: int) -> None:
        await self._rowcount(self._q_note_served, (list(jobs), now_ms))

    async def forget_unserved(self, before_ms: int) -> list[str]:
        return [str(row[0]) for row in await self._rows(self._q_forget_unserved, (before_ms,))]

    async def note_shared_spec(
        self, job: str, cluster: str, fingerprint: str, now_ms: int, ttl_ms: int
    ) -> list[SharedSide]:
        async def op(conn: Conn) -> list[SharedSide]:
            oldest = now_ms - ttl_ms
            async with conn.transaction():
                await conn.execute(self._q_shared_lock, (job,))
                cur = await conn.execute(self._q_shared_get, (job,))
                sides = [SharedSide(str(c), str(f), int(si), int(se)) for c, f, si, se in await cur.fetchall()]
                ours = note_side(sides, cluster, fingerprint, now_ms)
                values = (job, oldest, cluster, job, cluster, fingerprint, ours.since, now_ms)
                await conn.execute(self._q_shared_note, values)
            return [*(s for s in sides if s.cluster != cluster and s.seen_ms >= oldest), ours]

        return await self._run(op)

    async def drop_shared_spec(self, job: str, cluster: str) -> None:
        await self._rowcount(self._q_shared_drop, (job, cluster))

    async def note_presence(self, instance: str, now_ms: int, ttl_ms: int) -> None:
        await self._rowcount(self._q_note_presence, (now_ms, instance, instance, now_ms + ttl_ms))

    async def present(self, instances: Sequence[str], now_ms: int) -> set[str]:
        if not instances:
            return set()
        return {str(row[0]) for row in await self._rows(self._q_present, (list(instances), now_ms))}
