"""What a handler sees: the :class:`Job` it runs, and the outcomes it can signal."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

from psycopg import AsyncConnection

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.limits import check_key
from ..core.records import EnqueueResult, JobSpec, Lease, ParentOutcome, charged_attempts, describe_attempts
from ..core.validation import DEFAULT_MAX_PAYLOAD_BYTES, encode_result, encode_value
from .durable import DurableSteps, StepStore, seconds_of


class PermanentError(Exception):
    """Raise from a handler to fail the job for good: state ``failed``, no retry."""

    # Named by where users import it from, in tracebacks and error histories.
    __module__ = "miniqueue"


class Snooze(Exception):
    """Raise from a handler to run the job again after ``delay`` seconds without spending an attempt."""

    __module__ = "miniqueue"

    def __init__(self, delay: float | dt.timedelta = 0.0) -> None:
        seconds = seconds_of(delay, "snooze delay")
        super().__init__(f"snoozed for {seconds:g}s")
        self.seconds = seconds


class RateLimited(Snooze):
    """Raise from a handler (or a middleware's run hook) when a resource says "too many
    requests": no worker on any host claims a job of ``key`` for ``retry_after`` seconds, by the
    database's clock, and this job goes back without spending an attempt, due when the pause ends.

    ``key`` is a limit key, as jobs name it with ``rate_limit_key`` or ``concurrency_key``: the
    pause covers every job, of any task, whose rate-limit or concurrency key is ``key`` (see
    "Back-pressure" in docs/guides/limits.md). A pause never shortens a longer one in place.
    """

    __module__ = "miniqueue"

    def __init__(self, key: str, retry_after: float | dt.timedelta) -> None:
        try:
            super().__init__(seconds_of(retry_after, "retry_after"))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        self.key = check_key("rate-limited key", key)
        self.args = (f"key {key!r} rate limited for {self.seconds:g}s",)


#: The most a progress report's ``meta`` may take, as JSON: it is written with every renewal.
MAX_PROGRESS_META_BYTES = 4096

# Guards a job's latest progress between its handler (which reports it) and the heartbeat (which
# takes it to write): one lock for every job, as a lock per job would cost every job's start.
_PROGRESS_LOCK = threading.Lock()


def encode_progress(percent: object, meta: dict[str, Any]) -> str:
    """A progress report as the JSON text the worker writes, or InvalidInput naming the rule broken."""
    if isinstance(percent, bool) or not isinstance(percent, int | float):
        raise InvalidInput(f"progress percent {percent!r} is not a number: use a number from 0 to 100")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise InvalidInput(f"progress percent {percent!r} is out of range: use a number from 0 to 100")
    meta_json = encode_value("progress meta", meta, max_bytes=MAX_PROGRESS_META_BYTES)
    return f'{{"percent":{json.dumps(float(percent))},"meta":{meta_json}}}'


# Guards the lazy creation of a job's stop Event against a concurrent request_stop().
_EVENT_LOCK = threading.Lock()


class GroupAdder(Protocol):
    """What :meth:`Job.add_to_group` asks of its worker (see :mod:`miniqueue.worker.grouping`)."""

    def add(self, job: Job, conn: Connection, spec: JobSpec) -> EnqueueResult: ...
    async def aadd(self, job: Job, conn: AsyncConnection[Any], spec: JobSpec) -> EnqueueResult: ...


#: Opens the transaction in which a job completes (see :meth:`Job.transaction`).
TransactionFactory = Callable[["Job"], contextlib.AbstractContextManager[Connection]]
#: The same for an async handler (see :meth:`Job.atransaction`).
AsyncTransactionFactory = Callable[["Job"], contextlib.AbstractAsyncContextManager[AsyncConnection[Any]]]


class Job(DurableSteps):
    """A claimed job, as passed to its handler.

    Carries the job's fields and a way to learn that the handler should stop early:
    :meth:`should_stop` turns true when the lease is lost (the job was recovered, cancelled
    or claimed elsewhere), when the worker shuts down past its drain timeout, or when the
    task's ``timeout`` passes. Stopping is cooperative for a ``def`` handler: one that ignores
    it keeps running, but its outcome is discarded once the lease is lost. An ``async def``
    handler is also cancelled (``asyncio.CancelledError`` at its next ``await``).

    A durable handler records its progress as it goes: :meth:`step` (and
    :meth:`step_transaction`) run once per job, :meth:`sleep` and :meth:`wait_for` hand the job
    back until a time or a signal (``async def`` handlers: :meth:`astep`, :meth:`asleep`, ...).
    """

    # What most jobs never change, as class attributes: a worker makes a Job per job, and each
    # assignment in __init__ is a share of a no-op job's cost. An instance sets its own when it
    # changes one.
    # The Event is made only if a handler waits on it (see should_stop and wait).
    _stop: threading.Event | None = None
    _stop_reason: str | None = None
    _on_stop: Callable[[str], None] | None = None
    completed_in_transaction = False
    _parent_outcomes: dict[int, ParentOutcome] | None = None
    # The connection of the job's completing transaction while its block runs (add_to_group).
    _completing_on: Connection | AsyncConnection[Any] | None = None
    #: The result set by :meth:`set_result`, as JSON text (None: none set).
    result_json: str | None = None
    #: This attempt's span while it runs (set by :mod:`miniqueue.tracing` when tracing is on).
    _trace: Any = None
    #: The latest progress reported (JSON text; None: none), and whether the heartbeat has yet to take it.
    progress_json: str | None = None
    _progress_unsent = False

    def __init__(
        self,
        lease: Lease,
        *,
        worker_id: str,
        transaction: TransactionFactory | None = None,
        atransaction: AsyncTransactionFactory | None = None,
        max_result_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        read_results: Callable[[Job], list[tuple[int, ParentOutcome]]] | None = None,
        steps: StepStore | None = None,
        groups: GroupAdder | None = None,
    ) -> None:
        self.id: int = lease.id
        self.queue: str = lease.queue
        self.task: str = lease.task
        self.payload: Any = lease.payload
        #: This run's number: 1 on the first run and one more on each, charged or not (a stop we
        #: asked for, a snooze, a requeue); it never repeats for a job, and fences its writes.
        self.run: int = lease.attempt
        self.max_attempts: int = lease.max_attempts
        #: The attempts this job may be charged (``max_attempts`` as it was enqueued or requeued).
        self.attempt_budget: int = lease.max_attempts if lease.attempt_budget is None else lease.attempt_budget
        #: This attempt's number, as ``miniqueue jobs show``, the dashboard and the logs say it
        #: (``attempt 2 of 5``): the attempts charged against :attr:`attempt_budget` since the job
        #: was enqueued or last requeued, this one included. Runs handed back uncharged do not
        #: count (see :attr:`run`).
        self.attempt: int = charged_attempts(lease.attempt, lease.max_attempts, self.attempt_budget)
        self.priority: int = lease.priority
        self.scheduled_at: dt.datetime = lease.scheduled_at
        self.created_at: dt.datetime = lease.created_at
        #: The limits the job is subject to (see docs/guides/limits.md), or None.
        self.limits: list[str] | None = lease.limits
        #: The trace context of the span that enqueued the job (``{"traceparent": ...}``), or None
        #: when it was enqueued without tracing (see :mod:`miniqueue.tracing`).
        self.trace_context: dict[str, str] | None = (
            lease.trace_context if isinstance(lease.trace_context, dict) else None  # (undecodable: none)
        )
        self.worker_id = worker_id
        #: When the handler was handed the job (``time.monotonic()``), for timeouts.
        self.started_at = time.monotonic()
        self._transaction = transaction
        self._atransaction = atransaction
        #: The jobs this one waited for (empty for a job enqueued without ``depends_on``).
        self.parents: tuple[int, ...] = tuple(lease.parents) if lease.parents else ()
        self._read_results = read_results
        self._max_result_bytes = max_result_bytes
        self._steps_store = steps
        self._groups = groups

    @property
    def _on_event_loop(self) -> bool:
        """Whether the job runs an ``async def`` handler (the worker gave it the async transaction)."""
        return self._atransaction is not None and self._transaction is None

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.task} {self.describe_attempts()}>"

    @property
    def completing_on(self) -> Connection | AsyncConnection[Any] | None:
        """The connection of this job's completing transaction while ``with job.transaction()``
        (or ``async with job.atransaction()``) runs, else None: the job's own reads and writes
        inside the block (its parents' results, its steps) run on it."""
        return self._completing_on

    @property
    def charged_attempts(self) -> int:
        """The attempts charged so far against :attr:`attempt_budget`, this one included: runs
        handed back uncharged (a stop, a prefetched job never started, a snooze) are not."""
        return self.attempt

    def describe_attempts(self) -> str:
        """``attempt 2 of 5``, or ``attempt 2 of 5, 4 runs`` when some runs were not charged."""
        return describe_attempts(self.run, self.max_attempts, self.attempt_budget)

    @property
    def parent_results(self) -> dict[int, Any]:
        """Each parent's result by parent id, in the order the parents were given (a parent
        that returned nothing maps to None; one pruned since is missing).

        Read from the database the first time it is asked for (one query), then kept.
        """
        return {job_id: outcome.result for job_id, outcome in self.parent_outcomes.items()}

    @property
    def parent_outcomes(self) -> dict[int, ParentOutcome]:
        """How each parent ended, by parent id: its state, result and last error (what a job
        enqueued with ``allow_failure``, or a group's ``on_complete`` or ``on_failure``, reads to
        see which parents failed). Read with :attr:`parent_results`, in the same query."""
        if self._parent_outcomes is None:
            if not self.parents:
                self._parent_outcomes = {}
            elif self._read_results is None:
                raise RuntimeError(f"job {self.id}: its parents' results cannot be read outside a worker")
            else:
                self._parent_outcomes = dict(self._read_results(self))
        return self._parent_outcomes

    @property
    def parent_result(self) -> Any:
        """The result of this job's only parent (a step of a chain reads its predecessor's).

        Raises LookupError for a job that has no parent or several (use :attr:`parent_results`),
        or whose parent was pruned before this job ran.
        """
        if len(self.parents) != 1:
            raise LookupError(f"job {self.id} has {len(self.parents)} parents, not one: read job.parent_results")
        results = self.parent_results
        if self.parents[0] not in results:
            raise LookupError(f"job {self.id}'s parent {self.parents[0]} no longer exists (pruned?)")
        return results[self.parents[0]]

    def set_result(self, value: Any) -> None:
        """Set this job's result (JSON, by the payload's rules and size limit): what it stores
        when it completes, unless the handler returns something else than None.

        A handler that completes in :meth:`transaction` must use it, inside the block: the job
        completes when the block ends, before the handler returns. A value that breaks the
        rules raises InvalidInput here, which fails the attempt like any exception.
        """
        self.result_json = encode_result(value, max_bytes=self._max_result_bytes)

    def progress(self, percent: float, **meta: Any) -> None:
        """Report how far the handler has got: ``percent`` from 0 to 100, and ``meta``, small
        JSON (4 KiB at most), such as ``rows=420``. Bad input raises InvalidInput.

        Cheap enough to call in a tight loop, from ``def`` and ``async def`` handlers alike: the
        report is kept in memory, and the worker writes the latest one with its next renewal of
        the job's lease (every heartbeat interval) and once more as the job completes; reports
        in between are replaced, never queued. Read it with ``client.progress(id)`` or
        ``client.watch(id)``.
        """
        text = encode_progress(percent, meta)
        with _PROGRESS_LOCK:
            self.progress_json, self._progress_unsent = text, True

    def take_progress(self) -> str | None:
        """The progress reported since this was last called (JSON text), or None (the worker's
        heartbeat takes it to write)."""
        with _PROGRESS_LOCK:
            if not self._progress_unsent:
                return None
            self._progress_unsent = False
            return self.progress_json

    def should_stop(self) -> bool:
        """True once the handler should wrap up (see :attr:`stop_reason`)."""
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why the handler should stop: ``"lease lost"``, ``"cancelled"``, ``"shutdown"``, ``"timeout"``."""
        return self._stop_reason

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early if the job should stop; return :meth:`should_stop`.

        For ``def`` handlers: in an ``async def`` one it would block the event loop (and every
        coroutine on it); ``await asyncio.sleep(seconds)`` there, which is cancelled on a stop.
        """
        with _EVENT_LOCK:
            if self._stop is None:
                self._stop = threading.Event()
                if self._stop_reason is not None:
                    self._stop.set()
        return self._stop.wait(seconds)

    def request_stop(self, reason: str) -> None:
        """Tell the handler to stop (called by the worker; the first reason given wins)."""
        with _EVENT_LOCK:
            if self._stop_reason is not None:
                return
            self._stop_reason = reason
            if self._stop is not None:
                self._stop.set()
            on_stop = self._on_stop
        if on_stop is not None:  # outside the lock: it may take a lock of its own
            on_stop(reason)

    def on_stop(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once, when a stop is requested, or at once if it already was.

        The worker cancels an async handler's task this way. One callback per job: a second
        replaces the first.
        """
        with _EVENT_LOCK:
            reason = self._stop_reason
            if reason is None:
                self._on_stop = callback
        if reason is not None:
            callback(reason)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A database transaction in which this job completes.

        Do the handler's database work on the yielded connection. When the block ends without
        an exception, the job's fenced completion runs inside the same transaction, then it
        commits: the handler's writes and the completion happen together or not at all. If
        the lease was lost, :class:`~miniqueue.core.errors.LeaseLost` is raised and everything
        rolls back. Use it once per job, as the handler's last database step.
        """
        if self._transaction is None:
            raise RuntimeError(
                "job.transaction() is only available to 'def' handlers run by a miniqueue Worker "
                "(an async handler uses 'async with job.atransaction()')"
            )
        with self._transaction(self) as conn, self._completing_in(conn):
            yield conn
        self.completed_in_transaction = True

    def atransaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection[Any]]:
        """:meth:`transaction` for an ``async def`` handler: ``async with job.atransaction() as conn``.

        The yielded ``psycopg.AsyncConnection`` comes from a small pool of the worker's event
        loop; the same contract holds: the handler's writes and the job's fenced completion
        commit together, or :class:`~miniqueue.core.errors.LeaseLost` is raised and nothing does.
        If the job's coroutine is cancelled inside the block (its lease was lost, it timed
        out), the transaction rolls back.
        """
        if self._atransaction is None:  # raised here, not at `async with`, so a misuse is loud at once
            raise RuntimeError(
                "job.atransaction() is only available to async handlers run by a miniqueue Worker "
                "(a 'def' handler uses job.transaction())"
            )
        return self._completing(self._atransaction)

    @contextlib.asynccontextmanager
    async def _completing(self, factory: AsyncTransactionFactory) -> AsyncIterator[AsyncConnection[Any]]:
        async with factory(self) as conn:
            with self._completing_in(conn):
                yield conn
        self.completed_in_transaction = True

    @contextlib.contextmanager
    def _completing_in(self, conn: Connection | AsyncConnection[Any]) -> Iterator[None]:
        """While the block runs, ``conn`` is the transaction this job completes in (what
        :meth:`add_to_group` enqueues on)."""
        self._completing_on = conn
        try:
            yield
        finally:
            self._completing_on = None

    def add_to_group(self, spec: JobSpec) -> EnqueueResult:
        """Enqueue ``spec`` into this job's group: the jobs that wait for this one (its group's
        callbacks) wait for the new job too. Only inside ``with job.transaction()``: the new job
        and this job's completion commit together, so a callback can never be released before
        the job added for it exists. A job of a task this worker's app declares takes its
        declared options."""
        if self._groups is None or self._completing_on is None or isinstance(self._completing_on, AsyncConnection):
            raise RuntimeError("job.add_to_group() runs inside 'with job.transaction()' of a 'def' handler")
        return self._groups.add(self, self._completing_on, spec)

    async def aadd_to_group(self, spec: JobSpec) -> EnqueueResult:
        """:meth:`add_to_group` for an ``async def`` handler, inside ``async with job.atransaction()``."""
        if self._groups is None or not isinstance(self._completing_on, AsyncConnection):
            raise RuntimeError("job.aadd_to_group() runs inside 'async with job.atransaction()' of an async handler")
        return await self._groups.aadd(self, self._completing_on, spec)
