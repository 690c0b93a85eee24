"""The leases a worker holds, and where each job is: ready, running or finishing.

The claim loop adds leases, handler threads and the event loop move jobs through the slots,
the heartbeat renews every lease held; one lock makes each move atomic. A batch task's leases start
together, as one handler's jobs (see :mod:`miniqueue.worker.batching`).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal

from ..core.records import Lease
from ..tasks.batch import Batch
from ..tasks.job import Job
from .batching import due_batch, due_in

#: A claimed job starts only while its lease has at least this much left (the larger of the two,
#: in seconds and as a share of the lease, but at most half the lease), judged on this
#: process's monotonic clock from the claim or the last renewal: a worker that stalled
#: (SIGSTOP, swap) past a prefetched job's lease never starts it beside the job's next holder,
#: so limits hold for handlers too.
START_MARGIN_SECONDS = 1.0
START_MARGIN_SHARE = 0.1


def start_deadline(sent_at: float, lease_duration: float) -> float:
    """Until when a lease claimed or renewed by a statement sent at ``sent_at`` (monotonic) may
    start: it lasts ``lease_duration`` from the database's ``now()``, which is later than
    ``sent_at``; the margin keeps a job from starting just as its lease ends."""
    margin = min(max(START_MARGIN_SECONDS, lease_duration * START_MARGIN_SHARE), lease_duration / 2)
    return sent_at + lease_duration - margin


class HeldLeases(list[tuple[int, int]]):
    """The ``(job id, attempt)`` of every lease a worker holds, and the progress their handlers
    reported since the heartbeat last took it (JSON text by job id), which its renewal writes."""

    def __init__(self, leases: list[tuple[int, int]], progress: dict[int, str]) -> None:
        super().__init__(leases)
        self.progress = progress


@dataclass
class Slots:
    """Every job this worker holds a lease on, in one of three places: ``ready`` (claimed, not
    started), ``running`` (a handler has it) and ``finishing`` (its outcome waits to be
    recorded). The heartbeat renews all three; the lock makes each move atomic. Jobs of
    ``async_tasks`` run as coroutines, the others on threads, each kind within a limit of its own."""

    async_tasks: frozenset[str] = frozenset()
    #: The batch tasks' options: their leases start together (see :meth:`start_batch`), never
    #: one by one.
    batches: dict[str, Batch] = field(default_factory=dict)
    ready: collections.deque[Lease] = field(default_factory=collections.deque)
    # Keyed by job id and run: a worker may hold a new lease of a job whose stale handler (its
    # lease lost, the job claimed again) still runs.
    running: dict[tuple[int, int], Job] = field(default_factory=dict)
    finishing: dict[tuple[int, int], Job] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running_async: int = 0
    #: By when (monotonic) each ready lease must start: its lease may have ended after that. A
    #: lease's end is the database's ``now()`` at the claim or renewal plus the lease; counted
    #: here from just before the statement was sent, less a margin, so it is never later.
    start_by: dict[int, float] = field(default_factory=dict)
    #: Ready leases found past their start-by time, not started (the worker hands them back).
    overdue: list[Lease] = field(default_factory=list)
    #: When (monotonic) each ready lease of a batch task was added: a batch waits at most its
    #: ``wait`` from its oldest.
    ready_since: dict[int, float] = field(default_factory=dict)
    #: The jobs running in batches besides each batch's first, and how many of them by kind
    #: (True: async): a batch takes one handler, as one job does.
    batched: set[int] = field(default_factory=set)
    batched_by_kind: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    #: Whether a ready lease may run alone (see :meth:`_alone_first`): set as one is added, found
    #: unset by the next start that looks and finds none (so the common case costs a flag read).
    may_hold_alone: bool = False
    #: The job running alone in this process, if one is: nothing starts beside it.
    alone: int | None = None
    #: The limits of each running job that its claim took together with others (by job id and
    #: run): of the jobs taken together, one of a group runs at a time.
    lanes: dict[tuple[int, int], tuple[str, ...]] = field(default_factory=dict)

    def held(self) -> int:
        with self.lock:
            return len(self.ready) + len(self.running) + len(self.finishing)

    def leases(self) -> HeldLeases:
        """Every lease held, and the progress reported since the last call (taken: see
        :meth:`~miniqueue.Job.take_progress`)."""
        with self.lock:
            jobs = [*self.running.values(), *self.finishing.values()]
            leases = [(lease.id, lease.attempt) for lease in self.ready] + [(job.id, job.run) for job in jobs]
            progress = {job.id: text for job in jobs if (text := job.take_progress()) is not None}
            return HeldLeases(leases, progress)

    def start_next(self, make_job: Callable[[Lease], Job], limit: int, run_async: bool = False) -> Job | None:
        """Move the next ready lease of the kind (async or not) to running, if fewer than
        ``limit`` jobs of that kind run."""
        with self.lock:
            alone = self._alone_first(run_async, batch=False)
            if self._handlers(run_async) >= limit or alone is False:
                return None
            if alone is not None:
                return self._start_alone(make_job, alone, run_async)
            now = time.monotonic()
            while True:
                if not self.ready or (lease := self._take(run_async)) is None:
                    return None
                if self.start_by.pop(lease.id, now) > now:
                    break
                self.overdue.append(lease)  # a stall (SIGSTOP, swap) outlived its lease: not ours to start
            return self._run(make_job(lease), lease, run_async)

    def _alone_first(self, run_async: bool, *, batch: bool) -> Lease | Literal[False] | None:
        """What a job that runs alone asks of this start: None, nothing (none runs or is ready:
        the common case, a flag read); its lease, to start now (it is of this kind, a batch
        task's if ``batch``, and no handler runs); False, that nothing starts (one runs, or one
        waits for the process's handlers to finish). A job runs alone when its last run's process
        died while other handlers ran: a death while it runs is then its own."""
        if self.alone is not None:
            return False
        if not self.may_hold_alone:
            return None
        lease = self._alone_lease()
        if lease is None:
            return None
        if self.running or self.is_async(lease.task) != run_async or (lease.task in self.batches) != batch:
            return False
        return lease

    def _alone_lease(self) -> Lease | None:
        """The first ready lease that runs alone; none found clears :attr:`may_hold_alone`."""
        lease = next((lease for lease in self.ready if lease.run_alone), None)
        self.may_hold_alone = lease is not None
        return lease

    def _start_alone(self, make_job: Callable[[Lease], Job], lease: Lease, run_async: bool) -> Job | None:
        """Start ``lease``'s job alone (nothing else runs), unless its start-by time passed."""
        self.ready.remove(lease)
        self.ready_since.pop(lease.id, None)
        if self.start_by.pop(lease.id, 0.0) <= time.monotonic():
            self.overdue.append(lease)  # as in start_next: not ours to start
            return None
        job = self._run(make_job(lease), lease, run_async)
        self.alone = job.id
        return job

    def _run(self, job: Job, lease: Lease, run_async: bool) -> Job:
        """``lease``'s job is running: noted, with its group's lane if it was taken together."""
        self.running[(job.id, job.run)] = job
        self.running_async += run_async
        if lease.together:
            self.lanes[(job.id, job.run)] = tuple(lease.limits or ())
        return job

    def _waits(self, lease: Lease) -> bool:
        """Whether ``lease`` waits for a job of its group taken together with it to end."""
        return lease.together and bool(self.lanes) and tuple(lease.limits or ()) in self.lanes.values()

    def _handlers(self, run_async: bool) -> int:
        """Handlers of the kind running: a batch of jobs counts once."""
        jobs = self.running_async if run_async else len(self.running) - self.running_async
        return jobs - self.batched_by_kind[run_async]

    def _take(self, run_async: bool) -> Lease | None:
        """The first ready lease of the kind, in claim order (the only kind, in most apps),
        that is not a batch task's and does not wait for a job taken together with it."""
        first = self.ready[0]
        if self.is_async(first.task) == run_async and first.task not in self.batches and not self._waits(first):
            return self.ready.popleft()
        for index, lease in enumerate(self.ready):
            if self.is_async(lease.task) == run_async and lease.task not in self.batches and not self._waits(lease):
                del self.ready[index]
                return lease
        return None

    def add_ready(self, leases: list[Lease], start_by: float) -> None:
        with self.lock:
            self.ready.extend(leases)
            self.may_hold_alone = self.may_hold_alone or any(lease.run_alone for lease in leases)
            self.start_by.update((lease.id, start_by) for lease in leases)
            if self.batches:
                now = time.monotonic()
                self.ready_since.update((lease.id, now) for lease in leases if lease.task in self.batches)

    def start_batch(self, make_job: Callable[[Lease], Job], limit: int, run_async: bool = False) -> list[Job]:
        """Move the ready leases of a batch task of the kind that is due (see
        :func:`~miniqueue.worker.batching.due_batch`) to running, as one handler's jobs, if fewer
        than ``limit`` handlers of that kind run; [] when none is due. A lease past its start-by
        time is not started, as in :meth:`start_next`."""
        with self.lock:
            if not self.batches or not self.ready or self._handlers(run_async) >= limit:
                return []
            alone = self._alone_first(run_async, batch=True)
            if alone is not None:
                job = None if alone is False else self._start_alone(make_job, alone, run_async)
                return [] if job is None else [job]
            now = time.monotonic()
            for task, options in self.batches.items():
                if self.is_async(task) != run_async:
                    continue
                leases = due_batch(self._startable(task), options, self.ready_since, now)
                if leases:
                    return self._start_batch(make_job, leases, run_async, now)
            return []

    def _startable(self, task: str) -> list[Lease]:
        """The ready leases of batch task ``task`` that may start now: of the jobs taken together,
        one of a group, and none of a group one of which runs."""
        leases, lanes = [], set()
        for lease in self.ready:
            if lease.task != task:
                continue
            if lease.together:
                lane = tuple(lease.limits or ())
                if lane in lanes or lane in self.lanes.values():
                    continue
                lanes.add(lane)
            leases.append(lease)
        return leases

    def _start_batch(
        self, make_job: Callable[[Lease], Job], leases: list[Lease], run_async: bool, now: float
    ) -> list[Job]:
        taken = {lease.id for lease in leases}
        self.ready = collections.deque(lease for lease in self.ready if lease.id not in taken)
        jobs = []
        for lease in leases:
            self.ready_since.pop(lease.id, None)
            if self.start_by.pop(lease.id, now) > now:
                jobs.append(self._run(make_job(lease), lease, run_async))
            else:
                self.overdue.append(lease)  # as in start_next: not ours to start
        self.batched.update(job.id for job in jobs[1:])
        self.batched_by_kind[run_async] += max(0, len(jobs) - 1)
        return jobs

    def batch_due_in(self, now: float, limit: int) -> float:
        """Seconds until a batch waiting to fill is due (inf: none waits, or every handler of its
        kind is busy: the first to finish starts it)."""
        with self.lock:
            if not self.ready_since:
                return float("inf")
            free = {
                task: options for task, options in self.batches.items() if self._handlers(self.is_async(task)) < limit
            }
            # Only the leases that may start count: one waiting for a job taken together with it
            # is due when that job ends, not before.
            return due_in([lease for task in free for lease in self._startable(task)], free, self.ready_since, now)

    def renewed(self, ids: Collection[int], start_by: float) -> None:
        """The heartbeat renewed these leases: those still ready may start until ``start_by``."""
        with self.lock:
            for job_id in ids:
                if job_id in self.start_by:
                    self.start_by[job_id] = start_by

    def take_overdue(self) -> list[Lease]:
        with self.lock:
            overdue, self.overdue = self.overdue, []
            return overdue

    def put_overdue(self, leases: list[Lease]) -> None:
        """Return leases taken by :meth:`take_overdue` that could not be handed back."""
        with self.lock:
            self.overdue[:0] = leases

    def forget_start_by(self, leases: Collection[Lease]) -> None:
        """Released leases need no start-by time any more."""
        with self.lock:
            for lease in leases:
                self.start_by.pop(lease.id, None)
                self.ready_since.pop(lease.id, None)

    def finish(self, job: Job) -> None:
        with self.lock:
            if self.alone == job.id:
                self.alone = None
            if self.running.pop((job.id, job.run), None) is not None and job.task in self.async_tasks:
                self.running_async -= 1
            self.lanes.pop((job.id, job.run), None)
            if job.id in self.batched:
                self.batched.discard(job.id)
                self.batched_by_kind[job.task in self.async_tasks] -= 1
            self.finishing[(job.id, job.run)] = job

    def forget(self, job: Job) -> None:
        with self.lock:
            self.finishing.pop((job.id, job.run), None)

    def has_ready(self) -> bool:
        with self.lock:
            return bool(self.ready)

    def take_ready(self, kinds: Collection[bool] = (False, True)) -> list[Lease]:
        """Take the unstarted leases of ``kinds`` (True: async) out of the buffer, so that no
        handler can start one."""
        with self.lock:
            taken = [lease for lease in self.ready if self.is_async(lease.task) in kinds]
            if len(taken) == len(self.ready):
                self.ready = collections.deque()
            else:
                self.ready = collections.deque(lease for lease in self.ready if self.is_async(lease.task) not in kinds)
            return taken

    def is_async(self, task: str) -> bool:
        return task in self.async_tasks

    def running_for(self, now: float) -> dict[bool, list[float]]:
        """How long each running handler has run, by kind (True: async), in seconds."""
        by_kind: dict[bool, list[float]] = {False: [], True: []}
        with self.lock:
            for job in self.running.values():
                if job.id in self.batched:  # a batch is one handler
                    continue
                by_kind[self.is_async(job.task)].append(now - job.started_at)
        return by_kind

    def ready_kinds(self) -> set[bool]:
        """The kinds (True: async) of the unstarted leases."""
        with self.lock:
            return {self.is_async(lease.task) for lease in self.ready}

    def put_back(self, leases: list[Lease]) -> None:
        """Return leases taken by :meth:`take_ready` to the front of the buffer, in order."""
        with self.lock:
            self.ready.extendleft(reversed(leases))

    def drop_lost(self, lost: Collection[tuple[int, int]]) -> list[Job]:
        """Forget the unstarted leases among ``lost`` (job id and run: a newer lease of the same
        job is not lost); return the started jobs among them."""
        with self.lock:
            dropped = [lease for lease in self.ready if (lease.id, lease.attempt) in lost]
            self.ready = collections.deque(lease for lease in self.ready if (lease.id, lease.attempt) not in lost)
            for lease in dropped:
                self.start_by.pop(lease.id, None)
                self.ready_since.pop(lease.id, None)
            return [job for job in self.running.values() if (job.id, job.run) in lost]

    def running_jobs(self) -> list[Job]:
        with self.lock:
            return list(self.running.values())
