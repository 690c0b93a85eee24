"""miniqueue: a PostgreSQL-backed job queue with leases, fencing and at-least-once delivery."""

from .client import Client
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
from .retry import Backoff, default_backoff, exponential_backoff
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "AppLoadError",
    "AttemptError",
    "Backoff",
    "Client",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "InvalidInput",
    "InvalidTransition",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "Lease",
    "LeaseLost",
    "MiniqueueError",
    "QueueCount",
    "SchemaOutOfDate",
    "State",
    "Store",
    "__version__",
    "default_backoff",
    "exponential_backoff",
    "run_migrations",
]
