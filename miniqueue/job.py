"""Job data: states, what a producer asks for, and what the store returns."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class State(str, enum.Enum):
    """Where a job is in its life.

    ``available → running → completed | available (retry) | dead (attempts exhausted) |
    failed (permanent)``; ``available | running | waiting → cancelled`` by an operator; and
    ``dead | failed | cancelled → available`` by requeue. A job enqueued with parents starts
    ``waiting`` and becomes ``available`` when its last parent completes, or ``cancelled``
    when one of them ends failed, dead or cancelled.
    """

    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    WAITING = "waiting"


TERMINAL_STATES = frozenset({State.COMPLETED, State.FAILED, State.DEAD, State.CANCELLED})
REQUEUEABLE_STATES = frozenset({State.FAILED, State.DEAD, State.CANCELLED})
CANCELLABLE_STATES = frozenset({State.AVAILABLE, State.RUNNING, State.WAITING})


class JobSpec(NamedTuple):
    """One job to enqueue, as passed to :meth:`miniqueue.Client.enqueue_many`.

    ``run_at`` (timezone-aware) and ``delay`` (seconds or timedelta, counted on the database
    clock) are mutually exclusive; with neither the job is available at once. (A NamedTuple:
    producers build these by the thousand, and a frozen dataclass cost 3 us apiece.)
    """

    task: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    max_attempts: int = 5
    idempotency_key: str | None = None
    #: Limits (see the README's "Limits"): at most ``max_concurrent`` (default 1) jobs of this
    #: task with this key run at once, across every worker.
    concurrency_key: str | None = None
    max_concurrent: int | None = None
    #: At most this many jobs of the task start (``"100/s"``, ``"30/min"``, ``"1000/h"``), per
    #: task or, with a ``rate_limit_key``, per key.
    rate_limit: str | None = None
    rate_limit_key: str | None = None
    #: Ids of jobs that must complete before this one runs (see :meth:`miniqueue.Client.enqueue`).
    depends_on: Sequence[int] | None = None


class EnqueueResult(NamedTuple):
    """The outcome of one enqueue: the job's id, and whether an earlier job with the same
    idempotency key already existed (in which case ``id`` is that earlier job's)."""

    id: int
    duplicate: bool = False


class GroupResult(NamedTuple):
    """What :meth:`miniqueue.Client.group` enqueued: the members, and the job that runs after them."""

    members: list[EnqueueResult]
    then: EnqueueResult


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt in a job's error history."""

    attempt: int
    at: dt.datetime
    worker: str | None
    error: str


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
    #: The job's parents, and their results as ``[[id, result], ...]`` (None without parents).
    parents: list[int] | None = None
    parent_results: list[list[Any]] | None = None
    #: The enqueuing span's trace context (``{"traceparent": ...}``), None unless traced (miniqueue.tracing).
    trace_context: dict[str, str] | None = None


@dataclass(frozen=True)
class JobRecord:
    """A full row of the jobs table, as returned by :meth:`miniqueue.Client.get`."""

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
