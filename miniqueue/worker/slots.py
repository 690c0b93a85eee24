"""The leases a worker holds, and where each job is: ready, running or finishing.

The claim loop adds leases, handler threads and the event loop move jobs through the slots,
the heartbeat renews every lease held; one lock makes each move atomic. (Moved out of
:mod:`miniqueue.worker` unchanged.)
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from ..core.records import Lease
from ..tasks.job import Job

#: A claimed job starts only while its lease has at least this much left (the larger of the two,
#: in seconds and as a share of the lease, but at most half the lease), judged on this
#: process's monotonic clock from the claim or the last renewal: a worker that stalled
#: (SIGSTOP, swap) past a prefetched job's lease never starts it beside the job's next holder,
#: so limits hold for handlers too.
START_MARGIN_SECONDS = 1.0
START_MARGIN_SHARE = 0.1


def start_deadline(sent_at: float, lease_seconds: float) -> float:
    """Until when a lease claimed or renewed by a statement sent at ``sent_at`` (monotonic) may
    start: it lasts ``lease_seconds`` from the database's ``now()``, which is later than
    ``sent_at``; the margin keeps a job from starting just as its lease ends."""
    margin = min(max(START_MARGIN_SECONDS, lease_seconds * START_MARGIN_SHARE), lease_seconds / 2)
    return sent_at + lease_seconds - margin


@dataclass
class Slots:
    """Every job this worker holds a lease on, in one of three places: ``ready`` (claimed, not
    started), ``running`` (a handler has it) and ``finishing`` (its outcome waits to be
    recorded). The heartbeat renews all three; the lock makes each move atomic. Jobs of
    ``async_tasks`` run as coroutines, the others on threads, each kind within a limit of its own."""

    async_tasks: frozenset[str] = frozenset()
    ready: collections.deque[Lease] = field(default_factory=collections.deque)
    running: dict[int, Job] = field(default_factory=dict)
    finishing: dict[int, Job] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running_async: int = 0
    #: By when (monotonic) each ready lease must start: its lease may have ended after that. A
    #: lease's end is the database's ``now()`` at the claim or renewal plus the lease; counted
    #: here from just before the statement was sent, less a margin, so it is never later.
    start_by: dict[int, float] = field(default_factory=dict)
    #: Ready leases found past their start-by time, not started (the worker logs them).
    overdue: list[Lease] = field(default_factory=list)

    def held(self) -> int:
        with self.lock:
            return len(self.ready) + len(self.running) + len(self.finishing)

    def leases(self) -> list[tuple[int, int]]:
        with self.lock:
            jobs = [*self.running.values(), *self.finishing.values()]
            return [(lease.id, lease.attempt) for lease in self.ready] + [(job.id, job.attempt) for job in jobs]

    def start_next(self, make_job: Callable[[Lease], Job], limit: int, run_async: bool = False) -> Job | None:
        """Move the next ready lease of the kind (async or not) to running, if fewer than
        ``limit`` jobs of that kind run."""
        with self.lock:
            running = self.running_async if run_async else len(self.running) - self.running_async
            if running >= limit:
                return None
            now = time.monotonic()
            while True:
                if not self.ready or (lease := self._take(run_async)) is None:
                    return None
                if self.start_by.pop(lease.id, now) > now:
                    break
                self.overdue.append(lease)  # a stall (SIGSTOP, swap) outlived its lease: not ours to start
            job = make_job(lease)
            self.running[job.id] = job
            self.running_async += run_async
            return job

    def _take(self, run_async: bool) -> Lease | None:
        """The first ready lease of the kind, in claim order (the only kind, in most apps)."""
        if self.is_async(self.ready[0].task) == run_async:
            return self.ready.popleft()
        for index, lease in enumerate(self.ready):
            if self.is_async(lease.task) == run_async:
                del self.ready[index]
                return lease
        return None

    def add_ready(self, leases: list[Lease], start_by: float) -> None:
        with self.lock:
            self.ready.extend(leases)
            self.start_by.update((lease.id, start_by) for lease in leases)

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

    def forget_start_by(self, leases: Collection[Lease]) -> None:
        """Released leases need no start-by time any more."""
        with self.lock:
            for lease in leases:
                self.start_by.pop(lease.id, None)

    def finish(self, job: Job) -> None:
        with self.lock:
            if self.running.pop(job.id, None) is not None and job.task in self.async_tasks:
                self.running_async -= 1
            self.finishing[job.id] = job

    def forget(self, job: Job) -> None:
        with self.lock:
            self.finishing.pop(job.id, None)

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

    def drop_lost(self, ids: Collection[int]) -> list[Job]:
        """Forget unstarted leases in ``ids``; return the started jobs among them."""
        with self.lock:
            self.ready = collections.deque(lease for lease in self.ready if lease.id not in ids)
            for job_id in ids:
                self.start_by.pop(job_id, None)
            return [job for job in self.running.values() if job.id in ids]

    def running_jobs(self) -> list[Job]:
        with self.lock:
            return list(self.running.values())
