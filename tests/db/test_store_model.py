"""The store against a reference model: a stateful property test (hypothesis).

A :class:`~hypothesis.stateful.RuleBasedStateMachine` drives the real store on the suite's
database through random interleavings of enqueues (one or a batch; priority; due now or in an
hour, by delay or by run-at; 1-3 attempts), claims by three workers from one queue or two,
renewals, completions, retries, permanent failures, snoozes, reports by a worker that does not
hold the lease, lease expiries and the reaper, cancels and requeues. After every step the jobs
as ``Store.list_jobs`` reads them must be those of :class:`Model`, a page of Python stating the
documented rules (docs/guarantees.md, docs/guides/tasks.md): each job's state, runs, charged
attempts and budget, who holds it, whether its lease is in force and whether it is due.

Time is the database clock's, and never waited for. A job is due now or in an hour, and the hour
passes when a step moves every scheduled job back by exactly an hour, so that jobs keep the order
of the statements that scheduled them (the model's clock counts those statements); a lease
expires when a step moves its expiry into the past, as a worker frozen past it would see.

Each example starts from an empty queue (the tables ``clean_database`` empties, by DELETE). The
default profile runs 50 examples of up to 50 steps, in about 8 s; environment variables choose a
longer one::

    MINIQUEUE_MODEL_EXAMPLES=2000 MINIQUEUE_MODEL_STEPS=50 python -m pytest tests/db/test_store_model.py

A failure prints the shortest sequence of steps hypothesis found and a ``@reproduce_failure`` blob
that replays it; nothing is kept between runs (``database=None``), and ``--hypothesis-seed=N``
repeats a run's choices.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from miniqueue import InvalidTransition, JobSpec, LeaseLost
from miniqueue.core.backoff import backoff_ceiling
from miniqueue.core.db import Connection
from miniqueue.core.records import CANCELLABLE_STATES, REQUEUEABLE_STATES, JobRecord, State
from miniqueue.core.validation import validate
from miniqueue.store.store import Store
from miniqueue.testing.database import QUEUE_TABLES

from ..helpers import expire_lease, make_due

EXAMPLES = int(os.environ.get("MINIQUEUE_MODEL_EXAMPLES", "50"))
STEPS = int(os.environ.get("MINIQUEUE_MODEL_STEPS", "50"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    database=None,
    print_blob=True,
    # One failure, shrunk: shrinking each distinct one took minutes.
    report_multiple_bugs=False,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow],
)
# A step takes about 4 ms; a failure is then shrunk for up to 300 s (hypothesis's own limit), and
# pytest-timeout's interrupt would leave the connection mid-query and the sequence unprinted.
TIMEOUT = 300 + EXAMPLES * STEPS * 0.02

WORKERS = ("host:1:a", "host:2:b", "host:3:c")
QUEUES = ("q1", "q2")
REPORTS = ("renew", "complete", "retry", "fail", "snooze")
FORGERS = ("the next worker", "the worker after", "an earlier run")
LEASE_SECONDS = 600.0
HOUR = 3600.0

# The hour passes for every job scheduled in it: each was an hour ahead of the statement that
# scheduled it, and is now due as of that statement.
_AN_HOUR_PASSES = """
UPDATE miniqueue_jobs SET scheduled_at = scheduled_at - interval '1 hour'
 WHERE state = 'available' AND scheduled_at > now()
"""

_SECONDS_AHEAD = "SELECT id, extract(epoch FROM scheduled_at - now())::float8 FROM miniqueue_jobs WHERE id = ANY(%s)"


# --- the reference model ------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """A job to enqueue."""

    queue: str
    priority: int
    when: str  # "now", "in an hour", "run_at now" or "run_at in an hour"
    max_attempts: int


@dataclass(frozen=True)
class Held:
    """A lease a worker was given: its job, and the attempt that fences its reports."""

    worker: str
    job: int
    attempt: int


@dataclass
class Job:
    """One job as the rules have it."""

    id: int
    queue: str
    priority: int
    budget: int
    #: The model clock's reading its scheduled time came from (its place in the claim order
    #: among jobs of one priority), and whether that time has come.
    scheduled: int
    due: bool
    state: State = State.AVAILABLE
    runs: int = 0
    charged: int = 0
    holder: str | None = None
    expired: bool = False

    @property
    def max_attempts(self) -> int:
        """The row's ``max_attempts``: the runs so far and the attempts left of the budget."""
        return self.runs + self.budget - self.charged

    def expected(self) -> tuple[object, ...]:
        """What :func:`observed` must read of the job."""
        lease = not self.expired if self.state == State.RUNNING else None
        due = self.due if self.state == State.AVAILABLE else None
        attempts = (self.charged, self.runs, self.max_attempts, self.budget)
        return (self.state, *attempts, self.holder, lease, due)


def observed(record: JobRecord, now: dt.datetime) -> tuple[object, ...]:
    """A job as the store reads it: state; attempts charged, runs, ``max_attempts`` and budget; who
    holds it and whether the lease is in force (None: no lease); whether it is due (None: not
    available)."""
    lease = None if record.lease_expires_at is None else record.lease_expires_at > now
    due = record.scheduled_at <= now if record.state == State.AVAILABLE else None
    attempts = (record.attempt, record.run, record.max_attempts, record.attempt_budget)
    return (record.state, *attempts, record.leased_by, lease, due)


class Model:
    """The documented rules, without a database: states, fencing, the claim's order, attempts."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.clock = 0

    def tick(self) -> int:
        """A statement that stores a time ran: its time is later than any before it."""
        self.clock += 1
        return self.clock

    def any(self, *states: State, due: bool | None = None) -> bool:
        """Whether a job is in one of ``states`` (and due or not, given ``due``)."""
        return any(j.state in states and due in (None, j.due) for j in self.jobs.values())

    def any_expired(self) -> bool:
        """Whether a running job's lease expired."""
        return any(j.state == State.RUNNING and j.expired for j in self.jobs.values())

    def enqueue(self, ids: Sequence[int], specs: Sequence[Spec], read_at: int, enqueued_at: int) -> None:
        """New jobs: scheduled as of the clock read for their run-at, or as of their enqueue."""
        for job_id, spec in zip(ids, specs, strict=True):
            at = read_at if spec.when.startswith("run_at") else enqueued_at
            due = not spec.when.endswith("in an hour")
            self.jobs[job_id] = Job(job_id, spec.queue, spec.priority, spec.max_attempts, at, due)

    def best(self, queues: Iterable[str], limit: int) -> list[int]:
        """What a claim takes: available jobs that are due, by priority, then scheduled time, then id."""
        ready = [j for j in self.jobs.values() if j.state == State.AVAILABLE and j.due and j.queue in queues]
        ready.sort(key=lambda j: (-j.priority, j.scheduled, j.id))
        return [j.id for j in ready[:limit]]

    def claim(self, ids: Iterable[int], worker: str) -> None:
        """Each run is an attempt, charged unless handed back."""
        for job_id in ids:
            job = self.jobs[job_id]
            job.state, job.holder, job.expired = State.RUNNING, worker, False
            job.runs += 1
            job.charged += 1

    def holds(self, worker: str, job_id: int, attempt: int) -> bool:
        """Fencing: a report lands only from the job's holder, at the attempt it claimed."""
        job = self.jobs[job_id]
        return job.state == State.RUNNING and job.holder == worker and job.runs == attempt

    def renew(self, job_id: int) -> None:
        self.jobs[job_id].expired = False

    def finish(self, job_id: int, state: State) -> None:
        job = self.jobs[job_id]
        job.state, job.holder, job.expired = state, None, False

    def retry(self, job_id: int, backoff: float) -> State:
        """A failed attempt: dead once the budget is spent, else due again after the backoff."""
        job = self.jobs[job_id]
        if job.charged >= job.budget:
            self.finish(job_id, State.DEAD)
        else:
            self.finish(job_id, State.AVAILABLE)
            job.scheduled, job.due = self.tick(), backoff == 0
        return job.state

    def snooze(self, job_id: int, delay: float) -> None:
        """Back after ``delay``, the run not charged."""
        job = self.jobs[job_id]
        self.finish(job_id, State.AVAILABLE)
        job.charged -= 1
        job.scheduled, job.due = self.tick(), delay == 0

    def expire(self, job_id: int) -> bool:
        job = self.jobs[job_id]
        job.expired = job.state == State.RUNNING
        return job.expired

    def reap(self) -> dict[int, State]:
        """The reaper charges each run whose lease expired as a failed attempt (its backoff is
        random: the caller makes the job due). Returns id -> new state."""
        lost = sorted(j.id for j in self.jobs.values() if j.state == State.RUNNING and j.expired)
        return {job_id: self.retry(job_id, backoff=HOUR) for job_id in lost}

    def make_due(self, job_id: int) -> None:
        job = self.jobs[job_id]
        job.scheduled, job.due = self.tick(), True

    def an_hour_passes(self) -> None:
        for job in self.jobs.values():
            job.due = job.due or job.state == State.AVAILABLE

    def refusal(self, ids: Sequence[int], allowed: frozenset[State]) -> tuple[int, State] | None:
        """The first job an operator's action cannot take, and its state; None: it takes them all."""
        return next(((i, self.jobs[i].state) for i in ids if self.jobs[i].state not in allowed), None)

    def cancel(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            self.finish(job_id, State.CANCELLED)

    def requeue(self, ids: Iterable[int]) -> None:
        """Available now, with a fresh budget; the runs count on."""
        at = self.tick()
        for job_id in ids:
            job = self.jobs[job_id]
            self.finish(job_id, State.AVAILABLE)
            job.charged, job.scheduled, job.due = 0, at, True


# --- the machine --------------------------------------------------------------------------------

specs = st.builds(
    Spec,
    queue=st.sampled_from(QUEUES),
    priority=st.integers(-1, 2),
    when=st.sampled_from(("now", "now", "in an hour", "run_at now", "run_at in an hour")),
    max_attempts=st.integers(1, 3),
)


class StoreAgainstModel(RuleBasedStateMachine):
    """The store and the model, step by step, on the database the test gives it."""

    connection: ClassVar[Connection]

    jobs: Bundle[int] = Bundle("jobs")
    # Named to sort before "jobs": hypothesis orders rules by their targets' names and picks the
    # first ones more often. Named "leases", claims were 2% of the steps and few reports landed;
    # named "claimed", 15-25%.
    leases: Bundle[Held] = Bundle("claimed")

    def __init__(self) -> None:
        super().__init__()
        empty_the_queue(self.connection)
        self.conn = self.connection
        self.store = Store()
        self.model = Model()

    # -- producers and operators

    @initialize(target=jobs, batch=st.lists(specs, min_size=1, max_size=6))
    def start(self, batch: list[Spec]) -> MultipleResults[int]:
        return multiple(*self._enqueue(batch, together=True))

    @rule(target=jobs, batch=st.lists(specs, min_size=1, max_size=3), together=st.booleans())
    def enqueue(self, batch: list[Spec], together: bool) -> MultipleResults[int]:
        return multiple(*self._enqueue(batch, together))

    def _enqueue(self, batch: list[Spec], together: bool) -> list[int]:
        """``enqueue_many`` in one statement, or ``enqueue`` one by one."""
        if not together and len(batch) > 1:
            return [job_id for spec in batch for job_id in self._enqueue([spec], together)]
        now = self._now()
        read_at = self.model.tick()
        jobs = [validate(_job_spec(spec, now)) for spec in batch]
        results = self.store.enqueue_many(self.conn, jobs) if together else [self.store.enqueue(self.conn, jobs[0])]
        enqueued_at = self.model.tick()
        assert not any(result.duplicate for result in results)
        ids = [result.id for result in results]
        self.model.enqueue(ids, batch, read_at, enqueued_at)
        return ids

    @precondition(lambda self: self.model.any(*CANCELLABLE_STATES))
    @rule(ids=st.lists(jobs, min_size=1, max_size=2))
    def cancel(self, ids: list[int]) -> None:
        self._operate(ids, "cancel", CANCELLABLE_STATES, self.store.cancel, self.model.cancel)

    @precondition(lambda self: self.model.any(*REQUEUEABLE_STATES))
    @rule(ids=st.lists(jobs, min_size=1, max_size=2))
    def requeue(self, ids: list[int]) -> None:
        self._operate(ids, "requeue", REQUEUEABLE_STATES, self.store.requeue, self.model.requeue)

    def _operate(
        self,
        ids: list[int],
        verb: str,
        allowed: frozenset[State],
        act: Callable[[Connection, Sequence[int]], list[int]],
        expect: Callable[[list[int]], None],
    ) -> None:
        """An operator's action: on every job, or on none and naming the first it cannot take."""
        ids = list(dict.fromkeys(ids))
        refused = self.model.refusal(ids, allowed)
        if refused is None:
            assert act(self.conn, ids) == ids
            expect(ids)
            return
        with pytest.raises(InvalidTransition, match=f"cannot {verb} job {refused[0]}: it is {refused[1].value}"):
            act(self.conn, ids)

    # -- workers

    @rule(
        target=leases,
        worker=st.sampled_from(WORKERS),
        queues=st.sampled_from([(q,) for q in QUEUES] + [QUEUES]),
        limit=st.integers(1, 3),
    )
    def claim(self, worker: str, queues: tuple[str, ...], limit: int) -> MultipleResults[Held]:
        expected = self.model.best(queues, limit)
        leases = self.store.claim(self.conn, list(queues), worker, LEASE_SECONDS, limit)
        assert [lease.id for lease in leases] == expected, "a claim takes the best due jobs, in order"
        self.model.claim(expected, worker)
        for lease in leases:
            job = self.model.jobs[lease.id]
            got = (lease.queue, lease.priority, lease.attempt, lease.max_attempts, lease.attempt_budget)
            assert got == (job.queue, job.priority, job.runs, job.max_attempts, job.budget)
        return multiple(*(Held(worker, lease.id, lease.attempt) for lease in leases))

    # A worker reports once on each lease (a renewal keeps it) and drops one it was told it lost;
    # a report on a lease lost meanwhile (recovered, cancelled, taken over) is late, and refused.

    @rule(target=leases, held=consumes(leases))
    def renew(self, held: Held) -> MultipleResults[Held]:
        if not self._report(held, "renew"):
            return multiple()
        self.model.renew(held.job)
        return multiple(held)

    @rule(held=consumes(leases))
    def complete(self, held: Held) -> None:
        if self._report(held, "complete"):
            self.model.finish(held.job, State.COMPLETED)

    @rule(held=consumes(leases), backoff=st.sampled_from((0.0, HOUR)))
    def retry(self, held: Held, backoff: float) -> None:
        if not self.model.holds(held.worker, held.job, held.attempt):
            self._refused(self._sender(held, "retry", backoff))
            return
        state = self.store.record_failure(self.conn, held.job, held.worker, held.attempt, "boom", backoff)
        assert state == self.model.retry(held.job, backoff), "dead exactly when the budget is spent"

    @rule(held=consumes(leases))
    def fail(self, held: Held) -> None:
        if self._report(held, "fail"):
            self.model.finish(held.job, State.FAILED)

    @rule(held=consumes(leases), delay=st.sampled_from((0.0, HOUR)))
    def snooze(self, held: Held, delay: float) -> None:
        if self._report(held, "snooze", delay):
            self.model.snooze(held.job, delay)

    @rule(held=leases, forger=st.sampled_from(FORGERS), report=st.sampled_from(REPORTS))
    def report_without_the_lease(self, held: Held, forger: str, report: str) -> None:
        """A report on a lease's job by another worker at its attempt, or by its worker at the
        run before: refused, whatever it reports (attempts never repeat)."""
        if forger == "an earlier run":
            forged = Held(held.worker, held.job, held.attempt - 1)
        else:
            shift = 1 if forger == "the next worker" else 2
            forged = Held(WORKERS[(WORKERS.index(held.worker) + shift) % len(WORKERS)], held.job, held.attempt)
        assert not self._report(forged, report)

    def _report(self, held: Held, report: str, delay: float = 0.0) -> bool:
        """Send a report on ``held``'s job from its worker at its attempt. It lands only from the
        job's holder at that attempt (True: the caller moves the model); anyone else gets
        LeaseLost, and nothing changes."""
        send = self._sender(held, report, delay)
        if not self.model.holds(held.worker, held.job, held.attempt):
            self._refused(send)
            return False
        send()
        return True

    def _sender(self, held: Held, report: str, delay: float = 0.0) -> Callable[[], object]:
        store, conn, worker, job, attempt = self.store, self.conn, held.worker, held.job, held.attempt
        return {
            "renew": lambda: store.renew_lease(conn, job, worker, attempt, LEASE_SECONDS),
            "complete": lambda: store.complete(conn, job, worker, attempt),
            "retry": lambda: store.record_failure(conn, job, worker, attempt, "boom", delay),
            "fail": lambda: store.fail(conn, job, worker, attempt, "never"),
            "snooze": lambda: store.snooze(conn, job, worker, attempt, delay),
        }[report]

    @staticmethod
    def _refused(send: Callable[[], object]) -> None:
        with pytest.raises(LeaseLost):
            send()

    # -- time, and the reaper

    @rule(held=leases)
    def lease_expires(self, held: Held) -> None:
        """The job's worker froze past its lease (or whoever holds the job now did)."""
        if self.model.expire(held.job):
            expire_lease(self.conn, held.job)

    @precondition(lambda self: self.model.any_expired())
    @rule()
    def reap(self) -> None:
        expected = self.model.reap()
        assert self.store.recover_expired_leases(self.conn) == expected
        back = sorted(job_id for job_id, state in expected.items() if state == State.AVAILABLE)
        ahead = dict(self.conn.execute(_SECONDS_AHEAD, [back]).fetchall())
        for job_id in back:  # due after the task's backoff: the default's, for a task nobody declared
            assert ahead[job_id] <= backoff_ceiling(self.model.jobs[job_id].runs)
            make_due(self.conn, job_id)  # as if that time passed
            self.model.make_due(job_id)

    @precondition(lambda self: self.model.any(State.AVAILABLE, due=False))
    @rule()
    def an_hour_passes(self) -> None:
        self.conn.execute(_AN_HOUR_PASSES)
        self.model.an_hour_passes()

    # -- agreement

    @invariant()
    def agrees(self) -> None:
        """Every job, as the store reads it, is as the model has it."""
        now = self._now()
        stored = {record.id: observed(record, now) for record in self.store.list_jobs(self.conn, limit=100_000)}
        assert stored == {job.id: job.expected() for job in self.model.jobs.values()}

    def _now(self) -> dt.datetime:
        """The database clock (the model's clock does not tick: nothing stores this reading)."""
        row = self.conn.execute("SELECT now()").fetchone()
        assert row is not None
        now: dt.datetime = row[0]
        return now


def empty_the_queue(conn: Connection) -> None:
    """Empty the tables ``clean_database`` empties (the jobs table with its history's partitions,
    keys, counts, limits...), by DELETE: a TRUNCATE makes new files for every table and took
    63 ms an example, half the run. Job ids go on from where they were."""
    with conn.transaction():
        for table in QUEUE_TABLES:
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))


def _job_spec(spec: Spec, now: dt.datetime) -> JobSpec:
    """The spec as a producer writes it; a run-at counts from ``now``, the database clock."""
    ahead = HOUR if spec.when.endswith("in an hour") else 0.0
    job = JobSpec("model", None, queue=spec.queue, priority=spec.priority, max_attempts=spec.max_attempts)
    if spec.when.startswith("run_at"):
        return job._replace(run_at=now + dt.timedelta(seconds=ahead))
    return job._replace(delay=ahead)


@pytest.mark.timeout(TIMEOUT)
def test_store_agrees_with_the_model(conn: Connection) -> None:
    """Random interleavings of every worker, reaper and operator transition (see the module's
    docstring) leave each job as the documented rules say."""

    class OnTheTestDatabase(StoreAgainstModel):
        connection = conn

    run_state_machine_as_test(OnTheTestDatabase, settings=SETTINGS)
