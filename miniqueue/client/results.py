"""Reading a job's result, and waiting for a job to finish.

:func:`result_steps` turns a job's state into its result or the error that says why there is
none. :func:`wait_for` waits through LISTEN/NOTIFY: it listens on the store's finished-jobs
channel, flags the job as awaited (so the statement that finishes it notifies; jobs nobody
waits for notify nothing), then reads the job, and reads it again on each notification for
it, until it has finished or the timeout passes. It never polls on a timer: the order listen,
flag, read leaves no window in which a completion goes unnoticed (see
:meth:`~miniqueue.store.Store.await_job_steps`). :func:`await_for` does the same on asyncio.

:func:`watch` (and :func:`awatch`) follow a job the same way, listening on the progress channel
as well: each notification of written progress, or of the job's end, is a reason to read it
again, and each change is yielded, the job's end last.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..core.db import AsyncConnection, Connection, aconnect, connect, translate_errors
from ..core.errors import JobFailed, JobNotFinished, WaitTimeout
from ..core.records import JobProgress, State
from ..core.steps import Steps, arun, run
from ..core.validation import JOB_ID_RANGE, check_int_range
from ..store.store import Store

#: The states in which a job has no result yet, and may still get one.
UNFINISHED_STATES = frozenset({State.AVAILABLE, State.RUNNING, State.WAITING})


def result_steps(store: Store, job_id: int) -> Steps[Any]:
    """The result of job ``job_id`` (None if its handler returned nothing), as steps.

    Raises JobNotFound for an unknown id, JobNotFinished while it waits, is available or
    runs, and JobFailed (with the job's last error) when it ended failed, dead or cancelled.
    """
    state, result, error = yield from store.result_steps(job_id)
    return _result(job_id, state, result, error)


def _result(job_id: int, state: State, result: Any, error: str | None) -> Any:
    if state is State.COMPLETED:
        return result
    if state in UNFINISHED_STATES:
        raise JobNotFinished(job_id, state.value)
    raise JobFailed(job_id, state.value, error)


def _first_look(store: Store, job_id: int) -> Steps[tuple[State, Any, str | None]]:
    """Listen, flag the job as awaited, then read it (in that order: see above)."""
    yield from store.listen_finished_steps()
    yield from store.await_job_steps(job_id)
    return (yield from store.result_steps(job_id))


def _deadlines(job_id: int, timeout: float) -> Iterator[float]:
    """The seconds left to wait, once per look at the job; raises WaitTimeout once none are."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        yield remaining
    yield 0.0


def wait_for(store: Store, dsn: str, job_id: int, timeout: float) -> Any:
    """Wait up to ``timeout`` seconds for job ``job_id`` to finish; return its result.

    Raises WaitTimeout if it has not finished by then, JobFailed if it ends failed, dead or
    cancelled, and JobNotFound if it does not exist (or is deleted meanwhile). Uses a
    connection of its own for the time of the wait (LISTEN needs a session).
    """
    with connect(dsn, purpose="wait", schema=store.schema) as conn:
        state, result, error = run(conn, _first_look(store, job_id))
        for remaining in _deadlines(job_id, timeout):
            if state not in UNFINISHED_STATES:
                break
            notified = remaining > 0 and _notified(conn, job_id, remaining)
            state, result, error = run(conn, store.result_steps(job_id))
            if not notified and state in UNFINISHED_STATES:
                raise WaitTimeout(job_id, timeout, state.value)
    return _result(job_id, state, result, error)


async def await_for(store: Store, dsn: str, job_id: int, timeout: float) -> Any:
    """:func:`wait_for` for asyncio, on an ``AsyncConnection`` of its own."""
    conn = await aconnect(dsn, purpose="wait", schema=store.schema)
    async with conn:
        state, result, error = await arun(conn, _first_look(store, job_id))
        for remaining in _deadlines(job_id, timeout):
            if state not in UNFINISHED_STATES:
                break
            notified = remaining > 0 and await _anotified(conn, job_id, remaining)
            state, result, error = await arun(conn, store.result_steps(job_id))
            if not notified and state in UNFINISHED_STATES:
                raise WaitTimeout(job_id, timeout, state.value)
    return _result(job_id, state, result, error)


def _notified(conn: Connection, job_id: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for a notification that ``job_id`` finished; False if none came."""
    wanted = str(job_id)
    with translate_errors():
        for note in conn.notifies(timeout=seconds):
            if note.payload == wanted:
                return True
    return False


async def _anotified(conn: AsyncConnection, job_id: int, seconds: float) -> bool:
    """:func:`_notified` on an ``AsyncConnection``."""
    wanted = str(job_id)
    with translate_errors():
        async for note in conn.notifies(timeout=seconds):
            if note.payload == wanted:
                return True
    return False


def progress_steps(store: Store, job_id: int) -> Steps[JobProgress]:
    """Job ``job_id``'s state and last progress (see :meth:`miniqueue.Client.progress`), as steps."""
    return store.progress_steps(check_int_range("job id", job_id, JOB_ID_RANGE))


def _first_watch(store: Store, job_id: int) -> Steps[JobProgress]:
    """Listen, flag the job as awaited (its progress and its end then notify), then read it."""
    yield from store.listen_progress_steps()
    yield from store.await_job_steps(job_id)
    return (yield from store.progress_steps(job_id))


def _changed(seen: JobProgress, latest: JobProgress) -> bool:
    """Whether ``latest`` says something new (a progress written again unchanged does not)."""
    if latest.state != seen.state or (latest.progress is None) != (seen.progress is None):
        return True
    if latest.progress is None or seen.progress is None:
        return False
    return (latest.progress.percent, latest.progress.meta) != (seen.progress.percent, seen.progress.meta)


def watch(store: Store, dsn: str, job_id: int, timeout: float) -> Iterator[JobProgress]:
    """Yield job ``job_id`` as it is now, then each change of its progress or state, up to its
    end (the last item, ``finished``). Raises WaitTimeout if it has not finished within
    ``timeout`` seconds, JobNotFound if it does not exist. Holds a connection of its own."""
    with connect(dsn, purpose="watch", schema=store.schema) as conn:
        seen = run(conn, _first_watch(store, job_id))
        yield seen
        for remaining in _deadlines(job_id, timeout):
            if seen.finished:
                return
            if remaining > 0:
                _notified(conn, job_id, remaining)
            latest = run(conn, store.progress_steps(job_id))
            if _changed(seen, latest):
                seen = latest
                yield seen
        if not seen.finished:
            raise WaitTimeout(job_id, timeout, seen.state.value)


async def awatch(store: Store, dsn: str, job_id: int, timeout: float) -> AsyncIterator[JobProgress]:
    """:func:`watch` for asyncio, on an ``AsyncConnection`` of its own."""
    conn = await aconnect(dsn, purpose="watch", schema=store.schema)
    async with conn:
        seen = await arun(conn, _first_watch(store, job_id))
        yield seen
        for remaining in _deadlines(job_id, timeout):
            if seen.finished:
                return
            if remaining > 0:
                await _anotified(conn, job_id, remaining)
            latest = await arun(conn, store.progress_steps(job_id))
            if _changed(seen, latest):
                seen = latest
                yield seen
        if not seen.finished:
            raise WaitTimeout(job_id, timeout, seen.state.value)
