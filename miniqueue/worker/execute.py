"""Running one handler, ``def`` or ``async def``, inside the run hooks of its app's middleware
(:mod:`miniqueue.tasks.middleware`), and classifying what it did as an
:class:`~miniqueue.tasks.outcomes.Outcome`.

Whatever a handler does (returns, raises, returns what cannot be stored, completes its job in
its own transaction, asks to be snoozed, sleeps or waits for a signal) becomes an outcome here,
on the thread or the event loop that ran it; recording the outcome is the claim loop's (see
:mod:`miniqueue.worker.recording`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
import traceback
from collections.abc import Iterator
from typing import Any, cast

from ..core.db import UndecodableJson
from ..core.errors import InvalidInput, LeaseLost
from ..core.validation import encode_result
from ..tasks.app import App
from ..tasks.batch import BatchHandler
from ..tasks.durable import JobSuspended
from ..tasks.job import Job, PermanentError, RateLimited, Snooze
from ..tasks.outcomes import Outcome, WorkerHooks
from ..tasks.task import Handler

log = logging.getLogger("miniqueue.worker")

#: How long a job of a task this worker's app does not know waits before it is due again.
UNKNOWN_TASK_DELAY = 5.0


class Executor:
    """Runs the handlers of ``app``'s tasks; a result larger than ``max_result_bytes`` of JSON
    fails the attempt. ``hooks`` are told as each handler starts and ends."""

    def __init__(self, app: App, *, max_result_bytes: int, hooks: WorkerHooks | None = None) -> None:
        self.app = app
        self.max_result_bytes = max_result_bytes
        self.hooks = hooks or WorkerHooks()
        self._unknown_tasks: set[str] = set()

    def run(self, job: Job) -> Outcome:
        """Run one ``def`` handler and classify what it did."""
        task = self.app.tasks.get(job.task)
        if task is None:
            return self._unknown_task(job)
        if (unreadable := _unreadable(job)) is not None:
            return unreadable
        try:
            self.hooks.on_handler_start(job)  # (a trace's span starts: it encloses the middleware)
            try:
                returned = self.app.middleware_stack.run(job, functools.partial(_call, task.handler))
            finally:
                self.hooks.on_handler_end(job)
        except BaseException as exc:  # whatever the handler (or a middleware) raises is its outcome
            return _finished(job, exc)
        return _finished(job, returned=returned, max_result_bytes=self.max_result_bytes)

    async def run_async(self, job: Job) -> Outcome:
        """Await one ``async def`` handler and classify what it did; cancelled (a stop request),
        it raises CancelledError, which is its outcome like any other exception."""
        handler = self.app.tasks[job.task].handler
        if (unreadable := _unreadable(job)) is not None:
            return unreadable
        try:
            self.hooks.on_handler_start(job)
            try:
                returned = await self.app.middleware_stack.arun(job, handler)
            finally:
                self.hooks.on_handler_end(job)
        except BaseException as exc:  # whatever the handler (or a middleware) raises is its outcome
            return _finished(job, exc)
        return _finished(job, returned=returned, max_result_bytes=self.max_result_bytes)

    def run_batch(self, jobs: list[Job]) -> list[Outcome]:
        """Run a ``def`` batch handler on ``jobs`` (of one task), inside each job's run hooks,
        and classify what it did to each (see :class:`~miniqueue.Batch`)."""
        unreadable, readable = _split_unreadable(jobs)
        if not readable:
            return [unreadable[job.id] for job in jobs]
        with self._handling(readable):
            ran = self.app.middleware_stack.run_batch(readable, functools.partial(_call_batch, self._batch(jobs)))
        return self._batch_outcomes(jobs, unreadable, ran)

    async def run_batch_async(self, jobs: list[Job]) -> list[Outcome]:
        """Await an ``async def`` batch handler on ``jobs``, as :meth:`run_batch` runs a ``def`` one."""
        unreadable, readable = _split_unreadable(jobs)
        if not readable:
            return [unreadable[job.id] for job in jobs]
        with self._handling(readable):
            ran = await self.app.middleware_stack.arun_batch(readable, self._batch(jobs))
        return self._batch_outcomes(jobs, unreadable, ran)

    def _batch(self, jobs: list[Job]) -> BatchHandler:
        """The batch handler of ``jobs``' task."""
        return cast(BatchHandler, self.app.tasks[jobs[0].task].handler)

    @contextlib.contextmanager
    def _handling(self, jobs: list[Job]) -> Iterator[None]:
        """Each job's handler hooks around one handler's run of them all."""
        for job in jobs:
            self.hooks.on_handler_start(job)
        try:
            yield
        finally:
            for job in jobs:
                self.hooks.on_handler_end(job)

    def _batch_outcomes(
        self, jobs: list[Job], unreadable: dict[int, Outcome], ran: dict[int, tuple[Any, BaseException | None]]
    ) -> list[Outcome]:
        """Each job's outcome: failed unread, or from its result or error in the batch that ran."""
        batch_of = len(jobs) - len(unreadable)
        return [unreadable.get(job.id) or self._batch_outcome(job, *ran[job.id], batch_of) for job in jobs]

    def _batch_outcome(self, job: Job, result: Any, error: BaseException | None, batch_of: int) -> Outcome:
        """One job's outcome from its result, or error, in a batch of ``batch_of`` jobs."""
        if error is not None:
            outcome = _finished(job, error)
        else:
            outcome = _finished(job, returned=result, max_result_bytes=self.max_result_bytes)
        outcome.batch_of = batch_of
        return outcome

    def _unknown_task(self, job: Job) -> Outcome:
        """A job whose task this worker's app does not know. The claim takes only the app's
        tasks, so none should come; one that does anyway goes back uncharged, due again after
        :data:`UNKNOWN_TASK_DELAY` seconds, for a worker whose app declares it. Logged once per task."""
        if job.task not in self._unknown_tasks:
            self._unknown_tasks.add(job.task)
            log.warning(
                "no handler is registered for task %r in this worker's app (known: %s): its jobs are handed back "
                "without spending an attempt, for a worker whose app declares it",
                job.task,
                ", ".join(sorted(self.app.tasks)) or "none",
            )
        return Outcome("snoozed", delay=UNKNOWN_TASK_DELAY)


def _call(handler: Handler, job: Job) -> Any:
    """Run a ``def`` handler (see :func:`_returned`)."""
    return _returned(handler(job), job.task)


def _call_batch(handler: BatchHandler, jobs: list[Job]) -> Any:
    """Run a ``def`` batch handler (see :func:`_returned`)."""
    return _returned(handler(jobs), jobs[0].task)


def _returned(returned: Any, task: str) -> Any:
    """What a ``def`` handler of ``task`` returned; one that returned an awaitable did not run,
    which is its error. (None, what most return, needs no look: ``inspect.isawaitable`` goes
    through an ABC check, which cost a no-op job 2.6 us.)"""
    if returned is not None and inspect.isawaitable(returned):
        raise TypeError(_not_awaited(returned, task))
    return returned


def _unreadable(job: Job) -> Outcome | None:
    """The outcome of a job whose payload this process could not decode: it fails for good
    without running (another try would read the same bytes), and the jobs claimed with it run."""
    if not isinstance(job.payload, UndecodableJson):
        return None
    return Outcome(
        "permanent", f"the job's payload could not be decoded ({job.payload.error}): it fails without running"
    )


def _split_unreadable(jobs: list[Job]) -> tuple[dict[int, Outcome], list[Job]]:
    """The outcomes of the jobs of a batch whose payload could not be decoded (they fail
    without running), and the others, which run."""
    unreadable = {job.id: outcome for job in jobs if (outcome := _unreadable(job)) is not None}
    return unreadable, [job for job in jobs if job.id not in unreadable]


def _not_awaited(returned: object, task: str) -> str:
    """The error of a ``def`` handler that returned an awaitable: it never ran, so it did not
    complete (a bug in the app: the worker awaits only handlers defined with ``async def``)."""
    if inspect.iscoroutine(returned):
        returned.close()  # never awaited on purpose: close it so Python does not warn about it
    return (
        f"the handler of task {task!r} returned {type(returned).__name__} instead of running: "
        "the worker awaits only handlers defined with 'async def'"
    )


def _finished(
    job: Job, exc: BaseException | None = None, *, returned: object = None, max_result_bytes: int = 0
) -> Outcome:
    """The outcome of a handler, ``def`` or ``async def``, that returned ``returned`` (``exc``
    None) or raised ``exc``, with how long it ran. A return value that breaks the result rules
    (not JSON, too large) fails the attempt: completing without it would lose it silently."""
    if exc is not None:
        outcome = _outcome_of(job, exc)
    elif job.completed_in_transaction:
        if returned is not None:
            log.warning(
                "job %d returned a value after job.transaction() completed it: not stored (call "
                "job.set_result() inside the block)",
                job.id,
            )
        outcome = Outcome("completed_in_transaction")
    else:
        outcome = _completed(job, returned, max_result_bytes)
    outcome.duration = time.monotonic() - job.started_at
    return outcome


def _completed(job: Job, returned: object, max_result_bytes: int) -> Outcome:
    """A handler returned: its result is what it returned, else what it set with set_result()."""
    if returned is None:
        return Outcome("completed", result=job.result_json)
    try:
        return Outcome("completed", result=encode_result(returned, max_bytes=max_result_bytes))
    except InvalidInput as exc:
        return Outcome(
            "error", f"the handler of task {job.task!r} returned a value that cannot be stored as its result: {exc}"
        )


def _outcome_of(job: Job, exc: BaseException) -> Outcome:
    """Classify what a handler raised."""
    if job.completed_in_transaction:
        log.warning("job %d raised after its transaction committed; it stays completed: %r", job.id, exc)
        return Outcome("completed_in_transaction")
    if isinstance(exc, LeaseLost):
        return Outcome("lease_lost", str(exc))
    if isinstance(exc, RateLimited):
        return Outcome("snoozed", delay=exc.seconds, pause_key=exc.key)
    if isinstance(exc, Snooze):
        return Outcome("snoozed", delay=exc.seconds)
    if isinstance(exc, JobSuspended):  # the sleep or the wait gave the job back already
        return Outcome(exc.kind, delay=exc.seconds)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()
    if isinstance(exc, PermanentError):
        return Outcome("permanent", text, exception=exc)
    return Outcome("error", text, exception=exc)
