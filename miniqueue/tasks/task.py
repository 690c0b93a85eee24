"""A registered task: its handler, the defaults its jobs are enqueued with, what it declares to
producers without the app, and which kind of handler it has (run on a thread or on the loop)."""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.backoff import Backoff, default_backoff, published_backoff
from ..core.fairness import NO_KEY
from ..core.records import Debounce, JobSpec, KeyOptions, TaskDeclaration
from .batch import Batch
from .job import Job

Handler = Callable[[Job], Any]
#: A limit key, or how to compute it from a job's payload (None: the job is not limited).
KeyOf = str | Callable[[Any], str | None] | None


@dataclass(frozen=True)
class Task:
    """A registered task: its handler and the defaults its jobs are enqueued with.

    ``timeout`` (seconds) is when :meth:`Job.should_stop` turns true; under the supervisor the
    worker process is killed (and the attempt charged) once it is exceeded by a grace period.
    ``concurrency_key``, ``max_concurrent``, ``rate_limit``, ``rate_limit_key`` and ``rate_cost``
    are the limits its jobs are enqueued with (see docs/guides/limits.md). With ``batch``, the handler
    receives a list of up to ``batch.size`` jobs at once (see :class:`~miniqueue.Batch`). With
    ``fair_by="key"`` its jobs take turns by key (see docs/guides/fairness.md).
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
    rate_cost: int | None = None
    unique_key: KeyOf = None
    unique_states: tuple[str, ...] | None = None
    unique_window: float | None = None
    on_conflict: str | Debounce | None = None
    sequence_key: KeyOf = None
    on_failure: str | None = None
    expires_in: float | None = None
    batch: Batch | None = None
    fair_by: str | None = None

    def spec(self, payload: Any = None) -> JobSpec:
        """A JobSpec of this task for ``payload``, its keys computed from the payload."""
        concurrency_key = _key_of(self.concurrency_key, payload)
        return JobSpec(
            self.name,
            payload,
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
            concurrency_key=concurrency_key,
            max_concurrent=self.max_concurrent,
            rate_limit=self.rate_limit,
            rate_limit_key=_key_of(self.rate_limit_key, payload),
            rate_cost=self.rate_cost,
            unique_key=_key_of(self.unique_key, payload),
            unique_states=self.unique_states,
            unique_window=self.unique_window,
            on_conflict=self.on_conflict,
            sequence_key=_key_of(self.sequence_key, payload),
            on_failure=self.on_failure,
            expires_in=self.expires_in,
            fair_key=None if self.fair_by is None else concurrency_key or NO_KEY,
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
            rate_cost=self.rate_cost,
            backoff_base=base,
            backoff_cap=cap,
            keys=self._key_options(),
        )

    def _key_options(self) -> KeyOptions | None:
        """What this task declares of its jobs' keys and deadline, as published (None: nothing)."""
        if self.unique_key is None and self.sequence_key is None and self.expires_in is None and self.fair_by is None:
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
            fair_by=self.fair_by,
        )


def _key_of(key: KeyOf, payload: Any) -> str | None:
    return key(payload) if callable(key) else key


def _seconds(value: float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


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
