"""Before the supervisor forks: is the schema current, and do its connections fit the server?

Failing here, with a message that says how to fit, beats a fleet of workers that each find
"remaining connection slots are reserved" one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .aio import POOL_MAX_SIZE
from .db import behind_pooler, connect
from .errors import ConfigError
from .migrate import check_schema_version
from .store import Store

if TYPE_CHECKING:
    from .supervisor import SupervisorConfig


def check_database(config: SupervisorConfig, store: Store) -> None:
    """Raise SchemaOutOfDate if the schema is old, ConfigError if the connections cannot fit."""
    worker = config.worker
    # The claim loop's, the heartbeat's and (unless poll-only) the listener's, plus the pools
    # that job.transaction() and job.atransaction() open on demand (the app is not imported
    # here, so both count).
    own = 2 if worker.poll_only else 3
    pools = 2 * min(worker.concurrency, POOL_MAX_SIZE)
    per_worker = own + pools
    # The reaper's (and its vacuum's, and with --metrics-port its gauge reader's) and the supervisor's own.
    needed = config.workers * per_worker + 2 + int(config.reaper.vacuum) + int(config.metrics_port is not None)
    with connect(config.dsn, purpose="supervisor", schema=store.schema) as conn:
        check_schema_version(conn, store.schema)
        limit, reserved, in_use = store.connection_capacity(conn)
    if behind_pooler():
        return  # our clients are PgBouncer's (its max_client_conn), not the server's: nothing to count
    available = limit - reserved - in_use + 1  # +1: this check's own connection is closed now
    if needed > available:
        fit = max(0, (available - 2) // per_worker)
        raise ConfigError(
            f"--workers {config.workers} --concurrency {worker.concurrency} needs {needed} connections "
            f"({per_worker} per worker: {own} of its own and up to {pools} for job.transaction() and "
            "job.atransaction(); "
            f"plus the reaper and the supervisor) but the server has {available} free "
            f"(max_connections {limit}, {reserved} reserved, {in_use} in use): run at most {fit} worker(s) "
            "at this concurrency, lower --concurrency, or raise max_connections"
        )
