"""Why a job has not run: the causes a diagnosis names (see ``miniqueue jobs why``), each a
sentence and the same facts as fields."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field
from typing import Any

from .records import State


class CauseKind(str, enum.Enum):
    """What one :class:`Cause` of a :class:`Diagnosis` says (see :meth:`miniqueue.Client.why`)."""

    #: The job ran, or will not: completed, failed, dead, cancelled or expired.
    FINISHED = "finished"
    #: The job runs now, under a live lease.
    RUNNING = "running"
    #: The job is running under a lease that expired: its worker stopped renewing it.
    LEASE_EXPIRED = "lease_expired"
    #: Its deadline (``expires_at``) passed before a worker claimed it.
    DEADLINE_PASSED = "deadline_passed"
    #: A failed or dead job blocks its sequence key.
    SEQUENCE_BLOCKED = "sequence_blocked"
    #: Its queue is paused.
    PAUSED = "paused"
    #: No live worker serves its queue (or none ever has).
    NO_WORKER = "no_worker"
    #: The live workers of its queue run apps that do not declare its task.
    NO_HANDLER = "no_handler"
    #: It waits for parents (``depends_on``) to finish.
    PARENTS = "parents"
    #: It is parked until a signal (``job.wait_for``).
    SIGNAL = "signal"
    #: It waits its turn behind the job holding its sequence key.
    SEQUENCE_TURN = "sequence_turn"
    #: It sleeps (``job.sleep``) until a time.
    SLEEP = "sleep"
    #: It is scheduled for later: a run-at, a delay, a retry's backoff, a snooze.
    SCHEDULED = "scheduled"
    #: Its queue's cap on running jobs is full.
    QUEUE_CAP = "queue_cap"
    #: It is a fair job whose key's turn has not come: other keys' jobs are ahead of it.
    FAIR_SHARE = "fair_share"
    #: A concurrency limit it needs is full.
    CONCURRENCY_LIMIT = "concurrency_limit"
    #: A rate limit it needs has no token yet.
    RATE_LIMIT = "rate_limit"
    #: Nothing holds it back: it runs when a worker of its queue has a free slot.
    DUE = "due"


@dataclass(frozen=True)
class Cause:
    """One thing a diagnosis found: its ``kind``, one sentence for people (``message``), and the
    same facts for programs (``details``: names to JSON values, timestamps as aware datetimes
    by the database's clock)."""

    kind: CauseKind
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The cause as a JSON object (timestamps left as datetimes for the caller's encoder)."""
        return {"kind": self.kind.value, "message": self.message, "details": dict(self.details)}


@dataclass(frozen=True)
class Diagnosis:
    """Why job ``job_id`` has not run, as :meth:`miniqueue.Client.why` found it at ``checked_at``
    (the database's clock): every cause that holds it back, most decisive first (what needs a
    person before what passes by itself), or the one that says it ran, runs, or is due."""

    job_id: int
    queue: str
    task: str
    state: State
    #: How far it is through its attempts: ``attempt 2 of 5`` (see :func:`describe_attempts`).
    attempts: str
    checked_at: dt.datetime
    causes: tuple[Cause, ...]

    @property
    def kinds(self) -> tuple[CauseKind, ...]:
        """The kinds of :attr:`causes`, in their order."""
        return tuple(cause.kind for cause in self.causes)

    def to_dict(self) -> dict[str, Any]:
        """The diagnosis as a JSON object (what ``miniqueue jobs why --json`` prints)."""
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "task": self.task,
            "state": self.state.value,
            "attempts": self.attempts,
            "checked_at": self.checked_at,
            "causes": [cause.to_dict() for cause in self.causes],
        }
