"""Recording what became of a worker's jobs: the outcome queue the handlers fill and the claim
loop empties into the database.

A finished handler queues its job's outcome here and goes on to its next job; the claim loop
records the queue in batches. Completions ride on one statement (with the next claim, when the
loop has one to make: the caller sends that statement, see :meth:`OutcomeRecorder.flush`), and
the failed attempts on another, each with its task's backoff (a batch handler's failure fails
its jobs at once); snoozes and permanent failures are recorded one by one. Every write is
fenced by the job's attempt, so a job whose lease was lost meanwhile is reported as such rather
than recorded. An outcome leaves the queue only once the database
has it: after a connection error the same batch is recorded again, and a completion that had
committed before the connection dropped is recognised as such.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.backoff import default_backoff
from ..core.db import Connection
from ..core.errors import DatabaseUnavailable, LeaseLost
from ..core.records import State
from ..store.store import Failure, Store
from ..tasks.app import App
from ..tasks.job import Job
from ..tasks.outcomes import Outcome, WorkerHooks
from .prefetch import PrefetchPolicy
from .slots import Slots

log = logging.getLogger("miniqueue.worker")

#: Outcomes that leave a log line: every failed attempt, and every discarded outcome.
LOGGED_OUTCOMES = frozenset({"retried", "dead", "failed", "lease_lost"})


@dataclass
class Batch:
    """The outcomes queued when a flush began, and the completions among them."""

    outcomes: list[tuple[Job, Outcome]]
    #: (job id, attempt) of each completed job.
    completions: list[tuple[int, int]]
    #: The results of the completed jobs that have one, as JSON text.
    results: dict[int, str]

    @classmethod
    def of(cls, outcomes: list[tuple[Job, Outcome]]) -> Batch:
        completions = [(job.id, job.run) for job, outcome in outcomes if outcome.kind == "completed"]
        results = {
            job.id: outcome.result
            for job, outcome in outcomes
            if outcome.kind == "completed" and outcome.result is not None
        }
        return cls(outcomes, completions, results)


#: Sends a batch's completions (and whatever else the statement carries) and returns the ids
#: of the jobs it completed.
Commit = Callable[[Batch], set[int]]


class OutcomeRecorder:
    """The outcomes of ``worker_id``'s finished handlers, waiting to be recorded, and their
    recording. :meth:`add` is called from any handler thread; the rest from the claim loop."""

    def __init__(self, app: App, store: Store, worker_id: str, slots: Slots, prefetch: PrefetchPolicy) -> None:
        self.app, self.store, self.worker_id = app, store, worker_id
        self.slots = slots
        #: Learns each handler's run time (``auto`` prefetch).
        self.prefetch = prefetch
        self.hooks = WorkerHooks()
        #: Finished jobs and their outcomes, oldest first (the one deque for the worker's life:
        #: the dispatcher appends to it directly).
        self.queue: collections.deque[tuple[Job, Outcome]] = collections.deque()
        #: How many outcomes at the queue's head the claim loop is recording now: those left are
        #: the ones a next flush would record (see :meth:`unrecorded`).
        self.flushing = 0
        #: Outcomes recorded (the worker's jobs done).
        self.jobs_done = 0
        # A completion was under way when the connection dropped: it may have committed.
        self._in_doubt = False
        #: When the jobs this worker put to sleep are due again (time.monotonic(), a heap): the
        #: claim loop looks for work then, rather than at its next poll (nothing announces a
        #: sleep's end).
        self.wakeups: list[float] = []

    def add(self, job: Job, outcome: Outcome) -> None:
        self.queue.append((job, outcome))

    def __len__(self) -> int:
        return len(self.queue)

    def unrecorded(self) -> int:
        """The outcomes queued that no flush under way records (read from handler threads: the
        count may lag by the outcomes of a flush ending, never run ahead of them)."""
        return len(self.queue) - self.flushing

    def flush(self, conn: Connection, commit: Commit) -> None:
        """Record the outcomes queued now. ``commit`` sends their completions (the claim loop
        sends its claim in the same statement) and returns the jobs it completed; the rest are
        recorded here, one by one, on ``conn``."""
        batch = Batch.of(list(self.queue))
        self.flushing = len(batch.outcomes)
        try:
            self._record(conn, batch, commit)
        finally:
            self.flushing = 0

    def _record(self, conn: Connection, batch: Batch, commit: Commit) -> None:
        try:
            self._write_final_progress(conn, batch)
            completed = commit(batch)
        except DatabaseUnavailable:
            self._in_doubt = bool(batch.completions)  # the commit may have landed before the drop
            raise
        if self._in_doubt:
            completed |= self._completed_before_the_drop(conn, batch.completions, completed)
            self._in_doubt = False
        failed = self._record_failures(conn, batch)
        for job, outcome in batch.outcomes:
            self.prefetch.record(outcome.duration / outcome.batch_of)
            if outcome.kind == "completed" and job.id not in completed:
                outcome = Outcome("lease_lost", "completion rejected: the lease was no longer held")
            elif outcome.kind == "error":
                outcome = failed[job.id]
            elif outcome.kind in ("permanent", "snoozed"):
                outcome = self.record(conn, job, outcome)
            if outcome.kind == "slept":
                heapq.heappush(self.wakeups, time.monotonic() + outcome.delay)
            if outcome.kind in LOGGED_OUTCOMES:
                log_outcome(job, outcome)
            self.queue.popleft()
            self.slots.forget(job)
            self.jobs_done += 1
            self.hooks.on_job_end(job, outcome)

    def _write_final_progress(self, conn: Connection, batch: Batch) -> None:
        """Write the last progress of the jobs completing, just before their completion (the
        heartbeat may not have written it yet, and cannot once they completed): one statement
        for the batch, and none when no job of it reported progress."""
        final = {
            (job.id, job.run): job.progress_json
            for job, outcome in batch.outcomes
            if outcome.kind == "completed" and job.progress_json is not None
        }
        if final:
            self.store.record_progress(conn, self.worker_id, final)

    def wakeup_due(self, now: float) -> bool:
        """Whether a sleep of this worker's jobs ended by ``now`` (each counts once)."""
        due = False
        while self.wakeups and self.wakeups[0] <= now:
            heapq.heappop(self.wakeups)
            due = True
        return due

    def _completed_before_the_drop(
        self, conn: Connection, completions: list[tuple[int, int]], completed: set[int]
    ) -> set[int]:
        """After a connection dropped mid-completion, the retry matches nothing for jobs whose
        completion had committed: find them (completed at our attempt; attempts never repeat)
        so they are not reported as discarded."""
        unmatched = [(job_id, attempt) for job_id, attempt in completions if job_id not in completed]
        found = self.store.states_and_attempts(conn, [job_id for job_id, _ in unmatched])
        return {job_id for job_id, attempt in unmatched if found.get(job_id) == (State.COMPLETED, attempt)}

    def _record_failures(self, conn: Connection, batch: Batch) -> dict[int, Outcome]:
        """Record the batch's failed attempts in one statement, each after its task's backoff;
        return each one's outcome: ``retried``, ``dead``, or ``lease_lost`` when its lease was
        no longer held."""
        failed: dict[int, tuple[Job, Outcome, float]] = {}
        for job, outcome in batch.outcomes:
            if outcome.kind == "error":
                task = self.app.tasks.get(job.task)
                failed[job.id] = (job, outcome, (task.backoff if task else default_backoff)(job.attempt))
        if not failed:
            return {}
        failures = [Failure(job.id, job.run, outcome.error or "", delay) for job, outcome, delay in failed.values()]
        states = self.store.record_failures(conn, self.worker_id, failures)
        recorded = {}
        for job_id, (job, outcome, delay) in failed.items():
            state = states.get(job_id)
            if state is None:
                lost = LeaseLost(job_id, self.worker_id, job.run)
                recorded[job_id] = dataclasses.replace(outcome, kind="lease_lost", error=str(lost))
            else:
                recorded[job_id] = dataclasses.replace(
                    outcome, kind="dead" if state == State.DEAD else "retried", delay=delay
                )
        return recorded

    def record(self, conn: Connection, job: Job, outcome: Outcome) -> Outcome:
        """Record a permanent failure (``failed``) or a snooze (one that pauses a key too:
        RateLimited); LeaseLost turns it into ``lease_lost``."""
        try:
            if outcome.kind == "permanent":
                self.store.fail(conn, job.id, self.worker_id, job.run, outcome.error or "")
                return dataclasses.replace(outcome, kind="failed")
            if outcome.pause_key is not None:
                self.store.rate_limit(conn, job.id, self.worker_id, job.run, outcome.pause_key, outcome.delay)
                return outcome
            self.store.snooze(conn, job.id, self.worker_id, job.run, outcome.delay)
            return outcome
        except LeaseLost as exc:
            return dataclasses.replace(outcome, kind="lease_lost", error=str(exc))


def log_outcome(job: Job, outcome: Outcome) -> None:
    """One line per failed attempt: WARNING, with the error's last line for a retry and the whole
    traceback when the job fails for good; ERROR when its attempts are exhausted. JSON logs
    carry the same as fields (``job``)."""
    error = outcome.error or ""
    # attempt and max_attempts as people read them (charged, of the budget); run: the attempt
    # number, which counts every run (see Job.describe_attempts).
    fields = {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.charged_attempts,
        "max_attempts": job.attempt_budget,
        "run": job.run,
        "outcome": outcome.kind,
        "error": error,
    }
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
