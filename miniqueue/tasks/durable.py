"""Durable jobs, as a handler sees them: steps that run once, durable sleep, and waiting for a
signal (see docs/guides/durable.md).

A job's steps are recorded on its row in the order the handler runs them. When the job runs
again (a crash, a retry, a lost lease, after a sleep or a signal), each step the handler asks
for in that order returns what was recorded without running, and the first one not recorded
runs. The one rule for the handler: ask for the same steps in the same order, each name once per
run. A name asked for twice, or a step where another was recorded, raises :class:`StepError`.

The database work is the worker's (:class:`StepStore`, implemented in
:mod:`miniqueue.worker.worker_steps`); this module holds the bookkeeping both kinds of handler share.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
from collections.abc import Callable
from typing import Any, Literal, Protocol

from psycopg import AsyncConnection

from ..core.db import Connection
from ..core.keys import check_key
from ..core.validation import encode_value


class StepError(Exception):
    """A handler asked for its steps in another order than the one recorded, or for one name
    twice in a run: replaying a recorded value there could be the wrong one, so the attempt fails
    (and retries by the task's policy) instead."""

    __module__ = "miniqueue"


class SignalTimeout(Exception):
    """``job.wait_for(key, timeout=...)`` timed out before a signal of ``key`` came (the handler
    may catch it and go on: when the job runs again, the same wait raises it again)."""

    __module__ = "miniqueue"

    def __init__(self, key: str, name: str) -> None:
        super().__init__(f"no signal {key!r} came before the timeout of step {name!r}")
        self.key, self.name = key, name


class JobSuspended(BaseException):
    """Raised by a durable sleep or wait once the job is handed back: the run ends here, and the
    job runs again when the sleep ends or the signal comes. A BaseException, like
    ``asyncio.CancelledError``, so that a handler's ``except Exception`` does not swallow it."""

    def __init__(self, kind: Literal["slept", "waiting"], name: str, seconds: float = 0.0) -> None:
        super().__init__(f"{kind}: {name}")
        #: How long a sleep lasts (0 for a wait): its worker looks for the job again then.
        self.kind, self.name, self.seconds = kind, name, seconds


class StepStore(Protocol):
    """What a durable job asks of its worker's database (see :mod:`miniqueue.worker.worker_steps`).
    Every call is fenced by the job's worker and attempt, and raises LeaseLost once they no
    longer hold it."""

    def recorded(self, job: Any) -> list[dict[str, Any]]: ...
    def record(self, job: Any, name: str, value: str) -> None: ...
    def record_in_transaction(self, job: Any, name: str, work: Callable[[Connection], str]) -> str: ...
    def sleep(self, job: Any, name: str, seconds: float) -> None: ...
    def wait(self, job: Any, name: str, key: str, timeout: float | None) -> tuple[bool, Any]: ...
    async def arecorded(self, job: Any) -> list[dict[str, Any]]: ...
    async def arecord(self, job: Any, name: str, value: str) -> None: ...
    async def arecord_in_transaction(self, job: Any, name: str, work: Callable[[AsyncConnection[Any]], Any]) -> str: ...
    async def asleep(self, job: Any, name: str, seconds: float) -> None: ...
    async def await_(self, job: Any, name: str, key: str, timeout: float | None) -> tuple[bool, Any]: ...


class StepLog:
    """A run's walk through its job's recorded steps: which come next, which names it used."""

    def __init__(self, job_id: int, recorded: list[dict[str, Any]]) -> None:
        self.job_id = job_id
        # A last wait still marked "waiting" never resolved (the job was cancelled while it waited,
        # then requeued): it is asked for again.
        self.recorded = [entry for entry in recorded if not entry.get("waiting")]
        self.position = 0
        self.names: set[str] = set()
        self.counts: dict[str, int] = {}

    def auto_name(self, prefix: str) -> str:
        """``prefix #n``: the n-th step of that prefix in this run (sleeps and waits unnamed)."""
        self.counts[prefix] = self.counts.get(prefix, 0) + 1
        return f"{prefix} #{self.counts[prefix]}"

    def next(self, name: str, kind: str) -> dict[str, Any] | None:
        """The recorded entry of the next step, ``name`` of ``kind``, or None: not recorded yet."""
        if not isinstance(name, str) or not name:
            raise StepError(f"job {self.job_id}: a step's name must be a non-empty string, not {name!r}")
        if name in self.names:
            raise StepError(
                f"job {self.job_id}: step {name!r} was asked for twice in one run: give each step its own name"
            )
        self.names.add(name)
        position, self.position = self.position, self.position + 1
        if position >= len(self.recorded):
            return None
        entry = self.recorded[position]
        if entry.get("name") != name or entry.get("kind") != kind:
            raise StepError(
                f"job {self.job_id}: step {position + 1} was recorded as {entry.get('kind')} {entry.get('name')!r}, "
                f"and this run asks for {kind} {name!r} there: the handler's steps changed order since "
                "(a recorded step never runs again, so each run must ask for them in the recorded order)"
            )
        return entry


def seconds_of(delay: float | dt.timedelta, what: str) -> float:
    """``delay`` in seconds, or ValueError naming ``what`` for a negative or infinite one."""
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else float(delay)
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{what} {delay!r} is invalid: use a non-negative number of seconds or a timedelta")
    return seconds


def signal_value(entry: dict[str, Any], key: str, name: str) -> Any:
    """What a recorded wait gives its handler: the signal's data, or SignalTimeout."""
    if entry.get("timed_out"):
        raise SignalTimeout(key, name)
    return entry.get("value")


class DurableSteps:
    """The durable part of :class:`~miniqueue.Job`: steps, sleeps and waits (a mixin: the job
    gives it ``id``, ``_steps_store``, ``_max_result_bytes`` and ``_on_event_loop``: whether it
    runs an ``async def`` handler, on the event loop, where only the ``a`` forms may be used)."""

    id: int
    _steps_store: StepStore | None
    _max_result_bytes: int
    _step_log: StepLog | None = None

    @property
    def _on_event_loop(self) -> bool:
        raise NotImplementedError  # the job says

    @property
    def completing_on(self) -> Any:
        raise NotImplementedError  # the job says

    def _suspend_store(self, what: str, *, on_event_loop: bool) -> StepStore:
        """The store for a sleep or a wait, which hands the job back: never inside the block of
        ``job.transaction()``, which would roll back what it wrote and then complete the job."""
        if self.completing_on is not None:
            block = "async with job.atransaction()" if on_event_loop else "with job.transaction()"
            raise RuntimeError(
                f"job {self.id}: {what} cannot run inside '{block}': the block completes the job when it "
                "ends; sleep or wait before the block"
            )
        return self._store(on_event_loop=on_event_loop)

    def _store(self, *, on_event_loop: bool) -> StepStore:
        if self._steps_store is None:
            raise RuntimeError(f"job {self.id}: steps, sleeps and waits need a miniqueue Worker to run the job")
        if on_event_loop != self._on_event_loop:
            raise RuntimeError(
                f"job {self.id}: an 'async def' handler awaits job.astep(), job.asleep() and job.await_for()"
                if on_event_loop is False
                else f"job {self.id}: a 'def' handler calls job.step(), job.sleep() and job.wait_for()"
            )
        return self._steps_store

    def _encode(self, name: str, value: Any) -> str:
        return encode_value(f"the value of step {name!r}", value, max_bytes=self._max_result_bytes)

    def _log(self) -> StepLog:
        if self._step_log is None:
            self._step_log = StepLog(self.id, self._store(on_event_loop=False).recorded(self))
        return self._step_log

    async def _alog(self) -> StepLog:
        if self._step_log is None:
            self._step_log = StepLog(self.id, await self._store(on_event_loop=True).arecorded(self))
        return self._step_log

    # -- def handlers ---------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job: its return value (JSON, by the result's
        rules) is recorded, fenced by this attempt, before ``step`` returns it; when the job runs
        again, the recorded value comes back without ``fn`` running. The value is returned as JSON
        gives it back (a tuple becomes a list), the same on the first run and on every later one.
        A step whose ``fn`` raises is not recorded: the exception goes on, as the handler's."""
        entry = self._log().next(name, "step")
        if entry is not None:
            return entry.get("value")
        value = self._encode(name, fn(*args, **kwargs))
        self._store(on_event_loop=False).record(self, name, value)
        return json.loads(value)

    def step_transaction(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` whose ``fn(conn, *args, **kwargs)`` writes on ``conn`` commit with the
        step's record, in one transaction: exactly once, like :meth:`Job.transaction`. (A function,
        not a ``with`` block: a recorded step must not run its body again, and a block cannot be
        skipped.)"""
        entry = self._log().next(name, "step")
        if entry is not None:
            return entry.get("value")
        value = self._store(on_event_loop=False).record_in_transaction(
            self, name, lambda conn: self._encode(name, fn(conn, *args, **kwargs))
        )
        return json.loads(value)

    def sleep(self, delay: float | dt.timedelta, *, name: str | None = None) -> None:
        """End this run for ``delay`` (seconds or a timedelta) without spending an attempt, a
        worker or a lease: the job is due again when the database clock says the sleep ended,
        and its recorded steps are kept. When it runs again, this sleep returns at once."""
        seconds = seconds_of(delay, "sleep")
        log = self._log()
        step_name = name or log.auto_name("sleep")
        if log.next(step_name, "sleep") is not None:
            return
        self._suspend_store("job.sleep()", on_event_loop=False).sleep(self, step_name, seconds)
        raise JobSuspended("slept", step_name, seconds)

    def wait_for(self, key: str, *, timeout: float | dt.timedelta | None = None, name: str | None = None) -> Any:
        """Return the data of a signal of ``key`` (``client.signal(key, data)``): one kept for
        it already, or, if none is, park the job (no worker, no lease, no attempt spent) until
        one comes. After ``timeout`` without one the job runs again and this raises
        :class:`SignalTimeout`."""
        key, seconds, log = _key(key), _timeout(timeout), self._log()
        step_name = name or log.auto_name(f"signal {key}")
        entry = log.next(step_name, "signal")
        if entry is not None:
            return signal_value(entry, key, step_name)
        got, data = self._suspend_store("job.wait_for()", on_event_loop=False).wait(self, step_name, key, seconds)
        if not got:
            raise JobSuspended("waiting", step_name)
        return data

    # -- async def handlers ---------------------------------------------------------------------

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for an ``async def`` handler; ``fn`` may be a coroutine function."""
        entry = (await self._alog()).next(name, "step")
        if entry is not None:
            return entry.get("value")
        returned = fn(*args, **kwargs)
        if inspect.isawaitable(returned):
            returned = await returned
        value = self._encode(name, returned)
        await self._store(on_event_loop=True).arecord(self, name, value)
        return json.loads(value)

    async def astep_transaction(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """:meth:`step_transaction` for an ``async def`` handler: ``await fn(conn, ...)`` on a
        ``psycopg.AsyncConnection``."""
        entry = (await self._alog()).next(name, "step")
        if entry is not None:
            return entry.get("value")

        async def work(conn: AsyncConnection[Any]) -> str:
            returned = fn(conn, *args, **kwargs)
            if inspect.isawaitable(returned):
                returned = await returned
            return self._encode(name, returned)

        return json.loads(await self._store(on_event_loop=True).arecord_in_transaction(self, name, work))

    async def asleep(self, delay: float | dt.timedelta, *, name: str | None = None) -> None:
        """:meth:`sleep` for an ``async def`` handler."""
        seconds = seconds_of(delay, "sleep")
        log = await self._alog()
        step_name = name or log.auto_name("sleep")
        if log.next(step_name, "sleep") is not None:
            return
        await self._suspend_store("job.asleep()", on_event_loop=True).asleep(self, step_name, seconds)
        raise JobSuspended("slept", step_name, seconds)

    async def await_for(self, key: str, *, timeout: float | dt.timedelta | None = None, name: str | None = None) -> Any:
        """:meth:`wait_for` for an ``async def`` handler."""
        key, seconds, log = _key(key), _timeout(timeout), await self._alog()
        step_name = name or log.auto_name(f"signal {key}")
        entry = log.next(step_name, "signal")
        if entry is not None:
            return signal_value(entry, key, step_name)
        store = self._suspend_store("job.await_for()", on_event_loop=True)
        got, data = await store.await_(self, step_name, key, seconds)
        if not got:
            raise JobSuspended("waiting", step_name)
        return data


def _timeout(timeout: float | dt.timedelta | None) -> float | None:
    return None if timeout is None else seconds_of(timeout, "timeout")


def _key(key: str) -> str:
    return check_key("signal key", key)
