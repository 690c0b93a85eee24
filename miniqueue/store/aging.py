"""Priority aging (migration 035): a queue's setting, and the reaper's batches that raise the
priority of its jobs as they wait (see "Priority aging" in docs/guides/fairness.md).

A queue with ``age_after`` set has each available job's priority at
``least(top, enqueued priority + whole intervals due)``, where ``top`` is the highest priority
among the queue's available jobs: a job that waited long enough reaches the top, where the
claim's order (priority, then turn, then id) puts it before the jobs that came after it. The
claim does not change: the reaper writes the raised priorities, a batch at a time, and only for
the jobs whose priority rises, keeping the one each was enqueued with in ``aged_from``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from ..core.db import Connection
from ..core.steps import Query, Steps
from ..core.validation import check_queue_name
from .base import Statement, StoreBase, compose

# The queues whose jobs age, each with the highest priority among its available jobs without
# limits (the first entry of the claim index) and, if %(limited)s, among those with limits (the
# first entry of each group of the limited jobs' index, stepping from one group to the next as the
# claim does: one probe per group, 0.5 s at 10,000 groups); NULL where it has none.
_AGING_QUEUES = """
WITH RECURSIVE aging AS (
    SELECT name FROM {queues} WHERE age_after IS NOT NULL
), groups(queue, limits, priority) AS (
    SELECT a.name, f.limits, f.priority
      FROM aging a
     CROSS JOIN LATERAL (SELECT limits, priority FROM {jobs}
                          WHERE state = 'available' AND limits IS NOT NULL AND queue = a.name
                          ORDER BY limits, priority DESC LIMIT 1) f
     WHERE %(limited)s
    UNION ALL
    SELECT g.queue, n.limits, n.priority
      FROM groups g
     CROSS JOIN LATERAL (SELECT limits, priority FROM {jobs}
                          WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
                          ORDER BY limits, priority DESC LIMIT 1) n
)
SELECT a.name,
       (SELECT priority FROM {jobs} WHERE state = 'available' AND limits IS NULL AND queue = a.name
         ORDER BY priority DESC LIMIT 1),
       (SELECT max(g.priority) FROM groups g WHERE g.queue = a.name)
  FROM aging a
 ORDER BY a.name
"""

# Age one batch of a queue's jobs: of the next %(limit)s available jobs after the sweep's position
# that are below the queue's top (%(top)s) and have been due for an interval or more (`seen`),
# raise each whose priority rises (`risen`: least(top, enqueued priority + whole intervals due),
# above its own), keeping the priority it was enqueued with. The sweep reads the claim index in
# its order (priority DESC, turn, id: a job's turn is its fair rank, or its due time), then the
# limited jobs' index in its own (limits, priority DESC, due time, id); the position is the last
# job read, (%(limits)s, %(priority)s, %(at)s, %(id)s), `at` its turn or due time as its index
# has it, %(limits)s NULL in the claim index, and a priority of %(top)s to start. `seen` reads on
# from it through five ranges of the two indexes, in order: the rest of its level and the levels
# below in the claim index, then in the limited jobs' index the rest of its level and the levels
# below in its group, and the groups after; each is a range of its index, so that a batch reads
# what it returns and no more, however long the backlog. A job raised moves to a level the sweep
# has passed, so one sweep raises a job once, and the next raises it again if it has waited
# another interval by then.
#
# Lock and write: a job a claim holds is passed over (SKIP LOCKED), and the lock re-checks what the
# rise was reckoned from (available, with the priority and due time read), so a job claimed, or
# claimed and retried, meanwhile is left alone. Returns the jobs raised, the jobs read, and the
# position of the last one read.
_AGE_JOBS = compose(
    """
WITH setting AS (
    SELECT age_after, now() - make_interval(secs => age_after) AS due_before
      FROM {queues} WHERE name = %(queue)s AND age_after IS NOT NULL
), seen AS (
    SELECT s.*, least(%(top)s::int, s.enqueued_priority
                      + floor(extract(epoch FROM now() - s.scheduled_at) / (SELECT age_after FROM setting)))::smallint
                AS raised
      FROM (
        (SELECT 1 AS part, id, limits, priority, coalesce(rank_at, scheduled_at) AS at, scheduled_at,
                coalesce(aged_from, priority) AS enqueued_priority
           FROM {jobs}
          WHERE {ageable} AND limits IS NULL AND %(limits)s::text[] IS NULL
            AND priority = %(priority)s::int
            AND (coalesce(rank_at, scheduled_at), id) > (%(at)s::timestamptz, %(id)s::bigint)
          ORDER BY coalesce(rank_at, scheduled_at), id LIMIT %(limit)s)
        UNION ALL
        (SELECT 2, id, limits, priority, coalesce(rank_at, scheduled_at), scheduled_at, coalesce(aged_from, priority)
           FROM {jobs}
          WHERE {ageable} AND limits IS NULL AND %(limits)s::text[] IS NULL
            AND priority < %(priority)s::int
          ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT %(limit)s)
        UNION ALL
        (SELECT 3, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM {jobs}
          WHERE {ageable} AND limits = %(limits)s::text[]
            AND priority = %(priority)s::int AND (scheduled_at, id) > (%(at)s::timestamptz, %(id)s::bigint)
          ORDER BY scheduled_at, id LIMIT %(limit)s)
        UNION ALL
        (SELECT 4, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM {jobs}
          WHERE {ageable} AND limits = %(limits)s::text[]
            AND priority < %(priority)s::int
          ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s)
        UNION ALL
        (SELECT 5, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM {jobs}
          WHERE {ageable} AND limits > coalesce(%(limits)s::text[], '{}')
          ORDER BY limits, priority DESC, scheduled_at, id LIMIT %(limit)s)
      ) s
     LIMIT %(limit)s
), risen AS (
    SELECT j.id, s.raised
      FROM {jobs} j JOIN seen s ON s.id = j.id
     WHERE s.raised > s.priority
       AND j.state = 'available' AND j.priority = s.priority AND j.scheduled_at = s.scheduled_at
       FOR UPDATE OF j SKIP LOCKED
), raised AS (
    UPDATE {jobs} j
       SET aged_from = coalesce(j.aged_from, j.priority), priority = r.raised
      FROM risen r
     WHERE j.id = r.id AND j.state = 'available' AND j.priority < r.raised
    RETURNING j.id
)
SELECT (SELECT count(*) FROM raised), (SELECT count(*) FROM seen), last.limits, last.priority, last.at, last.id
  FROM (SELECT 1) one
  LEFT JOIN (SELECT limits, priority, at, id FROM seen
              ORDER BY part DESC, limits DESC, priority, at DESC, id DESC LIMIT 1) last ON true
""",
    ageable="state = 'available' AND queue = %(queue)s AND priority < %(top)s::int\n"
    "            AND scheduled_at <= (SELECT due_before FROM setting)",
)

# Set a queue's aging interval (NULL: off).
_SET_QUEUE_AGING = """
INSERT INTO {queues} (name, age_after) VALUES (%(name)s, %(age_after)s::float8)
ON CONFLICT (name) DO UPDATE SET age_after = excluded.age_after, updated_at = now()
"""

# The queues whose jobs age, and their intervals.
_QUEUE_AGING = "SELECT name, age_after FROM {queues} WHERE age_after IS NOT NULL ORDER BY name"


class AgingPosition(NamedTuple):
    """Where a sweep of one queue's jobs stands: the last job read, by its index's order (its
    scopes, None in the claim index; its priority; its turn in the claim index, its due time in
    the limited jobs'; its id)."""

    limits: list[str] | None
    priority: int
    at: dt.datetime | None
    id: int | None

    @classmethod
    def start(cls, top: int) -> AgingPosition:
        """Before the queue's first job below ``top``."""
        return cls(None, top, None, None)


class AgedBatch(NamedTuple):
    """What one batch did: the jobs raised, the jobs read, and where the next batch starts."""

    raised: int
    read: int
    position: AgingPosition


class Aging(StoreBase):
    """Priority aging: the queues' setting and the reaper's batches."""

    _aging_queues = Statement(_AGING_QUEUES)
    _age_jobs = Statement(_AGE_JOBS)
    _set_queue_aging = Statement(_SET_QUEUE_AGING)
    _queue_aging = Statement(_QUEUE_AGING)

    def aging_queues(self, conn: Connection, *, limited: bool) -> dict[str, tuple[int | None, int | None]]:
        """The queues whose jobs age, each with the highest priority among its available jobs
        without limits and (if ``limited``; None otherwise) with limits; None where it has none."""
        rows = self._rows(conn, self._aging_queues, {"limited": limited})
        return {name: (plain, with_limits) for name, plain, with_limits in rows}

    def age_jobs(self, conn: Connection, queue: str, top: int, after: AgingPosition, limit: int) -> AgedBatch:
        """Raise the jobs of ``queue`` that rise among the next ``limit`` read after ``after``
        (see _AGE_JOBS); the sweep is over once a batch reads fewer than ``limit``."""
        params: dict[str, Any] = {"queue": queue, "top": top, "limit": limit, **after._asdict()}
        [(raised, read, *last)] = self._rows(conn, self._age_jobs, params)
        return AgedBatch(raised, read, after if last[1] is None else AgingPosition(*last))

    def set_queue_aging_steps(self, queue: str, age_after: float | None) -> Steps[None]:
        """Age the jobs of ``queue`` one priority step per ``age_after`` seconds due (None: off)."""
        yield Query(self._set_queue_aging, {"name": check_queue_name(queue), "age_after": age_after})

    def queue_aging_steps(self) -> Steps[dict[str, float]]:
        """The queues whose jobs age, and their intervals (seconds)."""
        rows: list[tuple[Any, ...]] = yield Query(self._queue_aging, {})
        return {row[0]: row[1] for row in rows}
