"""Durable jobs: the steps a handler records on its job's row, durable sleep, parking a job until
a signal, and the signals themselves (see docs/guides/durable.md).

A handler's steps are the ``steps`` column of its job's row (migration 023), in the order it ran
them. Every statement here that a worker sends is *fenced* like the outcomes of
:mod:`~miniqueue.store.outcomes` (``id AND attempt AND state = 'running' AND leased_by``), so a
stale attempt records nothing: it learns by :class:`~miniqueue.core.errors.LeaseLost`.

A parked job (``waiting`` with a ``signal_key``) waits outside the claim index; a signal for its
key resumes it, and the reaper resumes those whose timeout passed. Signals and waits of a key
take one of 256 transaction-scoped advisory locks first (the key's bucket, in the schema's own
space), so that a signal sent while a job parks is either delivered to it or kept for it in the
mailbox, never neither. Buckets, not a lock per key: a batch of 10,000 signals takes at most 256
locks, well inside the server's shared lock table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.errors import LeaseLost
from ..core.steps import Query, Steps, atomic
from .base import Statement, StoreBase

# The recorded steps of the job a worker holds (NULL: none yet).
_STEPS = """
SELECT steps FROM {jobs}
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
"""

# Each statement below appends one step to the row's list. A last entry still marked "waiting"
# is a wait that never resolved (its job was cancelled while parked, then requeued): the entry
# that takes its place replaces it.

# Record a step the handler ran and its value.
_RECORD = """
UPDATE {jobs}
   SET steps = (CASE WHEN (steps -> -1) ? 'waiting' THEN steps - (-1) ELSE coalesce(steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'step', 'value', %(value)s::jsonb,
                                                       'attempt', attempt, 'at', now()))
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id
"""  # noqa: E501

# A durable sleep: record it, and give the job back, due when the sleep ends. Like a snooze, the
# attempt number stays spent and max_attempts moves up with it: no attempt is charged.
_SLEEP = """
UPDATE {jobs}
   SET steps = (CASE WHEN (steps -> -1) ? 'waiting' THEN steps - (-1) ELSE coalesce(steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'sleep',
                                                       'until', now() + make_interval(secs => %(seconds)s),
                                                       'attempt', attempt, 'at', now())),
       state = 'available', scheduled_at = now() + make_interval(secs => %(seconds)s),
       max_attempts = max_attempts + 1, lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id
"""

# Take the key's bucket lock (see the module's docstring), in bucket order: two transactions that
# lock buckets of each other's never wait for each other in a cycle.
_LOCK_KEYS = """
SELECT count(pg_advisory_xact_lock(hashtext('miniqueue-signals:' || %(schema)s), bucket))
  FROM (SELECT DISTINCT hashtext(key) & 255 AS bucket FROM unnest(%(keys)s::text[]) AS k(key) ORDER BY 1) buckets
"""

# Wait for a signal (under the key's lock): take the oldest signal kept for the key, if there is
# one, and record it as the step (the job runs on); else park the job: 'waiting' for the key until
# the timeout (NULL: none), its lease given up, no attempt charged, the step recorded as
# "waiting". The signal is taken only if the job is still held (`held`).
_WAIT = """
WITH held AS (
    SELECT id FROM {jobs}
     WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
       FOR UPDATE
), mail AS (
    DELETE FROM {signals}
     WHERE id = (SELECT id FROM {signals} WHERE key = %(key)s ORDER BY id LIMIT 1) AND EXISTS (SELECT 1 FROM held)
    RETURNING data
), waited AS (
UPDATE {jobs} j
   SET steps = (CASE WHEN (j.steps -> -1) ? 'waiting' THEN j.steps - (-1) ELSE coalesce(j.steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'signal', 'key', %(key)s::text,
                                                       'attempt', j.attempt, 'at', now())
                                    || CASE WHEN m.data IS NULL THEN jsonb_build_object('waiting', true)
                                            ELSE jsonb_build_object('value', m.data) END),
       state = CASE WHEN m.data IS NULL THEN 'waiting' ELSE j.state END,
       signal_key = CASE WHEN m.data IS NULL THEN %(key)s::text END,
       signal_timeout_at = CASE WHEN m.data IS NULL THEN now() + make_interval(secs => %(timeout)s::float8) END,
       max_attempts = CASE WHEN m.data IS NULL THEN j.max_attempts + 1 ELSE j.max_attempts END,
       lease_expires_at = CASE WHEN m.data IS NULL THEN NULL ELSE j.lease_expires_at END,
       leased_by = CASE WHEN m.data IS NULL THEN NULL ELSE j.leased_by END
  FROM held LEFT JOIN mail m ON true
 WHERE j.id = held.id
RETURNING j.state, m.data
)
SELECT state, data FROM waited
"""

# Send signals (under their keys' locks): the n-th signal of a key in the batch goes to the n-th
# job parked for it, oldest first (`parked`: locked, as of their latest version, so a job the
# reaper timed out meanwhile is not one), which becomes available at once with the signal's data
# as its step's value, its queue notified; a signal no job waits for is kept in the mailbox, in
# the batch's order. Returns, per signal in the batch's order, the job it resumed (NULL: kept).
_SIGNAL = """
WITH sent AS (
    SELECT s.key, s.data::jsonb AS data, s.n, row_number() OVER (PARTITION BY s.key ORDER BY s.n) AS turn
      FROM unnest(%(keys)s::text[], %(data)s::text[]) WITH ORDINALITY AS s(key, data, n)
), parked AS (
    SELECT id, signal_key FROM {jobs}
     WHERE state = 'waiting' AND signal_key = ANY(%(keys)s::text[])
       FOR UPDATE
), ranked AS (
    SELECT id, signal_key AS key, row_number() OVER (PARTITION BY signal_key ORDER BY id) AS turn FROM parked
), delivered AS (
UPDATE {jobs} j
   SET state = 'available', signal_key = NULL, signal_timeout_at = NULL, scheduled_at = now(),
       steps = (j.steps - (-1)) || jsonb_build_array(((j.steps -> -1) - 'waiting')
                                                     || jsonb_build_object('value', s.data, 'delivered_at', now()))
  FROM ranked r JOIN sent s ON s.key = r.key AND s.turn = r.turn
 WHERE j.id = r.id AND j.state = 'waiting'
RETURNING j.id, s.n, pg_notify({queue_channel}, j.queue)
), kept AS (
INSERT INTO {signals} (key, data)
SELECT key, data FROM sent s WHERE NOT EXISTS (SELECT 1 FROM ranked r WHERE r.key = s.key AND r.turn = s.turn)
 ORDER BY n
RETURNING 1)
SELECT d.id FROM sent s LEFT JOIN delivered d ON d.n = s.n
 WHERE (SELECT count(*) FROM kept) >= 0
 ORDER BY s.n
"""

# The reaper's: resume parked jobs whose timeout passed. The wait's step records the timeout
# (its handler raises SignalTimeout there); the job is available at once, its queue notified.
# A job a signal is resuming right now is locked, and passed over.
_TIME_OUT_WAITS = """
UPDATE {jobs} j
   SET state = 'available', signal_key = NULL, signal_timeout_at = NULL, scheduled_at = now(),
       steps = (j.steps - (-1)) || jsonb_build_array(((j.steps -> -1) - 'waiting')
                                                     || jsonb_build_object('timed_out', true, 'delivered_at', now()))
 WHERE j.id = ANY(ARRAY(
        SELECT id FROM {jobs}
         WHERE state = 'waiting' AND signal_timeout_at IS NOT NULL AND signal_timeout_at <= now()
         ORDER BY signal_timeout_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND j.state = 'waiting' AND j.signal_timeout_at <= now()
RETURNING j.id, pg_notify({queue_channel}, j.queue)
"""

# The signals kept for no one yet, per key (oldest first), for operators.
_KEPT = """
SELECT key, count(*), min(sent_at) FROM {signals}
 WHERE %(key)s::text IS NULL OR key = %(key)s
 GROUP BY key ORDER BY min(sent_at)
"""


class Durable(StoreBase):
    """Steps, sleeps, waits and signals."""

    _steps = Statement(_STEPS)
    _record_step = Statement(_RECORD)
    _sleep = Statement(_SLEEP)
    _lock_keys = Statement(_LOCK_KEYS)
    _wait = Statement(_WAIT)
    _signal = Statement(_SIGNAL)
    _time_out_waits = Statement(_TIME_OUT_WAITS)
    _kept = Statement(_KEPT)

    def recorded_steps_steps(self, job_id: int, worker_id: str, attempt: int) -> Steps[list[dict[str, Any]]]:
        """The steps job ``job_id`` recorded so far (raises LeaseLost if ``worker_id`` no
        longer holds that attempt)."""
        rows: list[tuple[Any, ...]] = yield Query(self._steps, {"id": job_id, "attempt": attempt, "worker": worker_id})
        if not rows:
            raise LeaseLost(job_id, worker_id, attempt)
        return list(rows[0][0] or [])

    def record_step_steps(self, job_id: int, worker_id: str, attempt: int, name: str, value: str) -> Steps[None]:
        """Record step ``name`` with ``value`` (JSON text); LeaseLost if not held."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "name": name, "value": value}
        if not (yield Query(self._record_step, params)):
            raise LeaseLost(job_id, worker_id, attempt)

    def sleep_steps(self, job_id: int, worker_id: str, attempt: int, name: str, seconds: float) -> Steps[None]:
        """Record sleep ``name`` and give the job back, due in ``seconds``; LeaseLost if not held."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "name": name, "seconds": float(seconds)}
        if not (yield Query(self._sleep, params)):
            raise LeaseLost(job_id, worker_id, attempt)

    def wait_steps(
        self, job_id: int, worker_id: str, attempt: int, name: str, key: str, timeout: float | None
    ) -> Steps[tuple[bool, Any]]:
        """Wait for a signal of ``key``: ``(True, data)`` if one was kept (the step is recorded
        and the job runs on), ``(False, None)`` if the job is parked now. LeaseLost if not held."""
        params = {
            "id": job_id,
            "attempt": attempt,
            "worker": worker_id,
            "name": name,
            "key": key,
            "timeout": None if timeout is None else float(timeout),
        }
        return (yield from atomic(self._locked_wait([key], params, job_id, worker_id, attempt)))

    def _locked_wait(
        self, keys: list[str], params: dict[str, Any], job_id: int, worker_id: str, attempt: int
    ) -> Steps[tuple[bool, Any]]:
        yield Query(self._lock_keys, {"schema": self.schema, "keys": keys})
        rows: list[tuple[Any, ...]] = yield Query(self._wait, params)
        if not rows:
            raise LeaseLost(job_id, worker_id, attempt)
        state, data = rows[0]
        return (False, None) if state == "waiting" else (True, data)

    def signal_steps(self, keys: Sequence[str], data: Sequence[str]) -> Steps[list[int | None]]:
        """Send signals: ``keys[i]`` with ``data[i]`` (JSON text). Returns, per signal, the id
        of the job it resumed, or None where it was kept for a job that waits later."""
        if not keys:
            return []
        return (yield from atomic(self._locked_signal(list(keys), list(data))))

    def _locked_signal(self, keys: list[str], data: list[str]) -> Steps[list[int | None]]:
        yield Query(self._lock_keys, {"schema": self.schema, "keys": keys})
        rows: list[tuple[Any, ...]] = yield Query(self._signal, {"keys": keys, "data": data})
        return [row[0] for row in rows]

    def time_out_waits_steps(self, limit: int = 1000) -> Steps[list[int]]:
        """Resume up to ``limit`` parked jobs whose timeout passed; their ids."""
        rows: list[tuple[Any, ...]] = yield Query(self._time_out_waits, {"limit": limit})
        return sorted(row[0] for row in rows)

    def kept_signals_steps(self, key: str | None = None) -> Steps[list[tuple[str, int, Any]]]:
        """The signals kept for no job yet: ``(key, how many, oldest sent_at)``, oldest first."""
        rows: list[tuple[Any, ...]] = yield Query(self._kept, {"key": key})
        return [(row[0], row[1], row[2]) for row in rows]
