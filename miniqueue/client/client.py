"""The producer API: enqueue jobs, and inspect or repair them.

:class:`Client` runs on psycopg's sync connections, :class:`~miniqueue.AsyncClient`
(:mod:`miniqueue.asyncclient`) on its asyncio ones. Both are thin: what they do is defined
once, in :class:`BaseClient`, as :mod:`steps <miniqueue.steps>` (validation first, then the
store's statements, row mapping and the logic between them, with no I/O), and each client only
borrows a connection and runs the steps on it (``run`` or ``await arun``). So both validate the
same way, raise the same errors, and run the same SQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from psycopg_pool import ConnectionPool

from ..core.db import Connection, connect, create_pool, translate_errors
from ..core.errors import InvalidInput
from ..core.limits import check_limit
from ..core.records import (
    DEFAULT_QUEUE,
    EnqueueResult,
    GroupResult,
    JobRecord,
    JobSpec,
    QueueCount,
    QueueStats,
    State,
    TaskDeclaration,
)
from ..core.steps import Steps, atomic, run
from ..core.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JOB_ID_RANGE,
    check_depends_on,
    check_int_range,
    check_job_ids,
    check_queue_name,
    check_schedule_name,
    check_seconds,
    check_task_name,
    declared,
    validate,
    validate_each,
)
from ..observability import tracing
from ..store.store import LimitWait, Store
from .inspection import Inspection, check_filters
from .results import result_steps, wait_for

if TYPE_CHECKING:
    from ..tasks.app import App

T = TypeVar("T")

log = logging.getLogger("miniqueue.client")


class Declared(NamedTuple):
    """Jobs with their options filled, and the tasks of those that went to the default queue
    because no app declared them."""

    specs: list[JobSpec]
    undeclared: set[str]


#: How long a client trusts the task declarations it read: a declaration a deploy changed reaches
#: producers this many seconds after the first worker of the new code starts, at most.
DECLARATIONS_TTL = 5.0
#: How soon a client reads them again for a task not among them (a worker may just have started).
UNDECLARED_TTL = 1.0

#: How many known names an "unknown queue" error lists.
_KNOWN_SHOWN = 20


class BaseClient:
    """What :class:`Client` and :class:`~miniqueue.AsyncClient` share: the settings, and each
    call as steps to run on a connection of either kind.

    Each ``_x_steps`` method checks its input at once (bad input raises InvalidInput before a
    connection is borrowed) and returns the steps, which a client runs with its executor.
    """

    def __init__(self, *, schema: str, max_payload_bytes: int, notify: bool) -> None:
        self.store = Store(schema)
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        # OpenTelemetry (miniqueue.tracing): None when off or not installed.
        self._tracing = tracing.current()
        # The task declarations last read (see _declarations_steps), and when (monotonic).
        self._declarations: dict[str, TaskDeclaration] = {}
        self._declarations_read_at = float("-inf")
        self._undeclared_warned: set[str] = set()

    def _declarations_steps(self, tasks: Iterable[str]) -> Steps[dict[str, TaskDeclaration]]:
        """The task declarations the apps' workers published, read again once they are
        DECLARATIONS_TTL old, or UNDECLARED_TTL old when one of ``tasks`` is not among them
        (a worker that just started may have published it)."""
        age = time.monotonic() - self._declarations_read_at
        missing = any(task not in self._declarations for task in tasks)
        if age >= DECLARATIONS_TTL or (missing and age >= UNDECLARED_TTL):
            read_at = time.monotonic()
            self._declarations = yield from self.store.task_declarations_steps()
            self._declarations_read_at = read_at
        return self._declarations

    def _declared_steps(self, specs: Sequence[JobSpec], what: str = "job") -> Steps[Declared]:
        """``specs`` with what their callers left unset filled from their tasks' declarations
        (see :func:`~miniqueue.validation.declared`), and the tasks of those that went to the
        default queue for want of one; a batch's error names the job (``what``) by index."""
        declarations = yield from self._declarations_steps({spec.task for spec in specs})
        filled = []
        undeclared = set()
        for index, spec in enumerate(specs):
            declaration = declarations.get(spec.task)
            if declaration is None and spec.queue is None:
                undeclared.add(spec.task)
            try:
                filled.append(declared(spec, declaration))
            except InvalidInput as exc:
                raise InvalidInput(f"{what} {index}: {exc}" if len(specs) > 1 else str(exc)) from exc
        return Declared(filled, undeclared)

    def _declare_steps(self, app: App) -> Steps[None]:
        declarations = app.declarations()
        yield from atomic(self.store.publish_tasks_steps(declarations))
        self._declarations = {**self._declarations, **{d.task: d for d in declarations}}

    def _queue_stats_steps(self, check_served: bool) -> Steps[list[QueueStats]]:
        stats = yield from self.store.queue_stats_steps()
        if not check_served:
            return stats
        unserved = set((yield from self.store.unserved_queues_steps([q.queue for q in stats])))
        return [dataclasses.replace(q, served=False) if q.queue in unserved else q for q in stats]

    def _warn_undeclared(self, tasks: Iterable[str]) -> None:
        """Say once per task (and client) that a job went to the default queue because no app
        has declared its task here: a job no worker may ever serve is not left in silence."""
        for task in sorted(set(tasks) - self._undeclared_warned):
            self._undeclared_warned.add(task)
            log.warning(
                "task %r is declared by no app whose worker has run on this database: its jobs go to queue %r "
                "with the default options unless the caller names them (start a worker of the app once, or pass "
                'queue=...; see the README\'s "Tasks and their options")',
                task,
                DEFAULT_QUEUE,
            )

    def _enqueue_steps(self, spec: JobSpec, trace_context: str | None = None) -> Steps[EnqueueResult]:
        """Enqueue one job; ``trace_context`` is its producer span's (see :mod:`miniqueue.tracing`)."""
        check_task_name(spec.task)
        return self._enqueue_declared(spec, trace_context)

    def _enqueue_declared(self, spec: JobSpec, trace_context: str | None) -> Steps[EnqueueResult]:
        (filled,), undeclared = yield from self._declared_steps([spec])
        result = yield from self._store_one_steps(filled, trace_context)
        self._warn_undeclared(undeclared)
        return result

    def _store_one_steps(self, spec: JobSpec, trace_context: str | None) -> Steps[EnqueueResult]:
        """Store one job whose options are all filled."""
        job = validate(spec, max_payload_bytes=self.max_payload_bytes)
        parents = check_depends_on(spec.depends_on)
        if parents is None:
            return (yield from self.store.enqueue_steps(job, notify=self.notify, trace_context=trace_context))
        return (
            yield from self.store.enqueue_waiting_steps(job, parents, notify=self.notify, trace_context=trace_context)
        )

    def _enqueue_many_steps(
        self, jobs: Iterable[JobSpec], trace_context: str | None = None
    ) -> Steps[list[EnqueueResult]]:
        specs = list(jobs)
        for index, spec in enumerate(specs):
            try:
                check_task_name(spec.task)
            except InvalidInput as exc:
                raise InvalidInput(f"job {index}: {exc}") from exc
        return self._enqueue_many_declared(specs, trace_context)

    def _enqueue_many_declared(self, specs: list[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        specs, undeclared = yield from self._declared_steps(specs)
        results = yield from self._store_many_steps(specs, trace_context)
        self._warn_undeclared(undeclared)
        return results

    def _store_many_steps(self, specs: list[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """Store jobs whose options are all filled, in one transaction."""
        if any(s.depends_on is not None for s in specs):
            return (yield from self._enqueue_each_steps(specs, trace_context))
        checked = validate_each(specs, max_payload_bytes=self.max_payload_bytes)
        if len(specs) >= self.store.copy_threshold and all(_plain(s) for s in specs):
            # Each job is checked as the COPY streams it, so the checks overlap the server's
            # inserts; an invalid one aborts the COPY, and nothing is stored.
            scheduled = any(s.run_at is not None or s.delay is not None for s in specs)
            return (
                yield from self.store.copy_many_steps(
                    len(specs), checked, scheduled=scheduled, notify=self.notify, trace_context=trace_context
                )
            )
        return (
            yield from self.store.enqueue_many_steps(list(checked), notify=self.notify, trace_context=trace_context)
        )

    def _enqueue_each_steps(self, specs: Sequence[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """A batch with dependencies (options filled): each job by the one-by-one path, in one transaction."""
        self._check_all(specs, "job")
        return (yield from atomic(_each_indexed([self._store_one_steps(spec, trace_context) for spec in specs])))

    def _check_all(self, specs: Sequence[JobSpec], what: str) -> None:
        """Check every job (options filled) before any is stored; an error names the ``what`` by index."""
        for index, spec in enumerate(specs):
            try:
                validate(spec, max_payload_bytes=self.max_payload_bytes)
                check_depends_on(spec.depends_on)
            except InvalidInput as exc:
                raise InvalidInput(f"{what} {index}: {exc}") from exc

    def _chain_steps(self, steps: Sequence[JobSpec]) -> Steps[list[EnqueueResult]]:
        if not steps:
            raise InvalidInput("a chain needs at least one step")
        for index, step in enumerate(steps):
            try:
                check_task_name(step.task)
            except InvalidInput as exc:
                raise InvalidInput(f"step {index}: {exc}") from exc
        return atomic(self._chain_in_one(steps))

    def _chain_in_one(self, steps: Sequence[JobSpec]) -> Steps[list[EnqueueResult]]:
        filled, undeclared = yield from self._declared_steps(steps, "step")
        self._check_all(filled, "step")
        results: list[EnqueueResult] = []
        for step in filled:
            before = [results[-1].id] if results else []
            parents = [*before, *(step.depends_on or ())]
            results.append((yield from self._store_one_steps(step._replace(depends_on=parents or None), None)))
        self._warn_undeclared(undeclared)
        return results

    def _group_steps(self, members: Sequence[JobSpec], then: JobSpec) -> Steps[GroupResult]:
        if not members:
            raise InvalidInput("a group needs at least one member")
        members_steps = self._enqueue_many_steps(members)
        check_task_name(then.task)
        return atomic(self._group_in_one(members_steps, then))

    def _group_in_one(self, members_steps: Steps[list[EnqueueResult]], then: JobSpec) -> Steps[GroupResult]:
        enqueued = yield from members_steps
        parents = [*dict.fromkeys(r.id for r in enqueued), *(then.depends_on or ())]
        (filled,), undeclared = yield from self._declared_steps([then._replace(depends_on=parents)])
        callback = yield from self._store_one_steps(filled, None)
        self._warn_undeclared(undeclared)
        return GroupResult(members=enqueued, then=callback)

    def _result_steps(self, job_id: int) -> Steps[Any]:
        return result_steps(self.store, check_int_range("job id", job_id, JOB_ID_RANGE))

    def _limit_queue_steps(self, name: str, max_running: int | None, create: bool) -> Steps[None]:
        queue = check_queue_name(name)
        if max_running is not None:
            check_limit("max_running", max_running)
        return atomic(self._limit_queue_in_one(queue, max_running, create))

    def _limit_queue_in_one(self, queue: str, max_running: int | None, create: bool) -> Steps[None]:
        if not create:
            yield from self._check_known_queues([queue])
        yield from self.store.set_queue_limit_steps(queue, max_running)

    def _get_steps(self, job_id: int) -> Steps[JobRecord]:
        return self.store.get_steps(check_int_range("job id", job_id, JOB_ID_RANGE))

    def _list_jobs_steps(self, before_id: int | None, limit: int, filters: dict[str, Any]) -> Steps[list[JobRecord]]:
        check_filters(before_id=before_id, **filters)
        return self.store.list_jobs_steps(before_id=before_id, limit=limit, **filters)

    def _prune_steps(self, states: Iterable[State], older_than_seconds: float, batch_size: int) -> Steps[int]:
        chosen = list(states)
        deleted = 0
        while True:
            n = yield from self.store.prune_steps(chosen, older_than_seconds, batch_size)
            deleted += n
            if n < batch_size:
                return deleted

    def _requeue_matching_steps(self, states: Iterable[State], queue: str | None, task: str | None) -> Steps[int]:
        check_filters(queue=queue, task=task)
        return self.store.requeue_matching_steps(states, queue=queue, task=task)

    def _list_queues_steps(self) -> Steps[dict[str, bool]]:
        paused = set((yield from self.store.paused_queues_steps()))
        names = {q.queue for q in (yield from self.store.queue_stats_steps())} | paused
        return {name: name in paused for name in sorted(names)}

    def _set_paused_steps(self, names: Iterable[str], paused: bool, create: bool) -> Steps[list[str]]:
        chosen = list(dict.fromkeys(check_queue_name(name) for name in names))
        if not chosen:
            raise InvalidInput("no queue name given: name at least one queue")
        # One transaction: with one unknown name among several, none is paused. (One name
        # that need not be known is one statement, which needs no transaction of its own.)
        steps = self._set_paused_in_one(chosen, paused, create)
        return steps if create and len(chosen) == 1 else atomic(steps)

    def _set_paused_in_one(self, chosen: list[str], paused: bool, create: bool) -> Steps[list[str]]:
        if not create:
            yield from self._check_known_queues(chosen)
        for name in chosen:
            yield from self.store.set_queue_paused_steps(name, paused)
        return chosen

    def _check_known_queues(self, names: list[str]) -> Steps[None]:
        known = yield from self.store.known_queues_steps(names)
        unknown = [name for name in names if name not in known]
        if not unknown:
            return
        listed = yield from self.store.known_queue_names_steps(limit=_KNOWN_SHOWN + 1)
        shown = ", ".join(listed[:_KNOWN_SHOWN]) + (", ..." if len(listed) > _KNOWN_SHOWN else "")
        which = f"queue {unknown[0]!r} is" if len(unknown) == 1 else f"queues {', '.join(map(repr, unknown))} are"
        raise InvalidInput(
            f"{which} unknown: no job waiting or running, never paused or resumed "
            f"(known: {shown or 'none yet'}); to set a queue before its first job, pass create=True "
            "(--create on the command line)"
        )

    def _switch_schedule_steps(self, name: str, enabled: bool, app: App | None, create: bool) -> Steps[None]:
        name = check_schedule_name(name)
        defined = set(app.schedules) if app is not None else set()
        steps = self._switch_schedule_in_one(name, enabled, defined, app is not None, create)
        return steps if create else atomic(steps)  # (unchecked, it is one statement)

    def _switch_schedule_in_one(
        self, name: str, enabled: bool, defined: set[str], has_app: bool, create: bool
    ) -> Steps[None]:
        if not create:
            stored = yield from self.store.periodic_state_steps()
            if name not in stored and name not in defined:
                known = ", ".join(sorted({*stored, *defined})) or "none yet"
                hint = "" if has_app else "; a schedule no scheduler has run yet needs the app that defines it"
                raise InvalidInput(f"schedule {name!r} is unknown (known: {known}){hint}")
        yield from self.store.set_periodic_enabled_steps(name, enabled)


class Client(BaseClient, Inspection):
    """Enqueue and manage jobs.

    ``Client(dsn)`` opens a small connection pool of its own (close it with :meth:`close` or a
    ``with`` block); ``Client(pool)`` uses a ``psycopg_pool.ConnectionPool`` you own, whose
    connections must be in autocommit mode.

    Every method that writes takes ``conn=``: pass your own psycopg connection to make the
    write part of your transaction; the job then exists only if your transaction commits, and
    workers are notified at that commit. The reads a view makes take it too, so that it reads
    several things on one connection (the dashboard's pages do); the inspection calls it needs
    beyond these are :class:`~miniqueue.client.inspection.Inspection`'s.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Connection],
        *,
        schema: str = "public",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        notify: bool = True,
    ) -> None:
        super().__init__(schema=schema, max_payload_bytes=max_payload_bytes, notify=notify)
        self._dsn: str | None = None
        if isinstance(dsn_or_pool, str):
            # Fail fast, with libpq's own reason, rather than after the pool's retries time out.
            connect(dsn_or_pool, purpose="client", schema=schema, connect_timeout=10).close()
            self._pool = create_pool(dsn_or_pool, purpose="client", schema=schema)
            self._owns_pool, self._dsn = True, dsn_or_pool
        else:
            self._pool, self._owns_pool = dsn_or_pool, False

    def close(self) -> None:
        """Close the pool if this client opened it."""
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self, conn: Connection | None = None) -> _Borrowed:
        """``with client.connection(conn) as c``: ``conn`` if given, else one of the pool's
        connections, returned to the pool when the block ends."""
        return _Borrowed(self._pool, self._dsn, conn)

    def _run(self, steps: Steps[T], conn: Connection | None = None) -> T:
        """Run ``steps`` on ``conn``, or on one of the pool's connections."""
        with self.connection(conn) as c:
            return run(c, steps)

    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        max_concurrent: int | None = None,
        rate_limit: str | None = None,
        rate_limit_key: str | None = None,
        depends_on: Sequence[int] | None = None,
        conn: Connection | None = None,
    ) -> EnqueueResult:
        """Enqueue one job and return its id.

        ``payload`` must be JSON-serialisable (no NaN/Infinity, no U+0000, at most
        ``max_payload_bytes`` encoded). ``run_at`` (timezone-aware) or ``delay`` (seconds on the
        database clock) schedules it for later. With an ``idempotency_key`` already used by a
        stored job, nothing is inserted and the result carries that job's id with
        ``duplicate=True``. Invalid input raises InvalidInput and stores nothing.

        Limits (see the README's "Limits"): with a ``concurrency_key``, at most ``max_concurrent``
        (default 1) jobs of this task with that key run at once; with a ``rate_limit``
        (``"100/s"``), at most that many jobs of the task (per ``rate_limit_key`` if given) start.

        ``depends_on`` names jobs that must complete first: the job is ``waiting`` until the
        last of them completes (released in that completion's transaction), and is cancelled,
        with an error naming the parent, if one of them ends failed, dead or cancelled. Its
        handler reads their results as ``job.parent_results``. Every id must name a job that
        exists and has not ended without completing, else InvalidInput (nothing stored).
        """
        spec = JobSpec(
            task,
            payload,
            queue=queue,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            max_concurrent=max_concurrent,
            rate_limit=rate_limit,
            rate_limit_key=rate_limit_key,
            depends_on=depends_on,
        )
        if self._tracing is None:
            return self._run(self._enqueue_steps(spec), conn)
        (spec,), undeclared = self._run(self._declared_steps([spec]), conn)  # the span names the job's queue
        with self._tracing.sending((spec,)) as send:  # a producer span: the job stores its context
            result = send.sent(self._run(self._enqueue_steps(spec, send.context), conn))
        self._warn_undeclared(undeclared)
        return result

    def declare(self, app: App, *, conn: Connection | None = None) -> None:
        """Publish what ``app``'s tasks declare (queue, priority, attempts, limits), as each of its
        workers does when it starts, so that jobs enqueued by name get their task's options from
        the first one, before any worker has run (a deploy step, a test fixture). See the
        README's "Tasks and their options"."""
        self._run(self._declare_steps(app), conn)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction; results are in input order.

        One invalid job raises InvalidInput (naming its index) and none is stored. Idempotency
        keys are honoured against stored jobs and within the batch (the first occurrence wins).
        """
        specs = list(jobs)
        if self._tracing is None:
            return self._run(self._enqueue_many_steps(specs), conn)
        specs, undeclared = self._run(self._declared_steps(specs), conn)  # the span names the jobs' queue
        # One producer span for the batch, whose context every job stores (miniqueue.tracing).
        with self._tracing.sending(specs, batch=True) as send:
            results = send.sent(self._run(self._enqueue_many_steps(specs, send.context), conn))
        self._warn_undeclared(undeclared)
        return results

    def chain(self, steps: Sequence[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue jobs that run one after another: each step depends on the one before it
        (and on whatever its own ``depends_on`` names), and reads that step's result as
        ``job.parent_result``. One transaction: all the steps are stored, or none.

        A step that ends failed, dead or cancelled cancels the steps after it.
        """
        return self._run(self._chain_steps(steps), conn)

    def group(self, members: Sequence[JobSpec], *, then: JobSpec, conn: Connection | None = None) -> GroupResult:
        """Enqueue ``members`` to run in parallel, and ``then`` to run once after every member
        completed; its handler reads the members' results as ``job.parent_results`` (by
        member id, in the order given). One transaction: all are stored, or none.

        ``then`` is a job whose parents are the members, released by the completion of the
        last one in that completion's transaction: it becomes runnable exactly once, however
        the members' workers die. If a member ends failed, dead or cancelled, ``then`` is
        cancelled with an error naming it.
        """
        return self._run(self._group_steps(members, then), conn)

    def result(self, job_id: int) -> Any:
        """The result job ``job_id``'s handler returned (None if it returned nothing).

        Raises JobNotFound for an unknown id, JobNotFinished while it waits, is available or
        runs, and JobFailed (carrying the job's last error) when it ended failed, dead or
        cancelled.
        """
        return self._run(self._result_steps(job_id))

    def wait(self, job_id: int, *, timeout: float = 60.0) -> Any:
        """Wait for job ``job_id`` to finish and return its result, as :meth:`result` does.

        Woken by a notification the statement that finishes the job sends (no polling); a
        connection of its own is held for the wait. Raises WaitTimeout (a TimeoutError) if
        the job has not finished within ``timeout`` seconds.
        """
        job_id, timeout = _check_wait(job_id, timeout)
        return wait_for(self.store, session_dsn(self._dsn, self._pool.conninfo), job_id, timeout)

    def get(self, job_id: int, *, conn: Connection | None = None) -> JobRecord:
        """Every field of one job, with its error history; raises JobNotFound."""
        return self._run(self._get_steps(job_id), conn)

    def counts(self) -> list[QueueCount]:
        """Job counts by queue and state."""
        return self._run(self.store.counts_steps())

    def queue_stats(self, *, check_served: bool = True, conn: Connection | None = None) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, the oldest waiting job's age, expired
        leases, and whether any worker has ever served it (``check_served=False`` skips that
        read, one statement: every queue then says served, unchecked)."""
        return self._run(self._queue_stats_steps(check_served), conn)

    def recount(self) -> None:
        """Recount finished jobs from the jobs table, repairing counts that drifted (see the
        README's Operating section). It reads every finished row: a repair, not a routine."""
        self._run(self.store.recount_steps())

    def list_jobs(
        self, *, before_id: int | None = None, limit: int = 50, conn: Connection | None = None, **filters: Any
    ) -> list[JobRecord]:
        """Jobs matching the filters (state, queue, task, search, created_after, created_before),
        newest first; page with ``before_id``. A filter that no job could match (a queue or task
        name that breaks the naming rules) raises InvalidInput. On ``conn`` (yours), the list
        includes the jobs your open transaction enqueued."""
        return self._run(self._list_jobs_steps(before_id, limit, filters), conn)

    def prune(self, states: Iterable[State], older_than_seconds: float, *, batch_size: int = 1000) -> int:
        """Delete every job in ``states`` (terminal states only) that finished more than
        ``older_than_seconds`` ago, in batches; return how many were deleted."""
        return self._run(self._prune_steps(states, older_than_seconds, batch_size))

    def requeue(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Make failed, dead or cancelled jobs available again, with a fresh attempt budget.

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be requeued.
        """
        return self._run(self.store.requeue_steps(check_job_ids(job_ids)), conn)

    def requeue_matching(self, states: Iterable[State], *, queue: str | None = None, task: str | None = None) -> int:
        """Requeue every failed/dead/cancelled job matching the filter; return how many."""
        return self._run(self._requeue_matching_steps(states, queue, task))

    def cancel(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Cancel available or running jobs (a running handler is told at its next heartbeat).

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be cancelled.
        """
        return self._run(self.store.cancel_steps(check_job_ids(job_ids)), conn)

    def delete(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Delete jobs and their error history, except running ones (cancel them first); return
        the ids deleted, in order. (Client only: the store deletes on a sync connection.)"""
        ids = check_job_ids(job_ids)
        with self.connection(conn) as c:
            return self.store.delete(c, ids)

    # -- queues and schedules (operator calls) ---------------------------------------------------

    def pause_queues(self, names: Iterable[str], *, create: bool = False, conn: Connection | None = None) -> list[str]:
        """Stop every worker, on every host, from claiming jobs of these queues; return them.

        A name that is not known (no job waiting or running in it, never paused or resumed)
        raises InvalidInput naming it, and nothing is paused: a typo must not leave a paused
        queue that nothing uses. ``create=True`` pauses such a queue anyway (before its first job).
        """
        return self._run(self._set_paused_steps(names, True, create), conn)

    def resume_queues(self, names: Iterable[str], *, create: bool = False, conn: Connection | None = None) -> list[str]:
        """Let workers claim jobs of these queues again; return them (unknown names: as :meth:`pause_queues`)."""
        return self._run(self._set_paused_steps(names, False, create), conn)

    def paused_queues(self, *, conn: Connection | None = None) -> list[str]:
        """The queues paused now."""
        return self._run(self.store.paused_queues_steps(), conn)

    def list_queues(self) -> dict[str, bool]:
        """Every queue that has jobs or is paused, in name order, and whether it is paused."""
        return self._run(self._list_queues_steps())

    def limit_queue(self, name: str, max_running: int | None, *, create: bool = False) -> None:
        """Cap the running jobs of queue ``name`` across every worker on every host at
        ``max_running``; None lifts the cap. Unknown names: as :meth:`pause_queues`."""
        self._run(self._limit_queue_steps(name, max_running, create))

    def queue_limits(self, *, conn: Connection | None = None) -> dict[str, int]:
        """The queues with a cap on running jobs, and their caps."""
        return self._run(self.store.queue_limits_steps(), conn)

    def limit_waits(self, limit: int = 100, *, conn: Connection | None = None) -> list[LimitWait]:
        """The limits jobs are waiting on or hold slots of, most waiting first: for each, how many
        due jobs name it (for a queue's cap, every due job of the queue), and its slots held and
        the jobs holding them, or its tokens left."""
        return self._run(self.store.limit_waits_steps(limit), conn)

    def enable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: Connection | None = None
    ) -> None:
        """Enable periodic schedule ``name`` (see :meth:`disable_schedule` for which names are known)."""
        self._run(self._switch_schedule_steps(name, True, app, create), conn)

    def disable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: Connection | None = None
    ) -> None:
        """Disable periodic schedule ``name``: its slots are skipped until it is enabled again.

        The name must be known: a schedule some scheduler has run, or one of ``app``'s
        schedules (which may be switched before its first run). Otherwise InvalidInput names it
        and the known ones, and nothing is stored. ``create=True`` switches it without that
        check (a schedule not run yet then starts so).
        """
        self._run(self._switch_schedule_steps(name, False, app, create), conn)

    def periodic_state(self, *, conn: Connection | None = None) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule a scheduler has run or an operator switched: its last slot and
        whether it is enabled."""
        return self._run(self.store.periodic_state_steps(), conn)

    def now(self, *, conn: Connection | None = None) -> dt.datetime:
        """The database's clock (what schedules and delays are measured against)."""
        return self._run(self.store.now_steps(), conn)


def _each_indexed(steps: list[Steps[EnqueueResult]]) -> Steps[list[EnqueueResult]]:
    """Run each job's steps in turn; an error names the job's index in the batch."""
    results = []
    for index, job_steps in enumerate(steps):
        try:
            results.append((yield from job_steps))
        except InvalidInput as exc:  # a parent that does not exist, or ended
            raise InvalidInput(f"job {index}: {exc}") from exc
    return results


def session_dsn(dsn: str | None, pool_conninfo: str | Callable[[], str]) -> str:
    """A DSN for a connection of a client's own (a LISTEN needs a session): the one it was given,
    else its pool's."""
    if dsn is not None:
        return dsn
    return pool_conninfo() if callable(pool_conninfo) else pool_conninfo


def _check_wait(job_id: int, timeout: float) -> tuple[int, float]:
    """A wait's job id and timeout, checked."""
    return check_int_range("job id", job_id, JOB_ID_RANGE), check_seconds("wait timeout", timeout)


class _Borrowed:
    """The context manager :meth:`Client.connection` returns. (A class: a @contextmanager
    generator cost a one-by-one enqueue a third as much as the pool itself.)"""

    __slots__ = ("_dsn", "_given", "_pool", "_pooled")

    def __init__(self, pool: ConnectionPool[Connection], dsn: str | None, given: Connection | None) -> None:
        self._pool, self._dsn, self._given = pool, dsn, given
        self._pooled: Connection | None = None

    def __enter__(self) -> Connection:
        if self._given is not None:
            return self._given
        with translate_errors(self._dsn):
            self._pooled = self._pool.getconn()
        return self._pooled

    def __exit__(self, *exc: object) -> None:
        if self._pooled is not None:
            self._pool.putconn(self._pooled)
            self._pooled = None


def _plain(spec: JobSpec) -> bool:
    """Whether a job can go by COPY: no idempotency key, no limits."""
    return spec.idempotency_key is None and spec.concurrency_key is None and spec.rate_limit is None
