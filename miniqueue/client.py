"""The producer API: enqueue jobs, and inspect or repair them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg_pool import ConnectionPool

from .db import Connection, connect, create_pool, translate_errors
from .job import EnqueueResult, JobRecord, JobSpec, QueueCount, QueueStats, State
from .store import Store
from .validation import DEFAULT_MAX_PAYLOAD_BYTES, validate, validate_each


class Client:
    """Enqueue and manage jobs.

    ``Client(dsn)`` opens a small connection pool of its own (close it with :meth:`close` or a
    ``with`` block); ``Client(pool)`` uses a ``psycopg_pool.ConnectionPool`` you own, whose
    connections must be in autocommit mode.

    Every method that writes takes ``conn=``: pass your own psycopg connection to make the
    write part of your transaction; the job then exists only if your transaction commits, and
    workers are notified at that commit.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Connection],
        *,
        schema: str = "public",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        notify: bool = True,
    ) -> None:
        self.store = Store(schema)
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        self._dsn: str | None = None
        if isinstance(dsn_or_pool, str):
            # Fail fast, with libpq's own reason, rather than after the pool's retries time out.
            connect(dsn_or_pool, purpose="client", schema=schema, connect_timeout=10).close()
            self._pool = create_pool(dsn_or_pool, purpose="client", schema=schema)
            self._owns_pool, self._dsn = True, dsn_or_pool
        else:
            self._pool, self._owns_pool = dsn_or_pool, False

    def close(self) -> None:
        """Close the pool if this client opened it."""
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self, conn: Connection | None = None) -> _Borrowed:
        """``with client.connection(conn) as c``: ``conn`` if given, else one of the pool's
        connections, returned to the pool when the block ends."""
        return _Borrowed(self._pool, self._dsn, conn)

    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        max_attempts: int = 5,
        idempotency_key: str | None = None,
        conn: Connection | None = None,
    ) -> EnqueueResult:
        """Enqueue one job and return its id.

        ``payload`` must be JSON-serialisable (no NaN/Infinity, no U+0000, at most
        ``max_payload_bytes`` encoded). ``run_at`` (timezone-aware) or ``delay`` (seconds on the
        database clock) schedules it for later. With an ``idempotency_key`` already used by a
        stored job, nothing is inserted and the result carries that job's id with
        ``duplicate=True``. Invalid input raises InvalidInput and stores nothing.
        """
        spec = JobSpec(task, payload, queue, priority, run_at, delay, max_attempts, idempotency_key)
        job = validate(spec, max_payload_bytes=self.max_payload_bytes)
        with self.connection(conn) as c:
            return self.store.enqueue(c, job, notify=self.notify)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction; results are in input order.

        One invalid job raises InvalidInput (naming its index) and none is stored. Idempotency
        keys are honoured against stored jobs and within the batch (the first occurrence wins).
        """
        specs = list(jobs)
        checked = validate_each(specs, max_payload_bytes=self.max_payload_bytes)
        with self.connection(conn) as c:
            if len(specs) >= self.store.copy_threshold and all(s.idempotency_key is None for s in specs):
                # Each job is checked as the COPY streams it, so the checks overlap the server's
                # inserts; an invalid one aborts the COPY, and nothing is stored.
                scheduled = any(s.run_at is not None or s.delay is not None for s in specs)
                return self.store.copy_many(c, len(specs), checked, scheduled=scheduled, notify=self.notify)
            return self.store.enqueue_many(c, list(checked), notify=self.notify)

    def get(self, job_id: int) -> JobRecord:
        """Every field of one job, with its error history; raises JobNotFound."""
        with self.connection() as c:
            return self.store.get(c, job_id)

    def counts(self) -> list[QueueCount]:
        """Job counts by queue and state."""
        with self.connection() as c:
            return self.store.counts(c)

    def queue_stats(self) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, the oldest waiting job's age, expired leases."""
        with self.connection() as c:
            return self.store.queue_stats(c)

    def list_jobs(self, *, before_id: int | None = None, limit: int = 50, **filters: Any) -> list[JobRecord]:
        """Jobs matching the filters (state, queue, task, search, created_after, created_before),
        newest first; page with ``before_id``."""
        with self.connection() as c:
            return self.store.list_jobs(c, before_id=before_id, limit=limit, **filters)

    def prune(self, states: Iterable[State], older_than_seconds: float, *, batch_size: int = 1000) -> int:
        """Delete every job in ``states`` (terminal states only) that finished more than
        ``older_than_seconds`` ago, in batches; return how many were deleted."""
        chosen = list(states)
        deleted = 0
        with self.connection() as c:
            while True:
                n = self.store.prune(c, chosen, older_than_seconds, batch_size)
                deleted += n
                if n < batch_size:
                    return deleted

    def requeue(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Make failed, dead or cancelled jobs available again, with a fresh attempt budget.

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be requeued.
        """
        with self.connection(conn) as c:
            return self.store.requeue(c, job_ids)

    def requeue_matching(self, states: Iterable[State], *, queue: str | None = None, task: str | None = None) -> int:
        """Requeue every failed/dead/cancelled job matching the filter; return how many."""
        with self.connection() as c:
            return self.store.requeue_matching(c, states, queue=queue, task=task)

    def cancel(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Cancel available or running jobs (a running handler is told at its next heartbeat).

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be cancelled.
        """
        with self.connection(conn) as c:
            return self.store.cancel(c, job_ids)


class _Borrowed:
    """The context manager :meth:`Client.connection` returns. (A class: a @contextmanager
    generator cost a one-by-one enqueue a third as much as the pool itself.)"""

    __slots__ = ("_dsn", "_given", "_pool", "_pooled")

    def __init__(self, pool: ConnectionPool[Connection], dsn: str | None, given: Connection | None) -> None:
        self._pool, self._dsn, self._given = pool, dsn, given
        self._pooled: Connection | None = None

    def __enter__(self) -> Connection:
        if self._given is not None:
            return self._given
        with translate_errors(self._dsn):
            self._pooled = self._pool.getconn()
        return self._pooled

    def __exit__(self, *exc: object) -> None:
        if self._pooled is not None:
            self._pool.putconn(self._pooled)
            self._pooled = None
