"""``run_jobs``: run the queued jobs in-process, through the real worker, and say what happened.

A real :class:`miniqueue.Worker` runs on a thread of this process against the real store: jobs
are claimed, leased, run by their handlers and recorded by the same fenced statements as in
production (completion, retry, dead, failed, snooze, :meth:`Job.transaction`). Only the
timing is a test's: the worker polls every 20 ms, prefetches nothing (so one handler thread
runs jobs one at a time, in claim order), and retries follow ``retries=`` below.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from psycopg import IsolationLevel
from psycopg.conninfo import make_conninfo
from psycopg.pq import TransactionStatus

from ..client.client import Client
from ..client.sharded import ShardedClient
from ..core.backoff import Backoff
from ..core.db import Connection
from ..core.errors import ConfigError
from ..core.records import JobRecord, State
from ..observability import tracing
from ..tasks.app import App
from ..tasks.job import Job
from ..tasks.outcomes import Outcome, OutcomeKind, WorkerHooks
from ..worker.worker import Worker, WorkerConfig
from .assertions import reading_connection

#: How a failed attempt is retried during a run: ``"immediate"`` runs it again at once (its
#: backoff is 0), until it completes, fails or is dead; ``"later"`` leaves it scheduled.
Retries = Literal["immediate", "later"]

#: How often the run looks whether anything is left to do (and the worker polls for jobs).
_POLL_SECONDS = 0.02
#: How long a handler still running when the run times out may take to finish; then it is
#: abandoned (told to stop), its job left leased as a stopped worker's would be.
_SHUTDOWN_SECONDS = 1.0
#: How long the worker's thread may take to end once asked to stop.
_STOP_SECONDS = 10.0
#: How many of the newest available jobs the look for uncommitted ones compares.
_UNCOMMITTED_LOOK = 1000


class RunTimeout(AssertionError):
    """``run_jobs`` passed its ``timeout`` with jobs still due or running; ``result`` holds what
    ran until then. (An AssertionError: in a test it is a failure, not an error.)"""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class JobRun:
    """One handler run during :func:`run_jobs`, as the worker recorded it.

    ``outcome`` is ``completed`` (or ``completed_in_transaction``), ``retried``, ``dead``,
    ``failed``, ``snoozed``, ``slept`` (a durable sleep), ``waiting`` (parked until a signal) or
    ``lease_lost``; ``error`` is the traceback of a failed attempt;
    ``delay`` the seconds until a retry or snoozed job is due again. ``attempt`` is the attempt
    as ``job.attempt`` counts it (charged), ``run`` the run (every run counts).
    """

    job_id: int
    task: str
    queue: str
    attempt: int
    outcome: OutcomeKind
    error: str | None
    delay: float
    duration: float
    run: int = 0


@dataclass(frozen=True)
class RunResult:
    """What :func:`run_jobs` did: every handler run in order (``runs``), the final row of every
    job that ran (``jobs``, in order of first run), and why the run ended (``stopped_by``:
    ``"idle"``, nothing left due in its queues, or ``"max_jobs"``)."""

    runs: tuple[JobRun, ...]
    jobs: tuple[JobRecord, ...]
    stopped_by: Literal["idle", "max_jobs", "timeout"]

    def in_state(self, state: State | str) -> list[JobRecord]:
        """The jobs that ran and are now in ``state``."""
        return [job for job in self.jobs if job.state == State(state)]

    @property
    def completed(self) -> list[JobRecord]:
        return self.in_state(State.COMPLETED)

    @property
    def failed(self) -> list[JobRecord]:
        """Jobs failed for good by a PermanentError."""
        return self.in_state(State.FAILED)

    @property
    def dead(self) -> list[JobRecord]:
        """Jobs whose attempts ran out."""
        return self.in_state(State.DEAD)

    @property
    def pending(self) -> list[JobRecord]:
        """Jobs that ran and will run again: retries left for later, snoozed jobs (available),
        or jobs still running when the run stopped."""
        return [job for job in self.jobs if job.state in (State.AVAILABLE, State.RUNNING)]

    def job(self, job_id: int) -> JobRecord:
        """The final row of job ``job_id``; KeyError if it did not run."""
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(f"job {job_id} did not run (ran: {[job.id for job in self.jobs]})")

    def errors(self, job_id: int) -> list[str]:
        """Job ``job_id``'s error history (every failed attempt's traceback, oldest first)."""
        return [entry.error for entry in self.job(job_id).errors]

    def summary(self) -> str:
        """One line per run: job, task, attempt and outcome, with a failed attempt's last line."""
        lines = [f"{len(self.runs)} run(s) of {len(self.jobs)} job(s), stopped by {self.stopped_by}:"]
        for run in self.runs:
            last = (run.error or "").strip().rsplit("\n", 1)[-1]
            line = f"  job {run.job_id} {run.task} attempt {run.attempt}: {run.outcome}"
            lines.append(f"{line}: {last}" if last else line)
        return "\n".join(lines)

    __str__ = summary


def run_jobs(
    app: App,
    target: str | Client | ShardedClient,
    *,
    queues: Sequence[str] | None = None,
    max_jobs: int | None = None,
    timeout: float = 10.0,
    retries: Retries = "immediate",
    concurrency: int = 1,
) -> RunResult:
    """Run ``app``'s queued jobs in this process until none is due, and return what happened.

    ``target`` is a DSN, a :class:`Client` (its schema is used) or a
    :class:`~miniqueue.ShardedClient`, whose databases are run in turn, round after round, until
    a round finds nothing to do (a handler may enqueue on another database). A real :class:`Worker` runs
    on a thread until no job of the app's tasks in its queues (``queues``, default the app's)
    is available and due now or running, or until it ran ``max_jobs`` jobs. A job of a task the
    app does not declare is another app's: the worker never claims it, and the run does not
    wait for it. Jobs scheduled for later (``delay``,
    ``run_at``, a snooze) are not waited for, and paused queues are not counted.

    ``retries="immediate"`` (the default) gives every task a backoff of 0, so a failing job
    runs again at once until it completes, fails or goes dead: its whole story in one call.
    ``retries="later"`` keeps each task's own backoff but never less than ``timeout`` seconds,
    so this run never picks a retry up again: the job is left ``available`` and scheduled, and
    the result lists it in ``pending``.

    Raises :class:`RunTimeout` (an AssertionError carrying the result) if jobs are still due or
    running after ``timeout`` seconds; an error that stops the worker itself (a database that
    is not migrated, say) is raised here. The worker sees committed jobs only: given the Django
    integration's client inside ``django.test.TestCase`` (whose transaction never commits), a
    job the test enqueued raises ConfigError naming ``TransactionTestCase``, rather than a run
    that finds nothing to do.
    """
    if retries not in ("immediate", "later"):
        raise ConfigError(f"retries {retries!r} is invalid: use 'immediate' or 'later'")
    if isinstance(target, ShardedClient):
        return _run_databases(app, target, queues, max_jobs, timeout, retries, concurrency)
    client = target if isinstance(target, Client) else Client(target)
    try:
        client.declare(app)  # as its worker will: jobs the handlers enqueue take their tasks' options
        return _Run(app, client, queues, max_jobs, timeout, retries, concurrency).run()
    finally:
        if client is not target:
            client.close()


def _run_databases(
    app: App,
    sharded: ShardedClient,
    queues: Sequence[str] | None,
    max_jobs: int | None,
    timeout: float,
    retries: Retries,
    concurrency: int,
) -> RunResult:
    """:func:`run_jobs` over every database of ``sharded``'s map, one after the other, round after
    round until a round runs nothing; one result, each job's row as its last run left it."""
    deadline = time.monotonic() + timeout
    runs: list[JobRun] = []
    jobs: dict[int, JobRecord] = {}
    while True:
        ran = len(runs)
        for name in sharded.shards.databases:
            left = None if max_jobs is None else max_jobs - len(runs)
            if left == 0:
                return RunResult(tuple(runs), tuple(jobs.values()), "max_jobs")
            result = run_jobs(
                app,
                sharded.client(name),
                queues=queues,
                max_jobs=left,
                timeout=max(deadline - time.monotonic(), 0.1),
                retries=retries,
                concurrency=concurrency,
            )
            runs += result.runs
            jobs.update((job.id, job) for job in result.jobs)
        if len(runs) == ran:
            return RunResult(tuple(runs), tuple(jobs.values()), "idle")


class _Run:
    """One call of :func:`run_jobs`: the worker's thread, and the watch for an idle queue."""

    def __init__(
        self,
        app: App,
        client: Client,
        queues: Sequence[str] | None,
        max_jobs: int | None,
        timeout: float,
        retries: Retries,
        concurrency: int,
    ) -> None:
        self.client, self.timeout = client, timeout
        self.runs: list[JobRun] = []
        # Jobs whose handler started and has no recorded outcome yet: what a timeout names.
        self.started: dict[int, tuple[Job, float]] = {}
        self.failure: BaseException | None = None
        config = WorkerConfig(
            queues=queues,
            concurrency=concurrency,
            max_jobs=max_jobs,
            prefetch=0,
            poll_only=True,
            poll_interval=_POLL_SECONDS,
            shutdown_timeout=_SHUTDOWN_SECONDS,
            schema=client.store.schema,
            worker_id=f"miniqueue-testing:{secrets.token_hex(4)}",
        )
        hooks = tracing.worker_hooks(WorkerHooks(on_job_start=self._started, on_job_end=self._record))
        self.worker = Worker(_app_for_run(app, retries, timeout), _dsn_of(client), config, hooks=hooks)
        paused = {name for name, is_paused in client.list_queues().items() if is_paused}
        self.queues = set(self.worker.queues) - paused

    def run(self) -> RunResult:
        uncommitted = self._uncommitted()
        if uncommitted:
            raise ConfigError(
                f"run_jobs: job(s) {uncommitted} are in a transaction still open on Django's connection, where "
                "the worker's connections cannot see them (django.test.TestCase runs each test in one, never "
                "committed): run jobs in a django.test.TransactionTestCase, whose writes commit"
            )
        thread = threading.Thread(target=self._work, name="miniqueue-run-jobs", daemon=True)
        deadline = time.monotonic() + self.timeout
        thread.start()
        stopped_by: Literal["idle", "max_jobs", "timeout"] = "timeout"
        idle_before = False
        try:
            while time.monotonic() < deadline:
                if not thread.is_alive():
                    stopped_by = "max_jobs"
                    break
                # Idle twice in a row: a retry recorded while one look ran can read as scheduled
                # in the future (its scheduled_at, the recording statement's now(), is later than
                # the look's own transaction start); the next look, in a newer transaction, sees it due.
                idle = self._idle()
                if idle and idle_before:
                    stopped_by = "idle"
                    break
                idle_before = idle
                # Returns as soon as the worker stops (max_jobs): no fixed sleep.
                thread.join(_POLL_SECONDS)
        finally:
            self.worker.stop()
            thread.join(_STOP_SECONDS)
        if self.failure is not None:
            raise self.failure
        result = self._result(stopped_by)
        if stopped_by == "timeout":
            raise RunTimeout(
                f"run_jobs: jobs still due or running after {self.timeout:g}s{self._stuck()}\n{result}", result
            )
        return result

    def _stuck(self) -> str:
        """The handlers still running at a timeout, one line each."""
        now = time.monotonic()
        return "".join(
            f"\n  job {job.id} {job.task} attempt {job.attempt}: its handler is still running after "
            f"{now - started:.1f}s (told to stop; its thread is left to end with it or with the process)"
            for job, started in sorted(self.started.values(), key=lambda item: item[1])
        )

    def _started(self, job: Job) -> None:
        self.started[job.id] = (job, time.monotonic())

    def _work(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # raised in the caller's thread by run()
            self.failure = exc
        finally:
            tracing.flush()

    def _record(self, job: Job, outcome: Outcome) -> None:
        """The worker's hook, called once an outcome is recorded in the database."""
        self.started.pop(job.id, None)
        self.runs.append(
            JobRun(
                job.id,
                job.task,
                job.queue,
                job.attempt,
                outcome.kind,
                outcome.error,
                outcome.delay,
                outcome.duration,
                job.run,
            )
        )

    def _uncommitted(self) -> list[int]:
        """Jobs of the run's queues that are available on the connection the code under test
        writes on (Django's, for the integration's client) and not to the worker: enqueued in
        a transaction that is still open there."""
        own = reading_connection(self.client)
        if own is None or own.info.transaction_status == TransactionStatus.IDLE:
            return []
        there = self.client.list_jobs(state=State.AVAILABLE, limit=_UNCOMMITTED_LOOK, conn=own)
        seen_there = {job.id for job in there if job.queue in self.queues}
        if not seen_there:
            return []
        committed = {job.id for job in self.client.list_jobs(state=State.AVAILABLE, limit=_UNCOMMITTED_LOOK)}
        return sorted(seen_there - committed)

    def _idle(self) -> bool:
        """No job of the app's tasks in the run's queues is due now, and none is running. (A
        job's state leaves ``running`` only when its outcome is recorded, so idle means every
        outcome is in the database. A job of a task the app does not declare is another app's:
        the worker never claims it, and it is not waited for.)"""
        # One snapshot for every read of a look: a job claimed between two of them must not read
        # as neither due nor running.
        with self.client.connection() as conn:
            conn.isolation_level = IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction():
                    return self._idle_in(conn)
            finally:
                conn.isolation_level = None

    def _idle_in(self, conn: Connection) -> bool:
        for stats in self.client.queue_stats(conn=conn):
            if stats.queue not in self.queues:
                continue
            if stats.counts[State.RUNNING] > 0:
                return False
            if stats.counts[State.AVAILABLE] - stats.scheduled > 0 and any(
                self.client.count_jobs(conn=conn, state=State.AVAILABLE, queue=stats.queue, task=task, due=True)
                for task in self.worker.app.tasks
            ):
                return False
        return True

    def _result(self, stopped_by: Literal["idle", "max_jobs", "timeout"]) -> RunResult:
        ids = list(dict.fromkeys(run.job_id for run in self.runs))
        return RunResult(tuple(self.runs), tuple(self.client.get(job_id) for job_id in ids), stopped_by)


def _app_for_run(app: App, retries: Retries, timeout: float) -> App:
    """``app`` with each task's backoff as ``retries`` wants it (the handlers and middleware are the same)."""
    run_app = App()
    run_app.schedules, run_app.middleware_stack = app.schedules, app.middleware_stack
    for name, task in app.tasks.items():
        backoff: Backoff = _no_backoff if retries == "immediate" else _at_least(task.backoff, timeout)
        run_app.tasks[name] = dataclasses.replace(task, backoff=backoff)
    return run_app


def _no_backoff(attempt: int) -> float:
    return 0.0


def _at_least(backoff: Backoff, floor: float) -> Backoff:
    return lambda attempt: max(backoff(attempt), floor)


def _dsn_of(client: Client) -> str:
    """The DSN the client's connections use (libpq never reports the password: it is added)."""
    with client.connection() as conn:
        info = conn.info
        return make_conninfo(info.dsn, password=info.password) if info.password else info.dsn
