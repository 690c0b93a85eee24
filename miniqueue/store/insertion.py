"""The clauses the enqueue statements share (store/enqueue.py, store/keyed.py), each written once
and composed into the statements that use it (:func:`~.base.compose`); tests/sql/store.sql shows
every statement whole, as sent.

- ``{scoped}``: the rows of the limits a job (or a batch) names, created or updated, so that the
  claim finds them. A new rate scope starts with one token, so that its first job starts at once,
  and a new scope of a key under a back-pressure pause starts paused with it (see _RATE_LIMIT in
  outcomes.py); a changed limit is updated (the latest enqueue's limit is the one in force). With
  no limits, its arrays are empty and it writes nothing.
- ``{held}``: one job's idempotency key, held in miniqueue_idempotency_keys (migration 022), for
  finished jobs too: it takes the key with the new job's id, and the job goes in only if it did
  (a job without a key goes in with an id of its own). A key held already returns its job; a key
  whose holder has not committed yet makes ``held`` wait for it, and returns nothing if it did
  (the caller looks again).
- ``{held_many}``: a batch's idempotency keys, each taken once, for the first job of the batch
  that has it.
- ``{sequenced}``: creates or locks the row of one job's sequence key.
- ``{enqueued}``: one job's result: its id, inserted or not, and its queue notified when it is
  due at once; or the job that holds its idempotency key.
- ``{stored_many}``: a batch's result, one row per job in input order: its id (or its key's
  holder's), and whether it was a duplicate; the queues of the jobs due at once notified.
"""

from __future__ import annotations

#: Which jobs hold their unique key: the predicate of idx_miniqueue_jobs_unique_key, word for word
#: (an ON CONFLICT names the index by it).
HOLDS_UNIQUE_KEY = """unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)"""

SCOPED = """scoped AS (
    INSERT INTO {limits} AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN {pauses} p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
)"""

HELD = """held AS (
    INSERT INTO {idempotency_keys} (key, job_id)
    SELECT %(key)s, nextval({job_ids}) WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
)"""

HELD_MANY = """held AS (
    INSERT INTO {idempotency_keys} (key, job_id)
    SELECT key, id FROM src WHERE key IS NOT NULL ORDER BY ord
    ON CONFLICT (key) DO NOTHING
    RETURNING key, job_id
)"""

SEQUENCED = """sequenced AS (
    INSERT INTO {sequences} AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
)"""

ENQUEUED = """SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT job_id, true, NULL FROM {idempotency_keys}
 WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins)"""

STORED_MANY = """notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord, COALESCE(i.id, h.job_id, e.job_id), i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN held h ON i.id IS NULL AND h.key = s.key
  LEFT JOIN {idempotency_keys} e ON i.id IS NULL AND h.key IS NULL AND e.key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord"""

#: Every clause by the name statements use for it.
CLAUSES = {
    "scoped": SCOPED,
    "held": HELD,
    "held_many": HELD_MANY,
    "sequenced": SEQUENCED,
    "enqueued": ENQUEUED,
    "stored_many": STORED_MANY,
    "holds_unique_key": HOLDS_UNIQUE_KEY,
}
