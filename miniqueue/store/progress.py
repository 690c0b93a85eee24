"""Progress: what a running handler reports of its own progress, written by its worker, and read
(or watched) by anyone.

A report is kept in the worker's memory and written with the heartbeat's next lease renewal
(see ``_RENEW`` in :mod:`miniqueue.store.outcomes`), and once more just before the job's
completion (:meth:`Progress.record_progress`): never a statement per report. Every write is
fenced like the worker's other writes, and notifies :attr:`progress_channel` for jobs someone
watches (``awaited``: see :meth:`~miniqueue.store.Store.await_job_steps`), payload the job id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg import sql

from ..core.db import Connection
from ..core.errors import JobNotFound
from ..core.records import JobProgress, State
from ..core.steps import Query, Steps
from .base import Statement, StoreBase
from .rows import columns

#: Where progress written for a watched job is announced (payload: the job id). The suffix is
#: as long as the finished-jobs channel's, so every schema name that fits that one fits this.
PROGRESS_CHANNEL = "miniqueue_{schema}_progress"

# Write the progress of a batch of held jobs (each `progress` JSON text aligned with the sorted
# `ids`, as in _COMPLETE), fenced; stamp it with the time written; announce it for watched jobs.
_RECORD_PROGRESS = """
UPDATE {jobs}
   SET progress = ((%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb || jsonb_build_object('at', now())
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, CASE WHEN awaited THEN pg_notify(%(channel)s, id::text) END
"""  # noqa: E501

# A job's state, last progress, and (once finished) its result or last error.
_PROGRESS = "SELECT state, progress, result, last_error FROM {jobs} WHERE id = %(id)s"


def progress_channel(schema: str) -> str:
    """The progress channel of the queue in ``schema``."""
    return PROGRESS_CHANNEL.format(schema=schema)


class Progress(StoreBase):
    """Writing and reading jobs' progress."""

    _record_progress = Statement(_RECORD_PROGRESS)
    _progress = Statement(_PROGRESS)

    @property
    def progress_channel(self) -> str:
        """Where written progress of watched jobs is announced (payload: the job id)."""
        return progress_channel(self.schema)

    def record_progress(self, conn: Connection, worker_id: str, progress: Mapping[tuple[int, int], str]) -> set[int]:
        """Write each ``(job id, attempt) → progress`` (JSON text) still leased to ``worker_id``;
        return the ids written."""
        if not progress:
            return set()
        ids, attempts = columns(list(progress))
        texts = [progress[(job_id, attempt)] for job_id, attempt in zip(ids, attempts, strict=True)]
        params = {"ids": ids, "attempts": attempts, "progress": texts, "worker": worker_id}
        return {row[0] for row in self._rows(conn, self._record_progress, {**params, "channel": self.progress_channel})}

    def progress_steps(self, job_id: int) -> Steps[JobProgress]:
        """Job ``job_id``'s state, last progress, result and last error; raises JobNotFound."""
        rows: list[tuple[Any, ...]] = yield Query(self._progress, {"id": job_id})
        if not rows:
            raise JobNotFound(job_id)
        state, progress, result, error = rows[0]
        return JobProgress.of(job_id, State(state), progress, result, error)

    def listen_progress_steps(self) -> Steps[None]:
        """Subscribe the connection to the progress and the finishing of watched jobs."""
        for channel in (self.progress_channel, self.finished_channel):
            yield Query(sql.SQL("LISTEN {}").format(sql.Identifier(channel)).as_string())
