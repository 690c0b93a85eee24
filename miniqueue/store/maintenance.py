"""Upkeep: what the reaper and the supervisor run so the queue stays sound and small. Expired
leases recovered, jobs past their deadline expired, finished jobs pruned, ended keys dropped,
the per-minute counts trimmed, the finished counts recounted, the jobs table vacuumed, the
server's connections counted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..core.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from ..core.db import Connection, translate_errors
from ..core.errors import InvalidInput
from ..core.records import TERMINAL_STATES, State
from ..core.steps import Atomic, Query, Steps, run
from ..core.validation import check_seconds
from .base import Statement, Statements, StoreBase, compose
from .finishing import counted_off, finishing, unkeyed

# Return expired leases to the queue (or dead, when attempts are exhausted), as a failure would
# (an entry in the error history as in outcomes._RECORD_FAILURES, the task's backoff from
# miniqueue_retry_delay, migration 020). The outer WHERE re-checks the expiry in the same
# statement, so a job completed or renewed between the scan and the update is left alone. Then
# `counted`, `per_minute` and `settled` (see miniqueue.store.finishing), of the jobs now dead.
_RECOVER_EXPIRED = compose(
    """
WITH recovered AS (
UPDATE {jobs}
   SET state = CASE WHEN attempt >= max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN attempt >= max_attempts THEN scheduled_at
                           ELSE now() + make_interval(secs => {retry_delay}(task => task, attempt => attempt_budget - (max_attempts - attempt),
                               default_base => %(base)s, default_cap => %(cap)s)) END,
       finished_at = CASE WHEN attempt >= max_attempts THEN now() END,
       last_error = format('worker lost: %%s stopped renewing its lease on attempt %%s of %%s',
                           leased_by, attempt_budget - (max_attempts - attempt), attempt_budget),
       errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', 'worker lost: lease expired without renewal')), lease_expires_at = NULL, leased_by = NULL
 WHERE id = ANY(ARRAY(
        SELECT id FROM {jobs}
         WHERE state = 'running' AND lease_expires_at < now()
         ORDER BY lease_expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state = 'running' AND lease_expires_at < now()
RETURNING id, queue, state, dependents, awaited, sequence_key
), {finishing}
""",  # noqa: E501
    finishing=finishing("recovered", select="id, state"),
)

# Expire the jobs whose deadline passed before any worker claimed them (the claim passes over
# them; a job parked for a signal was claimed, and stays): 'expired', a final state that requeue
# takes like 'dead', with an entry in the history. The outer WHERE re-checks in the same
# statement, so a job claimed meanwhile is left alone.
# Then `counted`, `per_minute` and `settled` (see miniqueue.store.finishing): the dependents of an
# expired job are cancelled, and a job of a sequence hands its key on.
_EXPIRE = compose(
    """
WITH expired AS (
UPDATE {jobs}
   SET state = 'expired', finished_at = now(), pending_parents = 0,
       last_error = format('expired: not started by its deadline, %%s', expires_at),
       errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', format('expired: not started by its deadline, %%s', expires_at)))
 WHERE id = ANY(ARRAY(
        SELECT id FROM {jobs}
         WHERE expires_at <= now() AND expires_at IS NOT NULL AND state IN ('available', 'waiting')
           AND signal_key IS NULL
         ORDER BY expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state IN ('available', 'waiting') AND expires_at <= now() AND signal_key IS NULL
RETURNING id, queue, state, dependents, awaited, sequence_key
), {finishing}
""",  # noqa: E501
    finishing=finishing("expired", select="id"),
)

# The unique keys' windows that ended (the reaper, every pass, in batches).
_DROP_WINDOWS = """
DELETE FROM {unique_windows}
 WHERE key = ANY(ARRAY(SELECT key FROM {unique_windows} WHERE until < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND until < now()
"""

# The sequence keys no job has held for an hour (the reaper, every pass, in batches): an
# enqueue of the key makes its row again.
_DROP_IDLE_SEQUENCES = """
DELETE FROM {sequences} s
 WHERE key = ANY(ARRAY(SELECT key FROM {sequences}
                        WHERE head IS NULL AND updated_at < now() - interval '1 hour'
                        LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND head IS NULL AND updated_at < now() - interval '1 hour'
"""

# The back-pressure pauses by key that ended (the reaper, every pass, in batches): the limit
# rows keep their own pause, and a limit row created from now on starts unpaused.
_DROP_ENDED_PAUSES = """
DELETE FROM {pauses}
 WHERE key = ANY(ARRAY(SELECT key FROM {pauses} WHERE paused_until < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND paused_until < now()
"""

# Recount the finished jobs from the table itself: the repair for counts that drifted (jobs
# finished by workers of an older version during the migration that added the counts, or rows
# changed by hand). It reads every finished row once; the lock makes statements that finish
# jobs wait until it commits, so none is counted twice or missed.
_RECOUNT = [
    "LOCK TABLE {counts} IN EXCLUSIVE MODE",
    "DELETE FROM {counts}",
    """
INSERT INTO {counts} (queue, state, shard, bucket, count)
SELECT queue, state, 0, date_trunc('hour', finished_at, 'UTC'), count(*) FROM {jobs}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
""",
]

# The throughput's minutes the chart no longer shows (the reaper, every pass).
_TRIM_MINUTES = "DELETE FROM {finished_minutes} WHERE minute < now() - interval '2 hours'"

# Delete a batch of jobs that finished longer ago than `age` seconds, row by row (an operator's
# prune: the reaper drops the history's partitions whole, see miniqueue.store.history). The
# literal state list lets the planner read only the history. `unkeyed` lets go of their
# idempotency keys, and `counted` takes them off the finished counts (see
# miniqueue.store.finishing).
_PRUNE = compose(
    """
WITH pruned AS (
    DELETE FROM {jobs}
     WHERE id = ANY(ARRAY(
            SELECT id FROM {jobs}
             WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') AND state = ANY(%(states)s::text[])
               AND finished_at < now() - make_interval(secs => %(age)s)
             LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING id, queue, state, finished_at, idempotency_key
), {unkeyed}, {counted_off}
SELECT count(*) FROM pruned
""",
    unkeyed=unkeyed("pruned"),
    counted_off=counted_off("pruned"),
)

# _PRUNE for the jobs that finished where no partition of the history was made (the reaper's):
# they are in the history tables' default partitions, read here by name, so that no partition
# of the history is read (a partition is dropped whole once past retention).
_PRUNE_DEFAULTS = compose(
    """
WITH pruned AS (
    DELETE FROM {jobs}
     WHERE id = ANY(ARRAY(SELECT id FROM {done_default}
                           WHERE state = ANY(%(states)s::text[])
                             AND finished_at < now() - make_interval(secs => %(age)s)
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                    || ARRAY(SELECT id FROM {failed_default}
                           WHERE state = ANY(%(states)s::text[])
                             AND finished_at < now() - make_interval(secs => %(age)s)
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
       AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') AND state = ANY(%(states)s::text[])
    RETURNING id, queue, state, finished_at, idempotency_key
), {unkeyed}, {counted_off}
SELECT count(*) FROM pruned
""",
    unkeyed=unkeyed("pruned"),
    counted_off=counted_off("pruned"),
)

# The hot table's churn, for the reaper's upkeep (see miniqueue.maintenance.vacuum): live rows,
# rows inserted and changed since the server's statistics began (a claim updates one, and a
# completion moves it out to the history: a delete here), rows changed since the planner's
# statistics were taken, when a vacuum and an analyze last finished, and whether this role may
# vacuum and analyze the table (it owns it). The history is written once per row and needs none
# of this: autovacuum's defaults serve it.
_JOBS_CHURN = """
SELECT pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_tuples_inserted(c.oid) AS inserted,
       pg_stat_get_tuples_updated(c.oid) + pg_stat_get_tuples_deleted(c.oid) AS updated,
       pg_stat_get_mod_since_analyze(c.oid) AS changed,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       greatest(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)) AS last_analyze,
       pg_has_role(c.relowner, 'USAGE') AS may_maintain
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass
"""

# SKIP_LOCKED: when autovacuum (or an operator) is already at it, there is nothing to add.
_VACUUM_JOBS = "VACUUM (SKIP_LOCKED, ANALYZE) {live}"
_ANALYZE_JOBS = "ANALYZE (SKIP_LOCKED) {live}"

# How many connections the server allows, keeps for superusers, and has in use by clients.
_CONNECTION_CAPACITY = """
SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int
"""


class JobsChurn(NamedTuple):
    """The jobs table's statistics as the server keeps them: ``live`` rows, rows ``inserted``
    and ``updated`` since the statistics began, rows ``changed`` (inserted, updated or deleted)
    since the planner's statistics were taken, when a vacuum and an analyze last finished
    (``None``: never), and whether this role may vacuum and analyze the table."""

    live: int
    inserted: int
    updated: int
    changed: int
    last_vacuum: dt.datetime | None
    last_analyze: dt.datetime | None
    may_maintain: bool


class Maintenance(StoreBase):
    """The queue's upkeep."""

    _recover = Statement(_RECOVER_EXPIRED)
    _expire = Statement(_EXPIRE)
    _drop_windows = Statement(_DROP_WINDOWS)
    _drop_idle_sequences = Statement(_DROP_IDLE_SEQUENCES)
    _drop_ended_pauses = Statement(_DROP_ENDED_PAUSES)
    _recount = Statements(_RECOUNT)
    _trim_minutes = Statement(_TRIM_MINUTES)
    _prune = Statement(_PRUNE)
    _prune_defaults = Statement(_PRUNE_DEFAULTS)
    _jobs_churn = Statement(_JOBS_CHURN)
    _vacuum_jobs = Statement(_VACUUM_JOBS)
    _analyze_jobs = Statement(_ANALYZE_JOBS)

    def recover_expired_leases(self, conn: Connection, limit: int = 1000) -> dict[int, State]:
        """Return up to ``limit`` jobs whose lease expired to ``available`` (or ``dead`` when their
        attempts are exhausted); return id → new state."""
        params = {"limit": limit, "base": DEFAULT_BASE_SECONDS, "cap": DEFAULT_CAP_SECONDS}
        return {row[0]: State(row[1]) for row in self._rows(conn, self._recover, params)}

    def expire_jobs(self, conn: Connection, limit: int = 1000) -> list[int]:
        """Move up to ``limit`` jobs past their deadline, never claimed, to ``expired``; return their ids."""
        return sorted(row[0] for row in self._rows(conn, self._expire, {"limit": limit}))

    def drop_ended_keys(self, conn: Connection, limit: int = 1000) -> int:
        """Delete up to ``limit`` ended unique-key windows, as many idle sequence keys and as many
        ended pauses; return how many."""
        with translate_errors():
            windows = conn.execute(self._drop_windows, {"limit": limit}).rowcount
            sequences = conn.execute(self._drop_idle_sequences, {"limit": limit}).rowcount
            pauses = conn.execute(self._drop_ended_pauses, {"limit": limit}).rowcount
        return windows + sequences + pauses

    def prune(
        self,
        conn: Connection,
        states: Iterable[State],
        older_than_seconds: float,
        limit: int = 1000,
        *,
        outside_partitions: bool = False,
    ) -> int:
        """Delete up to ``limit`` jobs in ``states`` (terminal states only) that finished more than
        ``older_than_seconds`` ago, one by one (``outside_partitions``: only those in the history's
        default partitions, which the reaper prunes this way while it drops the partitions
        whole); return how many were deleted."""
        return run(conn, self.prune_steps(states, older_than_seconds, limit, outside_partitions=outside_partitions))

    def prune_steps(
        self, states: Iterable[State], older_than_seconds: float, limit: int = 1000, *, outside_partitions: bool = False
    ) -> Steps[int]:
        """:meth:`prune` as steps."""
        chosen = sorted(State(s).value for s in states)
        if not chosen or any(State(s) not in TERMINAL_STATES for s in chosen):
            raise InvalidInput(
                f"prune states {chosen} are invalid: choose among completed, failed, dead, cancelled, expired"
            )
        older_than_seconds = check_seconds("prune age", older_than_seconds)
        params = {"states": chosen, "age": float(older_than_seconds), "limit": limit}
        rows: list[tuple[Any, ...]] = yield Query(self._prune_defaults if outside_partitions else self._prune, params)
        return int(rows[0][0])

    def trim_throughput(self, conn: Connection) -> None:
        """Drop the per-minute counts older than the chart shows (two hours)."""
        with translate_errors():
            conn.execute(self._trim_minutes)

    def recount(self, conn: Connection) -> None:
        """Recount finished jobs from the jobs table (see ``_RECOUNT``): O(table), for repair only."""
        run(conn, self.recount_steps())

    def recount_steps(self) -> Steps[None]:
        """:meth:`recount` as steps."""
        yield Atomic(_each(self._recount))

    def jobs_churn(self, conn: Connection) -> JobsChurn:
        """The jobs table's statistics, as the reaper's upkeep reads them (see :class:`JobsChurn`)."""
        return JobsChurn(**self._named_rows(conn, self._jobs_churn, {"table": self.live_table_name})[0])

    def vacuum_jobs(self, conn: Connection, *, analyze_only: bool = False) -> None:
        """VACUUM and ANALYZE the jobs table (or only ANALYZE it), unless another vacuum or
        analyze holds it. ``conn`` must be in autocommit."""
        with translate_errors():
            conn.execute(self._analyze_jobs if analyze_only else self._vacuum_jobs)

    def connection_capacity(self, conn: Connection) -> tuple[int, int, int]:
        """``(max_connections, superuser_reserved_connections, client connections in use)``."""
        row = self._rows(conn, _CONNECTION_CAPACITY, {})[0]
        return int(row[0]), int(row[1]), int(row[2])


def _each(statements: Iterable[str]) -> Steps[None]:
    for statement in statements:
        yield Query(statement)
