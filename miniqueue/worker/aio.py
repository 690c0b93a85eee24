"""The event loop that runs a worker's ``async def`` handlers, and their transactions.

A worker whose app has an async task runs one event loop, on a thread of its own. Each job
of an async task runs there as an asyncio task (at most ``concurrency`` at a time), so one
process waits on hundreds of network calls at once where threads would cost a stack each.
The worker's other threads reach the loop only through ``call_soon_threadsafe``: the claim
loop to start jobs, the heartbeat to cancel one whose lease was lost or whose timeout passed.

``job.atransaction()`` draws from a small ``AsyncConnectionPool`` that belongs to the loop,
opened on first use (a worker that never uses it opens no connection), and completes the
job inside the handler's transaction with the store's own fenced completion (its steps, run by
:func:`miniqueue.core.steps.arun`: the statement, the fence and the counts are the sync worker's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from ..core.db import create_async_pool
from ..core.service import Service
from ..core.steps import arun
from ..store.store import Store
from ..tasks.job import Job

log = logging.getLogger("miniqueue.worker")

T = TypeVar("T")

#: The most connections ``job.transaction()`` and ``job.atransaction()`` each hold per worker. A
#: transaction is the handler's last, short step, so a few connections serve hundreds of
#: handlers; one per handler would exhaust ``max_connections`` with a handful of workers at
#: ``--concurrency 200`` (a handler past the tenth waits for a connection to come back).
POOL_MAX_SIZE = 10


class EventLoop(Service):
    """One asyncio event loop on a daemon thread, and the tasks it runs for the worker."""

    log = log

    def __init__(self, name: str = "miniqueue-loop") -> None:
        super().__init__(name)
        self.loop = asyncio.new_event_loop()
        # The loop keeps only weak references to its tasks: these keep them alive until done.
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task of its own (on the loop's thread only)."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_threadsafe(self, run: Callable[[T], Coroutine[Any, Any, None]], arg: T) -> None:
        """Run ``run(arg)`` as a task, from any thread (the coroutine is made on the loop's)."""
        self.loop.call_soon_threadsafe(lambda: self.spawn(run(arg)))

    def cancel_threadsafe(self, task: asyncio.Task[None], message: str) -> None:
        """Cancel ``task`` from any thread: it gets CancelledError(message) at its next await."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the task is long gone
            self.loop.call_soon_threadsafe(task.cancel, message)

    def stop(
        self, timeout: float | None = None, *, before_stop: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """Cancel the tasks still running, give them ``timeout`` seconds (``stop_timeout`` when
        None) to unwind, await ``before_stop`` (closing the pool), then stop the loop and join
        its thread.

        A handler that blocks the loop (a ``time.sleep`` in ``async def``) keeps the thread
        busy: it is left behind as a daemon, as a stuck handler thread is."""
        if not self.is_alive():
            return
        self.stopping.set()
        grace = self.stop_timeout if timeout is None else timeout
        done = asyncio.run_coroutine_threadsafe(self._shutdown(grace, before_stop), self.loop)
        try:
            done.result(grace + 5.0)
        except concurrent.futures.TimeoutError:
            log.warning("the event loop did not shut down within %.1fs: a handler is blocking it", grace + 5.0)
        except Exception:  # closing the pool failed: the loop must stop anyway
            log.exception("error while stopping the event loop")
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.join(1.0):
            self.loop.close()

    async def _shutdown(self, grace: float, before_stop: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel("the worker stopped")
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        if before_stop is not None:
            await before_stop()


class AsyncTransactions:
    """The pool behind :meth:`Job.atransaction` and the fenced completion inside it, and behind
    an async durable job's steps."""

    def __init__(self, dsn: str, store: Store, worker_id: str, *, max_size: int) -> None:
        self.dsn, self.store, self.worker_id, self.max_size = dsn, store, worker_id, max_size
        self._opening: asyncio.Future[AsyncConnectionPool[AsyncConnection[Any]]] | None = None

    @contextlib.asynccontextmanager
    async def transaction(self, job: Job) -> AsyncIterator[AsyncConnection[Any]]:
        pool = await self._pool()
        async with pool.connection() as conn, conn.transaction():
            yield conn
            await arun(conn, self.store.complete_steps(job.id, self.worker_id, job.run, result=job.result_json))

    @contextlib.asynccontextmanager
    async def connection(self, job: Job) -> AsyncIterator[AsyncConnection[Any]]:
        """The connection for ``job``'s durable steps: its open transaction's, inside ``async
        with job.atransaction()`` (which holds one of the pool's), else one of the pool's."""
        if isinstance(job.completing_on, AsyncConnection):
            yield job.completing_on
            return
        pool = await self._pool()
        async with pool.connection() as conn:
            yield conn

    async def _pool(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        # Shielded: a handler cancelled while the pool opens must not cancel it for the others.
        return await asyncio.shield(self._opening)

    async def _open(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        # Checked on checkout, like the sync pool: a connection that died while idle (a server
        # restart) would otherwise fail the next handler's transaction and cost an attempt.
        pool = create_async_pool(
            self.dsn,
            purpose="handler",
            schema=self.store.schema,
            min_size=0,
            max_size=self.max_size,
            check=AsyncConnectionPool.check_connection,
            name="miniqueue-handler-async",
        )
        await pool.open()
        return pool

    async def close(self) -> None:
        if self._opening is not None:
            with contextlib.suppress(Exception):  # it never opened: nothing to close
                pool = await self._opening
                await pool.close()
            self._opening = None
