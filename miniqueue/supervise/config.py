"""How ``miniqueue-supervise`` runs (:class:`SupervisorConfig`), and the check made before it
forks: is the schema current, and do its connections fit the server?

Failing here, with a message that says how to fit, beats a fleet of workers that each find
"remaining connection slots are reserved" one by one.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ..core.db import behind_pooler, check_schema, connect
from ..core.errors import ConfigError
from ..core.scaling import CPU_SATURATED, DEFAULT_SCALE_COOLDOWN, DEFAULT_SCALE_TARGET, Autoscaler, parse_workers
from ..maintenance.reaper import ReaperConfig
from ..store.migrate import check_schema_version
from ..store.store import Store
from ..worker.aio import POOL_MAX_SIZE
from ..worker.worker import WorkerConfig


@dataclass(frozen=True)
class SupervisorConfig:
    """How ``miniqueue-supervise`` runs. Durations in seconds; memory in MB."""

    dsn: str
    app_ref: str
    #: The one schema of the deployment: the workers' and the reaper's configs are set to it.
    schema: str = "public"
    #: Worker processes; with ``max_workers``, the fewest (autoscaling from ``workers`` to it).
    workers: int = os.cpu_count() or 1
    #: ``--workers MIN:MAX``'s MAX (None: a fixed number of workers; see docs/operations/autoscaling.md).
    max_workers: int | None = None
    #: Autoscaling: the longest the served queues' due jobs should take to drain (seconds).
    scale_target: float = DEFAULT_SCALE_TARGET
    #: Autoscaling: how long workers sit idle, nothing due, before one is retired (seconds).
    scale_cooldown: float = DEFAULT_SCALE_COOLDOWN
    #: Autoscaling: the host's CPU busy share (0 to 1) at which no worker is added.
    scale_cpu_ceiling: float = CPU_SATURATED
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    max_jobs_per_child: int | None = None
    max_memory_mb: float | None = None
    preload: bool = False
    timeout_grace: float = 5.0
    liveness_timeout: float = 30.0
    report_interval: float = 1.0
    boot_failure_limit: int = 3
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    #: How often the reaper reads the queue gauges that /metrics serves (seconds).
    metrics_interval: float = 5.0
    #: With ``--shards``: the map's name of this supervisor's database, which /readyz's problems,
    #: and the ``database`` label of ``miniqueue_database_up`` name.
    database: str | None = None

    def validated(self) -> SupervisorConfig:
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers} is invalid: run at least 1 worker process")
        if self.max_workers is not None:
            parse_workers(f"{self.workers}:{self.max_workers}")
        # The scaling options are checked even for a fixed number of workers: a typo is an error.
        Autoscaler(self.workers, self.max_workers or self.workers, self.scale_target, self.scale_cooldown)
        if self.max_jobs_per_child is not None and self.max_jobs_per_child < 1:
            raise ConfigError(f"--max-jobs-per-child {self.max_jobs_per_child} is invalid: use 1 or more")
        if self.max_memory_mb is not None and not self.max_memory_mb > 0:
            raise ConfigError(f"--max-memory-per-child {self.max_memory_mb} is invalid: use a positive number of MB")
        if not self.metrics_interval > 0:
            raise ConfigError(f"--metrics-interval {self.metrics_interval} is invalid: use a positive number of s")
        if self.liveness_timeout <= 2 * self.report_interval:
            raise ConfigError("the liveness timeout must exceed two report intervals")
        check_schema(self.schema)
        self.worker.validated()
        self.reaper.validated()
        return self

    def __post_init__(self) -> None:
        # One schema for every process: the children's configs take the supervisor's.
        object.__setattr__(self, "worker", dataclasses.replace(self.worker, schema=self.schema))
        object.__setattr__(self, "reaper", dataclasses.replace(self.reaper, schema=self.schema))


def check_database(config: SupervisorConfig, store: Store) -> None:
    """Raise SchemaOutOfDate if the schema is old, ConfigError if the connections cannot fit."""
    worker = config.worker
    # The claim loop's, the heartbeat's and (unless poll-only) the listener's, plus the pools
    # that job.transaction() and job.atransaction() open on demand (the app is not imported
    # here, so both count).
    own = 2 if worker.poll_only else 3
    pools = 2 * min(worker.concurrency, POOL_MAX_SIZE)
    per_worker = own + pools
    # The reaper's (and its vacuum's, with --metrics-port its gauge reader's, and when autoscaling
    # its backlog reader's) and the supervisor's own; an autoscaling supervisor's MAX workers.
    workers = config.max_workers or config.workers
    readers = int(config.metrics_port is not None) + int(config.max_workers is not None)
    needed = workers * per_worker + 2 + int(config.reaper.vacuum) + readers
    with connect(config.dsn, purpose="supervisor", schema=store.schema) as conn:
        check_schema_version(conn, store.schema)
        limit, reserved, in_use = store.connection_capacity(conn)
    if behind_pooler():
        return  # our clients are PgBouncer's (its max_client_conn), not the server's: nothing to count
    available = limit - reserved - in_use + 1  # +1: this check's own connection is closed now
    if needed > available:
        fit = max(0, (available - 2) // per_worker)
        raise ConfigError(
            f"--workers {_workers(config)} --concurrency {worker.concurrency} needs {needed} connections "
            f"({per_worker} per worker: {own} of its own and up to {pools} for job.transaction() and "
            "job.atransaction(); "
            f"plus the reaper and the supervisor) but the server has {available} free "
            f"(max_connections {limit}, {reserved} reserved, {in_use} in use): run at most {fit} worker(s) "
            "at this concurrency, lower --concurrency, or raise max_connections"
        )


def _workers(config: SupervisorConfig) -> str:
    """``--workers`` as it was given."""
    return str(config.workers) if config.max_workers is None else f"{config.workers}:{config.max_workers}"
