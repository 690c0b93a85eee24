"""Enqueue with keys: unique keys (kept, replaced or debounced on conflict, with an optional time
window), sequence keys and deadlines; and the sequences as operators see and release them.

A unique key is enforced by PostgreSQL: the partial unique index idx_miniqueue_jobs_unique_key
(migration 021) says which jobs hold a key, and every insert here names it in its ON CONFLICT,
so two enqueues of one key can never both store a job, whatever their timing. A job of a
sequence is inserted ``waiting`` and handed the key by miniqueue_sequence_advance (migration
021) in the same statement, under the key's row lock: it runs at once only when no job of its
key holds it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.keys import JobKeys
from ..core.records import BlockedSequence, EnqueueResult
from ..core.steps import CopyIn, Query, Steps, atomic, rows, run
from ..core.validation import NewJob
from .base import Statement, StoreBase
from .rows import monitoring

# Which jobs hold their unique key: the predicate of idx_miniqueue_jobs_unique_key, word for word
# (an ON CONFLICT names the index by it).
HELD = """unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)"""

# Insert one job with keys or a deadline; a conflict of its idempotency key or unique key stores
# nothing and returns the job that holds the key (`held`; when that job committed after this
# statement's snapshot, nothing: the caller looks again with _HOLDER). `scoped` as in
# enqueue._ENQUEUE_LIMITED (no rows for a job without limits). `sequenced` creates or locks the
# row of the job's sequence key, the job goes in `waiting`, and `advanced` hands it the key if
# no job holds it (which notifies its queue).
_ENQUEUE_KEYED = f"""
WITH scoped AS (
    INSERT INTO {{limits}} AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO {{sequences}} AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), ins AS (
    INSERT INTO {{jobs}} (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state)
    SELECT %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state
), advanced AS (
    SELECT {{advance}}(ARRAY[%(sequence)s::text], %(channel)s) WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting')
)
SELECT id, false, CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT id, true, NULL FROM {{jobs}}
  WHERE NOT EXISTS (SELECT 1 FROM ins)
    AND (idempotency_key = %(key)s OR unique_key = %(unique)s AND {HELD})
  LIMIT 1)
"""  # noqa: E501

# Insert one job, or on a conflict of its unique key change the job that holds it while that job
# waits to run (under the lock ON CONFLICT takes on its row: a claim of it waits, or is waited
# for; a job that started is never touched): `replace` gives it this job's payload, priority and
# run-at; a debounce gives it the payload, and moves its run-at to `wait` seconds from now, but
# never past `max_wait` seconds after its first enqueue. The new job's id is drawn first (`new`)
# so that the row returned says whether it was inserted or changed. A job that holds the key and
# has started is returned by `held`, unchanged. `scoped`, `sequenced` and `advanced` as in
# _ENQUEUE_KEYED.
_ENQUEUE_REPLACING = f"""
WITH scoped AS (
    INSERT INTO {{limits}} AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO {{sequences}} AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), new AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id
), ins AS (
    INSERT INTO {{jobs}} AS j (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                             limits, trace_context, expires_at, unique_key, unique_while_running, sequence_key, state)
    SELECT new.id, %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           CASE WHEN %(wait)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(wait)s::float8)
                ELSE COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)) END,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END
      FROM new
    ON CONFLICT (unique_key) WHERE {HELD}
    DO UPDATE SET payload = excluded.payload, priority = excluded.priority,
                  scheduled_at = CASE WHEN %(wait)s::float8 IS NULL THEN excluded.scheduled_at
                                      ELSE least(excluded.scheduled_at,
                                                 j.created_at + make_interval(secs => %(max_wait)s::float8)) END
     WHERE j.state IN ('waiting', 'available')
    RETURNING j.id, j.queue, j.scheduled_at, j.state, j.id <> (SELECT id FROM new) AS replaced
), advanced AS (
    SELECT {{advance}}(ARRAY[%(sequence)s::text], %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting' AND NOT replaced)
)
SELECT id, replaced, replaced,
       CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT id, true, false, NULL FROM {{jobs}} WHERE NOT EXISTS (SELECT 1 FROM ins) AND unique_key = %(unique)s AND {HELD}
  LIMIT 1)
"""

# The job holding an idempotency key or a unique key, looked up again when the holder committed
# after the enqueue's snapshot was taken.
_HOLDER = f"""
SELECT id FROM {{jobs}}
 WHERE idempotency_key = %(key)s OR unique_key = %(unique)s AND {HELD}
 LIMIT 1
"""

# Lock the time window of a unique key (making its row, open, if there is none) and say whether
# it is still running, and for which job. The lock holds until the enqueue commits, so a second
# enqueue of the key waits here and then sees the window the first one opened.
_LOCK_WINDOW = """
INSERT INTO {unique_windows} AS w (key, job_id, until) VALUES (%(unique)s, 0, '-infinity')
ON CONFLICT (key) DO UPDATE SET key = excluded.key
RETURNING job_id, until > now()
"""

# Open a unique key's window for the job just enqueued.
_OPEN_WINDOW = """
UPDATE {unique_windows} SET job_id = %(id)s, until = now() + make_interval(secs => %(window)s) WHERE key = %(unique)s
"""

# Insert many jobs with keys or deadlines in one statement (enqueue._ENQUEUE_MANY with more
# columns, and `sequenced` and `advanced` as in _ENQUEUE_KEYED, for every key of the batch: its
# rows locked in key order, so that two batches never deadlock on them). A job whose key another
# holds, stored or earlier in the batch, stores nothing: the first of a batch wins, and each
# later one is matched to the holder (`ik`, `iu` in the batch; stored, by the two subqueries,
# which COALESCE runs only for a job that stored nothing: as joins, the stored holders were
# planned as a hash of every held key, 15 ms of a 25 ms batch at 50,000 of them).
_ENQUEUE_MANY_KEYED = """
WITH scoped AS (
    INSERT INTO {limits} AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO {sequences} AS s (key, on_failure)
    SELECT key, on_failure FROM unnest(%(sequence_keys)s::text[], %(on_failures)s::text[]) AS q(key, on_failure)
     ORDER BY key
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), src AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(expires_ats)b::timestamptz[], %(expires_ins)b::float8[], %(uniques)b::text[],
                  %(while_running)b::boolean[], %(sequences)b::text[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, expires_at,
                                expires_in, uniq, while_running, sequence, ord)
), ins AS (
    INSERT INTO {jobs} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(expires_at, now() + make_interval(secs => expires_in)), uniq,
           COALESCE(while_running, true), sequence, CASE WHEN sequence IS NULL THEN 'available' ELSE 'waiting' END
      FROM src WHERE (SELECT count(*) FROM sequenced) >= 0 ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state, idempotency_key, unique_key, sequence_key
), advanced AS (
    SELECT {advance}(ARRAY(SELECT DISTINCT sequence_key FROM ins WHERE sequence_key IS NOT NULL), %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE sequence_key IS NOT NULL)
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available' AND scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord,
       COALESCE(i.id, ik.id, iu.id,
                (SELECT id FROM {jobs} WHERE idempotency_key = s.key),
                (SELECT id FROM {jobs} WHERE unique_key = s.uniq AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running))),
       i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN ins ik ON i.id IS NULL AND ik.idempotency_key = s.key
  LEFT JOIN ins iu ON i.id IS NULL AND ik.id IS NULL AND iu.unique_key = s.uniq
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM advanced) >= 0
 ORDER BY s.ord
"""

# A large batch without keys goes by COPY (enqueue.Enqueuing.copy_many): 25% faster than the batch
# statement (enqueue._ENQUEUE_MANY) at 10,000 jobs, though its four extra round trips make it
# slower below a few hundred. Its ids are
# drawn first (to return them), with the transaction's now(): the database clock that every
# job's scheduled_at counts from, exactly as the column default would.
_DRAW_IDS = """
SELECT now(), ARRAY(SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass)
                      FROM generate_series(1, %(count)s))
"""

# Wake the workers of each queue the COPY gave a job due at once.
_NOTIFY_QUEUES = "SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS q(queue)"

# A large batch whose jobs have unique keys (kept on a conflict, without a window) or deadlines,
# and nothing else of the keyed statements, goes by COPY, as a batch without keys does (the rows
# stream while the client checks the next ones: _ENQUEUE_MANY_KEYED reached 0.6x of a COPY).
# A COPY cannot pass over a row, so a key held already, or twice in the batch, aborts it, and
# the batch goes by _ENQUEUE_MANY_KEYED instead, in the same transaction.
# A batch of jobs due at once, without deadlines, untraced, whose keys are held while they run,
# leaves scheduled_at and unique_while_running to their defaults, as copy_many does (parsing
# the timestamps cost the server a tenth of the COPY).
_COPY_KEYED = """
COPY {jobs} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at, trace_context,
             unique_key, unique_while_running, expires_at) FROM STDIN"""
_COPY_KEYED_DUE = """
COPY {jobs} (id, queue, task, payload, priority, max_attempts, attempt_budget, unique_key) FROM STDIN"""

# Hand a blocked sequence key on: its failed or dead head stays as it is, and the key's next job
# runs (miniqueue_sequence_advance, forced). Returns the job that blocked it (no row: the key is
# not blocked).
_RELEASE_SEQUENCE = """
WITH blocked AS (
    SELECT s.head FROM {sequences} s JOIN {jobs} h ON h.id = s.head
     WHERE s.key = %(key)s AND h.state IN ('failed', 'dead')
       FOR UPDATE OF s
), released AS (
    SELECT {advance}(ARRAY[%(key)s::text], {queue_channel}, force => true) WHERE EXISTS (SELECT 1 FROM blocked)
)
SELECT head FROM blocked WHERE (SELECT count(*) FROM released) >= 0
"""

# The sequence keys a failed or dead job blocks, with that job, its state and how many jobs wait
# behind it (read from the sequences' waiting index: its cost grows with the jobs waiting).
_BLOCKED_SEQUENCES = """
SELECT s.key, s.head, h.state, h.task, h.last_error,
       (SELECT count(*) FROM {jobs} w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM {sequences} s JOIN {jobs} h ON h.id = s.head
 WHERE h.state IN ('failed', 'dead') AND s.on_failure = 'block'
 ORDER BY s.key LIMIT %(limit)s
"""

# One sequence key: the job holding it (NULL: none) and its state, and the jobs waiting behind it.
_SEQUENCE = """
SELECT s.head, h.state, s.on_failure,
       (SELECT count(*) FROM {jobs} w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM {sequences} s LEFT JOIN {jobs} h ON h.id = s.head
 WHERE s.key = %(key)s
"""


class KeyedEnqueuing(StoreBase):
    """Inserting jobs with unique keys, sequence keys or deadlines; the sequences' state."""

    _enqueue_keyed = Statement(_ENQUEUE_KEYED)
    _enqueue_replacing = Statement(_ENQUEUE_REPLACING)
    _holder = Statement(_HOLDER)
    _lock_window = Statement(_LOCK_WINDOW)
    _open_window = Statement(_OPEN_WINDOW)
    _enqueue_many_keyed = Statement(_ENQUEUE_MANY_KEYED)
    _copy_keyed = Statement(_COPY_KEYED)
    _copy_keyed_due = Statement(_COPY_KEYED_DUE)
    _draw_ids = Statement(_DRAW_IDS)
    _notify_queues = Statement(_NOTIFY_QUEUES)
    _release_sequence = Statement(_RELEASE_SEQUENCE)
    _blocked_sequences = Statement(_BLOCKED_SEQUENCES)
    _sequence = Statement(_SEQUENCE)

    def enqueue_keyed_steps(self, job: NewJob, params: dict[str, Any], *, notify: bool = True) -> Steps[EnqueueResult]:
        """Insert one job with keys or a deadline (``params``: its columns, as the plain enqueue
        binds them): on a conflict of its unique key, keep, replace or debounce as it says; a
        unique window is locked and checked first, in one transaction with the insert."""
        keyed = {**params, **_key_params(job.keys), "notify": notify, "channel": self.channel}
        if job.keys.unique_window is None:
            return refusing_stale_deadlines(self._insert_keyed(job, keyed))
        return refusing_stale_deadlines(atomic(self._insert_in_window(job, keyed)))

    def _insert_keyed(self, job: NewJob, params: dict[str, Any]) -> Steps[EnqueueResult]:
        replacing = job.keys.on_conflict != "keep"
        query = self._enqueue_replacing if replacing else self._enqueue_keyed
        params = {**params, "table": self.table_name} if replacing else params
        for _ in range(3):
            rows: list[tuple[Any, ...]] = yield Query(query, params)
            if rows:
                row = rows[0]
                return EnqueueResult(id=row[0], duplicate=row[1], replaced=replacing and row[2])
            # The holder of the key committed after this statement's snapshot: a new statement
            # sees it, unless it has let go of the key meanwhile, and then the insert goes again.
            held: list[tuple[Any, ...]] = yield Query(self._holder, {"key": params["key"], "unique": params["unique"]})
            if held:
                return EnqueueResult(id=held[0][0], duplicate=True)
        raise InvalidInput(f"unique key {job.keys.unique_key!r} changed hands three times while it was enqueued")

    def _insert_in_window(self, job: NewJob, params: dict[str, Any]) -> Steps[EnqueueResult]:
        unique = {"unique": job.keys.unique_key}
        rows: list[tuple[Any, ...]] = yield Query(self._lock_window, unique)
        [(holder, running)] = rows
        if running:
            return EnqueueResult(id=holder, duplicate=True)
        result = yield from self._insert_keyed(job, params)
        if not result.duplicate:
            yield Query(self._open_window, {**unique, "id": result.id, "window": job.keys.unique_window})
        return result

    def enqueue_many_keyed_steps(
        self, jobs: Sequence[NewJob], params: dict[str, Any], *, notify: bool = True
    ) -> Steps[list[EnqueueResult]]:
        """Insert a batch of jobs of which some have keys or deadlines, none replacing and none
        with a window, in one statement (``params``: the plain batch's columns and limits)."""
        keys = [j.keys for j in jobs]
        sequences = {k.sequence_key: k.on_failure for k in keys if k.sequence_key is not None}
        params = {
            **params,
            # As in enqueue_many_steps, a column every job leaves at its default goes as an empty
            # array, which unnest() pads with NULLs (and unique_while_running's NULL means true).
            "expires_ats": _column([k.expires_at for k in keys]),
            "expires_ins": _column([k.expires_in for k in keys]),
            "uniques": _column([k.unique_key for k in keys]),
            "while_running": []
            if all(k.unique_while_running for k in keys)
            else [k.unique_while_running for k in keys],
            "sequences": _column([k.sequence_key for k in keys]),
            "sequence_keys": list(sequences),
            "on_failures": list(sequences.values()),
            "notify": notify,
            "channel": self.channel,
        }
        stored = yield from refusing_stale_deadlines(rows(self._enqueue_many_keyed, params))
        results = [EnqueueResult(id=row[1], duplicate=row[2]) for row in stored]
        for i, result in enumerate(results):
            if result.id is None:  # the holder of the key committed after the statement's snapshot
                lookup = {"key": jobs[i].idempotency_key, "unique": jobs[i].keys.unique_key}
                held: list[tuple[Any, ...]] = yield Query(self._holder, lookup)
                if not held:
                    raise InvalidInput(f"job {i}: its key changed hands while it was enqueued; enqueue it again")
                results[i] = EnqueueResult(id=held[0][0], duplicate=True)
        return results

    def copy_keyed_steps(
        self,
        count: int,
        jobs: Iterable[NewJob],
        fallback: Callable[[list[NewJob]], Steps[list[EnqueueResult]]],
        *,
        due: bool,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> Steps[list[EnqueueResult]]:
        """Insert ``count`` jobs whose keys a COPY can store (see _COPY_KEYED: unique keys kept
        on a conflict, deadlines) by COPY in one transaction, ``jobs`` consumed as the rows
        stream; if a unique key is held (or held twice in the batch), store them all by
        ``fallback`` (the batch statement) instead. Results are in input order. ``due``: every
        job is due at once, without a deadline, and holds its key while it runs (and the batch
        is untraced), so scheduled_at is left to its default."""
        seen: list[NewJob] = []
        stream = iter(jobs)
        copied = atomic(self._copy_keyed_in_one(count, stream, seen, due, notify, trace_context))
        try:
            results: list[EnqueueResult] = yield from refusing_stale_deadlines(copied)
            return results
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "idx_miniqueue_jobs_unique_key":
                raise
        return (yield from fallback([*seen, *stream]))

    def _copy_keyed_in_one(
        self,
        count: int,
        jobs: Iterator[NewJob],
        seen: list[NewJob],
        due: bool,
        notify: bool,
        trace_context: str | None,
    ) -> Steps[list[EnqueueResult]]:
        drawn: list[tuple[Any, ...]] = yield Query(self._draw_ids, {"table": self.table_name, "count": count})
        [(now, ids)] = drawn
        ids.sort()  # one session's nextval() only grows: already in order, so this costs nothing
        queues: set[str] = set()
        if due:
            yield CopyIn(self._copy_keyed_due, _due_keyed_rows(ids, jobs, seen, queues))
        else:
            yield CopyIn(self._copy_keyed, _keyed_rows(ids, jobs, seen, now, queues, trace_context))
        if notify and queues:
            yield Query(self._notify_queues, {"channel": self.channel, "queues": sorted(queues)})
        return [EnqueueResult(id=job_id) for job_id in ids]

    def release_sequence_steps(self, key: str) -> Steps[tuple[int, int | None]]:
        """Hand sequence ``key`` on from the failed or dead job that blocks it to its next job;
        return ``(blocking job, job holding it now or None)``. InvalidInput when it is not blocked."""
        return atomic(self._release_sequence_in_one(key))

    def _release_sequence_in_one(self, key: str) -> Steps[tuple[int, int | None]]:
        released: list[tuple[Any, ...]] = yield Query(self._release_sequence, {"key": key})
        found: list[tuple[Any, ...]] = yield Query(self._sequence, {"key": key})
        if released:
            return released[0][0], found[0][0]
        if not found:
            raise InvalidInput(f"sequence key {key!r} is unknown: no job of it is waiting, running or blocking it")
        head, state, _, waiting = found[0]
        holder = "no job holds it" if head is None else f"job {head} holds it ({state})"
        raise InvalidInput(f"sequence key {key!r} is not blocked: {holder}, {waiting} waiting")

    def blocked_sequences(self, conn: Connection, limit: int = 1000) -> list[BlockedSequence]:
        """The sequence keys a failed or dead job blocks, by key."""
        return run(conn, self.blocked_sequences_steps(limit))

    def blocked_sequences_steps(self, limit: int = 1000) -> Steps[list[BlockedSequence]]:
        """The sequence keys a failed or dead job blocks, by key."""
        found: list[tuple[Any, ...]] = yield from atomic(monitoring(Query(self._blocked_sequences, {"limit": limit})))
        return [BlockedSequence(*row) for row in found]


def copyable(job: NewJob) -> bool:
    """Whether a job's keys are ones a COPY can store (see _COPY_KEYED)."""
    keys = job.keys
    return (
        job.idempotency_key is None
        and not job.scopes
        and keys.sequence_key is None
        and keys.unique_window is None
        and keys.on_conflict == "keep"
    )


def _keyed_rows(
    ids: Sequence[int],
    jobs: Iterator[NewJob],
    seen: list[NewJob],
    now: dt.datetime,
    due: set[str],
    trace_context: str | None,
) -> Iterator[tuple[Any, ...]]:
    """The rows of _COPY_KEYED, made as they stream (each job kept in ``seen``); adds to ``due``
    each queue given a job due at once. Times count from ``now``, the transaction's database clock."""
    for job_id, job in zip(ids, jobs, strict=False):
        seen.append(job)
        if not copyable(job):
            raise ValueError("copy_keyed_steps() was given a job whose keys a COPY cannot store: use enqueue_many()")
        keys = job.keys
        at = job.run_at or now + dt.timedelta(seconds=job.delay_seconds)
        expires = keys.expires_at or (None if keys.expires_in is None else now + dt.timedelta(seconds=keys.expires_in))
        if at <= now:
            due.add(job.queue)
        yield (
            job_id,
            job.queue,
            job.task,
            job.payload_json,
            job.priority,
            job.max_attempts,
            job.max_attempts,
            at,
            trace_context,
            keys.unique_key,
            keys.unique_while_running,
            expires,
        )


def _due_keyed_rows(
    ids: Sequence[int], jobs: Iterator[NewJob], seen: list[NewJob], queues: set[str]
) -> Iterator[tuple[Any, ...]]:
    """The rows of _COPY_KEYED_DUE, made as they stream (each job kept in ``seen``); adds each
    job's queue to ``queues`` (all are due at once)."""
    for job_id, job in zip(ids, jobs, strict=False):
        seen.append(job)
        keys = job.keys
        # One expression rather than copyable() and the rest: it runs for every row of the batch.
        if not (
            job.run_at is None
            and not job.delay_seconds
            and job.idempotency_key is None
            and not job.scopes
            and keys.sequence_key is None
            and keys.expires_at is None
            and keys.expires_in is None
            and keys.unique_window is None
            and keys.on_conflict == "keep"
            and keys.unique_while_running
        ):
            raise ValueError("copy_keyed_steps(due=True) was given a job it cannot store so: use due=False")
        queues.add(job.queue)
        yield (
            job_id,
            job.queue,
            job.task,
            job.payload_json,
            job.priority,
            job.max_attempts,
            job.max_attempts,
            keys.unique_key,
        )


def _column(values: list[Any]) -> list[Any]:
    """A batch's column, or an empty array when every job leaves it NULL."""
    return values if any(v is not None for v in values) else []


def _key_params(keys: JobKeys) -> dict[str, Any]:
    """The parameters of a job's keys and deadline, for the keyed statements."""
    return {
        "expires_at": keys.expires_at,
        "expires_in": keys.expires_in,
        "unique": keys.unique_key,
        "while_running": keys.unique_while_running,
        "sequence": keys.sequence_key,
        "on_failure": keys.on_failure,
        "wait": keys.debounce_wait,
        "max_wait": keys.debounce_max_wait,
    }


def refusing_stale_deadlines(steps: Steps[Any]) -> Steps[Any]:
    """``steps``, with a deadline that is not after the enqueue (on the database clock) refused
    as bad input: such a job could never start."""
    try:
        return (yield from steps)
    except psycopg.errors.CheckViolation as exc:
        if exc.diag.constraint_name != "expires_after_enqueue":
            raise
        raise InvalidInput(
            "expires_at is not in the future on the database clock: a job that expired before it was enqueued "
            "would never start; give a later expires_at, or expires_in"
        ) from exc
