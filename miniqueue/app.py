"""Tasks: the registry that maps task names to handlers, and ``module:attribute`` loading."""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .client import Client
from .context import Job
from .db import AsyncConnection, Connection
from .errors import AppLoadError, ConfigError
from .job import EnqueueResult, JobSpec
from .periodic import CatchUp, Periodic
from .retry import Backoff, default_backoff
from .validation import MAX_ATTEMPTS_RANGE, PRIORITY_RANGE, check_int_range, check_queue_name, check_task_name

if TYPE_CHECKING:
    from .asyncclient import AsyncClient

Handler = Callable[[Job], Any]


@dataclass(frozen=True)
class Task:
    """A registered task: its handler and the defaults its jobs are enqueued with.

    ``timeout`` (seconds) is when :meth:`Job.should_stop` turns true; under the supervisor the
    worker process is killed (and the attempt charged) once it is exceeded by a grace period.
    """

    name: str
    handler: Handler
    queue: str = "default"
    max_attempts: int = 5
    priority: int = 0
    timeout: float | None = None
    backoff: Backoff = default_backoff


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
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of task ``name`` (default: its name).

        ``cron`` also schedules the task periodically (see :meth:`periodic`).
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
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice")
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
        self.schedules[schedule.name] = schedule
        return schedule

    def task_spec(self, task: str) -> JobSpec:
        """A JobSpec carrying ``task``'s queue, priority and max_attempts."""
        if task not in self.tasks:
            raise ConfigError(f"task {task!r} is not registered in this app (known: {', '.join(sorted(self.tasks))})")
        t = self.tasks[task]
        return JobSpec(task, queue=t.queue, priority=t.priority, max_attempts=t.max_attempts)

    @property
    def queues(self) -> list[str]:
        """Every queue a task of this app is enqueued to, sorted."""
        return sorted({task.queue for task in self.tasks.values()})

    def enqueue(
        self,
        client: Client,
        task: str,
        payload: Any = None,
        *,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        idempotency_key: str | None = None,
        conn: Connection | None = None,
        **overrides: Any,
    ) -> EnqueueResult:
        """Enqueue a job of a registered task with the task's queue, priority and max_attempts
        (each overridable by keyword)."""
        options = self._enqueue_options(task, overrides)
        return client.enqueue(
            task, payload, run_at=run_at, delay=delay, idempotency_key=idempotency_key, conn=conn, **options
        )

    async def aenqueue(
        self,
        client: AsyncClient,
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
        options = self._enqueue_options(task, overrides)
        return await client.enqueue(
            task, payload, run_at=run_at, delay=delay, idempotency_key=idempotency_key, conn=conn, **options
        )

    def _enqueue_options(self, task: str, overrides: dict[str, Any]) -> dict[str, Any]:
        """``task``'s queue, priority and max_attempts, with ``overrides`` applied."""
        spec = self.task_spec(task)
        options: dict[str, Any] = {"queue": spec.queue, "priority": spec.priority, "max_attempts": spec.max_attempts}
        unknown = set(overrides) - set(options)
        if unknown:
            raise ConfigError(f"unknown enqueue options {sorted(unknown)}: use queue, priority or max_attempts")
        options.update(overrides)
        return options


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


def _user_traceback(exc: BaseException) -> str:
    """The traceback of an import error without the import machinery's own frames, so the
    file and line that raised come first."""
    frames = [
        frame for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen importlib") and frame.filename != __file__
    ]  # fmt: skip
    return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)).rstrip()


def load_app(reference: str) -> App:
    """Import ``module:attribute`` and return the App it names, or raise AppLoadError."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(
            f"app reference {reference!r} is invalid: use 'module:attribute', e.g. 'myproject.tasks:app'"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`, let the current directory's modules be found
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken module can raise anything at import; report it whole
        raise AppLoadError(
            f"cannot import module {module_name!r} for app {reference!r}: {type(exc).__name__}: {exc}\n"
            f"{_user_traceback(exc)}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r} (app {reference!r})") from None
    if not isinstance(app, App):
        raise AppLoadError(f"{reference!r} is a {type(app).__name__}, not a miniqueue.App")
    return app
