"""``job.add_to_group``: a running member enqueues a job into its own group, in the transaction
that completes it (see :meth:`miniqueue.Job.add_to_group`). The new job takes the options its
task declares in this worker's app and passes through the app's enqueue hooks, as an enqueue
through the app does."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from psycopg import AsyncConnection

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.records import EnqueueResult, JobSpec
from ..core.steps import arun, run
from ..core.validation import NewJob, declared, validate
from ..store.store import Store
from ..tasks.app import App
from ..tasks.job import Job


class GroupMembers:
    """``worker_id``'s side of :meth:`Job.add_to_group`, for the tasks of ``app``."""

    def __init__(self, app: App, store: Store, worker_id: str, *, max_payload_bytes: int) -> None:
        self.store, self.worker_id, self.max_payload_bytes = store, worker_id, max_payload_bytes
        self.declarations = {d.task: d for d in app.declarations()}
        self.middleware = app.middleware_stack

    def _job(self, spec: JobSpec) -> NewJob:
        if spec.depends_on is not None:
            raise InvalidInput("a job added to a group waits for nothing: leave depends_on out")
        return validate(declared(spec, self.declarations.get(spec.task)), max_payload_bytes=self.max_payload_bytes)

    def add(self, job: Job, conn: Connection, spec: JobSpec) -> EnqueueResult:
        def store(spec: JobSpec) -> EnqueueResult:
            return run(conn, self.store.add_to_group_steps(job.id, self.worker_id, job.run, self._job(spec)))

        return self.middleware.enqueue_one(spec, store)

    async def aadd(self, job: Job, conn: AsyncConnection[Any], spec: JobSpec) -> EnqueueResult:
        def store(spec: JobSpec) -> Awaitable[EnqueueResult]:
            return arun(conn, self.store.add_to_group_steps(job.id, self.worker_id, job.run, self._job(spec)))

        return await self.middleware.aenqueue_one(spec, store)
