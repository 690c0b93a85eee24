"""The facts that hold a job back, as the store reads them in one transaction (one clock,
``now()``) and the diagnosis of :mod:`miniqueue.core.causes` puts into words: the job's row
and its queue's settings, the workers the registry shows, the limits it needs, its parents,
its sequence key and the jobs ahead of it. Plain records: no I/O here."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from .records import State

MAX_COUNTED = 1000


class JobFacts(NamedTuple):
    """The job's row as the store reads it (its columns, by name)."""

    id: int
    queue: str
    task: str
    state: State
    priority: int
    attempt: int
    max_attempts: int
    attempt_budget: int
    scheduled_at: dt.datetime
    created_at: dt.datetime
    completed_at: dt.datetime | None
    finished_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    leased_by: str | None
    last_error: str | None
    limits: list[str] | None
    parents: list[int] | None
    pending_parents: int
    run_when: str | None
    sequence_key: str | None
    signal_key: str | None
    signal_timeout_at: dt.datetime | None
    expires_at: dt.datetime | None
    last_step: dict[str, Any] | None
    last_failure: dict[str, Any] | None
    paused: bool
    settings_changed_at: dt.datetime | None
    queue_cap: int | None
    served_at: dt.datetime | None
    now: dt.datetime
    #: Its fair key (None: not a fair job), and its turn: its rank among its queue's fair jobs,
    #: or its due time (see docs/guides/fairness.md).
    fair_key: str | None = None
    turn: dt.datetime | None = None


class WorkerFacts(NamedTuple):
    """What the process registry and the queue's leases say of its workers."""

    live_workers: int
    worker_seen_at: dt.datetime | None
    live_reapers: int
    reaper_seen_at: dt.datetime | None
    holder_seen_at: dt.datetime | None
    worker_connections: int
    queue_lease_until: dt.datetime | None
    #: Of the live workers, those that reported their queues and tasks, those of them that claim
    #: from the job's queue, and the tasks those declare (None: no live worker of the queue reported).
    reporting_workers: int = 0
    queue_workers: int = 0
    queue_tasks: list[str] | None = None


class ScopeFacts(NamedTuple):
    """One limit the job needs, as it stands."""

    scope: str
    max_running: int | None
    rate: float | None
    tokens: float
    next_token_at: dt.datetime | None
    holders: list[int]


class ParentFacts(NamedTuple):
    """A parent the job still waits for."""

    id: int
    state: State
    task: str


class SequenceFacts(NamedTuple):
    """The job's sequence key as it stands."""

    head: int | None
    head_state: State | None
    head_task: str | None
    head_error: str | None
    head_scheduled_at: dt.datetime | None
    on_failure: str
    ahead: int


class WhyFacts(NamedTuple):
    """Everything the store read of one job; what its state did not call for is
    None (or empty)."""

    job: JobFacts
    workers: WorkerFacts | None = None
    limits: tuple[ScopeFacts, ...] = ()
    parents: tuple[ParentFacts, ...] = ()
    sequence: SequenceFacts | None = None
    ahead: int | None = None
    #: Of the jobs ahead of a fair job, how many other fair keys they are of (up to MAX_COUNTED).
    keys_ahead: int | None = None
