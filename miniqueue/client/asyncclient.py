"""The producer API for asyncio: :class:`AsyncClient`, :class:`~miniqueue.Client` on psycopg's
``AsyncConnection``.

Every call is :class:`~miniqueue.client.base.BaseClient`'s, the one :class:`~miniqueue.Client`
makes: the same validation (before any connection is borrowed), the same steps (statements,
row mapping, errors; see :mod:`miniqueue.core.steps`), run here by the async executor
(:func:`~miniqueue.core.steps.arun`) instead of the sync one. Only the connection handling is this
module's own: an ``AsyncConnectionPool``, opened on the event loop that uses it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from ..core.db import (
    DEFAULT_CONNECT_TIMEOUT,
    AsyncConnection,
    aconnect,
    connect_seconds,
    conninfo,
    create_async_pool,
    translate_errors,
)
from ..core.diagnosis import Diagnosis
from ..core.fairness import KeyRule, KeyShare
from ..core.options import JobOptions, job_spec
from ..core.records import (
    BlockedSequence,
    EnqueueResult,
    GroupResult,
    JobProgress,
    JobRecord,
    JobSpec,
    QueueCount,
    QueueStats,
    State,
)
from ..core.steps import Steps, arun
from ..core.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_job_ids
from ..store.store import LimitWait
from .aging import age_queue_steps
from .base import BaseClient, _check_wait, group_callbacks
from .results import await_for, awatch, progress_steps
from .schedules import AsyncSchedules

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

    from ..tasks.app import App

T = TypeVar("T")


class AsyncClient(BaseClient):
    """Enqueue and manage jobs from asyncio code: every method of :class:`~miniqueue.Client`,
    awaited, with the same arguments, validation, results and errors.

    ``AsyncClient(dsn)`` makes a small ``AsyncConnectionPool`` of its own, opened on first use
    (or by ``await client.open()``, or ``async with``) on the running event loop, which it then
    belongs to; close it with ``await client.close()`` or an ``async with`` block. A DSN that
    does not parse raises ConfigError at once; an unreachable database raises
    DatabaseUnavailable when the pool opens. ``AsyncClient(pool)`` uses a
    ``psycopg_pool.AsyncConnectionPool`` you own and open, whose connections must be in
    autocommit mode; closing the client leaves it open. ``connect_timeout`` bounds each wait
    for a connection, as :class:`~miniqueue.Client`'s does.

    Every method that writes takes ``conn=``: pass your own psycopg ``AsyncConnection`` to make
    the write part of your transaction; the job then exists only if your transaction commits,
    and workers are notified at that commit.
    """

    def __init__(
        self,
        dsn_or_pool: str | AsyncConnectionPool[AsyncConnection],
        *,
        schema: str = "public",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        notify: bool = True,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        super().__init__(schema=schema, max_payload_bytes=max_payload_bytes, notify=notify)
        #: Periodic schedules created, changed and deleted at run time.
        self.schedules = AsyncSchedules(self)
        self._dsn: str | None = None
        self._opened = asyncio.Lock()
        self._connect_seconds = connect_seconds(connect_timeout)
        if isinstance(dsn_or_pool, str):
            conninfo(dsn_or_pool, purpose="client", schema=schema)  # a DSN that does not parse fails here
            self._pool = create_async_pool(
                dsn_or_pool,
                purpose="client",
                schema=schema,
                timeout=connect_timeout,
                connect_timeout=self._connect_seconds,
            )
            self._owns_pool, self._dsn, self._ready = True, dsn_or_pool, False
        else:
            self._pool, self._owns_pool, self._ready = dsn_or_pool, False, True

    async def open(self) -> None:
        """Open the pool, if this client made it and it is not open yet (the first call does it
        anyway): first one connection, which fails fast with libpq's own reason rather than
        after the pool's retries time out."""
        if self._ready:
            return
        async with self._opened:
            if self._ready:
                return
            assert self._dsn is not None
            probe = await aconnect(
                self._dsn, purpose="client", schema=self.store.schema, connect_timeout=self._connect_seconds
            )
            await probe.close()
            with translate_errors(self._dsn):
                await self._pool.open()
            self._ready = True

    async def close(self) -> None:
        """Close the pool if this client made it."""
        if self._owns_pool:
            await self._pool.close()

    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def connection(self, conn: AsyncConnection | None = None) -> _AsyncBorrowed:
        """``async with client.connection(conn) as c``: ``conn`` if given, else one of the pool's
        connections, returned to the pool when the block ends."""
        return _AsyncBorrowed(self, conn)

    async def _run(self, steps: Steps[T], conn: AsyncConnection | None = None) -> T:
        """Run ``steps`` on ``conn``, or on one of the pool's connections."""
        async with self.connection(conn) as c:
            return await arun(c, steps)

    async def enqueue(
        self, task: str, payload: Any = None, *, conn: AsyncConnection | None = None, **options: Unpack[JobOptions]
    ) -> EnqueueResult:
        """Enqueue one job and return its id (see :meth:`miniqueue.Client.enqueue`)."""
        return await self._run(self._enqueue_steps(job_spec(task, payload, options)), conn)

    async def declares(self, task: str, *, conn: AsyncConnection | None = None) -> bool:
        """Whether an app has declared ``task`` here (see :meth:`miniqueue.Client.declares`)."""
        return await self._run(self._declares_steps(task), conn)

    async def declare(self, app: App, *, conn: AsyncConnection | None = None) -> None:
        """Publish what ``app``'s tasks declare (see :meth:`miniqueue.Client.declare`)."""
        await self._run(self._declare_steps(app), conn)

    async def enqueue_many(
        self, jobs: Iterable[JobSpec], *, conn: AsyncConnection | None = None
    ) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction (see :meth:`miniqueue.Client.enqueue_many`)."""
        return await self._run(self._enqueue_many_steps(jobs), conn)

    async def chain(self, steps: Sequence[JobSpec], *, conn: AsyncConnection | None = None) -> list[EnqueueResult]:
        """Enqueue jobs that run one after another (see :meth:`miniqueue.Client.chain`)."""
        return await self._run(self._chain_steps(steps), conn)

    async def group(
        self,
        members: Sequence[JobSpec],
        *,
        then: JobSpec | None = None,
        on_success: JobSpec | None = None,
        on_complete: JobSpec | None = None,
        on_failure: JobSpec | None = None,
        conn: AsyncConnection | None = None,
    ) -> GroupResult:
        """Enqueue jobs that run in parallel and callbacks after them (see
        :meth:`miniqueue.Client.group`)."""
        callbacks = group_callbacks(then, on_success, on_complete, on_failure)
        return await self._run(self._group_steps(members, callbacks), conn)

    async def result(self, job_id: int) -> Any:
        """The result of job ``job_id`` (see :meth:`miniqueue.Client.result`)."""
        return await self._run(self._result_steps(job_id))

    async def wait(self, job_id: int, *, timeout: float = 60.0) -> Any:
        """Wait for job ``job_id`` to finish and return its result (see :meth:`miniqueue.Client.wait`);
        an ``AsyncConnection`` of its own is held for the wait."""
        job_id, timeout = _check_wait(job_id, timeout)
        dsn = self._dsn if self._dsn is not None else await _pool_dsn(self._pool)
        return await await_for(self.store, dsn, job_id, timeout)

    async def progress(self, job_id: int, *, conn: AsyncConnection | None = None) -> JobProgress:
        """Job ``job_id``'s state and last progress (see :meth:`miniqueue.Client.progress`)."""
        return await self._run(progress_steps(self.store, job_id), conn)

    async def watch(self, job_id: int, *, timeout: float = 60.0) -> AsyncIterator[JobProgress]:
        """Follow job ``job_id`` up to its end: ``async for item in client.watch(id)`` (see
        :meth:`miniqueue.Client.watch`); an ``AsyncConnection`` of its own is held meanwhile."""
        job_id, timeout = _check_wait(job_id, timeout)
        dsn = self._dsn if self._dsn is not None else await _pool_dsn(self._pool)
        async for item in awatch(self.store, dsn, job_id, timeout):
            yield item

    async def get(self, job_id: int, *, conn: AsyncConnection | None = None) -> JobRecord:
        """Every field of one job, with its error history; raises JobNotFound."""
        return await self._run(self._get_steps(job_id), conn)

    async def why(self, job_id: int, *, conn: AsyncConnection | None = None) -> Diagnosis:
        """Why job ``job_id`` has not run (see :meth:`miniqueue.Client.why`)."""
        return await self._run(self._why_steps(job_id), conn)

    async def counts(self) -> list[QueueCount]:
        """Job counts by queue and state."""
        return await self._run(self.store.counts_steps())

    async def queue_stats(self, *, check_served: bool = True, conn: AsyncConnection | None = None) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, the oldest waiting job's age, expired leases
        (see :meth:`miniqueue.Client.queue_stats`)."""
        return await self._run(self._queue_stats_steps(check_served), conn)

    async def recount(self) -> None:
        """Recount finished jobs from the jobs table (see :meth:`miniqueue.Client.recount`)."""
        await self._run(self.store.recount_steps())

    async def list_jobs(
        self, *, before_id: int | None = None, limit: int = 50, conn: AsyncConnection | None = None, **filters: Any
    ) -> list[JobRecord]:
        """Jobs matching the filters, newest first (see :meth:`miniqueue.Client.list_jobs`)."""
        return await self._run(self._list_jobs_steps(before_id, limit, filters), conn)

    async def prune(self, states: Iterable[State], older_than_seconds: float, *, batch_size: int = 1000) -> int:
        """Delete finished jobs older than ``older_than_seconds`` (see :meth:`miniqueue.Client.prune`)."""
        return await self._run(self._prune_steps(states, older_than_seconds, batch_size))

    async def requeue(self, job_ids: Sequence[int], *, conn: AsyncConnection | None = None) -> list[int]:
        """Make failed, dead or cancelled jobs available again (see :meth:`miniqueue.Client.requeue`)."""
        return await self._run(self.store.requeue_steps(check_job_ids(job_ids)), conn)

    async def release_sequence(self, key: str, *, conn: AsyncConnection | None = None) -> tuple[int, int | None]:
        """Unblock sequence ``key`` (see :meth:`miniqueue.Client.release_sequence`)."""
        return await self._run(self._release_sequence_steps(key), conn)

    async def blocked_sequences(
        self, *, limit: int = 1000, conn: AsyncConnection | None = None
    ) -> list[BlockedSequence]:
        """The sequence keys that a failed or dead job blocks, by key."""
        return await self._run(self.store.blocked_sequences_steps(limit), conn)

    async def requeue_matching(
        self, states: Iterable[State], *, queue: str | None = None, task: str | None = None
    ) -> int:
        """Requeue every failed/dead/cancelled job matching the filter; return how many."""
        return await self._run(self._requeue_matching_steps(states, queue, task))

    async def signal(self, key: str, data: Any = None, *, conn: AsyncConnection | None = None) -> int | None:
        """Send signal ``key`` with ``data`` (see :meth:`miniqueue.Client.signal`)."""
        return (await self._run(self._signal_steps([(key, data)]), conn))[0]

    async def signal_many(
        self, signals: Iterable[tuple[str, Any]], *, conn: AsyncConnection | None = None
    ) -> list[int | None]:
        """Send signals in one statement (see :meth:`miniqueue.Client.signal_many`)."""
        return await self._run(self._signal_steps(signals), conn)

    async def cancel(self, job_ids: Sequence[int], *, conn: AsyncConnection | None = None) -> list[int]:
        """Cancel available or running jobs (see :meth:`miniqueue.Client.cancel`)."""
        return await self._run(self.store.cancel_steps(check_job_ids(job_ids)), conn)

    async def pause_queues(
        self, names: Iterable[str], *, create: bool = False, conn: AsyncConnection | None = None
    ) -> list[str]:
        """Stop every worker from claiming jobs of these queues (see :meth:`miniqueue.Client.pause_queues`)."""
        return await self._run(self._set_paused_steps(names, True, create), conn)

    async def resume_queues(
        self, names: Iterable[str], *, create: bool = False, conn: AsyncConnection | None = None
    ) -> list[str]:
        """Let workers claim jobs of these queues again (see :meth:`miniqueue.Client.resume_queues`)."""
        return await self._run(self._set_paused_steps(names, False, create), conn)

    async def paused_queues(self, *, conn: AsyncConnection | None = None) -> list[str]:
        """The queues paused now."""
        return await self._run(self.store.paused_queues_steps(), conn)

    async def list_queues(self) -> dict[str, bool]:
        """Every queue that has jobs or is paused, in name order, and whether it is paused."""
        return await self._run(self._list_queues_steps())

    async def limit_queue(self, name: str, max_running: int | None, *, create: bool = False) -> None:
        """Cap the running jobs of queue ``name`` fleet-wide (see :meth:`miniqueue.Client.limit_queue`)."""
        await self._run(self._limit_queue_steps(name, max_running, create))

    async def queue_limits(self, *, conn: AsyncConnection | None = None) -> dict[str, int]:
        """The queues with a cap on running jobs, and their caps."""
        return await self._run(self.store.queue_limits_steps(), conn)

    async def age_queue(self, name: str, age_after: float | None, *, create: bool = False) -> None:
        """Age the jobs of queue ``name`` (see :meth:`miniqueue.Client.age_queue`); None: off."""
        await self._run(age_queue_steps(self, name, age_after, create))

    async def queue_aging(self, *, conn: AsyncConnection | None = None) -> dict[str, float]:
        """The queues whose jobs age, and their intervals (seconds)."""
        return await self._run(self.store.queue_aging_steps(), conn)

    async def fair_queue(self, name: str, fair: bool = True, *, create: bool = False) -> int:
        """Make every job of queue ``name`` fair, or not (see :meth:`miniqueue.Client.fair_queue`)."""
        return await self._run(self._fair_queue_steps(name, fair, create))

    async def fair_queues(self, *, conn: AsyncConnection | None = None) -> list[str]:
        """The queues whose every job is fair."""
        return sorted(await self._run(self.store.fair_queues_steps(), conn))

    async def set_key_rule(
        self, pattern: str, *, limit: int | None = None, weight: float | None = None, every_key: bool = False
    ) -> KeyRule:
        """Set the rule of the keys ``pattern`` matches (see :meth:`miniqueue.Client.set_key_rule`)."""
        return await self._run(self._set_key_rule_steps(pattern, limit, weight, every_key))

    async def remove_key_rule(self, pattern: str) -> bool:
        """Remove the rule of ``pattern``; False if there was none."""
        return await self._run(self._remove_key_rule_steps(pattern))

    async def key_rules(self, *, conn: AsyncConnection | None = None) -> list[KeyRule]:
        """Every key rule, most specific first."""
        return await self._run(self.store.key_rules_steps(), conn)

    async def key_shares(
        self, queue: str | None = None, *, limit: int = 1000, conn: AsyncConnection | None = None
    ) -> list[KeyShare]:
        """The fair keys that have jobs, and what each holds now (see :meth:`miniqueue.Client.key_shares`)."""
        return await self._run(self.store.key_shares_steps(queue, limit), conn)

    async def limit_waits(self, limit: int = 100, *, conn: AsyncConnection | None = None) -> list[LimitWait]:
        """The limits jobs are waiting on or hold slots of (see :meth:`miniqueue.Client.limit_waits`)."""
        return await self._run(self.store.limit_waits_steps(limit), conn)

    async def enable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: AsyncConnection | None = None
    ) -> None:
        """Enable periodic schedule ``name`` (see :meth:`miniqueue.Client.disable_schedule`)."""
        await self._run(self._switch_schedule_steps(name, True, app, create), conn)

    async def disable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: AsyncConnection | None = None
    ) -> None:
        """Disable periodic schedule ``name`` (see :meth:`miniqueue.Client.disable_schedule`)."""
        await self._run(self._switch_schedule_steps(name, False, app, create), conn)

    async def periodic_state(self, *, conn: AsyncConnection | None = None) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule's last slot and whether it is enabled."""
        return await self._run(self.store.periodic_state_steps(), conn)

    async def now(self, *, conn: AsyncConnection | None = None) -> dt.datetime:
        """The database's clock (what schedules and delays are measured against)."""
        return await self._run(self.store.now_steps(), conn)


async def _pool_dsn(pool: AsyncConnectionPool[AsyncConnection]) -> str:
    """The DSN of a pool's connections (its conninfo may be a function, sync or async)."""
    info = pool.conninfo
    if not callable(info):
        return info
    value = info()
    return value if isinstance(value, str) else await value


class _AsyncBorrowed:
    """The async context manager :meth:`AsyncClient.connection` returns."""

    __slots__ = ("_client", "_given", "_pooled")

    def __init__(self, client: AsyncClient, given: AsyncConnection | None) -> None:
        self._client, self._given = client, given
        self._pooled: AsyncConnection | None = None

    async def __aenter__(self) -> AsyncConnection:
        if self._given is not None:
            return self._given
        client = self._client
        if not client._ready:
            await client.open()
        with translate_errors(client._dsn):
            self._pooled = await client._pool.getconn()
        return self._pooled

    async def __aexit__(self, *exc: object) -> None:
        if self._pooled is not None:
            await self._client._pool.putconn(self._pooled)
            self._pooled = None
