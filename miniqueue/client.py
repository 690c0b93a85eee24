"""The producer API: enqueue jobs, and inspect or repair them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from psycopg_pool import ConnectionPool

from . import tracing
from .db import Connection, connect, create_pool, translate_errors
from .errors import InvalidInput
from .job import EnqueueResult, JobRecord, JobSpec, QueueCount, QueueStats, State
from .store import Store
from .validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    JOB_ID_RANGE,
    check_int_range,
    check_job_ids,
    check_queue_name,
    check_schedule_name,
    check_task_name,
    check_text,
    validate,
    validate_each,
)

if TYPE_CHECKING:
    from .app import App

#: How many known names an "unknown queue" error lists.
_KNOWN_SHOWN = 20


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
        # OpenTelemetry (miniqueue.tracing): None when off or not installed.
        self._tracing = tracing.current()
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
            if self._tracing is None:
                return self.store.enqueue(c, job, notify=self.notify)
            with self._tracing.sending((spec,)) as send:  # a producer span: the job stores its context
                return send.sent(self.store.enqueue(c, job, notify=self.notify, trace_context=send.context))

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction; results are in input order.

        One invalid job raises InvalidInput (naming its index) and none is stored. Idempotency
        keys are honoured against stored jobs and within the batch (the first occurrence wins).
        """
        specs = list(jobs)
        checked = validate_each(specs, max_payload_bytes=self.max_payload_bytes)
        # One producer span for the batch, whose context every job stores (miniqueue.tracing).
        with self.connection(conn) as c, tracing.sending(self._tracing, specs, batch=True) as send:
            if len(specs) >= self.store.copy_threshold and all(s.idempotency_key is None for s in specs):
                # Each job is checked as the COPY streams it, so the checks overlap the server's
                # inserts; an invalid one aborts the COPY, and nothing is stored.
                scheduled = any(s.run_at is not None or s.delay is not None for s in specs)
                return self.store.copy_many(c, len(specs), checked, scheduled=scheduled, notify=self.notify,
                                            trace_context=send.context)  # fmt: skip
            return self.store.enqueue_many(c, list(checked), notify=self.notify, trace_context=send.context)

    def get(self, job_id: int) -> JobRecord:
        """Every field of one job, with its error history; raises JobNotFound."""
        job_id = check_int_range("job id", job_id, JOB_ID_RANGE)
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

    def recount(self) -> None:
        """Recount finished jobs from the jobs table, repairing counts that drifted (see the
        README's Operating section). It reads every finished row: a repair, not a routine."""
        with self.connection() as c:
            self.store.recount(c)

    def list_jobs(self, *, before_id: int | None = None, limit: int = 50, **filters: Any) -> list[JobRecord]:
        """Jobs matching the filters (state, queue, task, search, created_after, created_before),
        newest first; page with ``before_id``. A filter that no job could match (a queue or task
        name that breaks the naming rules) raises InvalidInput."""
        _check_filters(before_id=before_id, **filters)
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
        ids = check_job_ids(job_ids)
        with self.connection(conn) as c:
            return self.store.requeue(c, ids)

    def requeue_matching(self, states: Iterable[State], *, queue: str | None = None, task: str | None = None) -> int:
        """Requeue every failed/dead/cancelled job matching the filter; return how many."""
        _check_filters(queue=queue, task=task)
        with self.connection() as c:
            return self.store.requeue_matching(c, states, queue=queue, task=task)

    def cancel(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Cancel available or running jobs (a running handler is told at its next heartbeat).

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be cancelled.
        """
        ids = check_job_ids(job_ids)
        with self.connection(conn) as c:
            return self.store.cancel(c, ids)

    # -- queues and schedules (operator calls) ---------------------------------------------------

    def pause_queues(self, names: Iterable[str], *, create: bool = False) -> list[str]:
        """Stop every worker, on every host, from claiming jobs of these queues; return them.

        A name that is not known (no job waiting or running in it, never paused or resumed)
        raises InvalidInput naming it, and nothing is paused: a typo must not leave a paused
        queue that nothing uses. ``create=True`` pauses such a queue anyway (before its first job).
        """
        return self._set_paused(names, True, create)

    def resume_queues(self, names: Iterable[str], *, create: bool = False) -> list[str]:
        """Let workers claim jobs of these queues again; return them (unknown names: as :meth:`pause_queues`)."""
        return self._set_paused(names, False, create)

    def list_queues(self) -> dict[str, bool]:
        """Every queue that has jobs or is paused, in name order, and whether it is paused."""
        with self.connection() as c:
            paused = set(self.store.paused_queues(c))
            names = {q.queue for q in self.store.queue_stats(c)} | paused
        return {name: name in paused for name in sorted(names)}

    def enable_schedule(self, name: str, *, app: App | None = None) -> None:
        """Enable periodic schedule ``name`` (see :meth:`disable_schedule` for which names are known)."""
        self._switch_schedule(name, True, app)

    def disable_schedule(self, name: str, *, app: App | None = None) -> None:
        """Disable periodic schedule ``name``: its slots are skipped until it is enabled again.

        The name must be known: a schedule some scheduler has run, or one of ``app``'s
        schedules (which may be switched before its first run). Otherwise InvalidInput names it
        and the known ones, and nothing is stored.
        """
        self._switch_schedule(name, False, app)

    def periodic_state(self) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule a scheduler has run or an operator switched: its last slot and
        whether it is enabled."""
        with self.connection() as c:
            return self.store.periodic_state(c)

    def now(self) -> dt.datetime:
        """The database's clock (what schedules and delays are measured against)."""
        with self.connection() as c:
            return self.store.now(c)

    def _set_paused(self, names: Iterable[str], paused: bool, create: bool) -> list[str]:
        chosen = list(dict.fromkeys(check_queue_name(name) for name in names))
        if not chosen:
            raise InvalidInput("no queue name given: name at least one queue")
        # One transaction: with one unknown name among several, none is paused.
        with self.connection() as c, c.transaction():
            if not create:
                self._check_known_queues(c, chosen)
            for name in chosen:
                self.store.set_queue_paused(c, name, paused)
        return chosen

    def _check_known_queues(self, conn: Connection, names: list[str]) -> None:
        known = self.store.known_queues(conn, names)
        unknown = [name for name in names if name not in known]
        if not unknown:
            return
        listed = self.store.known_queue_names(conn, limit=_KNOWN_SHOWN + 1)
        shown = ", ".join(listed[:_KNOWN_SHOWN]) + (", ..." if len(listed) > _KNOWN_SHOWN else "")
        which = f"queue {unknown[0]!r} is" if len(unknown) == 1 else f"queues {', '.join(map(repr, unknown))} are"
        raise InvalidInput(
            f"{which} unknown: no job waiting or running, never paused or resumed "
            f"(known: {shown or 'none yet'}); to set a queue before its first job, pass create=True "
            "(--create on the command line)"
        )

    def _switch_schedule(self, name: str, enabled: bool, app: App | None) -> None:
        name = check_schedule_name(name)
        defined = set(app.schedules) if app is not None else set()
        with self.connection() as c, c.transaction():
            stored = self.store.periodic_state(c)
            if name not in stored and name not in defined:
                known = ", ".join(sorted({*stored, *defined})) or "none yet"
                hint = "" if app is not None else "; a schedule no scheduler has run yet needs the app that defines it"
                raise InvalidInput(f"schedule {name!r} is unknown (known: {known}){hint}")
            self.store.set_periodic_enabled(c, name, enabled)


def _check_filters(
    *,
    queue: str | None = None,
    task: str | None = None,
    search: str | None = None,
    before_id: int | None = None,
    **_: Any,
) -> None:
    """Reject a filter value that no stored job can match, before it reaches the database."""
    if queue is not None:
        check_queue_name(queue)
    if task is not None:
        check_task_name(task)
    if search is not None:
        check_text("search text", search)
    if before_id is not None:
        check_int_range("before id", before_id, JOB_ID_RANGE)


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
