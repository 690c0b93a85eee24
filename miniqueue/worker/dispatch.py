"""Dispatch: handing a worker's ready jobs to its handler threads and its event loop.

The claim loop calls :meth:`Dispatcher.dispatch` around each round trip to the database; a
handler that finishes queues its outcome (see :mod:`miniqueue.worker.recording`) and takes the
next ready job of its kind itself, so handlers never wait for the claim loop. Jobs of ``async
def`` tasks run as tasks on the worker's event loop, one each, so that a stop request cancels
exactly the job it is for; the others on handler threads. The heartbeat reaches running
handlers through here too: a lost lease or a passed timeout tells the handler to stop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable

from ..core.records import Lease, ParentOutcome
from ..tasks.app import App
from ..tasks.durable import StepStore
from ..tasks.job import AsyncTransactionFactory, GroupAdder, Job, TransactionFactory
from ..tasks.outcomes import Outcome, WorkerHooks
from .aio import EventLoop
from .claiming import ClaimPolicy
from .execute import Executor
from .handlerthreads import HandlerThreads
from .recording import OutcomeRecorder
from .slots import Slots

log = logging.getLogger("miniqueue.worker")


class Dispatcher:
    """Starts ``slots``' ready jobs on up to ``concurrency`` handlers of each kind (True: async)
    in ``kinds``, running them with ``executor`` and queuing their outcomes on ``outcomes``;
    sets ``wake`` when the claim loop has something to do.

    The claim loop sets :attr:`threads` and :attr:`aio` as it starts, and :attr:`stopping`
    when the worker stops (from then on no job starts).
    """

    def __init__(
        self,
        *,
        app: App,
        slots: Slots,
        claims: ClaimPolicy,
        outcomes: OutcomeRecorder,
        executor: Executor,
        wake: threading.Event,
        worker_id: str,
        concurrency: int,
        kinds: tuple[bool, ...],
        transaction: TransactionFactory,
        atransaction: AsyncTransactionFactory,
        read_results: Callable[[Job], list[tuple[int, ParentOutcome]]],
        max_result_bytes: int,
        steps: StepStore | None = None,
        groups: GroupAdder | None = None,
    ) -> None:
        self.app, self.slots, self.claims, self.outcomes, self.executor = app, slots, claims, outcomes, executor
        self.wake, self.worker_id, self.concurrency, self.kinds = wake, worker_id, concurrency, kinds
        self.transaction, self.atransaction, self.read_results = transaction, atransaction, read_results
        self.max_result_bytes, self.steps, self.groups = max_result_bytes, steps, groups
        # The recorder's queue itself: a handler appends to it per job.
        self._queue = outcomes.queue
        self.hooks = WorkerHooks()
        self.threads: HandlerThreads | None = None
        self.aio: EventLoop | None = None
        self.stopping = False

    # -- starting jobs (the claim loop) --------------------------------------------------------

    def dispatch(self) -> None:
        """Hand ready jobs to idle handler threads and, for async tasks, to the event loop (none
        once stopping: they go back unstarted)."""
        threads = self.threads
        assert threads is not None, "dispatch() before the handler threads were set"
        for run_async in self.kinds:
            while not self.stopping and (jobs := self.slots.start_batch(self.make_job, self.concurrency, run_async)):
                self._start_batch(jobs, threads, run_async)
            while not self.stopping and (job := self.slots.start_next(self.make_job, self.concurrency, run_async)):
                self.hooks.on_job_start(job)
                if self.aio is not None and run_async:
                    self.aio.spawn_threadsafe(self._work_async, job)
                else:
                    threads.submit(functools.partial(self._work, job))

    def _start_batch(self, jobs: list[Job], threads: HandlerThreads, run_async: bool) -> None:
        for job in jobs:
            self.hooks.on_job_start(job)
        if self.aio is not None and run_async:
            self.aio.spawn_threadsafe(self._work_batch_async, jobs)
        else:
            threads.submit(functools.partial(self._work_batch, jobs))

    def make_job(self, lease: Lease) -> Job:
        """The job a handler receives for ``lease``: an ``async def`` handler's opens its
        transactions on the event loop, a ``def`` handler's on its thread."""
        on_loop = lease.task in self.slots.async_tasks
        return Job(
            lease,
            worker_id=self.worker_id,
            transaction=None if on_loop else self.transaction,
            atransaction=self.atransaction if on_loop else None,
            max_result_bytes=self.max_result_bytes,
            read_results=self.read_results if lease.parents else None,
            steps=self.steps,
            groups=self.groups,
        )

    # -- running them (handler threads, the event loop) ----------------------------------------

    def _work(self, job: Job | None) -> None:
        """A handler thread's loop: run a job, queue its outcome, and take the next ready job
        straight away, so handlers never wait for the claim loop's round trips."""
        while job is not None:
            job = self.finish(job, self.executor.run(job))

    async def _work_async(self, job: Job) -> None:
        """One async job, as a task on the event loop; the next ready async job gets a task of
        its own, so a stop request cancels exactly the job it is for."""
        assert self.aio is not None
        aio, task = self.aio, asyncio.current_task()
        assert task is not None
        job.on_stop(lambda reason: aio.cancel_threadsafe(task, f"the job should stop: {reason}"))
        next_job = self.finish(job, await self.executor.run_async(job), run_async=True)
        if next_job is not None:
            aio.spawn(self._work_async(next_job))

    def _work_batch(self, jobs: list[Job]) -> None:
        """A handler thread's loop for batches: run one, queue its outcomes, and take the next
        due batch, else the next ready job, straight away."""
        batch: list[Job] = jobs
        while batch:
            batch = self.finish_batch(batch, self.executor.run_batch(batch))
        self._work(self._start_next(False))

    async def _work_batch_async(self, jobs: list[Job]) -> None:
        """One async batch, as a task on the event loop. A timeout or a shutdown, which stop
        every job of the batch alike, cancel it; one job's lost lease does not (its outcome is
        discarded by the fenced write)."""
        assert self.aio is not None
        aio, task = self.aio, asyncio.current_task()
        assert task is not None

        def stop(reason: str) -> None:
            if reason in ("timeout", "shutdown"):
                aio.cancel_threadsafe(task, f"the batch should stop: {reason}")

        for job in jobs:
            job.on_stop(stop)
        batch = self.finish_batch(jobs, await self.executor.run_batch_async(jobs), run_async=True)
        if batch:
            aio.spawn(self._work_batch_async(batch))
        elif (next_job := self._start_next(True)) is not None:
            aio.spawn(self._work_async(next_job))

    def finish_batch(self, jobs: list[Job], outcomes: list[Outcome], run_async: bool = False) -> list[Job]:
        """Queue a finished batch's outcomes, one per job, for the claim loop; return the next
        due batch of the same kind, now started ([] when there is none, or when stopping)."""
        for job, outcome in zip(jobs, outcomes, strict=True):
            self.slots.finish(job)
            self._queue.append((job, outcome))
            self.claims.note_finished(job.limits)
        if self.stopping:
            self.wake.set()
            return []
        batch = self.slots.start_batch(self.make_job, self.concurrency, run_async)
        # As for one job: wake the claim loop when a claim is due or no batch is left to run.
        if not batch or self.outcomes.unrecorded() >= self.claims.claim_batch:
            self.wake.set()
        for job in batch:
            self.hooks.on_job_start(job)
        return batch

    def _start_next(self, run_async: bool) -> Job | None:
        """The next ready job of the kind, now started (None: none, or stopping)."""
        job = None if self.stopping else self.slots.start_next(self.make_job, self.concurrency, run_async)
        if job is not None:
            self.hooks.on_job_start(job)
        return job

    def finish(self, job: Job, outcome: Outcome, run_async: bool = False) -> Job | None:
        """Queue a finished handler's outcome for the claim loop; return the next ready job of
        the same kind, now started (None when there is none, or when stopping)."""
        self.slots.finish(job)
        self._queue.append((job, outcome))
        self.claims.note_finished(job.limits)
        if self.stopping:
            self.wake.set()
            return None
        next_job = self.slots.start_next(self.make_job, self.concurrency, run_async)
        # Wake the claim loop when a claim is due or this handler has nothing left to run;
        # not for every job (the loop records lone outcomes within OUTCOME_DELAY anyway), nor
        # for the outcomes its flush under way records (it looks again once that is done).
        if next_job is None or self.outcomes.unrecorded() >= self.claims.claim_batch:
            self.wake.set()
        if next_job is not None:
            self.hooks.on_job_start(next_job)
        return next_job

    # -- stopping them (the heartbeat, the claim loop) -----------------------------------------

    def stop_lost(self, reasons: dict[tuple[int, int], str]) -> None:
        """The heartbeat found these leases lost (by job id and run): forget the unstarted ones
        and tell the handlers of the others to stop."""
        for job in self.slots.drop_lost(reasons):
            reason = reasons[(job.id, job.run)]
            log.warning("job %d (%s): %s; telling its handler to stop", job.id, job.task, reason)
            job.request_stop(reason)

    def stop_timed_out(self) -> None:
        """Tell each handler that has run past its task's timeout to stop."""
        now = time.monotonic()
        for job in self.slots.running_jobs():
            task = self.app.tasks.get(job.task)
            if task and task.timeout and now - job.started_at > task.timeout:
                job.request_stop("timeout")

    def abandon_running(self) -> list[Job]:
        """Tell every running handler the worker is shutting down; return their jobs."""
        abandoned = self.slots.running_jobs()
        for job in abandoned:
            job.request_stop("shutdown")
        return abandoned
