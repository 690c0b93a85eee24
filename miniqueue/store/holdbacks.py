"""Why a job has not run: the facts that hold it back, read in one transaction (one clock,
``now()``), for :meth:`miniqueue.Client.why` to put into words.

Each statement reads what one rule of the claim (or of a waiting job's release) looks at: the
job's row and its queue's settings, the workers the registry shows, the limits it needs, its
parents, its sequence key, and the jobs ahead of it. Which of them run depends on the job's
state: a finished job needs only its row. None reads finished rows beyond a probe by id: each
reads the hot table through a partial index, the registry (a row per supervised process) or
the small settings tables.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import JobNotFound
from ..core.job_facts import MAX_COUNTED, JobFacts, ParentFacts, ScopeFacts, SequenceFacts, WhyFacts, WorkerFacts
from ..core.limits import queue_scope
from ..core.records import State
from ..core.steps import Query, Steps, atomic
from .base import Statement, StoreBase
from .rows import MONITORING_TIMEOUT

#: A registry row refreshed within this many seconds is a live process (supervisors refresh
#: theirs every 5 s).
LIVE_SECONDS = 30.0
#: The most parents, or jobs ahead, a diagnosis reads one by one.
MAX_LISTED = 10

# The job, the settings of its queue (paused, capped: the claim reads them from the same row),
# when a worker last started serving the queue, and the database's clock.
_WHY_JOB = """
SELECT j.id, j.queue, j.task, j.state, j.priority, j.attempt, j.max_attempts, j.attempt_budget, j.scheduled_at,
       j.created_at, j.completed_at, j.finished_at, j.lease_expires_at, j.leased_by, j.last_error, j.limits,
       j.parents, j.pending_parents, j.run_when, j.sequence_key, j.signal_key, j.signal_timeout_at, j.expires_at,
       j.steps -> -1 AS last_step, j.errors -> -1 AS last_failure,
       coalesce(q.paused, false) AS paused, q.updated_at AS settings_changed_at, q.max_running AS queue_cap,
       s.served_at, now() AS now, j.fair_key, coalesce(j.rank_at, j.scheduled_at) AS turn
  FROM {jobs} j
  LEFT JOIN {queues} q ON q.name = j.queue
  LEFT JOIN {served_queues} s ON s.queue = j.queue
 WHERE j.id = %(id)s
"""

# The workers and reapers of the process registry (live: refreshed within %(live)s seconds) and
# when it last saw each kind, when it last saw the worker holding the job (NULL: not
# registered), the connections of workers to this database now (a worker keeps its claim and
# LISTEN connections open, registered by a supervisor or not; their application_name is visible
# to every role), and the latest live lease of a running job of the queue (read from the reaper's
# lease index: a worker renews it while it runs). Of the live workers that reported what they serve
# (migration 031): how many did, how many claim from the job's queue, and the tasks those declare.
# A few hundred rows at most, whatever the queue holds.
_WHY_WORKERS = """
SELECT count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)) AS live_workers,
       count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)
                          AND queues IS NOT NULL) AS reporting_workers,
       count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)
                          AND %(queue)s = ANY(queues)) AS queue_workers,
       (SELECT array_agg(DISTINCT t ORDER BY t) FROM {processes} p, unnest(p.tasks) AS t
         WHERE p.kind = 'worker' AND p.last_seen > now() - make_interval(secs => %(live)s)
           AND %(queue)s = ANY(p.queues)) AS queue_tasks,
       max(last_seen) FILTER (WHERE kind = 'worker') AS worker_seen_at,
       count(*) FILTER (WHERE kind = 'reaper' AND last_seen > now() - make_interval(secs => %(live)s)) AS live_reapers,
       max(last_seen) FILTER (WHERE kind = 'reaper') AS reaper_seen_at,
       max(last_seen) FILTER (WHERE id = %(holder)s::text) AS holder_seen_at,
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name IN ('miniqueue:worker', 'miniqueue:listen'))
           AS worker_connections,
       (SELECT max(lease_expires_at) FROM {jobs}
         WHERE state = 'running' AND lease_expires_at > now() AND queue = %(queue)s) AS queue_lease_until
  FROM {processes}
"""

# The limits the job needs (its scopes, and its queue's cap): each one's size, the jobs holding
# its slots (running at the attempt that took the slot, as `miniqueue limits` counts them), and
# its tokens now and when the next whole one comes (the claim needs one).
_WHY_LIMITS = """
SELECT l.scope, l.max_running, l.rate, t.tokens,
       CASE WHEN t.tokens < 1 THEN now() + make_interval(secs => (1 - t.tokens) / l.rate) END AS next_token_at,
       h.holders
  FROM {limits} l
 CROSS JOIN LATERAL (
       SELECT least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens) t
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN {jobs} j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE l.scope = ANY(%(scopes)s::text[])
 ORDER BY l.scope
"""

# The job's parents that have not finished (every one it still waits for), in its parents'
# order, the first %(limit)s: a probe of the hot table per parent.
_WHY_PARENTS = """
SELECT p.id, p.state, p.task
  FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord)
  JOIN {jobs} p ON p.id = u.id AND p.state IN ('waiting', 'available', 'running')
 ORDER BY u.ord
 LIMIT %(limit)s
"""

# The job's sequence key: the job holding it (NULL: none) and how that job stands, what a failure
# does to the key, and how many of its jobs wait ahead of this one (from the sequences' waiting
# index, at most %(cap)s).
_WHY_SEQUENCE = """
SELECT s.head, h.state AS head_state, h.task AS head_task, h.last_error AS head_error,
       h.scheduled_at AS head_scheduled_at, s.on_failure,
       (SELECT count(*) FROM (SELECT 1 FROM {jobs} w
                               WHERE w.sequence_key = s.key AND w.state = 'waiting' AND w.signal_key IS NULL
                                 AND w.id < %(id)s
                               LIMIT %(cap)s) a) AS ahead
  FROM {sequences} s LEFT JOIN {jobs} h ON h.id = s.head
 WHERE s.key = %(key)s
"""

# How many due jobs of the queue come before this one in the claim's order (priority, then
# scheduled time, then id): those of a higher priority, and those of its own scheduled before it,
# each a range of the claim index and of the limited jobs' index, at most %(cap)s from each. The
# ranges hold the queue's available jobs only: its cost grows with its backlog, never with
# finished rows.
_WHY_AHEAD = """
SELECT count(*) FROM (
    (SELECT 1 FROM {jobs} j
      WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.priority > %(priority)s
        AND j.scheduled_at <= now()
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM {jobs} j
      WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.priority = %(priority)s
        AND j.scheduled_at <= now()
        AND (coalesce(j.rank_at, j.scheduled_at), j.id) < (%(turn)s::timestamptz, %(id)s::bigint)
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM {jobs} j
      WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = %(queue)s AND j.priority > %(priority)s
        AND j.scheduled_at <= now()
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM {jobs} j
      WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = %(queue)s AND j.priority = %(priority)s
        AND j.scheduled_at <= %(scheduled_at)s
        AND (j.scheduled_at, j.id) < (%(scheduled_at)s::timestamptz, %(id)s::bigint)
      LIMIT %(cap)s)
) a
"""

# Of the due fair jobs ahead of a fair job in the claim's order (up to %(cap)s of them, read from
# the claim index in its order), how many other keys they are of: the keys whose turns come first.
_WHY_KEYS_AHEAD = """
SELECT count(DISTINCT a.fair_key) FROM (
    SELECT j.fair_key FROM {jobs} j
     WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.scheduled_at <= now()
       AND j.fair_key IS DISTINCT FROM %(key)s
       AND (j.priority > %(priority)s
            OR j.priority = %(priority)s
               AND (coalesce(j.rank_at, j.scheduled_at), j.id) < (%(turn)s::timestamptz, %(id)s::bigint))
     ORDER BY j.priority DESC, coalesce(j.rank_at, j.scheduled_at), j.id
     LIMIT %(cap)s) a
"""


class Why(StoreBase):
    """The facts behind :meth:`miniqueue.Client.why`."""

    _why_job = Statement(_WHY_JOB)
    _why_workers = Statement(_WHY_WORKERS)
    _why_limits = Statement(_WHY_LIMITS)
    _why_parents = Statement(_WHY_PARENTS)
    _why_sequence = Statement(_WHY_SEQUENCE)
    _why_ahead = Statement(_WHY_AHEAD)
    _why_keys_ahead = Statement(_WHY_KEYS_AHEAD)

    def why_steps(self, job_id: int) -> Steps[WhyFacts]:
        """What holds job ``job_id`` back (or that it ran), read in one transaction: JobNotFound
        if no job has the id."""
        return atomic(self._why_in_one(job_id))

    def _why_in_one(self, job_id: int) -> Steps[WhyFacts]:
        yield Query(MONITORING_TIMEOUT)  # an inspection answers quickly or not at all
        rows: list[dict[str, Any]] = yield Query(self._why_job, {"id": job_id}, named=True)
        if not rows:
            raise JobNotFound(job_id)
        job = JobFacts(**{**rows[0], "state": State(rows[0]["state"])})
        if job.state not in (State.AVAILABLE, State.WAITING, State.RUNNING):
            return WhyFacts(job)
        workers = yield from self._read_workers(job)
        if job.state is State.RUNNING:
            return WhyFacts(job, workers)
        parents = yield from self._read_parents(job)
        sequence = yield from self._read_sequence(job)
        due = job.state is State.AVAILABLE and job.scheduled_at <= job.now
        limits = (yield from self._read_limits(job)) if due else ()
        ahead = (yield from self._read_ahead(job)) if due else None
        keys_ahead = (yield from self._read_keys_ahead(job)) if due and job.fair_key is not None else None
        return WhyFacts(job, workers, limits, parents, sequence, ahead, keys_ahead)

    def _read_workers(self, job: JobFacts) -> Steps[WorkerFacts]:
        params = {"live": LIVE_SECONDS, "holder": job.leased_by, "queue": job.queue}
        rows: list[dict[str, Any]] = yield Query(self._why_workers, params, named=True)
        return WorkerFacts(**rows[0])

    def _read_limits(self, job: JobFacts) -> Steps[tuple[ScopeFacts, ...]]:
        scopes = [*(job.limits or ()), *([queue_scope(job.queue)] if job.queue_cap is not None else [])]
        if not scopes:
            return ()
        rows: list[dict[str, Any]] = yield Query(self._why_limits, {"scopes": scopes}, named=True)
        return tuple(ScopeFacts(**row) for row in rows)

    def _read_parents(self, job: JobFacts) -> Steps[tuple[ParentFacts, ...]]:
        if job.state is not State.WAITING or not job.pending_parents or not job.parents:
            return ()
        params = {"ids": job.parents, "limit": MAX_LISTED}
        rows: list[tuple[Any, ...]] = yield Query(self._why_parents, params)
        return tuple(ParentFacts(row[0], State(row[1]), row[2]) for row in rows)

    def _read_sequence(self, job: JobFacts) -> Steps[SequenceFacts | None]:
        if job.state is not State.WAITING or job.sequence_key is None or job.signal_key is not None:
            return None
        params = {"key": job.sequence_key, "id": job.id, "cap": MAX_COUNTED}
        rows: list[dict[str, Any]] = yield Query(self._why_sequence, params, named=True)
        if not rows:
            return None
        row = rows[0]
        return SequenceFacts(**{**row, "head_state": None if row["head_state"] is None else State(row["head_state"])})

    def _read_ahead(self, job: JobFacts) -> Steps[int]:
        params = {
            "queue": job.queue,
            "priority": job.priority,
            "scheduled_at": job.scheduled_at,
            "turn": job.turn,
            "id": job.id,
            "cap": MAX_COUNTED,
        }
        rows: list[tuple[Any, ...]] = yield Query(self._why_ahead, params)
        return min(int(rows[0][0]), MAX_COUNTED)

    def _read_keys_ahead(self, job: JobFacts) -> Steps[int]:
        params = {"queue": job.queue, "priority": job.priority, "turn": job.turn, "id": job.id, "key": job.fair_key}
        rows: list[tuple[Any, ...]] = yield Query(self._why_keys_ahead, {**params, "cap": MAX_COUNTED})
        return min(int(rows[0][0]), MAX_COUNTED)
