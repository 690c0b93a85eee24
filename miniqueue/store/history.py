"""The history: finished jobs in tables partitioned by finish time (migration 022), made ahead and
dropped whole once past retention, and the move of the rows an upgrade found in the old table.

Two history tables, each a partition of miniqueue_jobs by state and itself partitioned by
``finished_at``: ``done`` (completed and cancelled jobs, a partition per hour) and ``failed``
(failed, dead and expired ones, a partition per day), each with a default partition for a job
finished where no partition was made. Bounds are whole hours and days of UTC. Each partition is
recorded in miniqueue_history_partitions as it is made, so that what to drop is read there, not
parsed from the catalog.

Detaching a partition takes an ACCESS EXCLUSIVE lock on its history table for a moment (every
completion into that table waits meanwhile): each such statement here runs under a short
``lock_timeout`` and, when it cannot have the lock at once, gives up until the reaper's next pass
(nothing is lost by waiting: the partition stays). The history table is locked before the
partition, never after: a completion locks the history table and then the partition it lands
in, and a reader of finished jobs the history table and then the partitions it reads; a drop
holding the partition while it waited for the table would wait for them as they wait for it.
One exception, so that the history table is locked only for the detach itself: a drop first
locks the partitions it is about to detach in SHARE mode, which only a writer of their jobs
(a requeue or a delete of a job past retention) waits for; such a writer, if it locked the
history table first, holds up the drop's lock of the history table in turn, until the drop gives up (its
``lock_timeout``, or the server's deadlock check if that comes first) and lets it go on.
"""

from __future__ import annotations

import contextlib
import datetime as dt

import psycopg
from psycopg import sql

from ..core.db import Connection, translate_errors
from ..core.records import Partition, State
from .base import Statement, StoreBase

#: The history tables and their states (a partition of ``done`` spans an hour, one of
#: ``failed`` a day: see _MISSING).
CLASSES: dict[str, tuple[State, ...]] = {
    "done": (State.COMPLETED, State.CANCELLED),
    "failed": (State.FAILED, State.DEAD, State.EXPIRED),
}

#: How long a DDL statement of the history waits for its lock before it gives up until next time.
LOCK_TIMEOUT = "200ms"

# The partitions missing from some seconds ago (`back_done`, `back_failed`) to `ahead` partitions
# after the current one, per history table (its width in hours: a day is 24 of them, whatever the
# session's time zone).
_MISSING = """
SELECT c.class, s AS starts_at, s + make_interval(hours => c.hours) AS ends_at
  FROM (VALUES ('done', 1, 'hour', %(back_done)s::float8), ('failed', 24, 'day', %(back_failed)s::float8))
       AS c(class, hours, unit, back),
       generate_series(date_trunc(c.unit, now() - make_interval(secs => c.back), 'UTC'),
                       date_trunc(c.unit, now(), 'UTC') + make_interval(hours => c.hours * %(ahead)s),
                       make_interval(hours => c.hours)) AS s
 WHERE NOT EXISTS (SELECT 1 FROM {history_partitions} p WHERE p.class = c.class AND p.starts_at = s)
 ORDER BY 1, 2
"""

_RECORD = """
INSERT INTO {history_partitions} (name, class, starts_at, ends_at) VALUES (%(name)s, %(class)s, %(starts)s, %(ends)s)
ON CONFLICT (name) DO NOTHING
"""

# The partitions of a history table wholly past `age` seconds, oldest first.
_EXPIRED = """
SELECT name, starts_at, ends_at FROM {history_partitions}
 WHERE class = %(class)s AND ends_at <= now() - make_interval(secs => %(age)s)
 ORDER BY starts_at
"""

# The expired partitions taken out of the register (another reaper's same statement waits for
# these rows, then finds them gone), each with its table's oid if that table is a partition still
# (none if it is gone: dropped by hand, say).
_FORGET_EXPIRED = """
DELETE FROM {history_partitions} p
 WHERE class = %(class)s AND ends_at <= now() - make_interval(secs => %(age)s)
RETURNING name, starts_at, ends_at,
          (SELECT i.inhrelid::int8 FROM pg_inherits i
            WHERE i.inhrelid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(p.name)))
"""

# What the jobs of the partitions about to be detached hold outside them, let go: their
# idempotency keys (found by each partition's sparse index of the jobs that have one; the range of
# finish times prunes the history to those partitions, and `partitions` keeps out the default
# partition's rows in it), and the finished counts of their hours.
_UNKEY = """
DELETE FROM {idempotency_keys} k USING {jobs} p
 WHERE p.state = ANY(%(states)s::text[]) AND p.finished_at >= %(starts)s AND p.finished_at < %(ends)s
   AND p.tableoid::int8 = ANY(%(partitions)s::int8[])
   AND p.idempotency_key IS NOT NULL AND k.key = p.idempotency_key AND k.job_id = p.id
"""
_UNCOUNT = """
DELETE FROM {counts} c USING unnest(%(starts)s::timestamptz[], %(ends)s::timestamptz[]) AS r(starts, ends)
 WHERE c.state = ANY(%(states)s::text[]) AND c.bucket >= r.starts AND c.bucket < r.ends
"""

_CREATE = "CREATE TABLE IF NOT EXISTS {partition} PARTITION OF {parent} FOR VALUES FROM ({starts}) TO ({ends})"
_DETACH = "ALTER TABLE {parent} DETACH PARTITION {partition}"
_DROP = "DROP TABLE IF EXISTS {partition}"
# The oldest of a history table's partitions detached and not dropped yet (by name: they are no
# partition now; a name sorts as its start).
_DETACHED = """
SELECT relname FROM pg_class
 WHERE relnamespace = %(schema)s::regnamespace AND relkind = 'r' AND NOT relispartition
   AND relname ~ ('^miniqueue_jobs_' || %(class)s || '_[0-9]{8}')
 ORDER BY relname LIMIT 1
"""
# The history table, and with it each of its partitions.
_LOCK_HISTORY = "LOCK TABLE {history} IN ACCESS EXCLUSIVE MODE"
# The partitions about to be detached, against writers only: their jobs stay as they are.
_LOCK_PARTITIONS = "LOCK TABLE {partitions} IN SHARE MODE"
_LOCK_TIMEOUT = "SET LOCAL lock_timeout = {timeout}"

# The partitions as they are, for operators: rows (the server's estimate) and bytes.
_PARTITIONS = """
SELECT p.name, p.class, p.starts_at, p.ends_at, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
  FROM {history_partitions} p
  JOIN pg_class c ON c.oid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(p.name))
 ORDER BY p.class, p.starts_at
"""

# Move a batch of the rows an upgrade left in the old table, in id order, into the jobs table,
# which routes each to the partition of its state and finish time; their finished counts move
# from the bucket they were kept in ('-infinity', migration 022) to the hour each finished in
# (`rebucketed`).
_MOVE_LEGACY = """
WITH moved AS (
    DELETE FROM {legacy}
     WHERE id = ANY(ARRAY(SELECT id FROM {legacy} ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING *
), placed AS (
    INSERT INTO {jobs} SELECT * FROM moved RETURNING queue, state, finished_at
), rebucketed AS (
INSERT INTO {counts} AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, bucket, sum(n) FROM (
    SELECT queue, state, date_trunc('hour', finished_at, 'UTC') AS bucket, count(*) AS n FROM placed
     WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') GROUP BY 1, 2, 3
    UNION ALL
    SELECT queue, state, '-infinity', -count(*) FROM placed
     WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') GROUP BY 1, 2
) m GROUP BY queue, state, bucket
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)
SELECT count(*) FROM placed WHERE (SELECT count(*) FROM rebucketed) >= 0
"""

# Whether the old table is still there, and how long ago its oldest row finished (seconds).
_LEGACY = "SELECT to_regclass(%(legacy)s) IS NOT NULL"
_LEGACY_AGE = "SELECT extract(epoch FROM now() - min(finished_at))::float8 FROM {legacy}"
_DROP_LEGACY = "DROP TABLE IF EXISTS {legacy}"


class History(StoreBase):
    """Making, dropping and listing the history's partitions; moving an upgrade's old rows."""

    _missing = Statement(_MISSING)
    _forget_expired = Statement(_FORGET_EXPIRED)
    _unkey = Statement(_UNKEY)
    _record = Statement(_RECORD)
    _expired = Statement(_EXPIRED)
    _uncount = Statement(_UNCOUNT)
    _partitions = Statement(_PARTITIONS)
    _move_legacy = Statement(_MOVE_LEGACY)
    _legacy_age = Statement(_LEGACY_AGE)
    _drop_legacy = Statement(_DROP_LEGACY)

    def ensure_partitions(
        self, conn: Connection, *, back_seconds: dict[str, float] | None = None, ahead: int = 2
    ) -> list[str]:
        """Make the partitions missing from ``ahead`` partitions after the current one of each
        history table back to its current one, or to ``back_seconds[kind]`` ago; return the names
        made. One that cannot be made now (its lock is busy, or its default partition holds rows
        of its range, finished while it was missing) is left for a later call. ``conn`` must be
        in autocommit."""
        back = back_seconds or {}
        params = {"back_done": back.get("done", 0.0), "back_failed": back.get("failed", 0.0), "ahead": ahead}
        made = []
        for kind, starts, ends in self._rows(conn, self._missing, params):
            name = partition_name(kind, starts)
            create = sql.SQL(_CREATE).format(
                partition=sql.Identifier(self.schema, name),
                parent=sql.Identifier(self.schema, f"miniqueue_jobs_{kind}"),
                starts=sql.Literal(starts),
                ends=sql.Literal(ends),
            )
            with translate_errors():
                try:
                    with conn.transaction():
                        conn.execute(sql.SQL(_LOCK_TIMEOUT).format(timeout=sql.Literal(LOCK_TIMEOUT)))
                        conn.execute(create)
                        conn.execute(self._record, {"name": name, "class": kind, "starts": starts, "ends": ends})
                except (psycopg.errors.LockNotAvailable, psycopg.errors.CheckViolation, psycopg.errors.DuplicateTable):
                    continue
            made.append(name)
        return made

    def drop_partitions(self, conn: Connection, kind: str, older_than_seconds: float) -> list[str]:
        """Drop the partitions of history table ``kind`` whose every job finished more than
        ``older_than_seconds`` ago, each with its jobs' idempotency keys and finished counts;
        return the names taken out of the history, oldest first (none if a lock is busy: they
        are left for a later call). ``conn`` must be in autocommit.

        In two steps. The first, one transaction however many partitions expired together (a
        day's 24 hours after retention was cut, say), takes them out of the register, locks them
        against writers, lets go of what their jobs hold outside them (their keys, their counts),
        and only then locks the history table (see the module's docstring) to detach them all in
        one round trip: the history table, which every completion writes, is locked for the
        catalog changes alone, once. Their jobs are gone from every read from then on. The second
        drops one detached table a call, the oldest: its files (gigabytes, for a busy hour) are
        unlinked as it commits, which took 0.6-0.8 s of a core and the disk for 10,000,000 jobs
        and locks nothing but the table itself. The reaper's passes, seconds apart, drop the
        others one by one, so a drain running meanwhile meets one table's files at a time, not a
        day's. A table detached but not dropped (the process died between the two steps) is
        dropped by a later call just the same."""
        detached: list[str] = []
        if self._rows(conn, self._expired, {"class": kind, "age": older_than_seconds}):
            busy = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected)
            with translate_errors(), contextlib.suppress(*busy), conn.transaction():
                conn.execute(sql.SQL(_LOCK_TIMEOUT).format(timeout=sql.Literal(LOCK_TIMEOUT)))
                detached = self._detach(conn, kind, older_than_seconds)
        self._drop_detached(conn, kind)
        return detached

    def _detach(self, conn: Connection, kind: str, older_than_seconds: float) -> list[str]:
        """In a transaction: take the partitions of history table ``kind`` wholly past
        ``older_than_seconds`` out of the register, let go of what their jobs hold outside them,
        and detach them; their names."""
        params = {"class": kind, "age": older_than_seconds, "schema": self.schema}
        # Oldest first: the names come back in that order, and the partitions are locked in it.
        expired = sorted(row for row in self._rows(conn, self._forget_expired, params) if row[3] is not None)
        if not expired:
            return []
        names, starts, ends, oids = (list(column) for column in zip(*expired, strict=True))
        partitions = [sql.Identifier(self.schema, name) for name in names]
        conn.execute(sql.SQL(_LOCK_PARTITIONS).format(partitions=sql.SQL(", ").join(partitions)))
        states = [state.value for state in CLASSES[kind]]
        conn.execute(self._unkey, {"states": states, "starts": min(starts), "ends": max(ends), "partitions": oids})
        conn.execute(self._uncount, {"states": states, "starts": starts, "ends": ends})
        history = sql.Identifier(self.schema, f"miniqueue_jobs_{kind}")
        conn.execute(sql.SQL(_LOCK_HISTORY).format(history=history))
        detaches = (sql.SQL(_DETACH).format(parent=history, partition=partition) for partition in partitions)
        conn.execute(sql.SQL("; ").join(detaches))  # one round trip
        return names

    def _drop_detached(self, conn: Connection, kind: str) -> None:
        """Drop the oldest of history table ``kind``'s partitions that were detached (by
        :meth:`drop_partitions`), if any."""
        for (name,) in self._rows(conn, _DETACHED, {"schema": self.schema, "class": kind}):
            with translate_errors():
                conn.execute(sql.SQL(_DROP).format(partition=sql.Identifier(self.schema, name)))

    def partitions(self, conn: Connection) -> list[Partition]:
        """Every partition of the history, by table and then start."""
        return [Partition(*row) for row in self._rows(conn, self._partitions, {"schema": self.schema})]

    def has_legacy(self, conn: Connection) -> bool:
        """Whether rows an upgrade found in the old jobs table may still wait to be moved."""
        legacy = sql.Identifier(self.schema, "miniqueue_jobs_legacy").as_string()
        return bool(self._rows(conn, _LEGACY, {"legacy": legacy})[0][0])

    def move_legacy(self, conn: Connection, retention: dict[str, float], limit: int = 10_000) -> int:
        """Move a batch of at most ``limit`` rows from the old jobs table into the jobs table,
        making first the partitions their finish times need within ``retention`` (seconds, per
        history table: an older row lands in the default partition, pruned row by row); drop the
        old table once it is empty. Returns how many moved (0 once none is left). ``conn`` must
        be in autocommit."""
        if not self.has_legacy(conn):
            return 0
        [(age,)] = self._rows(conn, self._legacy_age, {})
        if age is not None:
            self.ensure_partitions(conn, back_seconds={kind: min(age, keep) for kind, keep in retention.items()})
        [(moved,)] = self._rows(conn, self._move_legacy, {"limit": limit})
        if moved == 0:
            with translate_errors(), contextlib.suppress(psycopg.errors.LockNotAvailable), conn.transaction():
                conn.execute(sql.SQL(_LOCK_TIMEOUT).format(timeout=sql.Literal(LOCK_TIMEOUT)))
                conn.execute(self._drop_legacy)
        return int(moved)


def partition_name(kind: str, starts: dt.datetime) -> str:
    """The name of the partition of history table ``kind`` that starts at ``starts``."""
    utc = starts.astimezone(dt.timezone.utc)
    return f"miniqueue_jobs_{kind}_{utc:%Y%m%dt%H}" if kind == "done" else f"miniqueue_jobs_{kind}_{utc:%Y%m%d}"
