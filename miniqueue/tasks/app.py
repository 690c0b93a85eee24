"""Tasks: the registry that maps task names to handlers, and ``module:attribute`` loading."""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import sys
import traceback
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.backoff import Backoff, default_backoff, published_backoff
from ..core.db import AsyncConnection, Connection
from ..core.errors import AppLoadError, ConfigError, InvalidInput
from ..core.keys import JobKeys, check_keys
from ..core.limits import job_scopes
from ..core.records import Debounce, EnqueueResult, JobSpec, KeyOptions, TaskDeclaration
from ..core.validation import MAX_ATTEMPTS_RANGE, PRIORITY_RANGE, check_int_range, check_queue_name, check_task_name
from .job import Job
from .periodic import CatchUp, Periodic


class Producer(Protocol):
    """What :meth:`App.enqueue` needs of a :class:`~miniqueue.Client` (the registry never
    imports the producer: the producer is built on the registry's records)."""

    @property
    def enqueue(self) -> Callable[..., EnqueueResult]: ...


class AsyncProducer(Protocol):
    """What :meth:`App.aenqueue` needs of an :class:`~miniqueue.AsyncClient`."""

    @property
    def enqueue(self) -> Callable[..., Awaitable[EnqueueResult]]: ...


Handler = Callable[[Job], Any]
#: A limit key, or how to compute it from a job's payload (None: the job is not limited).
KeyOf = str | Callable[[Any], str | None] | None


@dataclass(frozen=True)
class Task:
    """A registered task: its handler and the defaults its jobs are enqueued with.

    ``timeout`` (seconds) is when :meth:`Job.should_stop` turns true; under the supervisor the
    worker process is killed (and the attempt charged) once it is exceeded by a grace period.
    ``concurrency_key``, ``max_concurrent``, ``rate_limit`` and ``rate_limit_key`` are the
    limits its jobs are enqueued with (see docs/guides/limits.md).
    """

    name: str
    handler: Handler
    queue: str = "default"
    max_attempts: int = 5
    priority: int = 0
    timeout: float | None = None
    backoff: Backoff = default_backoff
    concurrency_key: KeyOf = None
    max_concurrent: int | None = None
    rate_limit: str | None = None
    rate_limit_key: KeyOf = None
    unique_key: KeyOf = None
    unique_states: tuple[str, ...] | None = None
    unique_window: float | None = None
    on_conflict: str | Debounce | None = None
    sequence_key: KeyOf = None
    on_failure: str | None = None
    expires_in: float | None = None

    def spec(self, payload: Any = None) -> JobSpec:
        """A JobSpec of this task for ``payload``, its keys computed from the payload."""
        return JobSpec(
            self.name,
            payload,
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
            concurrency_key=_key_of(self.concurrency_key, payload),
            max_concurrent=self.max_concurrent,
            rate_limit=self.rate_limit,
            rate_limit_key=_key_of(self.rate_limit_key, payload),
            unique_key=_key_of(self.unique_key, payload),
            unique_states=self.unique_states,
            unique_window=self.unique_window,
            on_conflict=self.on_conflict,
            sequence_key=_key_of(self.sequence_key, payload),
            on_failure=self.on_failure,
            expires_in=self.expires_in,
        )

    def declaration(self) -> TaskDeclaration:
        """What this task declares, as its workers publish it for producers without the app."""
        base, cap = published_backoff(self.backoff) or (None, None)
        return TaskDeclaration(
            self.name,
            self.queue,
            self.priority,
            self.max_attempts,
            concurrency_key=None if callable(self.concurrency_key) else self.concurrency_key,
            concurrency_key_computed=callable(self.concurrency_key),
            max_concurrent=self.max_concurrent,
            rate_limit=self.rate_limit,
            rate_limit_key=None if callable(self.rate_limit_key) else self.rate_limit_key,
            rate_limit_key_computed=callable(self.rate_limit_key),
            backoff_base=base,
            backoff_cap=cap,
            keys=self._key_options(),
        )

    def _key_options(self) -> KeyOptions | None:
        """What this task declares of its jobs' keys and deadline, as published (None: nothing)."""
        if self.unique_key is None and self.sequence_key is None and self.expires_in is None:
            return None
        debounce = self.on_conflict if isinstance(self.on_conflict, Debounce) else None
        mode = "debounce" if isinstance(self.on_conflict, Debounce) else self.on_conflict
        return KeyOptions(
            unique_key=None if callable(self.unique_key) else self.unique_key,
            unique_key_computed=callable(self.unique_key),
            unique_states=self.unique_states,
            unique_window=self.unique_window,
            on_conflict=mode,
            debounce_wait=None if debounce is None else _seconds(debounce.wait),
            debounce_max_wait=None if debounce is None else _seconds(debounce.max_wait),
            sequence_key=None if callable(self.sequence_key) else self.sequence_key,
            sequence_key_computed=callable(self.sequence_key),
            on_failure=self.on_failure,
            expires_in=self.expires_in,
        )


def _key_of(key: KeyOf, payload: Any) -> str | None:
    return key(payload) if callable(key) else key


def _seconds(value: float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


class App:
    """A set of tasks. Register handlers with :meth:`task`; workers run the app's tasks."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Periodic] = {}

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
        concurrency_key: KeyOf = None,
        max_concurrent: int | None = None,
        rate_limit: str | None = None,
        rate_limit_key: KeyOf = None,
        unique_key: KeyOf = None,
        unique_states: Collection[str] | None = None,
        unique_window: float | dt.timedelta | None = None,
        on_conflict: str | Debounce | None = None,
        sequence_key: KeyOf = None,
        on_failure: str | None = None,
        expires_in: float | dt.timedelta | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of task ``name`` (default: its name).

        ``cron`` also schedules the task periodically (see :meth:`periodic`). Limits, enforced
        across every worker on every host: with a ``concurrency_key`` (a string, or a function
        of the payload returning one or None), at most ``max_concurrent`` (default 1) jobs of
        this task with the same key run at once; with a ``rate_limit`` (``"100/s"``, ``"30/min"``,
        ``"1000/h"``), at most that many start, per task or per ``rate_limit_key``.

        Keys and deadlines, however its jobs are enqueued (see docs/guides/keys.md): a
        ``unique_key`` (a string, or a function of the payload) with its ``unique_states``,
        ``unique_window`` and ``on_conflict``; a ``sequence_key`` (jobs of one key run one at a
        time, in order) with its ``on_failure``; ``expires_in``, seconds after which a job not
        started never starts.
        """

        def register(handler: Handler) -> Handler:
            task_name = check_task_name(name or handler.__name__)
            if _is_async_generator(handler):
                raise ConfigError(
                    f"task {task_name!r}: the handler is an async generator function (it yields): define "
                    "it with 'async def' and no 'yield', or with 'def'"
                )
            if cron is not None and task_name not in self.schedules:
                Periodic(task_name, cron, task_name)  # validate before registering anything
                if on_conflict not in (None, "keep"):
                    raise ConfigError(_replacing_schedule(task_name, task_name))
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice")
            if callable(concurrency_key) or callable(rate_limit_key):
                job_scopes(task_name, "key", max_concurrent, rate_limit, None if rate_limit_key is None else "key")
            else:
                job_scopes(task_name, concurrency_key, max_concurrent, rate_limit, rate_limit_key)
            keys = _check_declared_keys(
                task_name, unique_key, unique_states, unique_window, on_conflict, sequence_key, on_failure, expires_in
            )
            if timeout is not None and not timeout > 0:
                raise ConfigError(
                    f"task {task_name!r}: timeout {timeout!r} is invalid: use a positive number of seconds"
                )
            self.tasks[task_name] = Task(
                name=task_name,
                handler=handler,
                queue=check_queue_name(queue),
                max_attempts=check_int_range("max_attempts", max_attempts, MAX_ATTEMPTS_RANGE),
                priority=check_int_range("priority", priority, PRIORITY_RANGE),
                timeout=timeout,
                backoff=backoff or default_backoff,
                concurrency_key=concurrency_key,
                max_concurrent=max_concurrent,
                rate_limit=rate_limit,
                rate_limit_key=rate_limit_key,
                unique_key=unique_key,
                unique_states=None if unique_states is None else tuple(sorted(unique_states)),
                unique_window=keys.unique_window,
                on_conflict=on_conflict,
                sequence_key=sequence_key,
                on_failure=on_failure,
                expires_in=keys.expires_in,
            )
            if cron is not None:
                self.periodic(cron, task=task_name)
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
    ) -> Periodic:
        """Enqueue a job of ``task`` at every slot of the cron expression ``cron`` (UTC).

        The reaper process schedules it; each slot is enqueued exactly once across every
        supervisor sharing the database. ``catch_up`` decides what happens to a slot missed
        during downtime: ``"skip"`` it if more than ``grace`` seconds late, or run the
        ``"latest"`` missed slot once.
        """
        schedule = Periodic(name or task, cron, task, payload, catch_up, grace)
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
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        idempotency_key: str | None = None,
        conn: Connection | None = None,
        **overrides: Any,
    ) -> EnqueueResult:
        """Enqueue a job of a registered task with the task's queue, priority, max_attempts,
        limits, keys and deadline (each overridable by keyword: queue, priority, max_attempts,
        concurrency_key, max_concurrent, rate_limit, rate_limit_key, unique_key, unique_states,
        unique_window, on_conflict, sequence_key, on_failure, expires_in, expires_at)."""
        return client.enqueue(conn=conn, **self._enqueue_spec(task, payload, run_at, delay, idempotency_key, overrides))

    async def aenqueue(
        self,
        client: AsyncProducer,
        task: str,
        payload: Any = None,
        *,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        idempotency_key: str | None = None,
        conn: AsyncConnection | None = None,
        **overrides: Any,
    ) -> EnqueueResult:
        """:meth:`enqueue` with an :class:`~miniqueue.AsyncClient` (``conn``: an ``AsyncConnection``)."""
        spec = self._enqueue_spec(task, payload, run_at, delay, idempotency_key, overrides)
        return await client.enqueue(conn=conn, **spec)

    def _enqueue_spec(
        self,
        task: str,
        payload: Any,
        run_at: dt.datetime | None,
        delay: float | dt.timedelta | None,
        idempotency_key: str | None,
        overrides: dict[str, Any],
    ) -> dict[str, Any]:
        """The enqueue arguments of a job of ``task``: the task's defaults, with ``overrides``."""
        unknown = set(overrides) - _OVERRIDABLE
        if unknown:
            raise ConfigError(f"unknown enqueue options {sorted(unknown)}: use {', '.join(sorted(_OVERRIDABLE))}")
        spec = self.task_spec(task, payload)._replace(
            run_at=run_at, delay=delay, idempotency_key=idempotency_key, **overrides
        )
        return spec._asdict()


#: The task defaults :meth:`App.enqueue` lets a caller override.
_OVERRIDABLE = frozenset(
    {
        "queue",
        "priority",
        "max_attempts",
        "concurrency_key",
        "max_concurrent",
        "rate_limit",
        "rate_limit_key",
        "unique_key",
        "unique_states",
        "unique_window",
        "on_conflict",
        "sequence_key",
        "on_failure",
        "expires_in",
        "expires_at",
    }
)


def _replacing_schedule(schedule: str, task: str) -> str:
    return (
        f"periodic schedule {schedule!r}: task {task!r} replaces or debounces on a conflict of its unique key, "
        "and a slot's job carries an idempotency key (each slot is enqueued once), which cannot go with it; "
        "give the schedule a task that keeps the first job"
    )


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


def is_async_handler(handler: Handler) -> bool:
    """True for a handler the worker awaits on its event loop: an ``async def`` function, a
    ``functools.partial`` of one, or a callable object with an ``async def __call__``."""
    return any(inspect.iscoroutinefunction(candidate) for candidate in _callables(handler))


def _is_async_generator(handler: Handler) -> bool:
    """True for an ``async def`` handler that yields: calling it returns no awaitable."""
    return any(inspect.isasyncgenfunction(candidate) for candidate in _callables(handler))


def _callables(handler: Handler) -> tuple[object, ...]:
    """The handler and its ``__call__`` method (an object's ``async def __call__``)."""
    return (handler, getattr(handler, "__call__", None))  # noqa: B004 (the method itself)


def _where(exc: BaseException) -> str:
    """Where an import error was raised in the app's own code, as `` (at FILE:LINE)``: the
    innermost frame outside the import machinery, or nothing (a module that does not exist)."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ") and frame.filename not in (importlib.__file__, __file__)
    ]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def load_app(reference: str) -> App:
    """Import ``module:attribute`` and return the App it names, or raise AppLoadError, whose
    message is one line naming the reference and why it failed (where, for an error the app's
    own code raised)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(
            f"app reference {reference!r} is invalid: use 'module:attribute', e.g. 'myproject.tasks:app'"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`, let the current directory's modules be found
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken module can raise anything at import
        reason = " ".join(str(exc).split())  # one line, whatever the module raised
        raise AppLoadError(
            f"cannot import module {module_name!r} for app {reference!r}: {type(exc).__name__}: {reason}{_where(exc)}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r} (app {reference!r})") from None
    if not isinstance(app, App):
        raise AppLoadError(f"{reference!r} is a {type(app).__name__}, not a miniqueue.App")
    return app
