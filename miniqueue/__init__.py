"""miniqueue: a PostgreSQL-backed job queue with leases, fencing and at-least-once delivery.

What is exported here is the public API: tasks and their handlers (:class:`App`, :class:`Job`,
:class:`PermanentError`, :class:`Snooze`), producing and inspecting (:class:`Client`,
:class:`AsyncClient`, :class:`JobSpec` and the result types), running in-process
(:class:`Worker`, :class:`Reaper` and their configs), migrations, backoff, and the errors.
Everything else (the store, the supervisor and its children, the wire protocol between them)
is internal and may change; run the supervisor with the ``miniqueue-supervise`` command.
"""

from .client.asyncclient import AsyncClient
from .client.client import Client
from .core.backoff import Backoff, default_backoff, exponential_backoff
from .core.errors import (
    AppLoadError,
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    JobFailed,
    JobNotFinished,
    JobNotFound,
    LeaseLost,
    MiniqueueError,
    ResultUnavailable,
    SchemaOutOfDate,
    WaitTimeout,
)
from .core.records import (
    AttemptError,
    BlockedSequence,
    Debounce,
    EnqueueResult,
    GroupResult,
    JobRecord,
    JobSpec,
    QueueCount,
    QueueStats,
    State,
)
from .maintenance.reaper import Reaper, ReaperConfig
from .store.migrate import run_migrations
from .tasks.app import App
from .tasks.job import Job, PermanentError, Snooze
from .worker.worker import Worker, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppLoadError",
    "AsyncClient",
    "AttemptError",
    "Backoff",
    "BlockedSequence",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "Debounce",
    "EnqueueResult",
    "GroupResult",
    "InvalidInput",
    "InvalidTransition",
    "Job",
    "JobFailed",
    "JobNotFinished",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "LeaseLost",
    "MiniqueueError",
    "PermanentError",
    "QueueCount",
    "QueueStats",
    "Reaper",
    "ReaperConfig",
    "ResultUnavailable",
    "SchemaOutOfDate",
    "Snooze",
    "State",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "__version__",
    "default_backoff",
    "exponential_backoff",
    "run_migrations",
]
