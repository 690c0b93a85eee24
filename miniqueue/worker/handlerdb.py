"""The connections ``def`` handlers use: :meth:`Job.transaction`, their parents' results and
their durable steps.

A small pool, opened on first use (a worker whose handlers never ask opens no connection), or
the pool the worker was given. Inside ``with job.transaction()`` the job's other reads and
writes run on the block's own connection, in its transaction: the block holds one of the
pool's connections, and at ``--concurrency 1`` (a pool of one) a second would never come.
``async def`` handlers have a pool of their own on the event loop (see
:mod:`miniqueue.worker.aio`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import psycopg
from psycopg_pool import ConnectionPool

from ..core.db import Connection, create_pool
from ..core.records import ParentOutcome
from ..store.store import Store
from ..tasks.job import Job


class HandlerConnections:
    """``worker_id``'s handler connections on ``dsn``: at most ``max_size``, in ``pool`` when
    given (the caller's, left open), else in a pool of its own (closed by :meth:`close`)."""

    def __init__(
        self,
        dsn: str,
        store: Store,
        worker_id: str,
        *,
        schema: str,
        max_size: int,
        pool: ConnectionPool[Connection] | None = None,
    ) -> None:
        self.dsn, self.store, self.worker_id = dsn, store, worker_id
        self.schema, self.max_size = schema, max_size
        self._pool, self._owns_pool = pool, pool is None
        self._opening = threading.Lock()

    def pool(self) -> ConnectionPool[Connection]:
        """The pool, opened on first use: once, however many handler threads ask at once (a pool
        each would leave all but the last open, their connections with them)."""
        with self._opening:
            if self._pool is None:
                # Checked on checkout: a connection that died while idle (a server restart) would
                # otherwise fail the next handler's transaction and cost its job an attempt.
                self._pool = create_pool(
                    self.dsn,
                    purpose="handler",
                    schema=self.schema,
                    min_size=0,
                    max_size=self.max_size,
                    check=ConnectionPool.check_connection,
                )
            return self._pool

    @contextlib.contextmanager
    def connection(self, job: Job) -> Iterator[Connection]:
        """The connection for ``job``'s reads and writes: its open transaction's, inside ``with
        job.transaction()``, else one of the pool's."""
        on = job.completing_on
        if isinstance(on, psycopg.Connection):
            yield on
            return
        with self.pool().connection() as conn:
            yield conn

    def read_parent_results(self, job: Job) -> list[tuple[int, ParentOutcome]]:
        with self.connection(job) as conn:
            return self.store.parent_results(conn, job.parents)

    @contextlib.contextmanager
    def transaction(self, job: Job) -> Iterator[Connection]:
        """``job.transaction()``: the handler's transaction, which completes the job (fenced by
        its attempt) before it commits."""
        with self.pool().connection() as conn, conn.transaction():
            yield conn
            self.store.complete(conn, job.id, self.worker_id, job.run, result=job.result_json)

    def close(self) -> None:
        """Close the pool if it is this worker's own."""
        if self._owns_pool and self._pool is not None:
            self._pool.close()
