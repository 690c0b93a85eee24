"""The clauses every statement that finishes jobs shares: the completion of a batch (the worker's
and the claim's), and what follows any statement that finishes jobs or removes finished ones.

Each is a named clause composed into the statements that use it (:func:`~.base.compose`), so that
each is written once; tests/sql/store.sql shows every statement whole, as sent.

After a CTE ``rows`` that finishes jobs (its rows: ``id, queue, state, dependents, awaited,
sequence_key``, the new state), :func:`finishing` adds:

- ``counted``: counts the finished jobs among the rows changed: one upsert per queue and terminal
  state into this backend's shard of miniqueue_counts (migration 011);
- ``per_minute``: counts them in this minute's row of the shard (migration 015), for the
  throughput chart;
- ``settled``: settles what they mean for others (miniqueue_settle, migration 013): wakes whoever
  waits for them, releases the dependents of completed ones, cancels those of failed, dead,
  cancelled or deleted ones ('deleted' stands for a job deleted before it finished), and hands a
  sequence's key on. The function is called only when one of them has a dependent, a waiter or a
  sequence key, so a drain of independent jobs pays for one scan of its own RETURNING rows. The
  statement's own count runs first (the function counts the dependents it cancels, maybe in the
  same row of the counts, and a row a statement changes after a function it called did is an
  error). Each list is ordered by (parent, dependent) so the three arrays of cancellations line up.

A CTE runs only if the statement reads it: the statement's final ``WHERE (SELECT count(*) FROM
settled) >= 0`` reads ``settled``, which reads ``counted``, and both conditions are always true
(``finishing(rows, select=...)`` ends a statement so, selecting from ``rows``).
A statement that removes finished jobs takes them off the counts instead (:func:`counted_off`:
-count(*), in the hour each finished in); the minutes they finished in keep them. One that
deletes jobs lets go of their idempotency keys (:func:`unkeyed`).
"""

from __future__ import annotations

from .base import compose

_COUNTED = """counted AS (
INSERT INTO {counts} AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM {rows}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)"""

_COUNTED_OFF = """counted AS (
INSERT INTO {counts} AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', finished_at, 'UTC'), -count(*) FROM {rows}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)"""

_PER_MINUTE = """per_minute AS (
INSERT INTO {finished_minutes} AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM {rows}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1)"""

_SETTLED = """settled AS (
SELECT {settle}(
    notify_ids => ARRAY(SELECT id FROM {rows} WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM {rows}, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM {rows}, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM {rows}, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM {rows}, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => {finished_channel}, queue_channel => {queue_channel},
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM {rows} WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM {rows} WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)"""  # noqa: E501


def finishing(rows: str, select: str | None = None) -> str:
    """``counted``, ``per_minute`` and ``settled`` of the jobs CTE ``rows`` finished; with
    ``select``, the statement's end as well: those columns of ``rows``, read once ``settled`` ran."""
    clauses = compose(f"{_COUNTED}, {_PER_MINUTE}, {_SETTLED}", rows=rows)
    if select is None:
        return clauses
    return f"{clauses}\nSELECT {select} FROM {rows} WHERE (SELECT count(*) FROM settled) >= 0"


def counted_off(rows: str) -> str:
    """``counted`` of the finished jobs CTE ``rows`` removed or requeued: taken off the counts."""
    return compose(_COUNTED_OFF, rows=rows)


_UNKEYED = """unkeyed AS (
    DELETE FROM {idempotency_keys} k USING {rows} gone WHERE k.key = gone.idempotency_key AND k.job_id = gone.id
)"""


def unkeyed(rows: str) -> str:
    """``unkeyed``: the idempotency keys of the jobs CTE ``rows`` deleted, let go of."""
    return compose(_UNKEYED, rows=rows)


def settled(rows: str) -> str:
    """``settled`` of ``rows`` alone (after a ``counted``): for a statement that removes jobs."""
    return compose(_SETTLED, rows=rows)


# The completion of a batch of leases, storing each job's result, fenced: the worker's (outcomes)
# and the one the claim starts with (claim.sql). Each row looks up its own attempt (and result) by
# binary search: `ids` is sorted (see rows.columns), so width_bucket() gives an id's position in
# O(log n). A join to unnest() planned as a nested loop comparing every pair, and array_position()
# scans the array: both are quadratic in the batch (7 ms per 1,000 jobs, against 0.7 ms).
# `results` is JSON text aligned with `ids`, or empty when no job of the batch returned anything.
COMPLETION = compose(
    """completed AS (
UPDATE {jobs}
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), {finishing}""",
    finishing=finishing("completed"),
)
