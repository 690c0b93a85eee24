"""COPY: the large batches. A batch without keys (:meth:`Copying.copy_many`), and one whose jobs
have unique keys kept on a conflict or deadlines (:meth:`Copying.copy_keyed_steps`), stream
their rows while the client checks the next ones."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.records import EnqueueResult
from ..core.steps import CopyIn, Query, Steps, atomic, run
from ..core.validation import NewJob
from .base import Statement, StoreBase

# A large batch goes by COPY: 25% faster than the batch statement (enqueue._MANY_JOBS) at
# 10,000 jobs, though its four extra round trips make it slower below a few hundred. Its ids are
# drawn first (to return them), with the transaction's now(): the database clock that every
# job's scheduled_at counts from, exactly as the column default would.
_DRAW_IDS = """
SELECT now(), ARRAY(SELECT nextval({job_ids}) FROM generate_series(1, %(count)s))
"""

# Wake the workers of each queue the COPY gave a job due at once.
_NOTIFY_QUEUES = "SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS q(queue)"

# The COPY itself: a batch due at once leaves scheduled_at to its default; a traced batch (see
# miniqueue.observability.tracing) sends its one trace context with every row.
# No job with limits goes by COPY (see copyable, and copy_many's check), so every row leaves
# rate_cost to its default of 1, which is the cost of a job without a rate limit.
_COPY_DUE = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget) FROM STDIN"""
_COPY_SCHEDULED = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at) FROM STDIN"""
_COPY_DUE_TRACED = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context) FROM STDIN"""
_COPY_SCHEDULED_TRACED = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context, scheduled_at) FROM STDIN"""  # noqa: E501


# A large batch whose jobs have unique keys (kept on a conflict, without a window) or deadlines,
# and nothing else of the keyed statements, goes by COPY, as a batch without keys does (the rows
# stream while the client checks the next ones: keyed._ENQUEUE_MANY_KEYED reached 0.6x of a
# COPY). A COPY cannot pass over a row, so a key held already, or twice in the batch, aborts it,
# and the batch goes by the batch statement instead, in the same transaction. A batch of jobs due
# at once, without deadlines, untraced, whose keys are held while they run, leaves scheduled_at
# and unique_while_running to their defaults, as copy_many does (parsing the timestamps cost the
# server a tenth of the COPY).
_COPY_KEYED = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at, trace_context,
             unique_key, unique_while_running, expires_at) FROM STDIN"""
_COPY_KEYED_DUE = """
COPY {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, unique_key) FROM STDIN"""


class Copying(StoreBase):
    """Inserting large batches by COPY."""

    #: The smallest batch without idempotency keys worth sending by :meth:`copy_many`.
    copy_threshold = 500

    _draw_ids = Statement(_DRAW_IDS)
    _notify_queues = Statement(_NOTIFY_QUEUES)
    _copy_due = Statement(_COPY_DUE)
    _copy_scheduled = Statement(_COPY_SCHEDULED)
    _copy_due_traced = Statement(_COPY_DUE_TRACED)
    _copy_scheduled_traced = Statement(_COPY_SCHEDULED_TRACED)
    _copy_keyed = Statement(_COPY_KEYED)
    _copy_keyed_due = Statement(_COPY_KEYED_DUE)

    def copy_many(
        self,
        conn: Connection,
        count: int,
        jobs: Iterable[NewJob],
        *,
        scheduled: bool,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> list[EnqueueResult]:
        """Insert ``count`` jobs without idempotency keys by COPY, in one transaction; results are
        in input order. Each queue given a job that is due at once is notified.

        ``jobs`` is consumed as the rows stream to the server, so a caller can check each job
        as it goes (its checks then overlap the server's inserts): an exception from it aborts
        the COPY and stores nothing. Unless ``scheduled`` (some job has a ``run_at`` or a
        delay), scheduled_at is left to its default, now(): parsing 10,000 timestamps cost the
        server a tenth of the COPY. Every job stores ``trace_context`` (see :meth:`enqueue`).
        """
        return run(
            conn, self.copy_many_steps(count, jobs, scheduled=scheduled, notify=notify, trace_context=trace_context)
        )

    def copy_many_steps(
        self,
        count: int,
        jobs: Iterable[NewJob],
        *,
        scheduled: bool,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> Steps[list[EnqueueResult]]:
        """:meth:`copy_many` as steps."""
        return atomic(self._copy_many(count, jobs, scheduled, notify, trace_context))

    def _copy_many(
        self, count: int, jobs: Iterable[NewJob], scheduled: bool, notify: bool, trace_context: str | None
    ) -> Steps[list[EnqueueResult]]:
        now, ids = yield from self._drawn_ids(count)
        due: set[str] = set()
        if trace_context is None:
            statement = self._copy_scheduled if scheduled else self._copy_due
        else:
            statement = self._copy_scheduled_traced if scheduled else self._copy_due_traced
        yield CopyIn(statement, _copy_rows(ids, jobs, now, scheduled, due, trace_context))
        return (yield from self._copied(ids, due, notify))

    def copy_keyed_steps(
        self,
        count: int,
        jobs: Iterable[NewJob],
        fallback: Callable[[list[NewJob]], Steps[list[EnqueueResult]]],
        *,
        due: bool,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> Steps[list[EnqueueResult]]:
        """Insert ``count`` jobs whose keys a COPY can store (see _COPY_KEYED: unique keys kept
        on a conflict, deadlines) by COPY in one transaction, ``jobs`` consumed as the rows
        stream; if a unique key is held (or held twice in the batch), store them all by
        ``fallback`` (the batch statement) instead. Results are in input order. ``due``: every
        job is due at once, without a deadline, and holds its key while it runs (and the batch
        is untraced), so scheduled_at is left to its default."""
        seen: list[NewJob] = []
        stream = iter(jobs)
        copied = atomic(self._copy_keyed_in_one(count, stream, seen, due, notify, trace_context))
        try:
            results: list[EnqueueResult] = yield from refusing_stale_deadlines(copied)
            return results
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "idx_miniqueue_jobs_unique_key":
                raise
        return (yield from fallback([*seen, *stream]))

    def _copy_keyed_in_one(
        self,
        count: int,
        jobs: Iterator[NewJob],
        seen: list[NewJob],
        due: bool,
        notify: bool,
        trace_context: str | None,
    ) -> Steps[list[EnqueueResult]]:
        now, ids = yield from self._drawn_ids(count)
        queues: set[str] = set()
        if due:
            yield CopyIn(self._copy_keyed_due, _due_keyed_rows(ids, jobs, seen, queues))
        else:
            yield CopyIn(self._copy_keyed, _keyed_rows(ids, jobs, seen, now, queues, trace_context))
        return (yield from self._copied(ids, queues, notify))

    def _drawn_ids(self, count: int) -> Steps[tuple[dt.datetime, list[int]]]:
        """The transaction's now() and ``count`` job ids, in order, for a COPY."""
        drawn: list[tuple[Any, ...]] = yield Query(self._draw_ids, {"count": count})
        [(now, ids)] = drawn
        ids.sort()  # one session's nextval() only grows: already in order, so this costs nothing
        return now, ids

    def _copied(self, ids: list[int], due: set[str], notify: bool) -> Steps[list[EnqueueResult]]:
        """A COPY's results, once each queue of ``due`` (given a job due at once) is notified
        (if ``notify``)."""
        if notify and due:
            yield Query(self._notify_queues, {"channel": self.channel, "queues": sorted(due)})
        return [EnqueueResult(id=job_id) for job_id in ids]


def _copy_rows(
    ids: Sequence[int],
    jobs: Iterable[NewJob],
    now: dt.datetime,
    scheduled: bool,
    due: set[str],
    trace_context: str | None,
) -> Iterator[tuple[Any, ...]]:
    """The COPY rows of :meth:`Copying.copy_many`, made as they stream; adds to ``due`` each
    queue given a job that is due at once. A traced batch sends its trace context with every row."""
    for job_id, job in zip(ids, jobs, strict=True):
        if job.idempotency_key is not None or job.scopes or job.keys.keyed:
            raise ValueError("copy_many() takes jobs without keys, limits or deadlines: use enqueue_many()")
        row = _columns(job_id, job)
        if trace_context is not None:
            row = (*row, trace_context)
        if scheduled:
            at = job.run_at or now + dt.timedelta(seconds=job.delay_seconds)
            yield (*row, at)
        elif job.run_at is None and not job.delay_seconds:
            at = now
            yield row
        else:
            raise ValueError("copy_many() was given a scheduled job without scheduled=True")
        if at <= now:
            due.add(job.queue)


def _columns(job_id: int, job: NewJob) -> tuple[Any, ...]:
    """The columns every COPY of jobs starts with: id, queue, task, payload, priority,
    max_attempts and attempt_budget (a new job's whole budget)."""
    return (job_id, job.queue, job.task, job.payload_json, job.priority, job.max_attempts, job.max_attempts)


def copyable(job: NewJob) -> bool:
    """Whether a job's keys are ones a COPY can store (see _COPY_KEYED)."""
    keys = job.keys
    return (
        job.idempotency_key is None
        and not job.scopes
        and keys.sequence_key is None
        and keys.unique_window is None
        and keys.on_conflict == "keep"
    )


def _keyed_rows(
    ids: Sequence[int],
    jobs: Iterator[NewJob],
    seen: list[NewJob],
    now: dt.datetime,
    due: set[str],
    trace_context: str | None,
) -> Iterator[tuple[Any, ...]]:
    """The rows of _COPY_KEYED, made as they stream (each job kept in ``seen``); adds to ``due``
    each queue given a job due at once. Times count from ``now``, the transaction's database clock."""
    for job_id, job in zip(ids, jobs, strict=False):
        seen.append(job)
        if not copyable(job):
            raise ValueError("copy_keyed_steps() was given a job whose keys a COPY cannot store: use enqueue_many()")
        keys = job.keys
        at = job.run_at or now + dt.timedelta(seconds=job.delay_seconds)
        expires = keys.expires_at or (None if keys.expires_in is None else now + dt.timedelta(seconds=keys.expires_in))
        if at <= now:
            due.add(job.queue)
        yield (*_columns(job_id, job), at, trace_context, keys.unique_key, keys.unique_while_running, expires)


def _due_keyed_rows(
    ids: Sequence[int], jobs: Iterator[NewJob], seen: list[NewJob], queues: set[str]
) -> Iterator[tuple[Any, ...]]:
    """The rows of _COPY_KEYED_DUE, made as they stream (each job kept in ``seen``); adds each
    job's queue to ``queues`` (all are due at once)."""
    for job_id, job in zip(ids, jobs, strict=False):
        seen.append(job)
        keys = job.keys
        if not (
            copyable(job)
            and job.run_at is None
            and not job.delay_seconds
            and keys.expires_at is None
            and keys.expires_in is None
            and keys.unique_while_running
        ):
            raise ValueError("copy_keyed_steps(due=True) was given a job it cannot store so: use due=False")
        queues.add(job.queue)
        yield (*_columns(job_id, job), keys.unique_key)


def refusing_stale_deadlines(steps: Steps[Any]) -> Steps[Any]:
    """``steps``, with a deadline that is not after the enqueue (on the database clock) refused
    as bad input: such a job could never start."""
    try:
        return (yield from steps)
    except psycopg.errors.CheckViolation as exc:
        if exc.diag.constraint_name != "expires_after_enqueue":
            raise
        raise InvalidInput(
            "expires_at is not in the future on the database clock: a job that expired before it was enqueued "
            "would never start; give a later expires_at, or expires_in"
        ) from exc
