"""Settings kept in the database: queues paused or capped (and which queues are known), periodic
schedules, and the task declarations an app publishes for producers without it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from ..core.db import Connection
from ..core.limits import queue_scope
from ..core.records import KeyOptions, TaskDeclaration
from ..core.steps import Query, Steps, atomic, run
from ..core.validation import check_queue_name
from .base import Statement, StoreBase

# Periodic schedules: where each one stands.
_PERIODIC_STATE = "SELECT name, last_slot, enabled FROM {periodic}"

# Claim a periodic slot: advance last_slot if this slot is newer and the schedule is enabled.
# Returns a row only for the one scheduler that advanced it.
_CLAIM_SLOT = """
INSERT INTO {periodic} (name, last_slot) VALUES (%(name)s, %(slot)s)
ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot, updated_at = now()
 WHERE {periodic}.last_slot < excluded.last_slot AND {periodic}.enabled
RETURNING name
"""

# Enable or disable a periodic schedule (creating its row if no scheduler has run it yet);
# says whether the row is new.
_SET_PERIODIC_ENABLED = """
INSERT INTO {periodic} (name, last_slot, enabled) VALUES (%(name)s, now(), %(enabled)s)
ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, updated_at = now()
RETURNING xmax = 0
"""

# Publish an app's task declarations (migration 019): what a producer without the app fills a
# job's unset options from. Rows are upserted in task order (workers starting together never
# deadlock), and a row is rewritten only when the declaration changed.
_PUBLISH_TASKS = """
INSERT INTO {tasks} AS t (task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed,
                          max_concurrent, rate_limit, rate_limit_key, rate_limit_key_computed, backoff_base,
                          backoff_cap, keys, rate_cost)
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_computed, backoff_base, backoff_cap, keys::jsonb, rate_cost
  FROM unnest(%(tasks)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(concurrency_keys)s::text[], %(concurrency_computed)s::boolean[], %(max_concurrent)s::int[],
              %(rate_limits)s::text[], %(rate_limit_keys)s::text[], %(rate_computed)s::boolean[],
              %(backoff_bases)s::float8[], %(backoff_caps)s::float8[], %(keys)s::text[], %(rate_costs)s::int[])
       AS d(task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
            rate_limit_key, rate_computed, backoff_base, backoff_cap, keys, rate_cost)
 ORDER BY 1
ON CONFLICT (task) DO UPDATE
   SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
       concurrency_key = excluded.concurrency_key, concurrency_key_computed = excluded.concurrency_key_computed,
       max_concurrent = excluded.max_concurrent, rate_limit = excluded.rate_limit,
       rate_limit_key = excluded.rate_limit_key, rate_limit_key_computed = excluded.rate_limit_key_computed,
       backoff_base = excluded.backoff_base, backoff_cap = excluded.backoff_cap, keys = excluded.keys,
       rate_cost = excluded.rate_cost, published_at = now()
 WHERE (t.queue, t.priority, t.max_attempts, t.concurrency_key, t.concurrency_key_computed, t.max_concurrent,
        t.rate_limit, t.rate_limit_key, t.rate_limit_key_computed, t.backoff_base, t.backoff_cap, t.keys,
        t.rate_cost)
       IS DISTINCT FROM
       (excluded.queue, excluded.priority, excluded.max_attempts, excluded.concurrency_key,
        excluded.concurrency_key_computed, excluded.max_concurrent, excluded.rate_limit, excluded.rate_limit_key,
        excluded.rate_limit_key_computed, excluded.backoff_base, excluded.backoff_cap, excluded.keys,
        excluded.rate_cost)
"""

# Record that a worker serves these queues (as it starts).
_SERVE_QUEUES = """
INSERT INTO {served_queues} (queue) SELECT q FROM unnest(%(queues)s::text[]) AS q ORDER BY q
ON CONFLICT (queue) DO UPDATE SET served_at = now()
"""

# Every task declaration (a handful of rows: one per task of the apps on this database).
_TASK_DECLARATIONS = """
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_limit_key_computed, backoff_base, backoff_cap, keys, rate_cost
  FROM {tasks}
"""

# Which of these queues no worker has ever served.
_UNSERVED_QUEUES = """
SELECT q FROM unnest(%(queues)s::text[]) AS q WHERE NOT EXISTS (SELECT 1 FROM {served_queues} s WHERE s.queue = q)
"""

# Per queue, the task of its next due job (the claim's order, among jobs without limits) when the
# queue has live workers and none of them declares that task: their claims pass its jobs over.
# A worker that reported no tasks (an older version) counts as declaring every task.
_UNRUN_TASKS = """
SELECT q.name, h.task
  FROM unnest(%(queues)s::text[]) AS q(name)
 CROSS JOIN LATERAL (
       SELECT task FROM {jobs}
        WHERE state = 'available' AND limits IS NULL AND queue = q.name AND scheduled_at <= now()
        ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT 1) h
 CROSS JOIN LATERAL (
       SELECT count(*) AS workers, coalesce(bool_or(p.tasks IS NULL OR h.task = ANY(p.tasks)), false) AS runs
         FROM {processes} p
        WHERE p.kind = 'worker' AND q.name = ANY(p.queues) AND p.last_seen > now() - interval '30 seconds') w
 WHERE w.workers > 0 AND NOT w.runs
"""

# Pause or resume a queue.
_SET_PAUSED = """
INSERT INTO {queues} (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
"""

# The queues paused.
_PAUSED = "SELECT name FROM {queues} WHERE paused ORDER BY name"

# Cap a queue's running jobs (or lift the cap: NULL). Its slots are the scope 'queue <name>'; the
# scope row keeps its holders when the cap is lifted, so a cap set again counts the jobs still
# running under the old one.
_SET_QUEUE_LIMIT = """
WITH capped AS (
    INSERT INTO {queues} (name, max_running) VALUES (%(name)s, %(max)s::int)
    ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = now()
)
INSERT INTO {limits} (scope, max_running) SELECT %(scope)s, %(max)s::int WHERE %(max)s::int IS NOT NULL
ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running
"""

# The queues capped, and their caps.
_QUEUE_LIMITS = "SELECT name, max_running FROM {queues} WHERE max_running IS NOT NULL ORDER BY name"

# Which of the given queue names are known: paused or resumed before, served by a worker,
# holding a job that is waiting or running, or counted with finished ones (as `stats` and
# `queues list` show them). Each probe is an index lookup: the claim index for waiting jobs, the
# expired-lease index (running jobs, one per busy handler thread) for running ones, the counts'
# primary key for finished ones (the jobs table has no index of finished jobs by queue).
_KNOWN_QUEUES = """
SELECT q.name FROM unnest(%(names)s::text[]) AS q(name)
 WHERE EXISTS (SELECT 1 FROM {queues} WHERE name = q.name)
    OR EXISTS (SELECT 1 FROM {served_queues} WHERE queue = q.name)
    OR EXISTS (SELECT 1 FROM {counts} WHERE queue = q.name AND count > 0)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'available' AND limits IS NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL AND queue = q.name)
"""

# Every known queue name (as _KNOWN_QUEUES knows them), for an error naming the known ones. The
# waiting queues are found by skipping through the claim index and the limited jobs' index one
# queue at a time, never reading each job.
_KNOWN_QUEUE_NAMES = """
WITH RECURSIVE waiting(queue) AS (
    (SELECT queue FROM {jobs} WHERE state = 'available' AND limits IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.state = 'available' AND j.limits IS NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM waiting w WHERE w.queue IS NOT NULL
), limited(queue) AS (
    (SELECT queue FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM limited w WHERE w.queue IS NOT NULL
)
SELECT queue FROM waiting WHERE queue IS NOT NULL
 UNION SELECT queue FROM limited WHERE queue IS NOT NULL
 UNION SELECT queue FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL
 UNION SELECT name FROM {queues}
 UNION SELECT queue FROM {served_queues}
 UNION SELECT queue FROM {counts} WHERE count > 0
 ORDER BY 1 LIMIT %(limit)s
"""


class Settings(StoreBase):
    """Queues, periodic schedules and task declarations."""

    _periodic_state = Statement(_PERIODIC_STATE)
    _claim_slot = Statement(_CLAIM_SLOT)
    _set_periodic_enabled = Statement(_SET_PERIODIC_ENABLED)
    _publish_tasks = Statement(_PUBLISH_TASKS)
    _serve_queues = Statement(_SERVE_QUEUES)
    _task_declarations = Statement(_TASK_DECLARATIONS)
    _unserved_queues = Statement(_UNSERVED_QUEUES)
    _unrun_tasks = Statement(_UNRUN_TASKS)
    _set_paused = Statement(_SET_PAUSED)
    _paused = Statement(_PAUSED)
    _set_queue_limit = Statement(_SET_QUEUE_LIMIT)
    _queue_limits = Statement(_QUEUE_LIMITS)
    _known_queues = Statement(_KNOWN_QUEUES)
    _known_queue_names = Statement(_KNOWN_QUEUE_NAMES)

    # -- periodic schedules -------------------------------------------------------------------------

    def periodic_state(self, conn: Connection) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule's last enqueued slot and whether it is enabled."""
        return run(conn, self.periodic_state_steps())

    def periodic_state_steps(self) -> Steps[dict[str, tuple[dt.datetime, bool]]]:
        """:meth:`periodic_state` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._periodic_state, {})
        return {row[0]: (row[1], row[2]) for row in rows}

    def claim_periodic_slot(self, conn: Connection, name: str, slot: dt.datetime) -> bool:
        """Advance schedule ``name`` to ``slot``; True only for the one caller that did (and only
        if the schedule is enabled). Run it in the transaction that enqueues the slot's job."""
        return bool(self._rows(conn, self._claim_slot, {"name": name, "slot": slot}))

    def set_periodic_enabled(self, conn: Connection, name: str, enabled: bool) -> bool:
        """Enable or disable periodic schedule ``name``. Returns True if no scheduler had run it
        yet (so callers can point out a possible typo); it then starts in that state."""
        return run(conn, self.set_periodic_enabled_steps(name, enabled))

    def set_periodic_enabled_steps(self, name: str, enabled: bool) -> Steps[bool]:
        """:meth:`set_periodic_enabled` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._set_periodic_enabled, {"name": name, "enabled": enabled})
        return bool(rows[0][0])

    # -- task declarations --------------------------------------------------------------------------

    def publish_tasks(self, conn: Connection, declarations: Sequence[TaskDeclaration], queues: Sequence[str]) -> None:
        """Publish an app's task declarations, and record that a worker serves ``queues``."""
        run(conn, atomic(self.publish_tasks_steps(declarations, queues)))

    def publish_tasks_steps(self, declarations: Sequence[TaskDeclaration], queues: Sequence[str] = ()) -> Steps[None]:
        """:meth:`publish_tasks` as steps (to run in one transaction)."""
        ordered = sorted(declarations)
        yield Query(
            self._publish_tasks,
            {
                "tasks": [d.task for d in ordered],
                "queues": [d.queue for d in ordered],
                "priorities": [d.priority for d in ordered],
                "max_attempts": [d.max_attempts for d in ordered],
                "concurrency_keys": [d.concurrency_key for d in ordered],
                "concurrency_computed": [d.concurrency_key_computed for d in ordered],
                "max_concurrent": [d.max_concurrent for d in ordered],
                "rate_limits": [d.rate_limit for d in ordered],
                "rate_limit_keys": [d.rate_limit_key for d in ordered],
                "rate_computed": [d.rate_limit_key_computed for d in ordered],
                "backoff_bases": [d.backoff_base for d in ordered],
                "backoff_caps": [d.backoff_cap for d in ordered],
                "keys": [None if d.keys is None else json.dumps(d.keys._asdict()) for d in ordered],
                "rate_costs": [d.rate_cost for d in ordered],
            },
        )
        if queues:
            yield Query(self._serve_queues, {"queues": sorted(set(queues))})

    def task_declarations_steps(self) -> Steps[dict[str, TaskDeclaration]]:
        """Every published task declaration, by task name."""
        rows: list[tuple[Any, ...]] = yield Query(self._task_declarations)
        return {row[0]: TaskDeclaration._make((*row[:-2], _key_options(row[-2]), row[-1])) for row in rows}

    def unserved_queues_steps(self, queues: Sequence[str]) -> Steps[list[str]]:
        """Which of ``queues`` no worker has ever served."""
        rows: list[tuple[str]] = yield Query(self._unserved_queues, {"queues": list(queues)})
        return [row[0] for row in rows]

    def unrun_tasks_steps(self, queues: Sequence[str]) -> Steps[dict[str, str]]:
        """Of ``queues``, those whose next due job is of a task none of their live workers
        declares: queue → task."""
        rows: list[tuple[str, str]] = yield Query(self._unrun_tasks, {"queues": list(queues)})
        return {queue: task for queue, task in rows}

    # -- queues ---------------------------------------------------------------------------------------

    def set_queue_paused(self, conn: Connection, queue: str, paused: bool) -> None:
        """Pause (no worker anywhere claims from it) or resume a queue."""
        run(conn, self.set_queue_paused_steps(queue, paused))

    def set_queue_paused_steps(self, queue: str, paused: bool) -> Steps[None]:
        """:meth:`set_queue_paused` as steps."""
        yield Query(self._set_paused, {"name": check_queue_name(queue), "paused": paused})

    def paused_queues(self, conn: Connection) -> list[str]:
        """The queues currently paused."""
        return run(conn, self.paused_queues_steps())

    def paused_queues_steps(self) -> Steps[list[str]]:
        """:meth:`paused_queues` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._paused, {})
        return [row[0] for row in rows]

    def set_queue_limit(self, conn: Connection, queue: str, max_running: int | None) -> None:
        """Cap the running jobs of ``queue`` across every worker (None lifts the cap)."""
        run(conn, self.set_queue_limit_steps(queue, max_running))

    def set_queue_limit_steps(self, queue: str, max_running: int | None) -> Steps[None]:
        """:meth:`set_queue_limit` as steps."""
        name = check_queue_name(queue)
        yield Query(self._set_queue_limit, {"name": name, "max": max_running, "scope": queue_scope(name)})

    def queue_limits(self, conn: Connection) -> dict[str, int]:
        """The queues with a cap on running jobs, and their caps."""
        return run(conn, self.queue_limits_steps())

    def queue_limits_steps(self) -> Steps[dict[str, int]]:
        """:meth:`queue_limits` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._queue_limits, {})
        return {row[0]: row[1] for row in rows}

    def known_queues_steps(self, names: Sequence[str]) -> Steps[set[str]]:
        """Those of ``names`` that are known: paused or resumed before, or with a job waiting or running."""
        rows: list[tuple[Any, ...]] = yield Query(self._known_queues, {"names": list(names)})
        return {row[0] for row in rows}

    def known_queue_names_steps(self, limit: int = 100) -> Steps[list[str]]:
        """Up to ``limit`` known queue names (see :meth:`known_queues_steps`), in order."""
        rows: list[tuple[Any, ...]] = yield Query(self._known_queue_names, {"limit": limit})
        return [row[0] for row in rows]


def _key_options(published: dict[str, Any] | None) -> KeyOptions | None:
    """A task's published key options (migration 021), from the JSON object they were stored as
    (an option a newer version added is left out)."""
    if published is None:
        return None
    known = {name: value for name, value in published.items() if name in KeyOptions._fields}
    states = known.get("unique_states")
    return KeyOptions(**{**known, "unique_states": None if states is None else tuple(states)})
