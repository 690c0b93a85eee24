"""The worker: claims jobs, runs their handlers, reports outcomes, shuts down gracefully.

One worker uses three connections of its own: the claim loop's (claims and batched
completions), the heartbeat's, and the listener's (unless ``poll_only``); plus, lazily, a
small pool for :meth:`Job.transaction` (and one for :meth:`Job.atransaction`). The claim loop
runs on the thread that calls :meth:`Worker.run`; ``def`` handlers run on up to
``concurrency`` threads, ``async def`` handlers as up to ``concurrency`` coroutines on one
event loop (see :mod:`miniqueue.worker.aio`). Both kinds share everything else: the lease
slots (:mod:`miniqueue.worker.slots`), the heartbeat, the outcome queue the claim loop records
from, and the hooks.

:class:`Worker` is the claim loop, and composes the parts it steers, each a module of its own:
the claim policy (:mod:`~miniqueue.worker.claiming`: when to claim, how many, where among
limited jobs), dispatch (:mod:`~miniqueue.worker.dispatch`: ready jobs to handlers), running a
handler (:mod:`~miniqueue.worker.execute`), recording outcomes
(:mod:`~miniqueue.worker.recording`), the claim connection (:mod:`~miniqueue.worker.connection`)
and the handlers' connections (:mod:`~miniqueue.worker.handlerdb`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

from psycopg_pool import ConnectionPool

from ..core.db import Connection
from ..core.errors import ConfigError, DatabaseUnavailable
from ..core.validation import DEFAULT_MAX_PAYLOAD_BYTES
from ..store.store import Release, Store
from ..tasks.app import App
from ..tasks.outcomes import Outcome, WorkerHooks
from ..tasks.task import is_async_handler
from .aio import POOL_MAX_SIZE, AsyncTransactions, EventLoop
from .claiming import ClaimPolicy
from .config import WorkerConfig, new_worker_id
from .connection import ClaimConnection
from .dispatch import Dispatcher
from .execute import Executor
from .grouping import GroupMembers
from .handlerdb import HandlerConnections
from .handlerthreads import HandlerThreads
from .heartbeat import Heartbeat
from .notify import Listener, listener_for
from .recording import Batch, OutcomeRecorder
from .slots import Slots, start_deadline
from .worker_steps import WorkerSteps

log = logging.getLogger("miniqueue.worker")

#: Seconds the event loop's tasks get to unwind from their cancellation when the worker stops.
ASYNC_UNWIND_SECONDS = 1.0


class Worker:
    """Claims and runs the jobs of an app's tasks until stopped.

    ``dsn_or_pool`` is a connection string, or a ``psycopg_pool.ConnectionPool`` (autocommit
    connections) that :meth:`Job.transaction` will use; the worker's own claim, heartbeat and
    listen connections are opened from the pool's conninfo, since they are held for the
    worker's lifetime.
    """

    #: Longest a finished job's outcome waits before the claim loop records it.
    OUTCOME_DELAY = 0.05

    def __init__(
        self,
        app: App,
        dsn_or_pool: str | ConnectionPool[Connection],
        config: WorkerConfig | None = None,
        *,
        hooks: WorkerHooks | None = None,
    ) -> None:
        self.app = app
        self.config = cfg = (config or WorkerConfig()).validated()
        async_tasks = frozenset(name for name, task in app.tasks.items() if is_async_handler(task.handler))
        # Jobs of unknown tasks fail on a thread, so threads are always a kind; an app with both
        # kinds of handlers runs up to `concurrency` of each.
        kinds = (False, True) if async_tasks else (False,)
        handler_kinds = 2 if async_tasks and len(async_tasks) < len(app.tasks) else 1
        self.queues = list(cfg.queues or app.queues)
        if not self.queues:
            raise ConfigError("the worker has no queue to claim from: register a task or pass queues")
        self.worker_id = cfg.worker_id or new_worker_id()
        pool: ConnectionPool[Connection] | None = None
        if isinstance(dsn_or_pool, str):
            self.dsn = dsn_or_pool
        else:
            info = dsn_or_pool.conninfo
            self.dsn, pool = (info() if callable(info) else info), dsn_or_pool
        store = Store(cfg.schema)
        pool_size = min(cfg.concurrency, POOL_MAX_SIZE)
        self._slots = Slots(async_tasks, {name: task.batch for name, task in app.tasks.items() if task.batch})
        self._claims = ClaimPolicy(cfg, self._slots, kinds=kinds, handler_kinds=handler_kinds)
        self._claim_conn = ClaimConnection(self.dsn, store, app, self.queues, schema=cfg.schema)
        self._handler_db = HandlerConnections(
            self.dsn, store, self.worker_id, schema=cfg.schema, max_size=pool_size, pool=pool
        )
        self._async_transactions = AsyncTransactions(self.dsn, store, self.worker_id, max_size=pool_size)
        self._groups = GroupMembers(app, store, self.worker_id, max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES)
        self._outcomes = OutcomeRecorder(app, store, self.worker_id, self._slots, self._claims.prefetch)
        self._executor = Executor(app, max_result_bytes=cfg.max_result_bytes)
        self._wake = threading.Event()
        self._dispatch = Dispatcher(
            app=app,
            slots=self._slots,
            claims=self._claims,
            outcomes=self._outcomes,
            executor=self._executor,
            wake=self._wake,
            worker_id=self.worker_id,
            concurrency=cfg.concurrency,
            kinds=kinds,
            transaction=self._handler_db.transaction,
            atransaction=self._async_transactions.transaction,
            read_results=self._handler_db.read_parent_results,
            steps=WorkerSteps(self.worker_id, self._handler_db, self._async_transactions),
            groups=self._groups,
            max_result_bytes=cfg.max_result_bytes,
        )
        self.store = store
        # The claim takes only jobs of the app's tasks: another app's, on a shared database or
        # queue, are never this worker's to run.
        self._tasks = sorted(app.tasks)
        self.hooks = hooks or WorkerHooks()
        self._stop_requested = False
        self._listener: Listener | None = None

    @property
    def store(self) -> Store:
        """The store the worker's statements go through (replaceable before :meth:`run`)."""
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = self._claim_conn.store = self._handler_db.store = self._outcomes.store = store
        self._async_transactions.store = self._groups.store = store

    @property
    def hooks(self) -> WorkerHooks:
        """The callbacks that follow this worker's jobs (replaceable before :meth:`run`)."""
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: WorkerHooks) -> None:
        self._hooks = self._dispatch.hooks = self._executor.hooks = self._outcomes.hooks = hooks

    @property
    def jobs_done(self) -> int:
        """How many jobs' outcomes this worker has recorded."""
        return self._outcomes.jobs_done

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop claiming and drain; :meth:`run` returns once drained.

        Safe to call from any thread, and from a signal handler: it only sets flags, which
        the claim loop checks at least every 0.2 s.
        """
        self._stop_requested = True
        self._dispatch.stopping = True

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    @property
    def listening(self) -> bool | None:
        """Whether the LISTEN connection is up (None in poll-only mode or before run())."""
        return None if self._listener is None else self._listener.connected.is_set()

    def _nudge(self) -> None:
        self._claims.nudge()
        self._wake.set()

    # -- main loop -----------------------------------------------------------------------------

    def run(self) -> None:
        """Claim and run jobs until :meth:`stop` is called, then drain and return.

        Graceful stop: no new claims; prefetched jobs are released unstarted; running handlers
        get ``shutdown_timeout`` seconds to finish and have their outcome recorded. Handlers
        still running then are told to stop (``job.stop_reason == "shutdown"``) and abandoned:
        their jobs stay leased until the lease expires and the reaper (or, under
        ``miniqueue-supervise``, the supervisor) returns them to the queue.
        """
        cfg = self.config
        listener = listener_for(self.dsn, cfg.listen_url, self.store, self.queues, self._nudge, poll_only=cfg.poll_only)
        self._listener = listener
        heartbeat = Heartbeat(
            self.dsn,
            self.store,
            self.worker_id,
            lease_duration=cfg.lease_duration,
            interval=cfg.heartbeat_interval,
            leases=self._slots.leases,
            on_lost=self._dispatch.stop_lost,
            on_tick=self._dispatch.stop_timed_out,
            on_renewed=lambda ids, sent_at: self._slots.renewed(ids, start_deadline(sent_at, cfg.lease_duration)),
        )
        threads = HandlerThreads(cfg.concurrency, "miniqueue-handler")
        aio = EventLoop() if self._slots.async_tasks else None
        self._dispatch.threads, self._dispatch.aio = threads, aio
        log.info("worker %s started on queues %s", self.worker_id, ",".join(self.queues))
        for service in (listener, heartbeat, aio):
            if service:
                service.start()
        try:
            self._loop()
        finally:
            threads.shutdown()
            if aio is not None:
                # After a drain nothing runs; after abandoning, the coroutines were cancelled.
                aio.stop(ASYNC_UNWIND_SECONDS, before_stop=self._async_transactions.close)
            heartbeat.stop()
            if listener:
                listener.stop()
            self._claim_conn.close()
            self._handler_db.close()
            log.info("worker %s stopped after %d jobs", self.worker_id, self.jobs_done)

    def _loop(self) -> None:
        deadline: float | None = None
        next_poll = 0.0
        delay = 0.1
        while True:
            # Clear before looking: a wake-up (outcome, notification) that lands while this
            # iteration runs keeps the next wait from sleeping.
            self._wake.clear()
            try:
                self._dispatch_ready()  # keep handler threads busy while we talk to the database
                if self._stop_requested:
                    deadline = deadline or time.monotonic() + self.config.shutdown_timeout
                    if self._drain(deadline):
                        return
                else:
                    self._hand_back_if_stuck()
                    now = time.monotonic()
                    if self._outcomes.wakeup_due(now):  # a job this worker put to sleep is due
                        self._claims.nudge()
                    claim = self._claim_size(now >= next_poll)
                    self._flush_outcomes(claim)
                    if claim:
                        next_poll = time.monotonic() + self._claims.poll_interval(time.monotonic())
                self._dispatch_ready()
                delay = 0.1
            except DatabaseUnavailable as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    self._abandon_running()
                    return
                log.warning("worker %s: %s; retrying in %.1fs", self.worker_id, exc, delay)
                self._claim_conn.close()
                self._claims.nudge()  # after reconnecting, poll once
                self._back_off(delay, deadline)
                delay = min(delay * 2, 5.0)
                continue
            # Handlers and notifications set the wake event; only a claim we could make right
            # now is a reason not to wait for one, and outcomes waiting to be recorded a reason
            # not to wait long. A wake-up that landed during this iteration has its reason looked
            # at here (a handler that ran dry while the claim was under way, say), so it does not
            # cut the next wait short too.
            self._wake.clear()
            wait = 0.0 if self._claim_size(False) else max(0.0, next_poll - time.monotonic())
            wait = min(wait, self._claims.stuck_in(time.monotonic()))
            wait = min(wait, self._slots.batch_due_in(time.monotonic(), self.config.concurrency))
            if self._outcomes.wakeups:  # a job this worker put to sleep is due then
                wait = min(wait, max(0.0, self._outcomes.wakeups[0] - time.monotonic()))
            self._sleep(min(wait, self.OUTCOME_DELAY) if self._outcomes else wait)

    def _dispatch_ready(self) -> None:
        """Start ready jobs; hand back at once, uncharged, those whose lease may have ended
        before they could start (the process stalled past it): they are not this worker's to
        start, and left to expire they would wait for the reaper."""
        self._dispatch.dispatch()
        overdue = self._slots.take_overdue()
        if not overdue:
            return
        note = "handed back unstarted: its lease may have ended before it could start; attempt not charged"
        try:
            self.store.release(
                self._claim_conn.get(), self.worker_id, [Release(lease.id, lease.attempt, note) for lease in overdue]
            )
        except BaseException:
            self._slots.put_overdue(overdue)  # told again at the next turn of the loop
            raise
        for lease in overdue:
            log.warning(
                "job %d (%s) not started: its lease may have ended before it could start (the worker "
                "stalled past it); handed back, attempt not charged",
                lease.id,
                lease.task,
            )

    def _drain(self, deadline: float) -> bool:
        """One step of a graceful stop; True once there is nothing left to wait for."""
        if time.monotonic() >= deadline:
            self._abandon_running()
            return True
        self._flush_outcomes(claim=0)
        self._release_ready("handed back unstarted: the worker stopped; attempt not charged")
        return not self._slots.running and not self._outcomes

    def _claim_size(self, poll_due: bool) -> int:
        """How many jobs to claim now (0: not now): see :meth:`ClaimPolicy.claim_size`."""
        return self._claims.claim_size(
            poll_due, finishing=len(self._outcomes), jobs_done=self.jobs_done, now=time.monotonic()
        )

    def _hand_back_if_stuck(self) -> None:
        """Work-conserving prefetch: jobs waiting behind handlers of their kind that all outlived
        the budget go back unstarted, so that an idle worker takes them instead of them waiting here."""
        stuck = self._claims.to_hand_back(time.monotonic())
        if stuck:
            handlers = {frozenset({False}): "handler thread", frozenset({True}): "async handler"}.get(
                frozenset(stuck), "handler"
            )
            budget = self.config.prefetch_budget
            self._release_ready(
                f"handed back unstarted: every {handlers} of its worker was busy past the "
                f"{budget:g}s prefetch budget; attempt not charged",
                stuck,
            )
            self._claims.handed_back_kinds(stuck)

    def _back_off(self, seconds: float, deadline: float | None) -> None:
        """Wait ``seconds`` before trying a database that did not answer again. A stopping worker
        waits too (up to its shutdown deadline): :meth:`_sleep` returns at once then, and the
        retries would spin."""
        if self._stop_requested:
            time.sleep(max(0.0, min(seconds, (deadline or time.monotonic() + seconds) - time.monotonic())))
        else:
            self._sleep(seconds)

    def _sleep(self, seconds: float) -> None:
        """Wait until woken (outcome, notification) or ``seconds`` pass, checking the stop flag."""
        end = time.monotonic() + seconds
        while not self._stop_requested:
            remaining = end - time.monotonic()
            if remaining <= 0 or self._wake.wait(min(remaining, 0.2)):
                return

    def publish(self) -> None:
        """Open the claim connection, publishing the app's task declarations (see
        docs/guides/tasks.md), as :meth:`run` does at its first claim: a supervised worker
        does it before it reports ready, so jobs enqueued once the supervisor is ready take
        their tasks' options. Raises DatabaseUnavailable if the database cannot be reached."""
        self._claim_conn.get()

    # -- outcomes and claims -------------------------------------------------------------------

    def _flush_outcomes(self, claim: int) -> None:
        """Record finished handlers' outcomes and, when ``claim`` > 0, claim that many jobs.

        Completions and the claim share one statement; the rest is the recorder's (see
        :mod:`miniqueue.worker.recording`).
        """
        if claim:  # before reading the outcomes: a job that finishes after that is a reason again
            self._claims.begin_claim()
        if not self._outcomes and not claim:
            return
        conn = self._claim_conn.get()
        if claim:
            self._outcomes.flush(conn, lambda batch: self._complete_and_claim(conn, batch, claim))
        else:
            self._outcomes.flush(
                conn,
                lambda batch: self.store.complete_many(conn, self.worker_id, batch.completions, results=batch.results),
            )
        if self.config.max_jobs is not None and self.jobs_done >= self.config.max_jobs and not self._stop_requested:
            log.info("worker %s ran %d jobs (max_jobs): stopping to be recycled", self.worker_id, self.jobs_done)
            self.stop()

    def _complete_and_claim(self, conn: Connection, batch: Batch, claim: int) -> set[int]:
        """Complete ``batch``'s jobs and claim ``claim`` more in one statement, where the claim
        policy says; the leases join the ready ones."""
        claims = self._claims
        kept = claims.kept(batch.outcomes)
        sent_at = time.monotonic()  # the leases end no sooner than lease_duration after this
        completed, leases = self.store.complete_and_claim(
            conn,
            self.worker_id,
            batch.completions,
            self.queues,
            self.config.lease_duration,
            claim,
            after=claims.cursor,
            descending=claims.descending,
            results=batch.results,
            tasks=self._tasks,
            together=claims.together(claim),
            per_group=claims.per_group,
            keep=kept,
        )
        claims.claimed(leases, claim, kept.values(), time.monotonic())
        self._slots.add_ready(leases, start_deadline(sent_at, self.config.lease_duration))
        return completed

    def _release_ready(self, note: str, kinds: Collection[bool] = (False, True)) -> None:
        """Hand prefetched (never started) jobs of ``kinds`` back without spending an attempt,
        ``note`` in their history. They leave the buffer first, so no handler starts one the
        database is being told is free; if the database cannot be told, they go back in."""
        unstarted = self._slots.take_ready(kinds)
        if unstarted:
            try:
                self.store.release(
                    self._claim_conn.get(),
                    self.worker_id,
                    [Release(lease.id, lease.attempt, note) for lease in unstarted],
                )
            except BaseException:
                self._slots.put_back(unstarted)
                raise
            self._slots.forget_start_by(unstarted)

    def _abandon_running(self) -> None:
        abandoned = self._dispatch.abandon_running()
        log.warning(
            "worker %s: shutdown timeout: abandoning %d running job(s) %s: each stays leased until "
            "the supervisor hands it back as this process exits (when supervised) or its lease expires",
            self.worker_id,
            len(abandoned),
            [job.id for job in abandoned],
        )


__all__ = ["Outcome", "Worker", "WorkerConfig", "WorkerHooks", "new_worker_id"]
