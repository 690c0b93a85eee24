"""Outcomes: what a worker reports of the jobs it holds (completed, failed, snoozed, handed back),
and the renewal of its leases.

Every transition here is *fenced*: one conditional ``UPDATE`` matching ``id AND state =
'running' AND leased_by = <worker> AND attempt = <attempt claimed>``. A transition that matches
no row raises :class:`~miniqueue.core.errors.LeaseLost` (or, in the batch forms, leaves that id
out of the result): the worker no longer holds the job.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from ..core.db import Connection
from ..core.errors import LeaseLost
from ..core.records import State
from ..core.steps import Query, Steps, run
from .base import Statement, StoreBase, compose
from .finishing import COMPLETION, finishing
from .progress import progress_channel
from .rows import aligned, bigints, columns, ints

# Complete a batch of leases, storing each job's result (see finishing.COMPLETION); returns the
# ids that were still held.
_COMPLETE = f"""
WITH {COMPLETION}
SELECT id FROM completed WHERE (SELECT count(*) FROM settled) >= 0
"""

# Extend a batch of leases by `lease` seconds from now; returns the ids still held. The progress
# their handlers reported since the last renewal rides along (`progress`: JSON text aligned with
# `ids`, NULL where none was reported, or empty when none was: see miniqueue.store.progress),
# stamped with the time written and announced for the jobs someone watches.
_RENEW = """
WITH renewed AS (
UPDATE {jobs}
   SET lease_expires_at = now() + make_interval(secs => %(lease_duration)s),
       progress = coalesce(((%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb
                           || jsonb_build_object('at', now()), progress)
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, lease_expires_at, awaited AND (%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])] IS NOT NULL AS told
)
SELECT id, lease_expires_at, CASE WHEN told THEN pg_notify(%(channel)s, id::text) END FROM renewed
"""  # noqa: E501

# Record failed attempts: retry after the given backoff (NULL: the task's published backoff, for
# a caller without the app: miniqueue_retry_delay, migration 020, at the attempts charged, which
# runs handed back uncharged do not count), or dead once attempts are exhausted. The error
# history gains an entry: which attempt, when, who held it, why. Then `counted`, `per_minute`
# and `settled` (see miniqueue.store.finishing), of the jobs that are now dead.
_RECORD_FAILURES = compose(
    """
WITH failed AS (
UPDATE {jobs} j
   SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN j.attempt >= j.max_attempts THEN j.scheduled_at
                           ELSE now() + make_interval(secs => coalesce(
                               f.backoff, {retry_delay}(task => j.task, attempt => j.attempt_budget - (j.max_attempts - j.attempt),
                                   default_base => %(base)s, default_cap => %(cap)s))) END,
       finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
       last_error = f.error, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by, 'error', f.error)),
       lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(backoffs)s::float8[])
       AS f(id, attempt, error, backoff)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id AND j.attempt = f.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, j.queue, j.state, j.dependents, j.awaited, j.sequence_key
), {finishing}
""",  # noqa: E501
    finishing=finishing("failed", select="id, state"),
)

# Fail a job permanently: the handler said never retry. The error history gains an entry as in
# _RECORD_FAILURES; `counted`, `per_minute` and `settled` (see miniqueue.store.finishing).
_FAIL = compose(
    """
WITH failed AS (
UPDATE {jobs}
   SET state = 'failed', finished_at = now(), last_error = %(error)s, errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', %(error)s::text)),
       lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, sequence_key
), {finishing}
""",  # noqa: E501
    finishing=finishing("failed", select="id"),
)

# Put a job back to sleep without spending an attempt (the attempt number still moves on when
# it is next claimed; max_attempts moves with it so the budget is unchanged).
_SNOOZE = """
UPDATE {jobs}
   SET state = 'available', scheduled_at = now() + make_interval(secs => %(delay)s),
       max_attempts = max_attempts + 1, lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id
"""

# Back-pressure (RateLimited): put a job back as a snooze does, its history noting why, due when
# the pause of its key ends, and pause the key's limit rows: every concurrency and rate scope of
# any task whose key is %(key)s (a scope name is `<kind> <task> <key>`, and task names hold no
# space). The job's fenced update comes first and the pause follows only if it landed, so a stale
# attempt pauses nothing. A pause never shortens a longer one, and the job is due when the longest
# ends. The scopes are found by a scan of the limit rows (one per key, and a RateLimited is rare):
# an index on the key would be one more entry to rewrite on every limited claim. The pause is also
# remembered by key (`remembered`), so that a limit row an enqueue creates while it lasts starts
# paused (the enqueue's `scoped` reads it).
_RATE_LIMIT = """
WITH backed AS (
    UPDATE {jobs} j
       SET state = 'available', max_attempts = j.max_attempts + 1, lease_expires_at = NULL, leased_by = NULL,
           scheduled_at = greatest(now() + make_interval(secs => %(delay)s),
                                   (SELECT max(l.paused_until) FROM {limits} l
                                     WHERE substring(l.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$') = %(key)s)),
           errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by,
               'error', %(note)s::text, 'charged', false))
     WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
    RETURNING j.id
), paused AS (
    UPDATE {limits} l
       SET paused_until = greatest(l.paused_until, now() + make_interval(secs => %(delay)s)),
           paused_by = CASE WHEN l.paused_until > now() + make_interval(secs => %(delay)s) THEN l.paused_by
                            ELSE %(id)s END
     WHERE substring(l.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$') = %(key)s AND EXISTS (SELECT 1 FROM backed)
    RETURNING l.scope
), remembered AS (
    INSERT INTO {pauses} AS p (key, paused_until, paused_by)
    SELECT %(key)s, now() + make_interval(secs => %(delay)s), %(id)s WHERE EXISTS (SELECT 1 FROM backed)
    ON CONFLICT (key) DO UPDATE SET paused_until = excluded.paused_until, paused_by = excluded.paused_by
     WHERE p.paused_until <= excluded.paused_until
)
SELECT id, (SELECT count(*) FROM paused) FROM backed
"""

# Hand back leases without spending an attempt: prefetched jobs never started, or jobs whose
# run was interrupted by a stop someone asked for (or by a neighbour's crash). Like a snooze,
# the attempt number stays spent (it is the fencing token and never repeats) and max_attempts
# moves up with it, so the job's budget of attempts is unchanged; the history says why (an entry
# as in _RECORD_FAILURES, the note for its error). Each job's queue is announced at the commit,
# so that an idle worker takes it at once rather than at its next poll (the worker that handed
# jobs back because its handlers were busy claims only at its poll meanwhile: ClaimPolicy).
_RELEASE = """
UPDATE {jobs} j
   SET state = 'available', max_attempts = j.max_attempts + 1, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by, 'error', r.note,
       'charged', false)),
       lease_expires_at = NULL, leased_by = NULL, run_alone = CASE WHEN r.alone THEN true ELSE j.run_alone END
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::text[], %(alone)s::bool[]) AS r(id, attempt, note, alone)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id AND j.attempt = r.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, pg_notify({queue_channel}, j.queue)
"""  # noqa: E501

# The leases a worker holds (used by the supervisor after reaping a dead worker). The
# lease_expires_at condition is always true for running jobs; it lets the planner use the
# reaper's partial index.
_LEASES_OF = """
SELECT id, attempt FROM {jobs}
 WHERE state = 'running' AND leased_by = %(worker)s AND lease_expires_at IS NOT NULL
"""


@dataclass(frozen=True)
class Failure:
    """A failed attempt to record: the lease it happened under, the error, the retry delay (None:
    the task's published backoff, for a caller without the app, as "Who pays an
    attempt" in docs/guarantees.md says)."""

    id: int
    attempt: int
    error: str
    backoff_seconds: float | None = None


@dataclass(frozen=True)
class Release:
    """A lease to hand back without spending an attempt, and the history note saying why;
    ``alone``: the job runs alone in its worker's process from then on (its process died while
    other handlers ran beside it)."""

    id: int
    attempt: int
    note: str
    alone: bool = False


class Outcomes(StoreBase):
    """A worker's reports on the jobs it holds."""

    _complete = Statement(_COMPLETE)
    _renew = Statement(_RENEW)
    _record_failures = Statement(_RECORD_FAILURES)
    _fail = Statement(_FAIL)
    _snooze = Statement(_SNOOZE)
    _rate_limit = Statement(_RATE_LIMIT)
    _release = Statement(_RELEASE)
    _leases_of = Statement(_LEASES_OF)

    def complete_many(
        self,
        conn: Connection,
        worker_id: str,
        leases: Iterable[tuple[int, int]],
        *,
        results: Mapping[int, str] | None = None,
    ) -> set[int]:
        """Complete every ``(job id, attempt)`` still leased to ``worker_id``; return those ids.

        ``results`` maps a job id to its result as JSON text (validated: see
        :func:`~miniqueue.core.validation.encode_result`); a job it leaves out has none. Dependents
        whose last parent this completes become available in the same statement. An id missing
        from the result lost its lease: its completion (and its result) did not happen.
        """
        return run(conn, self.complete_many_steps(worker_id, leases, results=results))

    def complete_many_steps(
        self, worker_id: str, leases: Iterable[tuple[int, int]], *, results: Mapping[int, str] | None = None
    ) -> Steps[set[int]]:
        """:meth:`complete_many` as steps."""
        ids, attempts = columns(leases)
        if not ids:
            return set()
        params = {"ids": ids, "attempts": attempts, "worker": worker_id, "results": aligned(ids, results)}
        rows: list[tuple[Any, ...]] = yield Query(self._complete, params)
        return {row[0] for row in rows}

    def complete(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, *, result: str | None = None
    ) -> None:
        """Complete one job (with ``result``, JSON text); raise LeaseLost if ``worker_id`` no
        longer holds that attempt."""
        run(conn, self.complete_steps(job_id, worker_id, attempt, result=result))

    def complete_steps(self, job_id: int, worker_id: str, attempt: int, *, result: str | None = None) -> Steps[None]:
        """:meth:`complete` as steps (``job.atransaction()`` runs them on its async connection)."""
        results = None if result is None else {job_id: result}
        if not (yield from self.complete_many_steps(worker_id, [(job_id, attempt)], results=results)):
            raise LeaseLost(job_id, worker_id, attempt)

    def renew_leases(
        self,
        conn: Connection,
        worker_id: str,
        leases: Iterable[tuple[int, int]],
        lease_duration: float,
        *,
        progress: Mapping[int, str] | None = None,
    ) -> dict[int, dt.datetime]:
        """Extend every lease still held to ``now() + lease_duration``; return id → new expiry.

        ``progress`` maps a job id to the progress its handler reported since the last renewal
        (JSON text, validated: see :meth:`~miniqueue.Job.progress`), written with the renewal;
        a job it leaves out keeps the progress it has.
        """
        ids, attempts = columns(leases)
        if not ids:
            return {}
        params = {"ids": ids, "attempts": attempts, "worker": worker_id, "lease_duration": float(lease_duration)}
        params |= {"progress": aligned(ids, progress), "channel": progress_channel(self.schema)}
        return {row[0]: row[1] for row in self._rows(conn, self._renew, params)}

    def renew_lease(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, lease_duration: float
    ) -> dt.datetime:
        """Extend one lease; return its new expiry, or raise LeaseLost."""
        renewed = self.renew_leases(conn, worker_id, [(job_id, attempt)], lease_duration)
        if job_id not in renewed:
            raise LeaseLost(job_id, worker_id, attempt)
        return renewed[job_id]

    def record_failures(self, conn: Connection, worker_id: str, failures: Sequence[Failure]) -> dict[int, State]:
        """Record failed attempts; return id → new state (``available`` or ``dead``) for those still held."""
        if not failures:
            return {}
        params = {
            "ids": bigints(f.id for f in failures),
            "attempts": ints(f.attempt for f in failures),
            "errors": [f.error for f in failures],
            "backoffs": [None if f.backoff_seconds is None else float(f.backoff_seconds) for f in failures],
            "worker": worker_id,
            "base": DEFAULT_BASE_SECONDS,
            "cap": DEFAULT_CAP_SECONDS,
        }
        return {row[0]: State(row[1]) for row in self._rows(conn, self._record_failures, params)}

    def record_failure(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, error: str, backoff_seconds: float
    ) -> State:
        """Record one failed attempt: ``available`` again after the backoff, or ``dead`` at max attempts.

        Raises LeaseLost if ``worker_id`` no longer holds that attempt.
        """
        states = self.record_failures(conn, worker_id, [Failure(job_id, attempt, error, backoff_seconds)])
        if job_id not in states:
            raise LeaseLost(job_id, worker_id, attempt)
        return states[job_id]

    def fail(self, conn: Connection, job_id: int, worker_id: str, attempt: int, error: str) -> None:
        """Fail a job permanently (state ``failed``, no retry); raise LeaseLost if not held."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "error": error}
        if not self._rows(conn, self._fail, params):
            raise LeaseLost(job_id, worker_id, attempt)

    def snooze(self, conn: Connection, job_id: int, worker_id: str, attempt: int, delay_seconds: float) -> None:
        """Make a job available again after ``delay_seconds`` without spending an attempt."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "delay": float(delay_seconds)}
        if not self._rows(conn, self._snooze, params):
            raise LeaseLost(job_id, worker_id, attempt)

    def rate_limit(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, key: str, retry_after: float
    ) -> int:
        """Pause every job of limit key ``key`` (its concurrency and rate scopes, of any task) for
        ``retry_after`` seconds fleet-wide, and make this job available again when the pause ends
        without spending an attempt, its history noting why. Returns the scopes paused; raises
        LeaseLost (pausing nothing) if the lease is no longer held."""
        note = f"rate limited: key {key!r} paused for {retry_after:g}s (RateLimited)"
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "key": key, "delay": float(retry_after)}
        rows = self._rows(conn, self._rate_limit, {**params, "note": note})
        if not rows:
            raise LeaseLost(job_id, worker_id, attempt)
        return int(rows[0][1])

    def release(self, conn: Connection, worker_id: str, releases: Sequence[Release]) -> set[int]:
        """Hand leases back without spending an attempt: each job is available again at once,
        its budget of attempts unchanged, and its history notes why. Returns the ids still held
        (and so released)."""
        if not releases:
            return set()
        params = {
            "ids": bigints(r.id for r in releases),
            "attempts": ints(r.attempt for r in releases),
            "notes": [r.note for r in releases],
            "alone": [r.alone for r in releases],
            "worker": worker_id,
        }
        return {row[0] for row in self._rows(conn, self._release, params)}

    def leases_of(self, conn: Connection, worker_id: str) -> list[tuple[int, int]]:
        """The ``(job id, attempt)`` of every job currently leased to ``worker_id``."""
        return [(row[0], row[1]) for row in self._rows(conn, self._leases_of, {"worker": worker_id})]
