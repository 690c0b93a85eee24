"""The process registry: each supervisor's rows of the processes it runs, for the dashboard and
`miniqueue status` to show every host's workers."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.db import Connection
from ..core.records import ProcessInfo
from .base import Statement, StoreBase

# Refresh one supervisor's rows of the process registry, and drop its children that are gone.
_UPSERT_PROCESSES = """
WITH incoming AS (
    SELECT * FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(pids)s::int[], %(titles)s::text[],
                         %(started)s::timestamptz[], %(rss)s::bigint[], %(done)s::bigint[], %(restarts)s::int[],
                         %(current)s::text[], %(queues)s::text[], %(tasks)s::text[], %(rates)s::float8[])
           AS i(id, kind, pid, title, started_at, rss_bytes, jobs_done, restarts, current_jobs, queues, tasks,
                jobs_per_second)
), gone AS (
    DELETE FROM {processes} WHERE supervisor = %(supervisor)s AND id <> ALL(%(ids)s::text[])
)
INSERT INTO {processes} AS p (id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done,
                              restarts, current_jobs, queues, tasks, jobs_per_second)
SELECT id, %(supervisor)s, kind, %(host)s, pid, title, started_at, now(), rss_bytes, jobs_done, restarts,
       current_jobs::bigint[], string_to_array(queues, ' '), string_to_array(tasks, ' '), jobs_per_second
  FROM incoming
ON CONFLICT (id) DO UPDATE SET title = excluded.title, last_seen = now(), rss_bytes = excluded.rss_bytes,
    jobs_done = excluded.jobs_done, restarts = excluded.restarts, current_jobs = excluded.current_jobs,
    queues = excluded.queues, tasks = excluded.tasks, jobs_per_second = excluded.jobs_per_second
"""

# Remove a supervisor's rows.
_DELETE_PROCESSES = "DELETE FROM {processes} WHERE supervisor = %(supervisor)s"

# Every registered process seen recently, supervisors first; older rows belong to dead hosts.
_PROCESSES = """
SELECT id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done, restarts, current_jobs,
       queues, tasks, jobs_per_second
  FROM {processes}
 WHERE last_seen > now() - make_interval(secs => %(max_age)s)
 ORDER BY host, supervisor, kind <> 'supervisor', kind, pid
"""


class Registry(StoreBase):
    """The supervisors' process registry."""

    _upsert_processes = Statement(_UPSERT_PROCESSES)
    _delete_processes = Statement(_DELETE_PROCESSES)
    _processes = Statement(_PROCESSES)

    def register_processes(
        self, conn: Connection, supervisor: str, host: str, processes: Sequence[ProcessInfo]
    ) -> None:
        """Replace supervisor ``supervisor``'s rows of the process registry with ``processes``."""
        params = {
            "supervisor": supervisor,
            "host": host,
            "ids": [p.id for p in processes],
            "kinds": [p.kind for p in processes],
            "pids": [p.pid for p in processes],
            "titles": [p.title for p in processes],
            "started": [p.started_at for p in processes],
            "rss": [p.rss_bytes for p in processes],
            "done": [p.jobs_done for p in processes],
            "restarts": [p.restarts for p in processes],
            "current": ["{" + ",".join(str(j) for j in p.current_jobs) + "}" for p in processes],
            # Each process's names as one text (names hold no space), split in the statement.
            "queues": [None if p.queues is None else " ".join(p.queues) for p in processes],
            "tasks": [None if p.tasks is None else " ".join(p.tasks) for p in processes],
            "rates": [p.jobs_per_second for p in processes],
        }
        self._rowcount(conn, self._upsert_processes, params)

    def unregister_processes(self, conn: Connection, supervisor: str) -> None:
        """Remove a supervisor's rows (it is stopping)."""
        self._rowcount(conn, self._delete_processes, {"supervisor": supervisor})

    def processes(self, conn: Connection, max_age_seconds: float = 60.0) -> list[ProcessInfo]:
        """Every process registered by a supervisor within the last ``max_age_seconds``."""
        rows = self._named_rows(conn, self._processes, {"max_age": float(max_age_seconds)})
        return [
            ProcessInfo(
                **{
                    **row,
                    "current_jobs": tuple(row["current_jobs"]),
                    "queues": None if row["queues"] is None else tuple(row["queues"]),
                    "tasks": None if row["tasks"] is None else tuple(row["tasks"]),
                }
            )
            for row in rows
        ]
