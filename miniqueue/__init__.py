"""miniqueue: a PostgreSQL-backed job queue with leases, fencing and at-least-once delivery.

What is exported here is the public API: tasks and their handlers (:class:`App`, :class:`Job`,
:class:`PermanentError`, :class:`Snooze`, :class:`RateLimited`; :class:`Middleware` and its hooks' types), producing
and inspecting (:class:`Client`, :class:`AsyncClient`, :class:`JobOptions`, :class:`JobSpec` and the result types;
:class:`ShardedClient` and :class:`AsyncShardedClient` over several databases), running
in-process (:class:`Worker`, :class:`Reaper` and their configs), migrations, backoff, and the errors.
Everything else (the store, the supervisor and its children, the wire protocol between them)
is internal and may change; run the supervisor with the ``miniqueue-supervise`` command.
"""

from .client.asyncclient import AsyncClient
from .client.asyncsharded import AsyncShardedClient
from .client.client import Client
from .client.sharded import ShardedClient
from .core.backoff import Backoff, default_backoff, exponential_backoff
from .core.diagnosis import Diagnosis
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
from .core.options import JobOptions
from .core.records import (
    AttemptError,
    BlockedSequence,
    Debounce,
    EnqueueResult,
    GroupResult,
    JobProgress,
    JobRecord,
    JobSpec,
    ParentOutcome,
    Progress,
    QueueCount,
    QueueStats,
    Schedule,
    State,
)
from .maintenance.reaper import Reaper, ReaperConfig
from .store.migrate import run_migrations
from .tasks.app import App
from .tasks.batch import Batch
from .tasks.durable import SignalTimeout, StepError
from .tasks.job import Job, PermanentError, RateLimited, Snooze
from .tasks.middleware import EnqueueHook, Middleware, RunHook
from .worker.worker import Worker, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppLoadError",
    "AsyncClient",
    "AsyncShardedClient",
    "AttemptError",
    "Backoff",
    "Batch",
    "BlockedSequence",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "Debounce",
    "Diagnosis",
    "EnqueueHook",
    "EnqueueResult",
    "GroupResult",
    "InvalidInput",
    "InvalidTransition",
    "Job",
    "JobFailed",
    "JobNotFinished",
    "JobNotFound",
    "JobOptions",
    "JobProgress",
    "JobRecord",
    "JobSpec",
    "LeaseLost",
    "Middleware",
    "MiniqueueError",
    "ParentOutcome",
    "PermanentError",
    "Progress",
    "QueueCount",
    "QueueStats",
    "RateLimited",
    "Reaper",
    "ReaperConfig",
    "ResultUnavailable",
    "RunHook",
    "Schedule",
    "SchemaOutOfDate",
    "ShardedClient",
    "SignalTimeout",
    "Snooze",
    "State",
    "StepError",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "__version__",
    "default_backoff",
    "exponential_backoff",
    "run_migrations",
]
