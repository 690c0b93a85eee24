"""Reading a job's result, and waiting for a job to finish.

:func:`result_of` turns a job's state into its result or the error that says why there is
none. :func:`wait_for` waits through LISTEN/NOTIFY: it listens on the store's finished-jobs
channel, flags the job as awaited (so the statement that finishes it notifies; jobs nobody
waits for notify nothing), then reads the job, and reads it again on each notification for
it, until it has finished or the timeout passes. It never polls on a timer: the order listen,
flag, read leaves no window in which a completion goes unnoticed (see
:meth:`~miniqueue.store.Store.await_job`).
"""

from __future__ import annotations

import time
from typing import Any

from .db import Connection, connect, translate_errors
from .errors import JobFailed, JobNotFinished, WaitTimeout
from .job import State
from .store import Store

#: The states in which a job has no result yet, and may still get one.
UNFINISHED_STATES = frozenset({State.AVAILABLE, State.RUNNING, State.WAITING})


def result_of(store: Store, conn: Connection, job_id: int) -> Any:
    """The result of job ``job_id`` (None if its handler returned nothing).

    Raises JobNotFound for an unknown id, JobNotFinished while it waits, is available or
    runs, and JobFailed (with the job's last error) when it ended failed, dead or cancelled.
    """
    state, result, error = store.result(conn, job_id)
    return _result(job_id, state, result, error)


def _result(job_id: int, state: State, result: Any, error: str | None) -> Any:
    if state is State.COMPLETED:
        return result
    if state in UNFINISHED_STATES:
        raise JobNotFinished(job_id, state.value)
    raise JobFailed(job_id, state.value, error)


def wait_for(store: Store, dsn: str, job_id: int, timeout: float) -> Any:
    """Wait up to ``timeout`` seconds for job ``job_id`` to finish; return its result.

    Raises WaitTimeout if it has not finished by then, JobFailed if it ends failed, dead or
    cancelled, and JobNotFound if it does not exist (or is deleted meanwhile). Uses a
    connection of its own for the time of the wait (LISTEN needs a session).
    """
    deadline = time.monotonic() + timeout
    with connect(dsn, purpose="wait", schema=store.schema) as conn:
        store.listen_finished(conn)
        store.await_job(conn, job_id)
        state, result, error = store.result(conn, job_id)
        while state in UNFINISHED_STATES:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not _notified(conn, job_id, remaining):
                state, result, error = store.result(conn, job_id)  # one last look before giving up
                if state in UNFINISHED_STATES:
                    raise WaitTimeout(job_id, timeout, state.value)
                break
            state, result, error = store.result(conn, job_id)
    return _result(job_id, state, result, error)


def _notified(conn: Connection, job_id: int, seconds: float) -> bool:
    """Wait up to ``seconds`` for a notification that ``job_id`` finished; False if none came."""
    wanted = str(job_id)
    with translate_errors():
        for note in conn.notifies(timeout=seconds):
            if note.payload == wanted:
                return True
    return False
