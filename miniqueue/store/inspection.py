"""Inspection: what the queue holds, as the CLI, the dashboard, a client and the worker read it.
Jobs one by one or by filter, results and waiting for them, per-queue figures, limits waited on,
throughput, the database's clock. Nothing here changes a job (but for asking to be told when
one finishes)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg import sql

from ..core.db import Connection
from ..core.errors import JobNotFound
from ..core.records import (
    AttemptError,
    JobRecord,
    ParentOutcome,
    QueueCount,
    QueueStats,
    State,
    StepRecord,
    charged_attempts,
    number_attempts,
)
from ..core.steps import Atomic, Query, Steps, atomic, run
from .base import Statement, StoreBase
from .rows import bigints, monitoring

# The state of each given job (to explain why a transition did not apply).
_STATES = "SELECT id, state, attempt FROM {jobs} WHERE id = ANY(%(ids)s::bigint[])"

# One job, every column (JobRecord's fields).
_GET = """SELECT id, queue, task, payload, state, priority, attempt, max_attempts, idempotency_key, scheduled_at,
       created_at, lease_expires_at, leased_by, last_error, completed_at, finished_at, errors, result, parents,
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at,
       steps, signal_key, signal_timeout_at, started_at, aged_from
  FROM {jobs} WHERE id = %(id)s"""

# What a job's result is, or why there is none.
_RESULT = "SELECT state, result, last_error FROM {jobs} WHERE id = %(id)s"

# Ask for a notification when a job finishes (see Inspection.await_job_steps): set only while it
# has not. The update locks the job's row for a moment, and a worker's claim that runs meanwhile
# passes over it (SKIP LOCKED), its wake-up spent: a job due now is announced again, at this
# statement's commit, so that it never waits for the next poll because someone waits for it.
_AWAIT = """
UPDATE {jobs} SET awaited = true
 WHERE id = %(id)s AND NOT awaited AND state IN ('available', 'running', 'waiting')
RETURNING CASE WHEN state = 'available' AND scheduled_at <= now() THEN pg_notify({queue_channel}, queue) END
"""

# A page of jobs (every column, as _GET), newest first, filtered (see job_filter: each condition
# holds when its parameter is NULL); `before` pages by id (keyset pagination stays fast).
_LIST = """
SELECT id, queue, task, payload, state, priority, attempt, max_attempts, idempotency_key, scheduled_at,
       created_at, lease_expires_at, leased_by, last_error, completed_at, finished_at, errors, result, parents,
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at,
       steps, signal_key, signal_timeout_at, started_at, aged_from
  FROM {jobs}
 WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
   AND (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s
"""

# How many jobs match a filter, as _LIST's (for "apply to all N matching jobs" confirmations).
_COUNT_MATCHING = """SELECT count(*) FROM {jobs} WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(due)s::bool IS NULL OR (scheduled_at <= now()) = %(due)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)"""

# The ids of the jobs matching a filter as _LIST's, oldest first.
_IDS_MATCHING = """SELECT id FROM {jobs} WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(due)s::bool IS NULL OR (scheduled_at <= now()) = %(due)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s) ORDER BY id LIMIT %(limit)s"""

# Per queue: counts by state, jobs scheduled for later, the age of the oldest job waiting to
# run, leases that expired without the reaper having recovered them yet, and the waiting jobs
# that wait for a signal. Its cost does not
# grow with finished rows: available and running jobs are read from their partial indexes (the
# claim index, the reaper's lease index), finished ones from the counters.
_QUEUE_STATS = """
WITH ready AS (
    SELECT queue, count(*) AS available, count(*) FILTER (WHERE scheduled_at > now()) AS scheduled,
           extract(epoch FROM now() - min(scheduled_at) FILTER (WHERE scheduled_at <= now()))
               AS oldest_available_seconds
      FROM (SELECT queue, scheduled_at FROM {jobs} WHERE state = 'available' AND limits IS NULL
            UNION ALL
            SELECT queue, scheduled_at FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL) a
     GROUP BY queue
), blocked AS (
    SELECT queue, count(*) AS waiting, count(*) FILTER (WHERE signal_key IS NOT NULL) AS signal_waits
      FROM {jobs} WHERE state = 'waiting' GROUP BY queue
), leased AS (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE lease_expires_at < now()) AS expired_leases
      FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL GROUP BY queue
), finished AS (
    SELECT queue,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'completed'), 0)) AS completed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'failed'), 0)) AS failed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'dead'), 0)) AS dead,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'cancelled'), 0)) AS cancelled,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'expired'), 0)) AS expired
      FROM {counts} GROUP BY queue
)
SELECT queue, coalesce(available, 0) AS available, coalesce(running, 0) AS running,
       coalesce(completed, 0) AS completed, coalesce(failed, 0) AS failed, coalesce(dead, 0) AS dead,
       coalesce(cancelled, 0) AS cancelled, coalesce(waiting, 0) AS waiting, coalesce(expired, 0) AS expired,
       coalesce(scheduled, 0) AS scheduled, oldest_available_seconds, coalesce(expired_leases, 0) AS expired_leases,
       coalesce(signal_waits, 0) AS signal_waits
  FROM ready FULL JOIN blocked USING (queue) FULL JOIN leased USING (queue) FULL JOIN finished USING (queue)
 WHERE coalesce(available, 0) + coalesce(running, 0) + coalesce(completed, 0) + coalesce(failed, 0)
       + coalesce(dead, 0) + coalesce(cancelled, 0) + coalesce(waiting, 0) + coalesce(expired, 0) > 0
 ORDER BY queue
"""

# A job's parents' outcomes (state, result, last error), one row per parent in the order of its
# parents (a parent pruned since is left out). Read when a handler asks for them, never by the claim: aggregated there,
# the results of a large group (each within the result limit) overflowed jsonb's 256 MB array
# limit and failed the whole claim, again at every retry.
_PARENT_RESULTS = """
SELECT p.id, p.state, p.result, p.last_error
  FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord) JOIN {jobs} p ON p.id = u.id
 ORDER BY u.ord
"""

# Each limit with jobs waiting on it or a slot held: due, available jobs that name it (or, for a
# queue's cap, every due job of the queue), its limit, the jobs holding its slots (running at the
# attempt that took the slot) and the tokens left. Read from the limited jobs' index, the claim
# index of capped queues and the expired-lease index (running jobs, one per busy handler): its
# cost grows with the jobs waiting on limits and the jobs running, never with finished rows.
# A paused limit (back-pressure) is listed even with no job waiting, with when its pause ends and
# the job that paused it: found by a scan of the limit rows, one per key.
_LIMIT_WAITS = """
WITH waiting AS (
    SELECT s.scope, count(*) AS waiting
      FROM {jobs} j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.scheduled_at <= now()
     GROUP BY s.scope
    UNION ALL
    SELECT 'queue ' || q.name,
           (SELECT count(*) FROM {jobs} j
             WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = q.name AND j.scheduled_at <= now())
           + (SELECT count(*) FROM {jobs} j
               WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = q.name AND j.scheduled_at <= now())
      FROM {queues} q WHERE q.max_running IS NOT NULL
    UNION ALL
    SELECT DISTINCT s.scope, 0
      FROM {jobs} j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'running' AND j.lease_expires_at IS NOT NULL AND j.limits IS NOT NULL
    UNION ALL
    SELECT scope, 0 FROM {limits} WHERE paused_until > now()
), scopes AS (
    SELECT scope, sum(waiting)::bigint AS waiting FROM waiting GROUP BY scope
)
SELECT w.scope, w.waiting, l.max_running, l.rate, least(cardinality(h.holders), l.max_running) AS held,
       least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens,
       h.holders, CASE WHEN l.paused_until > now() THEN l.paused_until END,
       CASE WHEN l.paused_until > now() THEN l.paused_by END
  FROM scopes w LEFT JOIN {limits} l USING (scope)
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN {jobs} j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE w.waiting > 0 OR cardinality(h.holders) > 0 OR l.paused_until > now()
 ORDER BY w.waiting DESC, cardinality(h.holders) DESC, w.scope
 LIMIT %(limit)s
"""

# Jobs finished per minute over the last hour, by outcome: the per-minute counts the finishing
# statements keep (`per_minute`, see outcomes._COMPLETE), summed over their shards.
_THROUGHPUT = """
SELECT minute, state, sum(count)::bigint FROM {finished_minutes}
 WHERE minute > now() - interval '1 hour'
 GROUP BY 1, 2 ORDER BY 1, 2
"""

# The database's clock, for schedulers that must not trust their host's.
_NOW = "SELECT now()"

_STATE_ORDER = (
    State.AVAILABLE,
    State.RUNNING,
    State.COMPLETED,
    State.FAILED,
    State.DEAD,
    State.CANCELLED,
    State.WAITING,
    State.EXPIRED,
)


class LimitWait(NamedTuple):
    """One limit that jobs wait on or hold slots of: its scope name, how many due jobs wait, and
    its state (a concurrency limit's ``max_running``, slots ``held`` and the ids of the jobs
    holding them, ``holders``, where the jobs a claim took together hold one slot; or a rate
    limit's ``rate`` per second and ``tokens`` left), and
    while it is paused (back-pressure: RateLimited), until when and by which job."""

    scope: str
    waiting: int
    max_running: int | None
    rate: float | None
    held: int | None
    tokens: float | None
    holders: list[int]
    paused_until: dt.datetime | None = None
    paused_by: int | None = None


class Inspection(StoreBase):
    """Reading the queue."""

    _states = Statement(_STATES)
    _get = Statement(_GET)
    _result = Statement(_RESULT)
    _await = Statement(_AWAIT)
    _list = Statement(_LIST)
    _count_matching = Statement(_COUNT_MATCHING)
    _ids_matching = Statement(_IDS_MATCHING)
    _queue_stats = Statement(_QUEUE_STATS)
    _parent_results = Statement(_PARENT_RESULTS)
    _limit_waits = Statement(_LIMIT_WAITS)
    _throughput = Statement(_THROUGHPUT)

    # -- jobs -------------------------------------------------------------------------------------

    def states(self, conn: Connection, job_ids: Sequence[int]) -> dict[int, State]:
        """The current state of each given job that exists."""
        return {job_id: state for job_id, (state, _) in self.states_and_attempts(conn, job_ids).items()}

    def states_and_attempts(self, conn: Connection, job_ids: Sequence[int]) -> dict[int, tuple[State, int]]:
        """The current state and attempt number of each given job that exists."""
        return {row[0]: (State(row[1]), row[2]) for row in self._rows(conn, self._states, {"ids": bigints(job_ids)})}

    def get(self, conn: Connection, job_id: int) -> JobRecord:
        """Every column of one job, with its error history; raise JobNotFound if absent."""
        return run(conn, self.get_steps(job_id))

    def get_steps(self, job_id: int) -> Steps[JobRecord]:
        """:meth:`get` as steps."""
        rows: list[dict[str, Any]] = yield Query(self._get, {"id": job_id}, named=True)
        if not rows:
            raise JobNotFound(job_id)
        return _record(rows[0])

    def list_jobs(
        self, conn: Connection, *, before_id: int | None = None, limit: int = 50, **filters: Any
    ) -> list[JobRecord]:
        """Jobs matching ``filters`` (see :func:`job_filter`), newest first; pass the last id seen
        as ``before_id`` for the next page (keyset pagination stays fast however deep)."""
        return run(conn, self.list_jobs_steps(before_id=before_id, limit=limit, **filters))

    def list_jobs_steps(
        self, *, before_id: int | None = None, limit: int = 50, **filters: Any
    ) -> Steps[list[JobRecord]]:
        """:meth:`list_jobs` as steps."""
        params = {**job_filter(**filters), "before": before_id, "limit": limit}
        rows: list[dict[str, Any]] = yield Query(self._list, params, named=True)
        return [_record(row) for row in rows]

    def count_jobs(self, conn: Connection, **filters: Any) -> int:
        """How many jobs match ``filters`` (see :func:`job_filter`)."""
        return int(self._rows(conn, self._count_matching, job_filter(**filters))[0][0])

    def job_ids(self, conn: Connection, *, limit: int = 100_000, **filters: Any) -> list[int]:
        """The ids of up to ``limit`` jobs matching ``filters``, oldest first."""
        return [row[0] for row in self._rows(conn, self._ids_matching, {**job_filter(**filters), "limit": limit})]

    def parent_results(self, conn: Connection, parents: Sequence[int]) -> list[tuple[int, ParentOutcome]]:
        """Each of ``parents``' results, in their order (pruned parents left out)."""
        rows = self._rows(conn, self._parent_results, {"ids": list(parents)})
        return [(row[0], ParentOutcome(State(row[1]), row[2], row[3])) for row in rows]

    # -- results ------------------------------------------------------------------------------------

    def result(self, conn: Connection, job_id: int) -> tuple[State, Any, str | None]:
        """A job's state, result (None unless completed with one) and last error; raise JobNotFound."""
        return run(conn, self.result_steps(job_id))

    def result_steps(self, job_id: int) -> Steps[tuple[State, Any, str | None]]:
        """:meth:`result` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._result, {"id": job_id})
        if not rows:
            raise JobNotFound(job_id)
        return State(rows[0][0]), rows[0][1], rows[0][2]

    def listen_finished_steps(self) -> Steps[None]:
        """Subscribe the connection to the notifications of awaited jobs that finish (payload:
        the id)."""
        yield Query(sql.SQL("LISTEN {}").format(sql.Identifier(self.finished_channel)).as_string())

    def await_job_steps(self, job_id: int) -> Steps[None]:
        """Ask that the statement finishing ``job_id`` notify :attr:`finished_channel`.

        Listen first, then call this, then read the job's state: a completion either saw the
        flag (it read the row after this committed, or waited on the row lock this took and
        then read its newest version) and notifies, or committed before, and the read that
        follows sees the job finished. Jobs nobody awaits send nothing.
        """
        yield Query(self._await, {"id": job_id})

    # -- figures ------------------------------------------------------------------------------------

    def queue_stats(self, conn: Connection) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, oldest waiting job's age, expired leases."""
        return run(conn, self.queue_stats_steps())

    def queue_stats_steps(self) -> Steps[list[QueueStats]]:
        """:meth:`queue_stats` as steps."""
        stats = []
        rows: list[dict[str, Any]] = yield Atomic(monitoring(Query(self._queue_stats, {}, named=True)))
        for row in rows:
            oldest = row["oldest_available_seconds"]
            stats.append(
                QueueStats(
                    queue=row["queue"],
                    counts={state: int(row[state.value]) for state in _STATE_ORDER},
                    scheduled=int(row["scheduled"]),
                    oldest_available_seconds=None if oldest is None else float(oldest),
                    expired_leases=int(row["expired_leases"]),
                    signal_waits=int(row["signal_waits"]),
                )
            )
        return stats

    def counts(self, conn: Connection) -> list[QueueCount]:
        """How many jobs each queue holds in each state (states with no jobs are omitted)."""
        return run(conn, self.counts_steps())

    def counts_steps(self) -> Steps[list[QueueCount]]:
        """:meth:`counts` as steps."""
        stats = yield from self.queue_stats_steps()
        return [
            QueueCount(queue=q.queue, state=state, count=n) for q in stats for state, n in sorted(q.counts.items()) if n
        ]

    def limit_waits(self, conn: Connection, limit: int = 100) -> list[LimitWait]:
        """The limits that jobs wait on or hold slots of, most waiting first, then most held (at
        most ``limit``)."""
        return run(conn, self.limit_waits_steps(limit))

    def limit_waits_steps(self, limit: int = 100) -> Steps[list[LimitWait]]:
        """:meth:`limit_waits` as steps."""
        rows: list[tuple[Any, ...]] = yield from atomic(monitoring(Query(self._limit_waits, {"limit": limit})))
        return [LimitWait(*row) for row in rows]

    def throughput(self, conn: Connection) -> list[tuple[dt.datetime, State, int]]:
        """Jobs finished per minute over the last hour: ``(minute, state, count)`` (read from the
        per-minute counts the finishing statements keep, at the same cost under any load)."""
        return [(row[0], State(row[1]), int(row[2])) for row in self._rows(conn, self._throughput, {})]

    def now(self, conn: Connection) -> dt.datetime:
        """The database's clock."""
        return run(conn, self.now_steps())

    def now_steps(self) -> Steps[dt.datetime]:
        """:meth:`now` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(_NOW, {})
        value: dt.datetime = rows[0][0]
        return value


def job_filter(
    *,
    state: State | str | None = None,
    queue: str | None = None,
    task: str | None = None,
    search: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    due: bool | None = None,
) -> dict[str, Any]:
    """The parameters of a job filter: state, queue, task, a substring of the payload's JSON
    text, a creation time range ``[created_after, created_before)``, and whether the job is due
    (its scheduled time passed, by the database's clock); None matches all."""
    return {
        "state": State(state).value if state else None,
        "queue": queue,
        "task": task,
        "due": due,
        "search": search or None,
        "after": created_after,
        "until": created_before,
    }


def _record(row: dict[str, Any]) -> JobRecord:
    """A job's row, by column name (_GET's columns are JobRecord's fields)."""
    history = tuple(
        AttemptError(
            attempt,
            _parse_timestamp(e["at"]),
            e["worker"],
            e["error"],
            run=e["attempt"],
            started=_parse_timestamp(e["started"]) if e.get("started") else None,
            requeued=e.get("requeued"),
            finished=_parse_timestamp(e["finished"]) if e.get("finished") else None,
        )
        for e, attempt in zip(row["errors"], number_attempts(row["errors"]), strict=True)
    )
    links = {"parents": tuple(row["parents"] or ()), "dependents": tuple(row["dependents"] or ())}
    steps = tuple(StepRecord.of(entry) for entry in row["steps"] or ())
    counted = {
        "run": row["attempt"],
        "attempt": charged_attempts(row["attempt"], row["max_attempts"], row["attempt_budget"]),
    }
    return JobRecord(**{**row, **counted, "state": State(row["state"]), "errors": history, **links, "steps": steps})


def _parse_timestamp(text: str) -> dt.datetime:
    """Parse a timestamp from jsonb (``2024-05-01T10:00:00.1234+00:00``). PostgreSQL trims the
    fraction's trailing zeros; Python 3.10's fromisoformat wants exactly 3 or 6 digits."""
    return dt.datetime.fromisoformat(_FRACTION_RE.sub(lambda m: "." + m[1].ljust(6, "0"), text, count=1))


_FRACTION_RE = re.compile(r"\.(\d{1,6})(?=[+-]|$)")
