"""The producer API: enqueue jobs, and inspect or repair them.

:class:`Client` runs on psycopg's sync connections, :class:`~miniqueue.AsyncClient`
(:mod:`miniqueue.client.asyncclient`) on its asyncio ones. Both are thin: what they do is defined
once, in :class:`~miniqueue.client.base.BaseClient`, as :mod:`steps <miniqueue.core.steps>` (validation first, then the
store's statements, row mapping and the logic between them, with no I/O), and each client only
borrows a connection and runs the steps on it (``run`` or ``await arun``). So both validate the
same way, raise the same errors, and run the same SQL.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg_pool import ConnectionPool

from ..core.db import DEFAULT_CONNECT_TIMEOUT, Connection, connect, connect_seconds, create_pool, translate_errors
from ..core.diagnosis import Diagnosis
from ..core.fairness import KeyRule, KeyShare
from ..core.health import Reading
from ..core.options import JobOptions, job_spec
from ..core.records import (
    BlockedSequence,
    EnqueueResult,
    GroupResult,
    HorizonHolder,
    JobProgress,
    JobRecord,
    JobSpec,
    QueueCount,
    QueueStats,
    State,
)
from ..core.steps import Steps, run
from ..core.validation import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    check_job_ids,
)
from ..store.migrate import latest_version
from ..store.store import LimitWait
from .aging import age_queue_steps
from .base import BaseClient, _check_wait, group_callbacks
from .inspection import Inspection
from .results import progress_steps, wait_for, watch
from .schedules import Schedules

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

    from ..tasks.app import App

T = TypeVar("T")


class Client(BaseClient, Inspection):
    """Enqueue and manage jobs.

    ``Client(dsn)`` opens a small connection pool of its own (close it with :meth:`close` or a
    ``with`` block); ``Client(pool)`` uses a ``psycopg_pool.ConnectionPool`` you own, whose
    connections must be in autocommit mode.

    ``connect_timeout`` (seconds, 10 by default) bounds how long a call waits to open a
    connection or to get one from the pool: with the database down, a call fails within it with
    :class:`~miniqueue.DatabaseUnavailable` (libpq counts whole seconds, at least 2, for a new
    connection; a refused one fails at once).

    Every method that writes takes ``conn=``: pass your own psycopg connection to make the
    write part of your transaction; the job then exists only if your transaction commits, and
    workers are notified at that commit. The reads a view makes take it too, so that it reads
    several things on one connection (the dashboard's pages do); the inspection calls it needs
    beyond these are :class:`~miniqueue.client.inspection.Inspection`'s.
    """

    def __init__(
        self,
        dsn_or_pool: str | ConnectionPool[Connection],
        *,
        schema: str = "public",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        notify: bool = True,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        super().__init__(schema=schema, max_payload_bytes=max_payload_bytes, notify=notify)
        #: Periodic schedules created, changed and deleted at run time.
        self.schedules = Schedules(self)
        self._dsn: str | None = None
        if isinstance(dsn_or_pool, str):
            seconds = connect_seconds(connect_timeout)
            # Fail fast, with libpq's own reason, rather than after the pool's retries time out.
            connect(dsn_or_pool, purpose="client", schema=schema, connect_timeout=seconds).close()
            self._pool = create_pool(
                dsn_or_pool, purpose="client", schema=schema, timeout=connect_timeout, connect_timeout=seconds
            )
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

    def _run(self, steps: Steps[T], conn: Connection | None = None) -> T:
        """Run ``steps`` on ``conn``, or on one of the pool's connections."""
        with self.connection(conn) as c:
            return run(c, steps)

    def enqueue(
        self, task: str, payload: Any = None, *, conn: Connection | None = None, **options: Unpack[JobOptions]
    ) -> EnqueueResult:
        """Enqueue one job of ``task`` and return its id; ``options`` are the job's (see
        :class:`~miniqueue.JobOptions`), each left out being what the task declares.

        ``payload`` must be JSON-serialisable (no NaN/Infinity, no U+0000, at most
        ``max_payload_bytes`` encoded). Where its idempotency key or unique key finds a job stored
        already, the result is that job's id with ``duplicate=True``. Invalid input raises
        InvalidInput and stores nothing; an unknown option, TypeError.
        """
        return self._run(self._enqueue_steps(job_spec(task, payload, options)), conn)

    def declares(self, task: str, *, conn: Connection | None = None) -> bool:
        """Whether an app has declared ``task`` on this database (its workers publish their app's
        declarations when they start; :meth:`declare` does too)."""
        return self._run(self._declares_steps(task), conn)

    def declare(self, app: App, *, conn: Connection | None = None) -> None:
        """Publish what ``app``'s tasks declare (queue, priority, attempts, limits), as each of its
        workers does when it starts, so that jobs enqueued by name get their task's options from
        the first one, before any worker has run (a deploy step, a test fixture). See
        docs/guides/tasks.md."""
        self._run(self._declare_steps(app), conn)

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue many jobs in one transaction; results are in input order.

        One invalid job raises InvalidInput (naming its index) and none is stored. Idempotency
        keys are honoured against stored jobs and within the batch (the first occurrence wins).
        """
        return self._run(self._enqueue_many_steps(jobs), conn)

    def chain(self, steps: Sequence[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """Enqueue jobs that run one after another: each step depends on the one before it
        (and on whatever its own ``depends_on`` names), and reads that step's result as
        ``job.parent_result``. One transaction: all the steps are stored, or none.

        A step that ends failed, dead or cancelled cancels the steps after it.
        """
        return self._run(self._chain_steps(steps), conn)

    def group(
        self,
        members: Sequence[JobSpec],
        *,
        then: JobSpec | None = None,
        on_success: JobSpec | None = None,
        on_complete: JobSpec | None = None,
        on_failure: JobSpec | None = None,
        conn: Connection | None = None,
    ) -> GroupResult:
        """Enqueue ``members`` to run in parallel, and callbacks to run once after them; a
        callback's handler reads the members' results as ``job.parent_results`` (by member id,
        in the order given) and how each ended as ``job.parent_outcomes``. One transaction: all
        are stored, or none. Give at least one callback:

        - ``then`` (or its alias ``on_success``) runs once every member completed; if one ends
          failed, dead or cancelled, it is cancelled with an error naming that member;
        - ``on_complete`` runs once every member finished, however each ended;
        - ``on_failure`` runs once every member finished, if one of them did not complete (if
          all completed, it is cancelled).

        Each callback's parents are the members, released in the transaction of the last
        member's finish: it becomes runnable exactly once, however the members' workers die. A
        running member can add jobs to its group (``job.add_to_group``): the callbacks wait for
        them too.
        """
        return self._run(self._group_steps(members, group_callbacks(then, on_success, on_complete, on_failure)), conn)

    def result(self, job_id: int) -> Any:
        """The result job ``job_id``'s handler returned (None if it returned nothing).

        Raises JobNotFound for an unknown id, JobNotFinished while it waits, is available or
        runs, and JobFailed (carrying the job's last error) when it ended failed, dead or
        cancelled.
        """
        return self._run(self._result_steps(job_id))

    def wait(self, job_id: int, *, timeout: float = 60.0) -> Any:
        """Wait for job ``job_id`` to finish and return its result, as :meth:`result` does.

        Woken by a notification the statement that finishes the job sends (no polling); a
        connection of its own is held for the wait. Raises WaitTimeout (a TimeoutError) if
        the job has not finished within ``timeout`` seconds.
        """
        job_id, timeout = _check_wait(job_id, timeout)
        return wait_for(self.store, session_dsn(self._dsn, self._pool.conninfo), job_id, timeout)

    def progress(self, job_id: int, *, conn: Connection | None = None) -> JobProgress:
        """Job ``job_id``'s state and the progress its handler last reported (``job.progress()``;
        ``progress`` is None until it reports some), with its result or last error once it
        finished. Raises JobNotFound.

        Progress is written with the worker's lease renewals (every heartbeat interval), so it
        may trail the handler's latest report by that long; the last report is written as the
        job completes.
        """
        return self._run(progress_steps(self.store, job_id), conn)

    def watch(self, job_id: int, *, timeout: float = 60.0) -> Iterator[JobProgress]:
        """Follow job ``job_id``: yield it as it is now, then each change of its progress or
        state as it is written, up to its end, the last item (``item.finished``: its state,
        result or last error).

        Woken by notifications (no polling); a connection of its own is held while iterating.
        Raises WaitTimeout (a TimeoutError) if the job has not finished within ``timeout``
        seconds, JobNotFound for an unknown id.
        """
        job_id, timeout = _check_wait(job_id, timeout)
        return watch(self.store, session_dsn(self._dsn, self._pool.conninfo), job_id, timeout)

    def get(self, job_id: int, *, conn: Connection | None = None) -> JobRecord:
        """Every field of one job, with its error history; raises JobNotFound."""
        return self._run(self._get_steps(job_id), conn)

    def why(self, job_id: int, *, conn: Connection | None = None) -> Diagnosis:
        """Why job ``job_id`` has not run: each cause that holds it back, most decisive first,
        each a sentence and its facts (see :class:`~miniqueue.core.diagnosis.CauseKind`), read in
        one transaction on the database's clock; or the one cause that says it ran, runs, or is
        due with nothing in its way. Raises JobNotFound for an unknown id."""
        return self._run(self._why_steps(job_id), conn)

    def counts(self) -> list[QueueCount]:
        """Job counts by queue and state."""
        return self._run(self.store.counts_steps())

    def queue_stats(self, *, check_served: bool = True, conn: Connection | None = None) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, the oldest waiting job's age, expired
        leases, and whether any worker has ever served it (``check_served=False`` skips that
        read, one statement: every queue then says served, unchecked)."""
        return self._run(self._queue_stats_steps(check_served), conn)

    def recount(self) -> None:
        """Recount finished jobs from the jobs table, repairing counts that drifted (see
        docs/operations/cli.md). It reads every finished row: a repair, not a routine."""
        self._run(self.store.recount_steps())

    def list_jobs(
        self, *, before_id: int | None = None, limit: int = 50, conn: Connection | None = None, **filters: Any
    ) -> list[JobRecord]:
        """Jobs matching the filters (state, queue, task, search, created_after, created_before),
        newest first; page with ``before_id``. A filter that no job could match (a queue or task
        name that breaks the naming rules) raises InvalidInput. On ``conn`` (yours), the list
        includes the jobs your open transaction enqueued."""
        return self._run(self._list_jobs_steps(before_id, limit, filters), conn)

    def prune(self, states: Iterable[State], older_than_seconds: float, *, batch_size: int = 1000) -> int:
        """Delete every job in ``states`` (terminal states only) that finished more than
        ``older_than_seconds`` ago, in batches; return how many were deleted."""
        return self._run(self._prune_steps(states, older_than_seconds, batch_size))

    def requeue(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Make failed, dead or cancelled jobs available again, with a fresh attempt budget.

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be requeued.
        """
        return self._run(self.store.requeue_steps(check_job_ids(job_ids)), conn)

    def release_sequence(self, key: str, *, conn: Connection | None = None) -> tuple[int, int | None]:
        """Unblock sequence ``key``: the failed or dead job that blocks it stays as it is, and the
        key's next job runs. Returns ``(the blocking job, the job holding the key now or None)``;
        InvalidInput if the key is not blocked (see docs/guides/keys.md)."""
        return self._run(self._release_sequence_steps(key), conn)

    def blocked_sequences(self, *, limit: int = 1000, conn: Connection | None = None) -> list[BlockedSequence]:
        """The sequence keys that a failed or dead job blocks, by key."""
        return self._run(self.store.blocked_sequences_steps(limit), conn)

    def requeue_matching(self, states: Iterable[State], *, queue: str | None = None, task: str | None = None) -> int:
        """Requeue every failed/dead/cancelled job matching the filter; return how many."""
        return self._run(self._requeue_matching_steps(states, queue, task))

    def signal(self, key: str, data: Any = None, *, conn: Connection | None = None) -> int | None:
        """Send signal ``key`` with ``data`` (JSON): it resumes the oldest job waiting for it
        (``job.wait_for(key)``) and returns that job's id, or, if none waits, it is kept until one
        does and this returns None. Delivered once. Inside ``conn``'s transaction, it takes effect
        when that commits (see docs/guides/durable.md)."""
        return self._run(self._signal_steps([(key, data)]), conn)[0]

    def signal_many(self, signals: Iterable[tuple[str, Any]], *, conn: Connection | None = None) -> list[int | None]:
        """Send ``(key, data)`` signals in one statement, as :meth:`signal` each (two of one key
        resume its two oldest waiters); per signal, the job it resumed or None (kept)."""
        return self._run(self._signal_steps(signals), conn)

    def kept_signals(self, key: str | None = None) -> list[tuple[str, int, dt.datetime]]:
        """The signals kept for no job yet: ``(key, how many, the oldest's sending time)``."""
        return self._run(self.store.kept_signals_steps(key))

    def cancel(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Cancel available or running jobs (a running handler is told at its next heartbeat).

        All or nothing: raises JobNotFound or InvalidTransition if any id cannot be cancelled.
        """
        return self._run(self.store.cancel_steps(check_job_ids(job_ids)), conn)

    def delete(self, job_ids: Sequence[int], *, conn: Connection | None = None) -> list[int]:
        """Delete jobs and their error history, except running ones (cancel them first); return
        the ids deleted, in order. (Client only: the store deletes on a sync connection.)"""
        ids = check_job_ids(job_ids)
        with self.connection(conn) as c:
            return self.store.delete(c, ids)

    def horizon(self, *, conn: Connection | None = None) -> list[HorizonHolder]:
        """What holds the database's MVCC horizon back, oldest first (see docs/operations/health.md)."""
        with self.connection(conn) as c:
            return self.store.horizon(c)

    def health(self, *, conn: Connection | None = None) -> Reading:
        """One reading of the database's health for the queue: what holds the MVCC horizon
        back, the jobs table's rows and sizes, connection headroom, the schema's version and this
        host's clock against the database's (see docs/operations/health.md; judge it with
        :func:`miniqueue.core.health.diagnose`). (Client only: the store reads it on a sync connection.)"""
        with self.connection(conn) as c:
            table = self.store.table_health(c)
            host_clock = time.time()  # compared with the database's clock, read just before
            return Reading(
                horizon=self.store.horizon(c),
                table=table,
                connections=self.store.connection_capacity(c),
                schema_version=self.store.schema_version(c),
                latest_version=latest_version(),
                host_clock=host_clock,
                history=tuple(self.store.partitions(c)),
                legacy=self.store.has_legacy(c),
            )

    # -- queues and schedules (operator calls) ---------------------------------------------------

    def pause_queues(self, names: Iterable[str], *, create: bool = False, conn: Connection | None = None) -> list[str]:
        """Stop every worker, on every host, from claiming jobs of these queues; return them.

        A name that is not known (no job waiting or running in it, never paused or resumed)
        raises InvalidInput naming it, and nothing is paused: a typo must not leave a paused
        queue that nothing uses. ``create=True`` pauses such a queue anyway (before its first job).
        """
        return self._run(self._set_paused_steps(names, True, create), conn)

    def resume_queues(self, names: Iterable[str], *, create: bool = False, conn: Connection | None = None) -> list[str]:
        """Let workers claim jobs of these queues again; return them (unknown names: as :meth:`pause_queues`)."""
        return self._run(self._set_paused_steps(names, False, create), conn)

    def paused_queues(self, *, conn: Connection | None = None) -> list[str]:
        """The queues paused now."""
        return self._run(self.store.paused_queues_steps(), conn)

    def list_queues(self) -> dict[str, bool]:
        """Every queue that has jobs or is paused, in name order, and whether it is paused."""
        return self._run(self._list_queues_steps())

    def limit_queue(self, name: str, max_running: int | None, *, create: bool = False) -> None:
        """Cap the running jobs of queue ``name`` across every worker on every host at
        ``max_running``; None lifts the cap. Unknown names: as :meth:`pause_queues`."""
        self._run(self._limit_queue_steps(name, max_running, create))

    def queue_limits(self, *, conn: Connection | None = None) -> dict[str, int]:
        """The queues with a cap on running jobs, and their caps."""
        return self._run(self.store.queue_limits_steps(), conn)

    def age_queue(self, name: str, age_after: float | None, *, create: bool = False) -> None:
        """Age the jobs of queue ``name``: each due job's priority rises one step per ``age_after``
        seconds it has been due, up to the highest priority among the queue's available jobs, so
        that a stream of high-priority jobs never starves the others (the reaper raises them:
        see "Priority aging" in docs/guides/fairness.md). None turns aging off; the jobs keep the
        priorities they reached. ``age_after`` is a positive number of seconds: anything else
        raises InvalidInput, and nothing is stored. Unknown names: as :meth:`pause_queues`."""
        self._run(age_queue_steps(self, name, age_after, create))

    def queue_aging(self, *, conn: Connection | None = None) -> dict[str, float]:
        """The queues whose jobs age, and their intervals (seconds)."""
        return self._run(self.store.queue_aging_steps(), conn)

    def fair_queue(self, name: str, fair: bool = True, *, create: bool = False) -> int:
        """Make every job of queue ``name`` fair (see docs/guides/fairness.md), or, with
        ``fair=False``, only those whose task or caller says so. The jobs the queue holds take
        their turns at once, by their concurrency key; returns how many. Unknown names: as
        :meth:`pause_queues`."""
        return self._run(self._fair_queue_steps(name, fair, create))

    def fair_queues(self, *, conn: Connection | None = None) -> list[str]:
        """The queues whose every job is fair."""
        return sorted(self._run(self.store.fair_queues_steps(), conn))

    def set_key_rule(
        self,
        pattern: str,
        *,
        limit: int | None = None,
        weight: float | None = None,
        every_key: bool = False,
        conn: Connection | None = None,
    ) -> KeyRule:
        """Set the rule of the keys ``pattern`` matches (``*`` matches any characters): at most
        ``limit`` of a key's fair jobs run at once, and its ``weight`` (its jobs take that many
        turns for one of a key of weight 1). It replaces the pattern's rule, and holds from the
        next claim, for the jobs waiting too. A key takes each setting from the most specific rule
        that sets it: its own name first, then the longest pattern. A pattern of ``*`` alone needs
        ``every_key=True``. Returns the rule as stored."""
        return self._run(self._set_key_rule_steps(pattern, limit, weight, every_key), conn)

    def remove_key_rule(self, pattern: str, *, conn: Connection | None = None) -> bool:
        """Remove the rule of ``pattern`` (the keys it matched take the other rules'); False if there was none."""
        return self._run(self._remove_key_rule_steps(pattern), conn)

    def key_rules(self, *, conn: Connection | None = None) -> list[KeyRule]:
        """Every key rule, most specific first."""
        return self._run(self.store.key_rules_steps(), conn)

    def key_shares(
        self, queue: str | None = None, *, limit: int = 1000, conn: Connection | None = None
    ) -> list[KeyShare]:
        """The fair keys that have jobs (of ``queue``, or of every queue), and what each holds now."""
        return self._run(self.store.key_shares_steps(queue, limit), conn)

    def limit_waits(self, limit: int = 100, *, conn: Connection | None = None) -> list[LimitWait]:
        """The limits jobs are waiting on or hold slots of, most waiting first: for each, how many
        due jobs name it (for a queue's cap, every due job of the queue), and its slots held and
        the jobs holding them, or its tokens left."""
        return self._run(self.store.limit_waits_steps(limit), conn)

    def enable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: Connection | None = None
    ) -> None:
        """Enable periodic schedule ``name`` (see :meth:`disable_schedule` for which names are known)."""
        self._run(self._switch_schedule_steps(name, True, app, create), conn)

    def disable_schedule(
        self, name: str, *, app: App | None = None, create: bool = False, conn: Connection | None = None
    ) -> None:
        """Disable periodic schedule ``name``: its slots are skipped until it is enabled again.

        The name must be known: a schedule some scheduler has run, or one of ``app``'s
        schedules (which may be switched before its first run). Otherwise InvalidInput names it
        and the known ones, and nothing is stored. ``create=True`` switches it without that
        check (a schedule not run yet then starts so).
        """
        self._run(self._switch_schedule_steps(name, False, app, create), conn)

    def periodic_state(self, *, conn: Connection | None = None) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule a scheduler has run or an operator switched: its last slot and
        whether it is enabled."""
        return self._run(self.store.periodic_state_steps(), conn)

    def now(self, *, conn: Connection | None = None) -> dt.datetime:
        """The database's clock (what schedules and delays are measured against)."""
        return self._run(self.store.now_steps(), conn)

    def shard_place(self, *, conn: Connection | None = None) -> tuple[str, int] | None:
        """The name and index this database took in a shard map when it joined it (``miniqueue
        migrate --shards``), or None if it joined none."""
        return self._run(self.store.shard_steps(), conn)


def session_dsn(dsn: str | None, pool_conninfo: str | Callable[[], str]) -> str:
    """A DSN for a connection of a client's own (a LISTEN needs a session): the one it was given,
    else its pool's."""
    if dsn is not None:
        return dsn
    return pool_conninfo() if callable(pool_conninfo) else pool_conninfo


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
