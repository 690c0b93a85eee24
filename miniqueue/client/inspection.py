"""The client's read-only inspection calls: what an operator's view (the dashboard) reads about
jobs, workers and throughput beyond :class:`~miniqueue.Client`'s producer and repair calls.

The store answers these on a sync connection only (they are not :mod:`steps <miniqueue.core.steps>`),
so :class:`Inspection` is mixed into :class:`~miniqueue.Client` alone; :class:`~miniqueue.AsyncClient`
offers them once the store has them as steps. Each takes ``conn=``, so that a page that reads
several things reads them on one connection, as with the client's other calls.

Also here: :func:`check_filters`, the check of a job filter every listing call makes, and
:class:`LimitWait`, the store's type that :meth:`~miniqueue.Client.limit_waits` returns,
re-exported for callers that name it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..core.db import Connection
from ..core.records import ProcessInfo, State
from ..core.validation import JOB_ID_RANGE, check_int_range, check_queue_name, check_task_name, check_text
from ..store.store import LimitWait, Store

__all__ = ["Inspection", "LimitWait", "check_filters"]


class Inspection:
    """The inspection calls of :class:`~miniqueue.Client` (see the module's docstring)."""

    store: Store

    def connection(self, conn: Connection | None = None) -> AbstractContextManager[Connection]:
        """``conn`` if given, else a connection borrowed for the block (the client's own)."""
        raise NotImplementedError

    def throughput(self, *, conn: Connection | None = None) -> list[tuple[dt.datetime, State, int]]:
        """Jobs finished per minute over the last hour, as ``(minute, state, count)`` rows (read
        from per-minute counts the finishing statements keep: the same cost under any load)."""
        with self.connection(conn) as c:
            return self.store.throughput(c)

    def processes(self, max_age_seconds: float = 60.0, *, conn: Connection | None = None) -> list[ProcessInfo]:
        """Every supervisor, worker and reaper process that a supervisor registered within the
        last ``max_age_seconds``, on every host."""
        with self.connection(conn) as c:
            return self.store.processes(c, max_age_seconds)

    def job_states(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> dict[int, State]:
        """The current state of each of ``job_ids`` that names a job; an id that names none
        (deleted, or never given) is left out."""
        with self.connection(conn) as c:
            return self.store.states(c, job_ids)

    def count_jobs(self, *, conn: Connection | None = None, **filters: Any) -> int:
        """How many jobs match the filters (those of :meth:`~miniqueue.Client.list_jobs`, which
        refuses the same values)."""
        check_filters(**filters)
        with self.connection(conn) as c:
            return self.store.count_jobs(c, **filters)

    def job_ids(self, *, limit: int = 100_000, conn: Connection | None = None, **filters: Any) -> list[int]:
        """The ids of up to ``limit`` jobs matching the filters (as :meth:`count_jobs`), oldest first."""
        check_filters(**filters)
        with self.connection(conn) as c:
            return self.store.job_ids(c, limit=limit, **filters)


def check_filters(
    *,
    queue: str | None = None,
    task: str | None = None,
    search: str | None = None,
    before_id: int | None = None,
    **_: Any,
) -> None:
    """Reject a filter value that no stored job can match, before it reaches the database."""
    if queue is not None:
        check_queue_name(queue)
    if task is not None:
        check_task_name(task)
    if search is not None:
        check_text("search text", search)
    if before_id is not None:
        check_int_range("before id", before_id, JOB_ID_RANGE)
