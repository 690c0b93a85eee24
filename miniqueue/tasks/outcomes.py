"""The outcome vocabulary shared by the worker, the supervisor's children, tracing and the
testing kit: what became of a handler run, and the hooks that follow a worker's jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from .job import Job

#: What became of a handler run. A handler's exception is an ``error`` (recorded as ``retried``
#: or ``dead``); a PermanentError is ``permanent`` (recorded as ``failed``). A durable sleep
#: (``slept``) or wait for a signal (``waiting``) handed its job back already.
OutcomeKind = Literal[
    "completed",
    "completed_in_transaction",
    "error",
    "permanent",
    "snoozed",
    "slept",
    "waiting",
    "lease_lost",
    "retried",
    "dead",
    "failed",
]


@dataclass
class Outcome:
    """What became of one job's handler run."""

    kind: OutcomeKind
    error: str | None = None
    delay: float = 0.0
    #: How long the handler ran, in seconds.
    duration: float = 0.0
    #: The jobs of the batch the handler ran this job in (1: alone); the prefetch learns each
    #: job's share of the batch's run time.
    batch_of: int = 1
    #: A completed handler's result as JSON text (None: it returned nothing).
    result: str | None = None
    #: The limit key a ``snoozed`` job pauses fleet-wide for ``delay`` seconds (it raised
    #: RateLimited); None for a plain snooze.
    pause_key: str | None = None
    #: What the handler raised, for an ``error`` or ``permanent`` outcome (recorded on the
    #: attempt's span by :mod:`miniqueue.tracing`).
    exception: BaseException | None = field(default=None, repr=False, compare=False)


@dataclass
class WorkerHooks:
    """Callbacks the supervisor uses to follow a worker. ``on_job_start`` may run on a handler
    thread; ``on_job_end`` runs on the claim loop once the outcome is recorded.
    ``on_handler_start`` and ``on_handler_end`` run on the handler thread (the event loop's
    thread for an async handler) right before and right after the handler itself."""

    on_job_start: Callable[[Job], None] = lambda job: None
    on_job_end: Callable[[Job, Outcome], None] = lambda job, outcome: None
    on_handler_start: Callable[[Job], None] = lambda job: None
    on_handler_end: Callable[[Job], None] = lambda job: None
