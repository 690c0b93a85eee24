"""Tasks: the registry that maps task names to handlers, and ``module:attribute`` loading."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ..core.backoff import Backoff, default_backoff
from ..core.db import AsyncConnection, Connection
from ..core.errors import ConfigError, InvalidInput
from ..core.fairness import check_fair_by
from ..core.keys import JobKeys, check_keys
from ..core.limits import check_rate_cost, job_scopes
from ..core.options import JobOptions, check_options
from ..core.records import Debounce, EnqueueResult, GroupResult, JobSpec, TaskDeclaration
from ..core.validation import MAX_ATTEMPTS_RANGE, PRIORITY_RANGE, check_int_range, check_queue_name, check_task_name
from .batch import Batch
from .middleware import Middleware, MiddlewareStack, group_results
from .periodic import CatchUp, Periodic
from .task import Handler, KeyOf, Task, _is_async_generator

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

#: A task's handler as the decorator returns it: of one job, or of a batch of them.
HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])


class Producer(Protocol):
    """What :meth:`App.enqueue` needs of a :class:`~miniqueue.Client` (the registry never
    imports the producer: the producer is built on the registry's records)."""

    @property
    def enqueue(self) -> Callable[..., EnqueueResult]: ...
    @property
    def chain(self) -> Callable[..., list[EnqueueResult]]: ...
    @property
    def group(self) -> Callable[..., GroupResult]: ...


class AsyncProducer(Protocol):
    """What :meth:`App.aenqueue` needs of an :class:`~miniqueue.AsyncClient`."""

    @property
    def enqueue(self) -> Callable[..., Awaitable[EnqueueResult]]: ...
    @property
    def chain(self) -> Callable[..., Awaitable[list[EnqueueResult]]]: ...
    @property
    def group(self) -> Callable[..., Awaitable[GroupResult]]: ...


M = TypeVar("M", bound=Middleware)


class App:
    """A set of tasks. Register handlers with :meth:`task`; workers run the app's tasks."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Periodic] = {}
        self.middleware_stack = MiddlewareStack()

    def middleware(self, middleware: M) -> M:
        """Run ``middleware`` (a :class:`~miniqueue.Middleware`) around each enqueue through this
        app (:meth:`enqueue`, :meth:`chain`, :meth:`group` and their async forms) and each run of
        its jobs' handlers, in every worker of the app; return it.

        The first registered is nearest the database: on an enqueue it sees the spec last,
        just before it is stored; around a run it is the outermost (see docs/guides/middleware.md).
        A job enqueued without the app (a :class:`~miniqueue.Client` given only a task name, the
        command line) passes no enqueue hook, and its handler still runs inside the run hooks.
        """
        self.middleware_stack.add(middleware)
        return middleware

    def task(
        self,
        name: str | None = None,
        *,
        queue: str = "default",
        max_attempts: int = 5,
        priority: int = 0,
        timeout: float | None = None,
        backoff: Backoff | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        concurrency_key: KeyOf = None,
        max_concurrent: int | None = None,
        rate_limit: str | None = None,
        rate_limit_key: KeyOf = None,
        rate_cost: int | None = None,
        unique_key: KeyOf = None,
        unique_states: Collection[str] | None = None,
        unique_window: float | dt.timedelta | None = None,
        on_conflict: str | Debounce | None = None,
        sequence_key: KeyOf = None,
        on_failure: str | None = None,
        expires_in: float | dt.timedelta | None = None,
        batch: Batch | None = None,
        fair_by: str | None = None,
    ) -> Callable[[HandlerT], HandlerT]:
        """Register the decorated function as the handler of task ``name`` (default: its name).

        The queue, priority, attempts, limits, keys and ``expires_in`` are what every job of the
        task gets however it is enqueued, unless its producer gives its own; each means what the
        job option of its name does (see :class:`~miniqueue.JobOptions`). A key
        (``concurrency_key``, ``rate_limit_key``, ``unique_key``, ``sequence_key``) may also be a
        function of the payload returning one, or None.

        ``cron`` also schedules the task periodically, on the wall clock of ``timezone``
        (default UTC; see :meth:`periodic`).

        ``fair_by="key"``: the task's jobs take turns by key with the other fair jobs of their
        queue, each key's in their order (the fair key is the job's ``fair_key``, else its
        ``concurrency_key``; see docs/guides/fairness.md).

        ``batch`` (a :class:`~miniqueue.Batch`): the handler receives a ``list[Job]`` of up to
        ``batch.size`` jobs, waiting at most ``batch.wait`` seconds to fill one, and returns each
        job's outcome by id (see docs/guides/tasks.md, "Batch handlers").
        """

        def register(handler: HandlerT) -> HandlerT:
            task_name = check_task_name(name or handler.__name__)
            if _is_async_generator(handler):
                raise ConfigError(
                    f"task {task_name!r}: the handler is an async generator function (it yields): define "
                    "it with 'async def' and no 'yield', or with 'def'"
                )
            if timezone is not None and cron is None:
                raise ConfigError(f"task {task_name!r}: timezone {timezone!r} is for a cron schedule: give cron too")
            zone = "UTC" if timezone is None else timezone
            if cron is not None and task_name not in self.schedules:
                Periodic(task_name, cron, task_name, timezone=zone)  # validate before registering anything
                if on_conflict not in (None, "keep"):
                    raise ConfigError(_replacing_schedule(task_name, task_name))
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice")
            if callable(concurrency_key) or callable(rate_limit_key):
                scopes = job_scopes(
                    task_name, "key", max_concurrent, rate_limit, None if rate_limit_key is None else "key"
                )
            else:
                scopes = job_scopes(task_name, concurrency_key, max_concurrent, rate_limit, rate_limit_key)
            if rate_cost is not None:
                check_rate_cost(rate_cost, scopes)
            keys = _check_declared_keys(
                task_name, unique_key, unique_states, unique_window, on_conflict, sequence_key, on_failure, expires_in
            )
            if timeout is not None and not timeout > 0:
                raise ConfigError(
                    f"task {task_name!r}: timeout {timeout!r} is invalid: use a positive number of seconds"
                )
            self.tasks[task_name] = Task(
                name=task_name,
                handler=cast(Handler, handler),
                queue=check_queue_name(queue),
                max_attempts=check_int_range("max_attempts", max_attempts, MAX_ATTEMPTS_RANGE),
                priority=check_int_range("priority", priority, PRIORITY_RANGE),
                timeout=timeout,
                backoff=backoff or default_backoff,
                concurrency_key=concurrency_key,
                max_concurrent=max_concurrent,
                rate_limit=rate_limit,
                rate_limit_key=rate_limit_key,
                rate_cost=rate_cost,
                unique_key=unique_key,
                unique_states=None if unique_states is None else tuple(sorted(unique_states)),
                unique_window=keys.unique_window,
                on_conflict=on_conflict,
                sequence_key=sequence_key,
                on_failure=on_failure,
                expires_in=keys.expires_in,
                batch=None if batch is None else batch.checked(task_name),
                fair_by=_check_fair_by(task_name, fair_by),
            )
            if cron is not None:
                self.periodic(cron, task=task_name, timezone=zone)
            return handler

        return register

    def periodic(
        self,
        cron: str,
        *,
        task: str,
        payload: Any = None,
        name: str | None = None,
        catch_up: CatchUp = "skip",
        grace: float = 300.0,
        timezone: str = "UTC",
    ) -> Periodic:
        """Enqueue a job of ``task`` at every slot of the cron expression ``cron``.

        The cron is read on the wall clock of ``timezone``, a tz database name (an unknown one
        is a ConfigError). Where that clock jumps, a cron whose hour field starts with ``*``
        runs at every instant whose time matches (none in a skipped hour, twice in a repeated
        one); any other runs once per wall-clock time: a repeated time at its first occurrence,
        a skipped one at the first instant after the jump (docs/guides/periodic.md).

        The reaper process schedules it; each slot is enqueued exactly once across every
        supervisor sharing the database. ``catch_up`` decides what happens to a slot missed
        during downtime: ``"skip"`` it if more than ``grace`` seconds late, or run the
        ``"latest"`` missed slot once.
        """
        schedule = Periodic(name or task, cron, task, payload, catch_up, grace, timezone)
        if schedule.name in self.schedules:
            raise ConfigError(f"periodic schedule {schedule.name!r} is registered twice")
        declared = self.tasks.get(task)
        if declared is not None and declared.on_conflict not in (None, "keep"):
            raise ConfigError(_replacing_schedule(schedule.name, task))
        self.schedules[schedule.name] = schedule
        return schedule

    def task_spec(self, task: str, payload: Any = None) -> JobSpec:
        """A JobSpec of ``task`` for ``payload``: the task's queue, priority, max_attempts and limits."""
        if task not in self.tasks:
            raise ConfigError(f"task {task!r} is not registered in this app (known: {', '.join(sorted(self.tasks))})")
        return self.tasks[task].spec(payload)

    def declarations(self) -> list[TaskDeclaration]:
        """What each task declares (see :meth:`Task.declaration`)."""
        return [task.declaration() for task in self.tasks.values()]

    @property
    def queues(self) -> list[str]:
        """Every queue a task of this app is enqueued to, sorted."""
        return sorted({task.queue for task in self.tasks.values()})

    def enqueue(
        self,
        client: Producer,
        task: str,
        payload: Any = None,
        *,
        conn: Connection | None = None,
        **options: Unpack[JobOptions],
    ) -> EnqueueResult:
        """Enqueue a job of a registered task with what the task declares (queue, priority,
        max_attempts, limits, keys and deadline), each option given in ``options`` winning (see
        :class:`~miniqueue.JobOptions`); an unknown option is a ConfigError.

        The job passes the enqueue hooks of the app's middleware, inside ``conn``'s transaction
        when one is given."""
        spec = self._enqueue_spec(task, payload, options)
        return self.middleware_stack.enqueue_one(spec, lambda spec: client.enqueue(conn=conn, **spec._asdict()))

    async def aenqueue(
        self,
        client: AsyncProducer,
        task: str,
        payload: Any = None,
        *,
        conn: AsyncConnection | None = None,
        **options: Unpack[JobOptions],
    ) -> EnqueueResult:
        """:meth:`enqueue` with an :class:`~miniqueue.AsyncClient` (``conn``: an ``AsyncConnection``)."""
        spec = self._enqueue_spec(task, payload, options)
        return await self.middleware_stack.aenqueue_one(spec, lambda spec: client.enqueue(conn=conn, **spec._asdict()))

    def chain(
        self, client: Producer, steps: Sequence[JobSpec], *, conn: Connection | None = None
    ) -> list[EnqueueResult]:
        """:meth:`Client.chain <miniqueue.Client.chain>`, each step through the enqueue hooks of
        the app's middleware (in ``conn``'s transaction when one is given)."""
        return self.middleware_stack.enqueue(steps, lambda specs: client.chain(specs, conn=conn), list)

    async def achain(
        self, client: AsyncProducer, steps: Sequence[JobSpec], *, conn: AsyncConnection | None = None
    ) -> list[EnqueueResult]:
        """:meth:`chain` with an :class:`~miniqueue.AsyncClient`."""
        return await self.middleware_stack.aenqueue(steps, lambda specs: client.chain(specs, conn=conn), list)

    def group(
        self, client: Producer, members: Sequence[JobSpec], *, conn: Connection | None = None, **callbacks: JobSpec
    ) -> GroupResult:
        """:meth:`Client.group <miniqueue.Client.group>` (callbacks ``then``, ``on_success``,
        ``on_complete``, ``on_failure``), each member and callback through the enqueue hooks
        of the app's middleware (in ``conn``'s transaction when one is given)."""
        n = len(members)

        def store(specs: list[JobSpec]) -> GroupResult:
            return client.group(specs[:n], conn=conn, **dict(zip(callbacks, specs[n:], strict=True)))

        return self.middleware_stack.enqueue([*members, *callbacks.values()], store, group_results(callbacks))

    async def agroup(
        self,
        client: AsyncProducer,
        members: Sequence[JobSpec],
        *,
        conn: AsyncConnection | None = None,
        **callbacks: JobSpec,
    ) -> GroupResult:
        """:meth:`group` with an :class:`~miniqueue.AsyncClient`."""
        n = len(members)

        def store(specs: list[JobSpec]) -> Awaitable[GroupResult]:
            return client.group(specs[:n], conn=conn, **dict(zip(callbacks, specs[n:], strict=True)))

        return await self.middleware_stack.aenqueue([*members, *callbacks.values()], store, group_results(callbacks))

    def _enqueue_spec(self, task: str, payload: Any, options: JobOptions) -> JobSpec:
        """A job of ``task``: the task's defaults, with ``options``."""
        check_options(options, ConfigError)
        return self.task_spec(task, payload)._replace(**options)


def _replacing_schedule(schedule: str, task: str) -> str:
    return (
        f"periodic schedule {schedule!r}: task {task!r} replaces or debounces on a conflict of its unique key, "
        "and a slot's job carries an idempotency key (each slot is enqueued once), which cannot go with it; "
        "give the schedule a task that keeps the first job"
    )


def _check_fair_by(task: str, fair_by: object) -> str | None:
    try:
        return check_fair_by(fair_by)
    except InvalidInput as exc:
        raise ConfigError(f"task {task!r}: {exc}") from exc


def _check_declared_keys(
    task: str,
    unique_key: KeyOf,
    unique_states: Collection[str] | None,
    unique_window: float | dt.timedelta | None,
    on_conflict: str | Debounce | None,
    sequence_key: KeyOf,
    on_failure: str | None,
    expires_in: float | dt.timedelta | None,
) -> JobKeys:
    """The key options of a task, checked as a job's are (a computed key stands in as "key"),
    or ConfigError naming the task."""
    spec = JobSpec(
        task,
        unique_key=None if unique_key is None else "key",
        unique_states=unique_states,
        unique_window=unique_window,
        on_conflict=on_conflict,
        sequence_key=None if sequence_key is None else "key",
        on_failure=on_failure,
        expires_in=expires_in,
    )
    try:
        return check_keys(spec)
    except InvalidInput as exc:
        raise ConfigError(f"task {task!r}: {exc}") from None
