"""The database side of durable jobs: the steps, sleeps and waits of the jobs a worker runs
(:class:`~miniqueue.tasks.durable.StepStore`), on the handlers' connections: a ``def``
handler's on the handler pool, an ``async def`` one's on the event loop's pool. Every statement
is fenced by the job's worker and attempt (see :mod:`miniqueue.store.durable_steps`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import AsyncConnection

from ..core.db import Connection
from ..core.steps import arun, run
from ..tasks.job import Job
from .aio import AsyncTransactions
from .handlerdb import HandlerConnections


class WorkerSteps:
    """``worker_id``'s durable jobs' statements, on ``sync`` (def handlers) or ``aio`` (async)."""

    def __init__(self, worker_id: str, sync: HandlerConnections, aio: AsyncTransactions) -> None:
        self.worker_id, self.sync, self.aio = worker_id, sync, aio

    def recorded(self, job: Job) -> list[dict[str, Any]]:
        with self.sync.connection(job) as conn:
            return run(conn, self.sync.store.recorded_steps_steps(job.id, self.worker_id, job.run))

    def record(self, job: Job, name: str, value: str) -> None:
        with self.sync.connection(job) as conn:
            run(conn, self.sync.store.record_step_steps(job.id, self.worker_id, job.run, name, value))

    def record_in_transaction(self, job: Job, name: str, work: Callable[[Connection], str]) -> str:
        with self.sync.connection(job) as conn, conn.transaction():
            value = work(conn)
            run(conn, self.sync.store.record_step_steps(job.id, self.worker_id, job.run, name, value))
        return value

    def sleep(self, job: Job, name: str, seconds: float) -> None:
        with self.sync.connection(job) as conn:
            run(conn, self.sync.store.sleep_steps(job.id, self.worker_id, job.run, name, seconds))

    def wait(self, job: Job, name: str, key: str, timeout: float | None) -> tuple[bool, Any]:
        with self.sync.connection(job) as conn:
            return run(conn, self.sync.store.wait_steps(job.id, self.worker_id, job.run, name, key, timeout))

    async def arecorded(self, job: Job) -> list[dict[str, Any]]:
        async with self.aio.connection(job) as conn:
            return await arun(conn, self.aio.store.recorded_steps_steps(job.id, self.worker_id, job.run))

    async def arecord(self, job: Job, name: str, value: str) -> None:
        async with self.aio.connection(job) as conn:
            await arun(conn, self.aio.store.record_step_steps(job.id, self.worker_id, job.run, name, value))

    async def arecord_in_transaction(self, job: Job, name: str, work: Callable[[AsyncConnection[Any]], Any]) -> str:
        async with self.aio.connection(job) as conn, conn.transaction():
            value: str = await work(conn)
            await arun(conn, self.aio.store.record_step_steps(job.id, self.worker_id, job.run, name, value))
        return value

    async def asleep(self, job: Job, name: str, seconds: float) -> None:
        async with self.aio.connection(job) as conn:
            await arun(conn, self.aio.store.sleep_steps(job.id, self.worker_id, job.run, name, seconds))

    async def await_(self, job: Job, name: str, key: str, timeout: float | None) -> tuple[bool, Any]:
        async with self.aio.connection(job) as conn:
            steps = self.aio.store.wait_steps(job.id, self.worker_id, job.run, name, key, timeout)
            return await arun(conn, steps)
