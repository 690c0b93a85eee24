"""The worker: claims jobs, runs their handlers, reports outcomes, shuts down gracefully.

One worker uses three connections of its own: the claim loop's (claims and batched
completions), the heartbeat's, and the listener's (unless ``poll_only``); plus, lazily, a
small pool for :meth:`Job.transaction` (and one for :meth:`Job.atransaction`). The claim loop
runs on the thread that calls :meth:`Worker.run`; ``def`` handlers run on up to
``concurrency`` threads, ``async def`` handlers as up to ``concurrency`` coroutines on one
event loop (see :mod:`miniqueue.aio`). Both kinds share everything else: the lease slots
(:mod:`miniqueue.slots`), the heartbeat, the outcome queue the claim loop records from, and
the hooks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import secrets
import threading
import time
import traceback
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool

from ..core.backoff import default_backoff
from ..core.db import Connection, behind_pooler, check_dsn, connect, create_pool
from ..core.errors import ConfigError, DatabaseUnavailable, InvalidInput, LeaseLost
from ..core.limits import holds_a_slot
from ..core.process import host_name
from ..core.records import Lease, State
from ..core.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_queue_name, encode_result
from ..observability import tracing
from ..store.store import MAX_GROUPS_PER_CLAIM, Failure, Release, Store
from ..tasks.app import App, is_async_handler
from ..tasks.job import Job, PermanentError, Snooze
from .aio import POOL_MAX_SIZE, AsyncTransactions, EventLoop
from .handlerthreads import HandlerThreads
from .heartbeat import Heartbeat
from .notify import Listener, listener_for
from .outcomes import Outcome, WorkerHooks
from .prefetch import Prefetch, PrefetchPolicy, parse_prefetch
from .slots import Slots

log = logging.getLogger("miniqueue.worker")

#: While limited jobs flow (one was claimed within the window, in seconds), poll at least this
#: often: a slot freed by another worker or a refilled rate bucket sends no notification.
LIMITED_POLL_INTERVAL = 0.1
LIMITED_POLL_WINDOW = 5.0

#: A claimed job starts only while its lease has at least this much left (the larger of the two,
#: in seconds and as a share of the lease, but at most half the lease), judged on this
#: process's monotonic clock from the claim or the last renewal: a worker that stalled
#: (SIGSTOP, swap) past a prefetched job's lease never starts it beside the job's next holder,
#: so limits hold for handlers too.
START_MARGIN_SECONDS = 1.0
START_MARGIN_SHARE = 0.1

def new_worker_id(pid: int | None = None, suffix: str | None = None) -> str:
    """A worker id unique per process incarnation: host, pid and a random suffix, so a restarted
    process (or a recycled pid) never inherits a dead one's leases. The supervisor passes the
    child's pid and the suffix it chose before fork, so both sides compute the same id."""
    return f"{host_name()}:{pid or os.getpid()}:{suffix or secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker claims and runs jobs. Durations are in seconds.

    ``queues`` defaults to every queue of the app's tasks. ``heartbeat_seconds`` defaults to a
    third of the lease. ``prefetch`` claims jobs beyond the free handler slots, so the next
    job is ready when a slot frees and outcomes commit in batches (prefetched jobs hold leases,
    renewed like running ones, and are released unstarted at shutdown): ``"auto"`` holds as
    many as the threads are expected to finish within ``prefetch_budget`` seconds, judged from
    recent run times, and hands them back when every thread is stuck past the budget (see
    :mod:`miniqueue.prefetch`); a number holds that many; 0 claims one job per free thread.
    ``poll_only`` skips LISTEN/NOTIFY; ``listen_url`` runs LISTEN on a connection of its own
    to that URL (a direct one, when the worker's DSN goes through PgBouncer in transaction mode).
    ``concurrency`` is how many ``def`` handlers run at once (threads) and, separately, how many
    ``async def`` handlers (coroutines on the worker's event loop; hundreds are fine).
    """

    queues: Sequence[str] | None = None
    concurrency: int = 1
    lease_seconds: float = 30.0
    heartbeat_seconds: float | None = None
    poll_interval: float = 1.0
    shutdown_timeout: float = 10.0
    prefetch: Prefetch = "auto"
    prefetch_budget: float = 0.1
    poll_only: bool = False
    listen_url: str | None = None
    worker_id: str | None = None
    schema: str = "public"
    #: Stop (drain and return from run()) after this many jobs; the supervisor then recycles the process.
    max_jobs: int | None = None
    #: The largest handler result stored, in bytes of JSON (a larger one fails the attempt).
    max_result_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: Go round the groups of limited jobs from the last one down instead of from the first up.
    #: The supervisor sets it on every other worker: two workers going the same way end up one
    #: behind the other, each claim passing over the keys the other's last claim just took.
    descending: bool = False

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_seconds if self.heartbeat_seconds is not None else self.lease_seconds / 3

    def validated(self) -> WorkerConfig:
        """Return this config if it is consistent, else raise ConfigError naming the problem."""
        positive = {"lease_seconds": self.lease_seconds, "poll_interval": self.poll_interval,
                    "heartbeat interval": self.heartbeat_interval, "prefetch_budget": self.prefetch_budget}  # fmt: skip
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{name} {value!r} is invalid: use a positive number of seconds")
        if self.heartbeat_interval >= self.lease_seconds:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat_interval:g}s must be below the lease "
                f"({self.lease_seconds:g}s), or leases expire between renewals"
            )
        if self.concurrency < 1:
            raise ConfigError(
                f"concurrency {self.concurrency!r} is invalid: use 1 or more (handler threads, and coroutines "
                "for async tasks)"
            )
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max_jobs {self.max_jobs} is invalid: use 1 or more")
        parse_prefetch(self.prefetch)
        if self.shutdown_timeout < 0:
            raise ConfigError(f"shutdown_timeout {self.shutdown_timeout!r} is invalid: use 0 or more seconds")
        for queue in self.queues or ():
            check_queue_name(queue)
        if self.listen_url is not None:
            check_dsn(self.listen_url)
        return self


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
        self.config = (config or WorkerConfig()).validated()
        self._async_tasks = frozenset(name for name, task in app.tasks.items() if is_async_handler(task.handler))
        # Jobs of unknown tasks fail on a thread, so threads are always a kind; an app with both
        # kinds of handlers runs up to `concurrency` of each.
        self._kinds = (False, True) if self._async_tasks else (False,)
        kinds = 2 if self._async_tasks and len(self._async_tasks) < len(app.tasks) else 1
        self._handler_slots = self.config.concurrency * kinds
        self._prefetch = PrefetchPolicy(
            parse_prefetch(self.config.prefetch), concurrency=self.config.concurrency, kinds=kinds,
            budget=self.config.prefetch_budget,
        )  # fmt: skip
        # Kinds of handler (True: async) whose jobs this worker handed back because its every
        # handler of that kind was busy past the budget: while that lasts, the jobs at the head
        # of its queues are likely more of them, so it claims at its poll only, leaving them to
        # idle workers rather than claiming them back at once.
        self._handed_back: set[bool] = set()
        # The smallest claim worth a statement of its own: half the jobs held at most (running
        # and prefetched), so that claims come in batches. Set by the claim loop, read by
        # handler threads to decide when to wake it.
        self._claim_batch = 1
        self.queues = list(self.config.queues or app.queues)
        if not self.queues:
            raise ConfigError("the worker has no queue to claim from: register a task or pass queues")
        self.worker_id = self.config.worker_id or new_worker_id()
        self.store = Store(self.config.schema)
        self.hooks = hooks or WorkerHooks()
        if isinstance(dsn_or_pool, str):
            self.dsn, self._tx_pool, self._owns_tx_pool = dsn_or_pool, None, True
        else:
            info = dsn_or_pool.conninfo
            self.dsn = info() if callable(info) else info
            self._tx_pool, self._owns_tx_pool = dsn_or_pool, False
        self.jobs_done = 0
        self._slots = Slots(self._async_tasks)
        self._aio: EventLoop | None = None
        self._async_transactions = AsyncTransactions(
            self.dsn, self.store, self.worker_id, max_size=min(self.config.concurrency, POOL_MAX_SIZE)
        )
        self._outcomes: collections.deque[tuple[Job, Outcome]] = collections.deque()
        self._wake = threading.Event()
        self._nudged = True  # poll once at start
        self._backlog = False  # the last claim came back full: there is probably more
        # Limited jobs: where the next claim starts looking (after the last group claimed), and
        # when one was last claimed (while they flow, a slot freed elsewhere or a refilled
        # bucket sends no notification, so the worker polls sooner).
        self._limits_cursor: list[str] = []
        self._limited_at = float("-inf")
        # A job holding a concurrency slot finished since the last claim: its slot is free for
        # the key's next job, a reason to claim that no notification announces.
        self._freed_slot = False
        # Whether the claim connection plans each statement for its parameters (see
        # _plan_for_limits); None until the connection has been set either way.
        self._custom_plans: bool | None = None
        self._stop_requested = False
        self._conn: Connection | None = None
        self._listener: Listener | None = None
        self._completions_in_doubt = False
        self._unknown_tasks: set[str] = set()
        self._published = False

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop claiming and drain; :meth:`run` returns once drained.

        Safe to call from any thread, and from a signal handler: it only sets a flag, which
        the claim loop checks at least every 0.2 s.
        """
        self._stop_requested = True

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    @property
    def listening(self) -> bool | None:
        """Whether the LISTEN connection is up (None in poll-only mode or before run())."""
        return None if self._listener is None else self._listener.connected.is_set()

    def _nudge(self) -> None:
        self._nudged = True
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
        hooks = self.hooks
        if (traced := tracing.for_worker()) is not None:
            self.hooks = traced.instrument(hooks, self.worker_id)  # a span per attempt (miniqueue.tracing)
        listener = listener_for(self.dsn, cfg.listen_url, self.store, self.queues, self._nudge, poll_only=cfg.poll_only)
        self._listener = listener
        heartbeat = Heartbeat(
            self.dsn, self.store, self.worker_id, lease_seconds=cfg.lease_seconds, interval=cfg.heartbeat_interval,
            leases=self._slots.leases, on_lost=self._on_lost, on_tick=self._check_timeouts,
            on_renewed=lambda ids, sent_at: self._slots.renewed(ids, self._start_by(sent_at)),
        )  # fmt: skip
        threads = HandlerThreads(cfg.concurrency, "miniqueue-handler")
        self._aio = EventLoop() if self._async_tasks else None
        log.info("worker %s started on queues %s", self.worker_id, ",".join(self.queues))
        for thread in (listener, heartbeat, self._aio):
            if thread:
                thread.start()
        try:
            self._loop(threads)
        finally:
            threads.shutdown()
            if self._aio is not None:
                # After a drain nothing runs; after abandoning, the coroutines were cancelled.
                self._aio.stop(ASYNC_UNWIND_SECONDS, before_stop=self._async_transactions.close)
            heartbeat.stop()
            if listener:
                listener.stop()
            self._close()
            if self._owns_tx_pool and self._tx_pool is not None:
                self._tx_pool.close()
            self.hooks = hooks
            if traced is not None:
                traced.flush()  # before a supervised worker's os._exit, which runs no atexit flush
            log.info("worker %s stopped after %d jobs", self.worker_id, self.jobs_done)

    def _loop(self, threads: HandlerThreads) -> None:
        deadline: float | None = None
        next_poll = 0.0
        delay = 0.1
        while True:
            # Clear before looking: a wake-up (outcome, notification) that lands while this
            # iteration runs keeps the next wait from sleeping.
            self._wake.clear()
            try:
                self._dispatch(threads)  # keep handler threads busy while we talk to the database
                if self._stop_requested:
                    deadline = deadline or time.monotonic() + self.config.shutdown_timeout
                    if self._drain(deadline):
                        return
                else:
                    self._hand_back_if_stuck()
                    claim = self._claim_size(time.monotonic() >= next_poll)
                    self._flush_outcomes(claim)
                    if claim:
                        next_poll = time.monotonic() + self._poll_interval()
                self._dispatch(threads)
                delay = 0.1
            except DatabaseUnavailable as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    self._abandon_running()
                    return
                log.warning("worker %s: %s; retrying in %.1fs", self.worker_id, exc, delay)
                self._close()
                self._nudged = True  # after reconnecting, poll once
                self._sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            # Handlers and notifications set the wake event; only a claim we could make right
            # now is a reason not to wait for one, and outcomes waiting to be recorded a reason
            # not to wait long.
            wait = 0.0 if self._claim_size(False) else max(0.0, next_poll - time.monotonic())
            wait = min(wait, self._stuck_in())
            self._sleep(min(wait, self.OUTCOME_DELAY) if self._outcomes else wait)

    def _drain(self, deadline: float) -> bool:
        """One step of a graceful stop; True once there is nothing left to wait for."""
        if time.monotonic() >= deadline:
            self._abandon_running()
            return True
        self._flush_outcomes(claim=0)
        self._release_ready("handed back unstarted: the worker stopped; attempt not charged")
        return not self._slots.running and not self._outcomes

    def _claim_size(self, poll_due: bool) -> int:
        """How many jobs to claim now (0: not now).

        Claim when there is room (counting the slots that outcomes about to be recorded will
        free) and a reason: a notification, a full last batch, a concurrency slot this worker
        freed, or the poll timer. With prefetch, wait until half the buffer is free (or it ran
        dry) so that claims come in batches rather than one statement per finished job.
        """
        busy = self._busy_kinds()
        capacity = self._handler_slots + self._prefetch.size(stuck=bool(busy))
        self._claim_batch = max(1, capacity // 2)
        free = capacity - self._slots.held() + len(self._outcomes)
        if self.config.max_jobs is not None:  # never claim a job this worker will not run
            # (jobs held, finishing ones included, will all count as done)
            free = min(free, self.config.max_jobs - self.jobs_done - self._slots.held())
        self._handed_back &= busy
        reason = poll_due if self._handed_back else self._nudged or self._backlog or self._freed_slot or poll_due
        if free <= 0 or not reason:
            return 0
        with self._slots.lock:
            ran_dry = not self._slots.ready
        return free if ran_dry or free >= self._claim_batch else 0

    def _note_limited(self, leases: list[Lease], asked: int, kept: set[tuple[str, ...]]) -> None:
        """Move the limited-jobs cursor past the groups just claimed (the last one, in the
        direction this worker goes). A claim that took as many groups as one claim takes goes on
        from there at once; one that came back short from a cursor may have run out of groups
        after it: the next claim starts again from the first group (the last one, going down), at
        once rather than at the next poll. The groups of the jobs the claim completed (``kept``)
        came first, wherever they lie, so they do not move the cursor."""
        groups = {tuple(lease.limits) for lease in leases if lease.limits}
        if groups:
            self._limited_at = time.monotonic()
        swept = groups - kept
        last = min if self.config.descending else max
        if len(groups) >= MAX_GROUPS_PER_CLAIM:
            self._limits_cursor = list(last(swept)) if swept else self._limits_cursor
            self._nudged = True
        elif len(leases) < asked and self._limits_cursor:
            self._limits_cursor = []
            self._nudged = True
        elif swept:
            self._limits_cursor = list(last(swept))
        elif not groups:
            self._limits_cursor = []

    def _plan_for_limits(self, conn: Connection) -> None:
        """While limited jobs flow, plan each claim for its parameters: PostgreSQL's generic plan
        for the claim, which it picks after five runs of the prepared statement, ran claims of
        limited jobs 4x slower. Otherwise keep the generic plan: planning the statement afresh
        each time added a millisecond to every claim, which one-job-at-a-time flows (a chain,
        enqueue-to-start latency) feel. Behind a pooler nothing is prepared, so every plan is
        custom already."""
        wanted = time.monotonic() - self._limited_at < LIMITED_POLL_WINDOW
        if wanted != self._custom_plans and not behind_pooler():
            self.store.set_custom_plans(conn, wanted)
            self._custom_plans = wanted

    def _poll_interval(self) -> float:
        """Seconds until the next poll: shorter while limited jobs are flowing."""
        if time.monotonic() - self._limited_at < LIMITED_POLL_WINDOW:
            return min(self.config.poll_interval, LIMITED_POLL_INTERVAL)
        return self.config.poll_interval

    def _busy_kinds(self) -> set[bool]:
        """The kinds of handler (True: async) whose every handler is busy with a job that has
        outlived the prefetch budget (``auto`` only): jobs of such a kind held here would wait
        longer than the budget. Each kind is judged alone: in an app with both, busy threads
        are no reason to hold a thread job while the event loop idles, nor the reverse."""
        if not self._prefetch.adaptive:
            return set()
        running_for = self._slots.running_for(time.monotonic())
        return {kind for kind in self._kinds if self._prefetch.stuck(running_for[kind])}

    def _stuck_in(self) -> float:
        """Seconds until every handler of a kind will have outlived the prefetch budget while
        jobs of that kind wait here (when they are handed back); infinity when that cannot happen."""
        if not self._prefetch.adaptive:
            return float("inf")
        running_for = self._slots.running_for(time.monotonic())
        return min(
            (max(0.0, self.config.prefetch_budget - min(running_for[kind])) + 0.001
             for kind in self._slots.ready_kinds() if len(running_for[kind]) >= self.config.concurrency),
            default=float("inf"),
        )  # fmt: skip

    def _hand_back_if_stuck(self) -> None:
        """Work-conserving prefetch: jobs waiting behind handlers of their kind that all outlived
        the budget go back unstarted, so that an idle worker takes them instead of them waiting here."""
        stuck = self._busy_kinds() & self._slots.ready_kinds()
        if stuck:
            handlers = {frozenset({False}): "handler thread", frozenset({True}): "async handler"}.get(
                frozenset(stuck), "handler")
            budget = self.config.prefetch_budget
            self._release_ready(f"handed back unstarted: every {handlers} of its worker was busy past the "
                                f"{budget:g}s prefetch budget; attempt not charged", stuck)  # fmt: skip
            self._handed_back |= stuck

    def _sleep(self, seconds: float) -> None:
        """Wait until woken (outcome, notification) or ``seconds`` pass, checking the stop flag."""
        end = time.monotonic() + seconds
        while not self._stop_requested:
            remaining = end - time.monotonic()
            if remaining <= 0 or self._wake.wait(min(remaining, 0.2)):
                return

    def publish(self) -> None:
        """Open the claim connection, publishing the app's task declarations (see the README's
        "Tasks and their options"), as :meth:`run` does at its first claim: a supervised worker
        does it before it reports ready, so jobs enqueued once the supervisor is ready take
        their tasks' options. Raises DatabaseUnavailable if the database cannot be reached."""
        self._connection()

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = connect(self.dsn, purpose="worker", schema=self.config.schema)
            if not self._published:
                # Producers without the app fill their jobs' options from these (see the
                # README's "Tasks and their options").
                self.store.publish_tasks(self._conn, self.app.declarations(), self.queues)
                self._published = True
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            self._custom_plans = None

    # -- claiming and dispatching --------------------------------------------------------------

    def _dispatch(self, threads: HandlerThreads) -> None:
        """Hand ready jobs to idle handler threads and, for async tasks, to the event loop (none
        once stopping: they go back unstarted)."""
        for run_async in self._kinds:
            while not self._stop_requested and (
                job := self._slots.start_next(self._make_job, self.config.concurrency, run_async)
            ):
                self.hooks.on_job_start(job)
                if self._aio is not None and run_async:
                    self._aio.spawn_threadsafe(self._work_async, job)
                else:
                    threads.submit(functools.partial(self._work, job))
        self._log_overdue()

    def _start_by(self, sent_at: float) -> float:
        """Until when a lease claimed or renewed by a statement sent at ``sent_at`` may start:
        its lease lasts ``lease_seconds`` from the database's ``now()``, which is later than
        ``sent_at``; the margin keeps a job from starting just as its lease ends."""
        lease = self.config.lease_seconds
        return sent_at + lease - min(max(START_MARGIN_SECONDS, lease * START_MARGIN_SHARE), lease / 2)

    def _log_overdue(self) -> None:
        for lease in self._slots.take_overdue():
            log.warning("job %d (%s) not started: its lease may have ended before it could start (the "
                        "worker stalled past it); it runs again once the lease is taken back",
                        lease.id, lease.task)  # fmt: skip

    def _make_job(self, lease: Lease) -> Job:
        limit = self.config.max_result_bytes
        read = self._read_parent_results if lease.parents else None
        if lease.task in self._async_tasks:
            return Job(lease, worker_id=self.worker_id, atransaction=self._async_transactions.transaction,
                       max_result_bytes=limit, read_results=read)  # fmt: skip
        return Job(lease, worker_id=self.worker_id, transaction=self._job_transaction, max_result_bytes=limit,
                   read_results=read)  # fmt: skip

    def _work(self, job: Job | None) -> None:
        """A handler thread's loop: run a job, queue its outcome, and take the next ready job
        straight away, so handlers never wait for the claim loop's round trips."""
        while job is not None:
            job = self._finish(job, self._execute(job))

    async def _work_async(self, job: Job) -> None:
        """One async job, as a task on the event loop; the next ready async job gets a task of
        its own, so a stop request cancels exactly the job it is for."""
        assert self._aio is not None
        aio, task = self._aio, asyncio.current_task()
        assert task is not None
        job.on_stop(lambda reason: aio.cancel_threadsafe(task, f"the job should stop: {reason}"))
        next_job = self._finish(job, await self._execute_async(job), run_async=True)
        if next_job is not None:
            aio.spawn(self._work_async(next_job))

    def _finish(self, job: Job, outcome: Outcome, run_async: bool = False) -> Job | None:
        """Queue a finished handler's outcome for the claim loop; return the next ready job of
        the same kind, now started (None when there is none, or when stopping)."""
        self._slots.finish(job)
        self._outcomes.append((job, outcome))
        if holds_a_slot(job.limits):
            self._freed_slot = True
        if self._stop_requested:
            self._wake.set()
            return None
        next_job = self._slots.start_next(self._make_job, self.config.concurrency, run_async)
        # Wake the claim loop when a claim is due or this handler has nothing left to run;
        # not for every job (the loop records lone outcomes within OUTCOME_DELAY anyway).
        if next_job is None or len(self._outcomes) >= self._claim_batch:
            self._wake.set()
        if next_job is not None:
            self.hooks.on_job_start(next_job)
        return next_job

    def _execute(self, job: Job) -> Outcome:
        """Run one ``def`` handler and classify what it did."""
        task = self.app.tasks.get(job.task)
        if task is None:
            return Outcome("error", self._unknown_task(job.task))
        try:
            self.hooks.on_handler_start(job)
            try:
                returned = task.handler(job)
            finally:
                self.hooks.on_handler_end(job)
            if inspect.isawaitable(returned):
                raise TypeError(_not_awaited(returned, job.task))
        except BaseException as exc:  # whatever the handler raises is its outcome
            return _finished(job, exc)
        return _finished(job, returned=returned, max_result_bytes=self.config.max_result_bytes)

    async def _execute_async(self, job: Job) -> Outcome:
        """Await one ``async def`` handler and classify what it did; cancelled (a stop request),
        it raises CancelledError, which is its outcome like any other exception."""
        handler = self.app.tasks[job.task].handler
        try:
            self.hooks.on_handler_start(job)
            try:
                returned = await handler(job)
            finally:
                self.hooks.on_handler_end(job)
        except BaseException as exc:  # whatever the handler raises is its outcome
            return _finished(job, exc)
        return _finished(job, returned=returned, max_result_bytes=self.config.max_result_bytes)

    def _unknown_task(self, task: str) -> str:
        """The error of a job whose task this worker's app does not know; logged once per task."""
        message = f"no handler is registered for task {task!r} in this worker's app"
        if task not in self._unknown_tasks:
            self._unknown_tasks.add(task)
            log.error("%s (known: %s): its jobs fail and retry with backoff until they are dead", message,
                      ", ".join(sorted(self.app.tasks)) or "none")  # fmt: skip
        return message

    # -- outcomes ------------------------------------------------------------------------------

    def _flush_outcomes(self, claim: int) -> None:
        """Record finished handlers' outcomes and, when ``claim`` > 0, claim that many jobs.

        Completions and the claim share one statement; failures, snoozes and permanent
        failures are recorded one by one. An outcome leaves the queue only once the database
        has it, so a connection error retries it; fencing makes a repeat harmless.
        """
        if claim:  # before reading the outcomes: a job that finishes after that sets it again
            self._freed_slot = False
        pending = list(self._outcomes)
        if not pending and not claim:
            return
        conn = self._connection()
        completions = [(job.id, job.attempt) for job, outcome in pending if outcome.kind == "completed"]
        results = {job.id: outcome.result for job, outcome in pending
                   if outcome.kind == "completed" and outcome.result is not None}  # fmt: skip
        try:
            if claim:
                self._nudged = False
                self._plan_for_limits(conn)
                sent_at = time.monotonic()  # the leases end no sooner than lease_seconds after this
                completed, leases = self.store.complete_and_claim(
                    conn, self.worker_id, completions, self.queues, self.config.lease_seconds, claim,
                    after=self._limits_cursor, descending=self.config.descending, results=results,
                )  # fmt: skip
                kept = {tuple(job.limits) for job, outcome in pending if outcome.kind == "completed" and job.limits}
                self._note_limited(leases, claim, kept)
                self._slots.add_ready(leases, self._start_by(sent_at))
                self._backlog = len(leases) == claim
            else:
                completed = self.store.complete_many(conn, self.worker_id, completions, results=results)
        except DatabaseUnavailable:
            self._completions_in_doubt = bool(completions)  # the commit may have landed before the drop
            raise
        if self._completions_in_doubt:
            completed |= self._completed_before_the_drop(conn, completions, completed)
            self._completions_in_doubt = False
        for job, outcome in pending:
            self._prefetch.record(outcome.duration)
            if outcome.kind == "completed" and job.id not in completed:
                outcome = Outcome("lease_lost", "completion rejected: the lease was no longer held")
            elif outcome.kind in ("error", "permanent", "snoozed"):
                outcome = self._record(conn, job, outcome)
            if outcome.kind in _LOGGED_OUTCOMES:
                _log_outcome(job, outcome)
            self._outcomes.popleft()
            self._slots.forget(job)
            self.jobs_done += 1
            self.hooks.on_job_end(job, outcome)
        if self.config.max_jobs is not None and self.jobs_done >= self.config.max_jobs and not self._stop_requested:
            log.info("worker %s ran %d jobs (max_jobs): stopping to be recycled", self.worker_id, self.jobs_done)
            self.stop()

    def _completed_before_the_drop(
        self, conn: Connection, completions: list[tuple[int, int]], completed: set[int]
    ) -> set[int]:
        """After a connection dropped mid-completion, the retry matches nothing for jobs whose
        completion had committed: find them (completed at our attempt; attempts never repeat)
        so they are not reported as discarded."""
        unmatched = [(job_id, attempt) for job_id, attempt in completions if job_id not in completed]
        found = self.store.states_and_attempts(conn, [job_id for job_id, _ in unmatched])
        return {job_id for job_id, attempt in unmatched if found.get(job_id) == (State.COMPLETED, attempt)}

    def _record(self, conn: Connection, job: Job, outcome: Outcome) -> Outcome:
        """Record a failure, permanent failure or snooze; LeaseLost turns it into ``lease_lost``."""
        try:
            if outcome.kind == "error":
                task = self.app.tasks.get(job.task)
                backoff = (task.backoff if task else default_backoff)(job.attempt)
                failure = Failure(job.id, job.attempt, outcome.error or "", backoff)
                state = self.store.record_failures(conn, self.worker_id, [failure]).get(job.id)
                if state is None:
                    raise LeaseLost(job.id, self.worker_id, job.attempt)
                return dataclasses.replace(outcome, kind="dead" if state == State.DEAD else "retried", delay=backoff)
            if outcome.kind == "permanent":
                self.store.fail(conn, job.id, self.worker_id, job.attempt, outcome.error or "")
                return dataclasses.replace(outcome, kind="failed")
            self.store.snooze(conn, job.id, self.worker_id, job.attempt, outcome.delay)
            return outcome
        except LeaseLost as exc:
            return dataclasses.replace(outcome, kind="lease_lost", error=str(exc))

    def _release_ready(self, note: str, kinds: Collection[bool] = (False, True)) -> None:
        """Hand prefetched (never started) jobs of ``kinds`` back without spending an attempt,
        ``note`` in their history. They leave the buffer first, so no handler starts one the
        database is being told is free; if the database cannot be told, they go back in."""
        unstarted = self._slots.take_ready(kinds)
        if unstarted:
            try:
                self.store.release(self._connection(), self.worker_id,
                                   [Release(lease.id, lease.attempt, note) for lease in unstarted])  # fmt: skip
            except BaseException:
                self._slots.put_back(unstarted)
                raise
            self._slots.forget_start_by(unstarted)

    def _abandon_running(self) -> None:
        abandoned = self._slots.running_jobs()
        for job in abandoned:
            job.request_stop("shutdown")
        log.warning("worker %s: shutdown timeout: abandoning %d running job(s) %s: each stays leased until "
                    "the supervisor hands it back as this process exits (when supervised) or its lease expires",
                    self.worker_id, len(abandoned), [job.id for job in abandoned])  # fmt: skip

    # -- heartbeat callbacks (heartbeat thread) ------------------------------------------------

    def _on_lost(self, reasons: dict[int, str]) -> None:
        for job in self._slots.drop_lost(reasons):
            log.warning("job %d (%s): %s; telling its handler to stop", job.id, job.task, reasons[job.id])
            job.request_stop(reasons[job.id])

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for job in self._slots.running_jobs():
            task = self.app.tasks.get(job.task)
            if task and task.timeout and now - job.started_at > task.timeout:
                job.request_stop("timeout")

    # -- transactional completion --------------------------------------------------------------

    def _handler_pool(self) -> ConnectionPool[Connection]:
        """The connections handlers use (transactions, parents' results), opened on first use."""
        if self._tx_pool is None:
            # Checked on checkout: a connection that died while idle (a server restart) would
            # otherwise fail the next handler's transaction and cost its job an attempt.
            self._tx_pool = create_pool(
                self.dsn, purpose="handler", schema=self.config.schema, min_size=0,
                max_size=min(self.config.concurrency, POOL_MAX_SIZE), check=ConnectionPool.check_connection,
            )  # fmt: skip
        return self._tx_pool

    def _read_parent_results(self, parents: Sequence[int]) -> list[tuple[int, Any]]:
        with self._handler_pool().connection() as conn:
            return self.store.parent_results(conn, parents)

    @contextlib.contextmanager
    def _job_transaction(self, job: Job) -> Iterator[Connection]:
        with self._handler_pool().connection() as conn, conn.transaction():
            yield conn
            self.store.complete(conn, job.id, self.worker_id, job.attempt, result=job.result_json)


#: Seconds the event loop's tasks get to unwind from their cancellation when the worker stops.
ASYNC_UNWIND_SECONDS = 1.0

#: Outcomes that leave a log line: every failed attempt, and every discarded outcome.
_LOGGED_OUTCOMES = frozenset({"retried", "dead", "failed", "lease_lost"})


def _log_outcome(job: Job, outcome: Outcome) -> None:
    """One line per failed attempt: WARNING, with the error's last line for a retry and the whole
    traceback when the job fails for good; ERROR when its attempts are exhausted. JSON logs
    carry the same as fields (``job``)."""
    error = outcome.error or ""
    # attempt and max_attempts as people read them (charged, of the budget); run: the attempt
    # number, which counts every run (see Job.describe_attempts).
    fields = {"job_id": job.id, "task": job.task, "queue": job.queue, "attempt": job.charged_attempts,
              "max_attempts": job.attempt_budget, "run": job.attempt, "outcome": outcome.kind,
              "error": error}  # fmt: skip
    where = f"job {job.id} ({job.task} on {job.queue}) {job.describe_attempts()}"
    extra = {"job": fields}
    if outcome.kind == "retried":
        summary = error.strip().rsplit("\n", 1)[-1]
        log.warning("%s failed; retrying in %.1fs: %s", where, outcome.delay, summary, extra=extra)
    elif outcome.kind == "dead":
        log.error("%s failed; no attempts left, the job is dead:\n%s", where, error, extra=extra)
    elif outcome.kind == "failed":
        log.warning("%s failed permanently:\n%s", where, error, extra=extra)
    else:
        log.warning("%s: outcome discarded: %s", where, error or "the lease was lost", extra=extra)


def _not_awaited(returned: object, task: str) -> str:
    """The error of a ``def`` handler that returned an awaitable: it never ran, so it did not
    complete (a bug in the app: the worker awaits only handlers defined with ``async def``)."""
    if inspect.iscoroutine(returned):
        returned.close()  # never awaited on purpose: close it so Python does not warn about it
    return (f"the handler of task {task!r} returned {type(returned).__name__} instead of running: "
            "the worker awaits only handlers defined with 'async def'")  # fmt: skip


def _finished(
    job: Job, exc: BaseException | None = None, *, returned: object = None, max_result_bytes: int = 0
) -> Outcome:
    """The outcome of a handler, ``def`` or ``async def``, that returned ``returned`` (``exc``
    None) or raised ``exc``, with how long it ran. A return value that breaks the result rules
    (not JSON, too large) fails the attempt: completing without it would lose it silently."""
    if exc is not None:
        outcome = _outcome_of(job, exc)
    elif job.completed_in_transaction:
        if returned is not None:
            log.warning("job %d returned a value after job.transaction() completed it: not stored (call "
                        "job.set_result() inside the block)", job.id)  # fmt: skip
        outcome = Outcome("completed_in_transaction")
    else:
        outcome = _completed(job, returned, max_result_bytes)
    outcome.duration = time.monotonic() - job.started_at
    return outcome


def _completed(job: Job, returned: object, max_result_bytes: int) -> Outcome:
    """A handler returned: its result is what it returned, else what it set with set_result()."""
    if returned is None:
        return Outcome("completed", result=job.result_json)
    try:
        return Outcome("completed", result=encode_result(returned, max_bytes=max_result_bytes))
    except InvalidInput as exc:
        return Outcome("error", f"the handler of task {job.task!r} returned a value that cannot be stored as "
                                f"its result: {exc}")  # fmt: skip


def _outcome_of(job: Job, exc: BaseException) -> Outcome:
    """Classify what a handler raised."""
    if job.completed_in_transaction:
        log.warning("job %d raised after its transaction committed; it stays completed: %r", job.id, exc)
        return Outcome("completed_in_transaction")
    if isinstance(exc, LeaseLost):
        return Outcome("lease_lost", str(exc))
    if isinstance(exc, Snooze):
        return Outcome("snoozed", delay=exc.seconds)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).strip()
    if isinstance(exc, PermanentError):
        return Outcome("permanent", text, exception=exc)
    return Outcome("error", text, exception=exc)


__all__ = ["Outcome", "Worker", "WorkerConfig", "WorkerHooks", "new_worker_id"]
