"""Job data: states, what a producer asks for, and what the store returns."""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class State(str, enum.Enum):
    """Where a job is in its life.

    ``available → running → completed | available (retry) | dead (attempts exhausted) |
    failed (permanent)``; ``available | running | waiting → cancelled`` by an operator; and
    ``dead | failed | cancelled | expired → available`` by requeue. A job enqueued with parents
    starts ``waiting`` and becomes ``available`` when its last parent completes, or ``cancelled``
    when one of them ends failed, dead, cancelled or expired; a job of a sequence waits its turn
    the same way. ``available | waiting → expired`` when its deadline (``expires_at``) passes
    before a worker claimed it.
    """

    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"
    EXPIRED = "expired"


TERMINAL_STATES = frozenset({State.COMPLETED, State.FAILED, State.DEAD, State.CANCELLED, State.EXPIRED})
REQUEUEABLE_STATES = frozenset({State.FAILED, State.DEAD, State.CANCELLED, State.EXPIRED})
CANCELLABLE_STATES = frozenset({State.AVAILABLE, State.RUNNING, State.WAITING})


class JobSpec(NamedTuple):
    """One job to enqueue, as passed to :meth:`miniqueue.Client.enqueue_many`: its task, its
    payload, and the options of :class:`~miniqueue.JobOptions`, which says what each means and
    what one left None is (the task's declaration, else a default; see docs/guides/tasks.md).

    (A NamedTuple: producers build these by the thousand, and a frozen dataclass cost 3 us apiece.)
    """

    task: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    max_concurrent: int | None = None
    rate_limit: str | None = None
    rate_limit_key: str | None = None
    depends_on: Sequence[int] | None = None
    unique_key: str | None = None
    unique_states: Collection[str] | None = None
    unique_window: float | dt.timedelta | None = None
    on_conflict: str | Debounce | None = None
    sequence_key: str | None = None
    on_failure: str | None = None
    expires_in: float | dt.timedelta | None = None
    expires_at: dt.datetime | None = None
    allow_failure: bool = False
    rate_cost: int | None = None
    fair_key: str | None = None


class Debounce(NamedTuple):
    """``on_conflict=Debounce(wait, max_wait)``: a job runs ``wait`` seconds after the last
    enqueue of its unique key, with the last payload, but never later than ``max_wait`` seconds
    after the first, so that a steady stream of enqueues still runs it."""

    wait: float | dt.timedelta
    max_wait: float | dt.timedelta


class KeyOptions(NamedTuple):
    """What a task declares for its jobs' keys and deadline (see :class:`JobSpec`), as its
    workers publish it: durations in seconds, ``on_conflict`` by name (``"debounce"`` with its
    two durations), a key computed from the payload by a function of the app as ``*_computed``."""

    unique_key: str | None = None
    unique_key_computed: bool = False
    unique_states: tuple[str, ...] | None = None
    unique_window: float | None = None
    on_conflict: str | None = None
    debounce_wait: float | None = None
    debounce_max_wait: float | None = None
    sequence_key: str | None = None
    sequence_key_computed: bool = False
    on_failure: str | None = None
    expires_in: float | None = None
    #: ``"key"``: the task's jobs take turns by key (see docs/guides/fairness.md); None: not fair.
    fair_by: str | None = None


class TaskDeclaration(NamedTuple):
    """What a task declares for its jobs, as its app's workers publish it to the database.

    A key computed from each payload by a function of the app is published as ``*_computed``:
    a producer without the app cannot compute it and must pass the key itself.
    """

    task: str
    queue: str
    priority: int
    max_attempts: int
    concurrency_key: str | None = None
    concurrency_key_computed: bool = False
    max_concurrent: int | None = None
    rate_limit: str | None = None
    rate_limit_key: str | None = None
    rate_limit_key_computed: bool = False
    #: The task's full-jitter backoff (seconds), applied by the supervisor and the reaper to the
    #: attempts they charge; None for a backoff function of the app's own (the default applies there).
    backoff_base: float | None = None
    backoff_cap: float | None = None
    #: Its keys and deadline; None for a task that declares none.
    keys: KeyOptions | None = None
    #: Tokens each of its jobs takes from its rate limit's bucket; None for 1.
    rate_cost: int | None = None


#: The options of a job whose task declares none (no app that has run on the database knows it).
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 0
DEFAULT_MAX_ATTEMPTS = 5


class Schedule(NamedTuple):
    """A periodic schedule created at run time (``client.schedules``), as stored.

    ``enabled`` and ``last_slot`` (the latest slot a scheduler claimed, a UTC instant; at first
    the schedule's creation) are kept where every schedule's are, code or runtime; ``updated_at``
    changes with every change of the definition.
    """

    name: str
    cron: str
    task: str
    payload: Any
    timezone: str
    catch_up: str
    grace: float
    enabled: bool
    last_slot: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime


class EnqueueResult(NamedTuple):
    """The outcome of one enqueue: the job's id, and whether an earlier job with the same
    idempotency key or unique key already existed (in which case ``id`` is that earlier job's);
    ``replaced`` when that job took this one's payload (``on_conflict="replace"`` or a
    :class:`Debounce`)."""

    id: int
    duplicate: bool = False
    replaced: bool = False


class BlockedSequence(NamedTuple):
    """A sequence key that a failed or dead job blocks (see docs/guides/keys.md): its jobs wait
    until an operator requeues, cancels or deletes that job, or releases the key."""

    key: str
    job_id: int
    state: str
    task: str
    last_error: str | None
    #: How many jobs of the key wait behind it.
    waiting: int


class HorizonHolder(NamedTuple):
    """Something that holds the database's MVCC horizon back (see docs/operations/health.md): no
    vacuum can remove a row that died after its snapshot was taken."""

    #: 'transaction' (a session: a long query, or idle in a transaction), 'prepared transaction',
    #: 'replication slot' or 'standby feedback'.
    kind: str
    pid: int | None
    #: The session's application name, the prepared transaction's gid, or the slot's name.
    name: str | None
    state: str | None
    #: When its transaction (or query, or prepared transaction, or standby connection) began;
    #: None for a slot.
    since: dt.datetime | None
    #: For how long, on the database clock (None for a slot).
    seconds: float | None
    #: How many transactions ago its snapshot was taken.
    age: int | None
    query: str | None

    def describe(self) -> str:
        """One line naming it, as a log line and ``miniqueue doctor`` say it."""
        who = {"transaction": f"pid {self.pid}", "standby feedback": f"standby pid {self.pid}"}.get(self.kind, "")
        parts = [self.kind, who, f"{self.name!r}" if self.name else "", self.state or ""]
        since = f"since {self.since:%Y-%m-%d %H:%M:%S%z}" if self.since else ""
        query = f"query {self.query!r}" if self.query else ""
        return " ".join(p for p in (*parts, since, f"{self.age} transactions old" if self.age else "", query) if p)


class TableHealth(NamedTuple):
    """The jobs table as the server's statistics have it (see docs/operations/health.md)."""

    live_rows: int
    dead_rows: int
    table_bytes: int
    index_bytes: int
    claim_index_bytes: int | None
    last_vacuum: dt.datetime | None
    autovacuum: bool
    vacuum_scale_factor: float
    vacuum_threshold: int
    #: The database's clock, in seconds since the epoch, as it was read.
    database_clock: float


class Partition(NamedTuple):
    """One partition of the history of finished jobs (see docs/guides/retention.md)."""

    name: str
    #: ``done`` (completed and cancelled jobs) or ``failed`` (failed, dead and expired ones).
    kind: str
    starts_at: dt.datetime
    ends_at: dt.datetime
    #: The server's estimate (as of the partition's last vacuum or analyze).
    rows: int
    bytes: int


class ParentOutcome(NamedTuple):
    """How one of a job's parents ended (``job.parent_outcomes``): its state, its result (None
    unless it completed with one), and its last error (None if it had none)."""

    state: State
    result: Any
    error: str | None


@dataclass(frozen=True)
class Progress:
    """A running handler's last report of its progress (``job.progress(percent, **meta)``), as
    written by its worker: ``at`` is when it was written (the database's clock)."""

    percent: float
    meta: dict[str, Any]
    at: dt.datetime | None

    @classmethod
    def of(cls, value: Any) -> Progress | None:
        """The record of a job's ``progress`` column (None: nothing reported)."""
        if not isinstance(value, dict):
            return None
        at = value.get("at")
        return cls(float(value.get("percent", 0)), dict(value.get("meta") or {}), _instant(at))

    def describe(self) -> str:
        """One line for people: ``42% (rows=420, of=1000)``."""
        meta = ", ".join(f"{key}={json.dumps(item)}" for key, item in self.meta.items())
        return f"{self.percent:g}%" + (f" ({meta})" if meta else "")


def _instant(text: Any) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text) if isinstance(text, str) else None


@dataclass(frozen=True)
class JobProgress:
    """Where a job is (``client.progress(id)``, and each item ``client.watch(id)`` yields): its
    state, its last progress (None until its handler reports some), and once it finished, its
    result (None unless it completed with one) or last error."""

    id: int
    state: State
    progress: Progress | None
    result: Any = None
    error: str | None = None

    @classmethod
    def of(cls, job_id: int, state: State, progress: Any, result: Any, error: str | None) -> JobProgress:
        finished = state in TERMINAL_STATES
        return cls(job_id, state, Progress.of(progress), result if finished else None, error if finished else None)

    @property
    def finished(self) -> bool:
        """Whether the job reached a terminal state (its outcome is final)."""
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class GroupResult:
    """What :meth:`miniqueue.Client.group` enqueued: the members, and the callbacks that run after
    them (None where none was given): ``on_success`` (``then``) once every member completed,
    ``on_complete`` once every member finished, ``on_failure`` once every member finished and
    one did not complete."""

    members: list[EnqueueResult]
    on_success: EnqueueResult | None = None
    on_complete: EnqueueResult | None = None
    on_failure: EnqueueResult | None = None

    @property
    def then(self) -> EnqueueResult:
        """The callback given as ``then=`` (or ``on_success=``); LookupError for a group without one."""
        if self.on_success is None:
            raise LookupError("this group has no then (on_success) callback: read on_complete or on_failure")
        return self.on_success


@dataclass(frozen=True)
class AttemptError:
    """One entry of a job's history: a run that ended without completing (a failed attempt, or
    a run handed back uncharged), or a requeue."""

    #: The attempt's number as ``jobs show`` counts them (charged since the job was enqueued or
    #: last requeued); None for an entry that charged nothing (a hand-back, a requeue).
    attempt: int | None
    at: dt.datetime
    worker: str | None
    error: str
    #: The run's number (every run counts, charged or not: the job's fencing token then).
    run: int = 0
    #: When that run started (None: an entry written before runs recorded it, or a requeue).
    started: dt.datetime | None = None
    #: For a requeue: the state the job left (dead, failed, cancelled, expired) and when it had
    #: finished in it.
    requeued: str | None = None
    finished: dt.datetime | None = None


def number_attempts(entries: Sequence[dict[str, Any]]) -> list[int | None]:
    """Each raw history entry's attempt number, as people count them (see :class:`AttemptError`):
    charged entries count from 1, a requeue starts the count over, an entry that charged nothing
    has none. (An entry written before entries said whether they charged is a charge unless its
    note says it was not.)"""
    numbers: list[int | None] = []
    count = 0
    for entry in entries:
        if entry.get("requeued"):
            count = 0
        charged = entry.get("charged", "attempt not charged" not in str(entry.get("error", "")))
        if charged and not entry.get("requeued"):
            count += 1
            numbers.append(count)
        else:
            numbers.append(None)
    return numbers


class Lease(NamedTuple):
    """A job claimed by a worker: what the handler needs, plus the attempt that fences it.
    (A NamedTuple: a worker builds one per job, and a frozen dataclass cost 3 us apiece.)"""

    id: int
    queue: str
    task: str
    payload: Any
    priority: int
    attempt: int
    max_attempts: int
    scheduled_at: dt.datetime
    created_at: dt.datetime
    lease_expires_at: dt.datetime
    #: The limits the job is subject to (its scope names), or None.
    limits: list[str] | None = None
    #: The job's parents (None without parents); their results are read when the handler asks.
    parents: list[int] | None = None
    #: The enqueuing span's trace context (``{"traceparent": ...}``), None unless traced (miniqueue.tracing).
    trace_context: dict[str, str] | None = None
    #: The attempts the job may be charged (see :func:`charged_attempts`); None: as ``max_attempts``.
    attempt_budget: int | None = None
    #: Whether the job runs alone in its worker's process (no other handler beside it): its last
    #: run's process died while other handlers ran, and which job killed it is not known.
    run_alone: bool | None = None
    #: A fair job's key ("" for a fair job without one); None for a job that is not fair.
    fair_key: str | None = None
    #: Whether the claim took the job together with others of its limits, in the one slot they
    #: had free: its worker runs those jobs one after another, never two at once.
    together: bool = False


def charged_attempts(attempt: int, max_attempts: int, budget: int) -> int:
    """The attempts charged against a job's ``budget`` so far, a running one included.

    ``attempt`` counts every run (it is the job's fencing token: it never repeats), but a run
    handed back uncharged (a stop we asked for, a prefetched job never started, a snooze) moves
    ``max_attempts`` up with it, and a requeue sets ``max_attempts`` to ``attempt + budget``:
    so ``max_attempts - attempt`` is always the attempts left, and the budget less those is
    what was charged."""
    return max(0, budget - (max_attempts - attempt))


def describe_attempts(attempt: int, max_attempts: int, budget: int) -> str:
    """How far a job is through its attempts, as people read it: ``attempt 2 of 5``, with the
    runs when they differ (``attempt 2 of 5, 4 runs``: runs handed back uncharged, and runs
    before a requeue, are runs but not attempts)."""
    charged = charged_attempts(attempt, max_attempts, budget)
    runs = "" if attempt == charged else f", {attempt} run{'s' if attempt != 1 else ''}"
    return f"attempt {charged} of {budget}{runs}"


@dataclass(frozen=True)
class StepRecord:
    """One step a durable job recorded: ``kind`` ``step`` (with its ``value``), ``sleep`` (until
    ``until``) or ``signal`` (of ``key``: its data as ``value``, or ``timed_out``, or still
    ``waiting``), by which run (``attempt``), at ``at`` (the database clock's time, as text)."""

    name: str
    kind: str
    attempt: int
    at: str
    value: Any = None
    key: str | None = None
    until: str | None = None
    waiting: bool = False
    timed_out: bool = False

    @classmethod
    def of(cls, entry: dict[str, Any]) -> StepRecord:
        """The record of one entry of a job's ``steps`` column."""
        return cls(
            name=str(entry.get("name")),
            kind=str(entry.get("kind")),
            attempt=int(entry.get("attempt", 0)),
            at=str(entry.get("at", "")),
            value=entry.get("value"),
            key=entry.get("key"),
            until=entry.get("until"),
            waiting=bool(entry.get("waiting")),
            timed_out=bool(entry.get("timed_out")),
        )

    def describe(self) -> str:
        """One line for people: ``2 charge (step): {"id": 7}``, ``3 approval (signal): waiting``."""
        if self.kind == "sleep":
            outcome = f"until {self.until}"
        elif self.waiting:
            outcome = f"waiting for {self.key!r}"
        elif self.timed_out:
            outcome = f"timed out waiting for {self.key!r}"
        else:
            outcome = json.dumps(self.value)
        return f"{self.name} ({self.kind}): {outcome}"


@dataclass(frozen=True)
class JobRecord:
    """A full row of the jobs table, as returned by :meth:`miniqueue.Client.get`.

    ``attempt`` is the attempt as ``jobs show`` and the handler's ``job.attempt`` count it (the
    attempts charged since the job was enqueued or last requeued); ``run`` counts every run,
    charged or not (the row's ``attempt`` column, the fencing token)."""

    id: int
    queue: str
    task: str
    payload: Any
    state: State
    priority: int
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    scheduled_at: dt.datetime
    created_at: dt.datetime
    lease_expires_at: dt.datetime | None
    leased_by: str | None
    last_error: str | None
    completed_at: dt.datetime | None
    finished_at: dt.datetime | None
    errors: tuple[AttemptError, ...] = field(default_factory=tuple)
    #: What the handler returned (None if nothing, or not completed).
    result: Any = None
    #: The jobs this one waits for, and those waiting for it (empty when none).
    parents: tuple[int, ...] = ()
    dependents: tuple[int, ...] = ()
    #: How many of its parents have not completed yet (while ``waiting``).
    pending_parents: int = 0
    #: The attempts the job may be charged: its ``max_attempts`` as enqueued or last requeued.
    attempt_budget: int = 0
    #: Its keys and deadline (see docs/guides/keys.md): None when it has none.
    unique_key: str | None = None
    unique_while_running: bool = True
    sequence_key: str | None = None
    expires_at: dt.datetime | None = None
    #: The steps its handler recorded, in order (see docs/guides/durable.md).
    steps: tuple[StepRecord, ...] = ()
    #: The signal key it is parked on (state ``waiting``), or None; and until when (None: no timeout).
    signal_key: str | None = None
    signal_timeout_at: dt.datetime | None = None
    #: Every run so far, charged or not (the fencing token), and when the latest started.
    run: int = 0
    started_at: dt.datetime | None = None
    #: The priority it was enqueued with, once priority aging raised :attr:`priority` (see
    #: docs/guides/fairness.md); None: never raised.
    aged_from: int | None = None

    @property
    def charged_attempts(self) -> int:
        """The attempts charged against :attr:`attempt_budget`: :attr:`attempt`."""
        return self.attempt

    def describe_attempts(self) -> str:
        """``attempt 2 of 5``, or ``attempt 2 of 5, 4 runs`` (see :func:`describe_attempts`)."""
        return describe_attempts(self.run, self.max_attempts, self.attempt_budget)

    def describe_priority(self) -> str:
        """``7``, or ``7 (enqueued at 0, aged)`` once priority aging raised it."""
        return str(self.priority) if self.aged_from is None else f"{self.priority} (enqueued at {self.aged_from}, aged)"


@dataclass(frozen=True)
class QueueCount:
    """How many jobs of one queue are in one state."""

    queue: str
    state: State
    count: int


@dataclass(frozen=True)
class QueueStats:
    """What an operator wants to know about one queue."""

    queue: str
    counts: dict[State, int]
    #: Available jobs whose scheduled time is still in the future.
    scheduled: int
    #: Seconds the oldest runnable available job has waited (None when none waits).
    oldest_available_seconds: float | None
    #: Running jobs whose lease expired and that the reaper has not recovered yet.
    expired_leases: int
    #: Whether any worker has ever served the queue (a job waiting in one that none has is
    #: waiting for nobody: see docs/guides/tasks.md).
    served: bool = True
    #: Of the waiting jobs, those parked until a signal (see docs/guides/durable.md).
    signal_waits: int = 0
    #: The task of the queue's next due job when no live worker of the queue declares it while
    #: some serve the queue (their claims pass its jobs over: see "Tasks and their options" in
    #: docs/guides/tasks.md); None otherwise, or not checked.
    unrun_task: str | None = None

    @property
    def stranded(self) -> int:
        """How many jobs wait (available, or for their parents) in a queue no worker has ever
        served: 0 for a served queue."""
        return 0 if self.served else self.counts[State.AVAILABLE] + self.counts[State.WAITING]


@dataclass(frozen=True)
class ProcessInfo:
    """One row of the process registry: a supervisor, worker or reaper process on some host."""

    id: str
    kind: str
    pid: int
    title: str
    started_at: dt.datetime
    supervisor: str = ""
    host: str = ""
    last_seen: dt.datetime | None = None
    rss_bytes: int | None = None
    jobs_done: int = 0
    restarts: int = 0
    current_jobs: tuple[int, ...] = ()
    #: A worker's queues and the tasks its app declares (None: not reported).
    queues: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    #: The jobs a worker finished per second over its supervisor's last refresh (None: not known).
    jobs_per_second: float | None = None
