"""Enqueue with keys: unique keys (kept, replaced or debounced on conflict, with an optional time
window), sequence keys and deadlines.

A unique key is enforced by PostgreSQL: the partial unique index idx_miniqueue_jobs_unique_key
(migration 021) says which jobs hold a key, and every insert here names it in its ON CONFLICT,
so two enqueues of one key can never both store a job, whatever their timing. A job of a
sequence is inserted ``waiting`` and handed the key by miniqueue_sequence_advance (migration
021) in the same statement, under the key's row lock: it runs at once only when no job of its
key holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import InvalidInput
from ..core.keys import JobKeys
from ..core.records import EnqueueResult
from ..core.steps import Query, Steps, atomic, rows
from ..core.validation import NewJob
from .base import Statement, compose
from .copying import Copying, refusing_stale_deadlines
from .insertion import HELD, HELD_MANY, HOLDS_UNIQUE_KEY, SCOPED, SEQUENCED

# Insert one job with keys or a deadline; a conflict of its idempotency key (`held`) or unique
# key stores nothing and returns the job that holds the key (when that job committed after this
# statement's snapshot, nothing: the caller looks again with _HOLDER), with the id its idempotency
# key was taken for when the unique key kept the job out (the caller gives the key back, in the
# same transaction). `held`, `scoped` (no rows for a job without limits) and `sequenced`: see
# miniqueue.store.insertion. A job of a sequence goes in `waiting`, and `advanced` hands it the
# key if no job holds it (which notifies its queue).
_ENQUEUE_KEYED = compose(
    """
WITH {scoped}, {sequenced}, {held}, ins AS (
    INSERT INTO {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state, rate_cost)
    SELECT coalesce((SELECT job_id FROM held), nextval({job_ids})), %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END, %(rate_cost)s
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state
), advanced AS (
    SELECT {advance}(ARRAY[%(sequence)s::text], %(channel)s) WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting')
)
SELECT id, false, CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END,
       NULL::bigint
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT holder, true, NULL, (SELECT job_id FROM held)
   FROM (SELECT job_id AS holder FROM {idempotency_keys} WHERE key = %(key)s
         UNION ALL
         SELECT id FROM {live} WHERE unique_key = %(unique)s AND {holds_unique_key}) h
  WHERE NOT EXISTS (SELECT 1 FROM ins)
  LIMIT 1)
""",  # noqa: E501
    scoped=SCOPED,
    held=HELD,
    sequenced=SEQUENCED,
    holds_unique_key=HOLDS_UNIQUE_KEY,
)

# Insert one job, or on a conflict of its unique key change the job that holds it while that job
# waits to run (under the lock ON CONFLICT takes on its row: a claim of it waits, or is waited
# for; a job that started is never touched): `replace` gives it this job's payload, priority and
# run-at; a debounce gives it the payload, and moves its run-at to `wait` seconds from now, but
# never past `max_wait` seconds after its first enqueue. The new job's id is drawn first (`new`)
# so that the row returned says whether it was inserted or changed. A job that holds the key and
# has started is returned by `held`, unchanged. `scoped`, `sequenced` and `advanced` as in
# _ENQUEUE_KEYED.
_ENQUEUE_REPLACING = compose(
    """
WITH {scoped}, {sequenced}, new AS MATERIALIZED (
    SELECT nextval({job_ids}) AS id
), ins AS (
    INSERT INTO {live} AS j (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                             limits, trace_context, expires_at, unique_key, unique_while_running, sequence_key, state,
                             rate_cost)
    SELECT new.id, %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           CASE WHEN %(wait)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(wait)s::float8)
                ELSE COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)) END,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END, %(rate_cost)s
      FROM new
    ON CONFLICT (unique_key) WHERE {holds_unique_key}
    DO UPDATE SET payload = excluded.payload, priority = excluded.priority,
                  scheduled_at = CASE WHEN %(wait)s::float8 IS NULL THEN excluded.scheduled_at
                                      ELSE least(excluded.scheduled_at,
                                                 j.created_at + make_interval(secs => %(max_wait)s::float8)) END
     WHERE j.state IN ('waiting', 'available')
    RETURNING j.id, j.queue, j.scheduled_at, j.state, j.id <> (SELECT id FROM new) AS replaced
), advanced AS (
    SELECT {advance}(ARRAY[%(sequence)s::text], %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting' AND NOT replaced)
)
SELECT id, replaced, replaced,
       CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT id, true, false, NULL FROM {live} WHERE NOT EXISTS (SELECT 1 FROM ins) AND unique_key = %(unique)s AND {holds_unique_key}
  LIMIT 1)
""",  # noqa: E501
    scoped=SCOPED,
    sequenced=SEQUENCED,
    holds_unique_key=HOLDS_UNIQUE_KEY,
)

# The job holding an idempotency key or a unique key, looked up again when the holder committed
# after the enqueue's snapshot was taken.
_HOLDER = compose(
    """
SELECT job_id FROM {idempotency_keys} WHERE key = %(key)s
UNION ALL
SELECT id FROM {live} WHERE unique_key = %(unique)s AND {holds_unique_key}
 LIMIT 1
""",
    holds_unique_key=HOLDS_UNIQUE_KEY,
)

# Give back an idempotency key that _ENQUEUE_KEYED took for a job its unique key then kept out.
_DROP_KEY = "DELETE FROM {idempotency_keys} WHERE key = %(key)s AND job_id = %(id)s"

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

# Insert many jobs with keys or deadlines in one statement (enqueue._MANY_JOBS with more
# columns, and `sequenced` and `advanced` as in _ENQUEUE_KEYED, for every key of the batch: its
# rows locked in key order, so that two batches never deadlock on them). A job whose key another
# holds, stored or earlier in the batch, stores nothing: the first of a batch wins, and each
# later one is matched to the holder (`ik`, `iu` in the batch; stored, by the two subqueries,
# which COALESCE runs only for a job that stored nothing: as joins, the stored holders were
# planned as a hash of every held key, 15 ms of a 25 ms batch at 50,000 of them).
_ENQUEUE_MANY_KEYED = compose(
    """
WITH {scoped}, sequenced AS (
    INSERT INTO {sequences} AS s (key, on_failure)
    SELECT key, on_failure FROM unnest(%(sequence_keys)s::text[], %(on_failures)s::text[]) AS q(key, on_failure)
     ORDER BY key
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), src AS MATERIALIZED (
    SELECT nextval({job_ids}) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(expires_ats)b::timestamptz[], %(expires_ins)b::float8[], %(uniques)b::text[],
                  %(while_running)b::boolean[], %(sequences)b::text[], %(rate_costs)b::int[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, expires_at,
                                expires_in, uniq, while_running, sequence, rate_cost, ord)
), {held_many}, ins AS (
    INSERT INTO {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state, rate_cost)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(expires_at, now() + make_interval(secs => expires_in)), uniq,
           COALESCE(while_running, true), sequence, CASE WHEN sequence IS NULL THEN 'available' ELSE 'waiting' END,
           COALESCE(rate_cost, 1)
      FROM src WHERE (SELECT count(*) FROM sequenced) >= 0 AND (key IS NULL OR id IN (SELECT job_id FROM held))
     ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state, unique_key, sequence_key
), advanced AS (
    SELECT {advance}(ARRAY(SELECT DISTINCT sequence_key FROM ins WHERE sequence_key IS NOT NULL), %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE sequence_key IS NOT NULL)
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available' AND scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord,
       COALESCE(i.id, ik.job_id, iu.id,
                (SELECT job_id FROM {idempotency_keys} WHERE key = s.key),
                (SELECT id FROM {live} WHERE unique_key = s.uniq AND {holds_unique_key})),
       i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN held ik ON i.id IS NULL AND ik.key = s.key
  LEFT JOIN ins iu ON i.id IS NULL AND ik.job_id IS NULL AND iu.unique_key = s.uniq
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM advanced) >= 0
 ORDER BY s.ord
""",
    scoped=SCOPED,
    held_many=HELD_MANY,
    holds_unique_key=HOLDS_UNIQUE_KEY,
)


class KeyedEnqueuing(Copying):
    """Inserting jobs with unique keys, sequence keys or deadlines (a large batch of kept unique keys
    by :class:`~miniqueue.store.copying.Copying`)."""

    _enqueue_keyed = Statement(_ENQUEUE_KEYED)
    _enqueue_replacing = Statement(_ENQUEUE_REPLACING)
    _holder = Statement(_HOLDER)
    _drop_key = Statement(_DROP_KEY)
    _lock_window = Statement(_LOCK_WINDOW)
    _open_window = Statement(_OPEN_WINDOW)
    _enqueue_many_keyed = Statement(_ENQUEUE_MANY_KEYED)

    def enqueue_keyed_steps(self, job: NewJob, params: dict[str, Any], *, notify: bool = True) -> Steps[EnqueueResult]:
        """Insert one job with keys or a deadline (``params``: its columns, as the plain enqueue
        binds them): on a conflict of its unique key, keep, replace or debounce as it says; a
        unique window is locked and checked first, in one transaction with the insert."""
        keyed = {**params, **_key_params(job.keys), "notify": notify, "channel": self.channel}
        if job.keys.unique_window is not None:
            return refusing_stale_deadlines(atomic(self._insert_in_window(job, keyed)))
        if job.idempotency_key is not None and job.keys.unique_key is not None:
            # Two keys: the idempotency key is taken before the unique key can keep the job out,
            # and given back then, in the same transaction (see _insert_keyed).
            return refusing_stale_deadlines(atomic(self._insert_keyed(job, keyed)))
        return refusing_stale_deadlines(self._insert_keyed(job, keyed))

    def _insert_keyed(self, job: NewJob, params: dict[str, Any]) -> Steps[EnqueueResult]:
        replacing = job.keys.on_conflict != "keep"
        query = self._enqueue_replacing if replacing else self._enqueue_keyed
        for _ in range(3):
            rows: list[tuple[Any, ...]] = yield Query(query, params)
            if rows:
                row = rows[0]
                if not replacing and row[3] is not None:  # its idempotency key, taken for nothing
                    yield Query(self._drop_key, {"key": params["key"], "id": row[3]})
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
