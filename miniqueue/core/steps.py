"""Store operations as steps: the one definition that sync and async callers both run.

A store operation that :class:`~miniqueue.Client` and :class:`~miniqueue.AsyncClient` both
need is written once, with no I/O in it, as a generator (:data:`Steps`) that *yields* each
request it needs and receives that request's result::

    def get_steps(self, job_id: int) -> Steps[JobRecord]:          # in Store
        rows: list[dict[str, Any]] = yield Query(self._get, {"id": job_id}, named=True)
        if not rows:
            raise JobNotFound(job_id)
        return _record(rows[0])

The statement, its parameters, the row mapping, the errors, and any logic between statements
(a fallback lookup, a check that names what could not be done) all live in that generator. An
*executor* drives it on a connection: :func:`run` on a psycopg ``Connection``, :func:`arun` on
an ``AsyncConnection``. The executors are the only code here that touches a connection; they
know three requests:

- :class:`Query`: run one statement; the result is its rows (tuples, or dicts by column name).
- :class:`CopyIn`: ``COPY ... FROM STDIN`` the rows of an iterable, consumed as they stream
  (an exception from it aborts the COPY); the result is None.
- :class:`Atomic`: run nested steps in one transaction (a savepoint inside a caller's own);
  the result is what they return. :func:`atomic` wraps steps so.

A request that fails is thrown back into the steps at the ``yield`` that made it, so steps
can catch an error (to name what failed) or let it propagate; a failed :class:`Atomic` has
rolled back by then. Both executors translate psycopg's errors the same way
(:func:`~miniqueue.core.db.translate_errors`), so a sync and an async caller see the same
exceptions. Callers validate their input *before* making the steps (a plain function that
checks, then returns the generator), so bad input raises InvalidInput before a connection is
borrowed.

Adding an operation both clients offer: write ``x_steps`` on the store (or on
:class:`~miniqueue.client.base.BaseClient` when it composes store steps with ``yield from``), then
one line in each client: ``return self._run(self._x_steps(...), conn)`` and ``return await
self._run(...)``. A request kind neither executor knows (a sleep between polls, say) is one
class here and one branch in each executor.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import psycopg

from .db import AsyncConnection, Connection, acursor_for, anamed_cursor, cursor_for, named_cursor, translate_errors

T = TypeVar("T")


class Query(NamedTuple):
    """Run ``sql`` with ``params``; the result is its rows (dicts by column name if ``named``)."""

    sql: str
    params: Mapping[str, Any] | None = None
    named: bool = False


class CopyIn(NamedTuple):
    """``COPY ... FROM STDIN`` (``sql``) each of ``rows`` as it is consumed; the result is None."""

    sql: str
    rows: Iterable[Sequence[Any]]


class Atomic(NamedTuple):
    """Run ``steps`` in one transaction (a savepoint inside the caller's); the result is theirs."""

    steps: Steps[Any]


Request = Query | CopyIn | Atomic

#: An operation as data: a generator that yields requests, is sent each one's result, and
#: returns the operation's result.
Steps = Generator[Request, Any, T]


def atomic(steps: Steps[T]) -> Steps[T]:
    """``steps`` run in one transaction."""
    result: T = yield Atomic(steps)
    return result


def rows(sql: str, params: Mapping[str, Any] | None = None) -> Steps[list[tuple[Any, ...]]]:
    """One statement as steps, for steps that wrap others (to catch what a statement raises): its rows."""
    result: list[tuple[Any, ...]] = yield Query(sql, params)
    return result


# -- sync ------------------------------------------------------------------------------------------


def run(conn: Connection, steps: Steps[T]) -> T:
    """Drive ``steps`` on ``conn`` and return their result."""
    with translate_errors():
        return _drive(conn, steps)


#: How many times a statement that is its own transaction runs again after a row it needed moved
#: to another partition under it (see :func:`fetch`).
MOVED_ROW_RETRIES = 5


def fetch(conn: Connection, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run one statement on ``conn`` and return its rows (none for a statement that returns none).

    A pooled connection's own cursor runs it (see :class:`~miniqueue.core.db.PooledConnection`).
    A statement that waited for a row's lock while another moved that row to another partition
    of the jobs table (a job finished, requeued or cancelled meanwhile) fails with a
    serialization failure where it would have read the row's new version: run outside a
    transaction, it runs again, on a new snapshot that finds the row where it went. Inside a
    transaction the error propagates (the transaction is lost).
    """
    cur = cursor_for(conn)
    for attempt in range(MOVED_ROW_RETRIES + 1):
        try:
            cur.execute(sql, params)
            break
        except psycopg.errors.SerializationFailure:
            if attempt == MOVED_ROW_RETRIES or not _ran_alone(conn):
                raise
    # (rownumber is None when the statement returned no rows; description would build Column
    # objects, which cost the one-by-one enqueue more than its validation.)
    return cur.fetchall() if cur.rownumber is not None else []


def _ran_alone(conn: Connection | AsyncConnection) -> bool:
    """Whether a statement that just failed was its own transaction (read after the failure, so
    that a statement that succeeds pays nothing for it): in autocommit, outside a transaction
    block, the connection is idle again; inside one, the transaction is in error."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


class _Driven(Generic[T]):
    """Steps being driven, as an iterator of their requests: after each request, an executor
    sets its ``result``, or the ``error`` it raised; once they are done, ``value`` is theirs."""

    value: T

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps
        self.result: Any = None
        self.error: Exception | None = None

    def __iter__(self) -> _Driven[T]:
        return self

    def __next__(self) -> Request:
        error, self.error = self.error, None
        try:
            # A request that failed is thrown back into the steps, so that they can catch it
            # (and name what failed) or let it propagate.
            return self.steps.throw(error) if error is not None else self.steps.send(self.result)
        except StopIteration as done:
            self.value = done.value
            raise StopIteration from None


def _drive(conn: Connection, steps: Steps[T]) -> T:
    driven = _Driven(steps)
    for request in driven:
        try:
            driven.result = _do(conn, request)
        except Exception as exc:
            driven.error = exc
    return driven.value


def _do(conn: Connection, request: Request) -> Any:
    """Carry out one request on ``conn``; return its result."""
    if type(request) is Query:
        if request.named:
            with named_cursor(conn) as cur:
                cur.execute(request.sql, request.params)
                return cur.fetchall()
        return fetch(conn, request.sql, request.params)
    if type(request) is Atomic:
        with conn.transaction():
            return _drive(conn, request.steps)
    if type(request) is CopyIn:
        with conn.cursor() as cur, cur.copy(request.sql) as copy:
            for row in request.rows:
                copy.write_row(row)
        return None
    raise TypeError(f"unknown request {request!r}")


# -- async -----------------------------------------------------------------------------------------


async def arun(conn: AsyncConnection, steps: Steps[T]) -> T:
    """:func:`run` on an ``AsyncConnection``."""
    with translate_errors():
        return await _adrive(conn, steps)


async def _adrive(conn: AsyncConnection, steps: Steps[T]) -> T:
    driven = _Driven(steps)
    for request in driven:
        try:
            driven.result = await _ado(conn, request)
        except Exception as exc:
            driven.error = exc
    return driven.value


async def _ado(conn: AsyncConnection, request: Request) -> Any:
    """:func:`_do` on an ``AsyncConnection``."""
    if type(request) is Query:
        if request.named:
            async with anamed_cursor(conn) as cur:
                await cur.execute(request.sql, request.params)
                return await cur.fetchall()
        acur = acursor_for(conn)
        for attempt in range(MOVED_ROW_RETRIES + 1):  # as in fetch()
            try:
                await acur.execute(request.sql, request.params)
                break
            except psycopg.errors.SerializationFailure:
                if attempt == MOVED_ROW_RETRIES or not _ran_alone(conn):
                    raise
        return await acur.fetchall() if acur.rownumber is not None else []
    if type(request) is Atomic:
        async with conn.transaction():
            return await _adrive(conn, request.steps)
    if type(request) is CopyIn:
        async with conn.cursor() as cur, cur.copy(request.sql) as copy:
            for row in request.rows:
                await copy.write_row(row)
        return None
    raise TypeError(f"unknown request {request!r}")
