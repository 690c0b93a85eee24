"""miniqueue: a PostgreSQL-backed job queue with leases, fencing and at-least-once delivery."""

from .app import App, Task, load_app
from .client import Client
from .context import Job, PermanentError, Snooze
from .errors import (
    AppLoadError,
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    LeaseLost,
    MiniqueueError,
    SchemaOutOfDate,
)
from .job import AttemptError, EnqueueResult, JobRecord, JobSpec, Lease, QueueCount, State
from .migrate import run_migrations
from .reaper import Reaper, ReaperConfig
from .retry import Backoff, default_backoff, exponential_backoff
from .store import Store
from .supervisor import Supervisor, SupervisorConfig
from .worker import Worker, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "App",
    "AppLoadError",
    "AttemptError",
    "Backoff",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "InvalidInput",
    "InvalidTransition",
    "Job",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "Lease",
    "LeaseLost",
    "MiniqueueError",
    "PermanentError",
    "QueueCount",
    "Reaper",
    "ReaperConfig",
    "SchemaOutOfDate",
    "Snooze",
    "State",
    "Store",
    "Supervisor",
    "SupervisorConfig",
    "Task",
    "Worker",
    "WorkerConfig",
    "__version__",
    "default_backoff",
    "exponential_backoff",
    "load_app",
    "run_migrations",
]
