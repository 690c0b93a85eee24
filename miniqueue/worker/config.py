"""How a worker is configured (:class:`WorkerConfig`) and named (:func:`new_worker_id`).

Apart from the worker itself so that the parts it is made of (the claim policy above all) can
read the config without importing the worker.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.db import check_dsn
from ..core.errors import ConfigError
from ..core.process import host_name
from ..core.validation import DEFAULT_MAX_PAYLOAD_BYTES, check_queue_name
from .prefetch import Prefetch, parse_prefetch


def new_worker_id(pid: int | None = None, suffix: str | None = None) -> str:
    """A worker id unique per process incarnation: host, pid and a random suffix, so a restarted
    process (or a recycled pid) never inherits a dead one's leases. The supervisor passes the
    child's pid and the suffix it chose before fork, so both sides compute the same id."""
    return f"{host_name()}:{pid or os.getpid()}:{suffix or secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker claims and runs jobs. Durations are in seconds.

    ``queues`` defaults to every queue of the app's tasks. ``heartbeat_seconds`` defaults to a
    third of the lease. ``prefetch`` claims jobs beyond the free handler slots, so the next
    job is ready when a slot frees and outcomes commit in batches (prefetched jobs hold leases,
    renewed like running ones, and are released unstarted at shutdown): ``"auto"`` holds as
    many as the threads are expected to finish within ``prefetch_budget`` seconds, judged from
    recent run times, and hands them back when every thread is stuck past the budget (see
    :mod:`miniqueue.worker.prefetch`); a number holds that many; 0 claims one job per free thread.
    ``poll_only`` skips LISTEN/NOTIFY; ``listen_url`` runs LISTEN on a connection of its own
    to that URL (a direct one, when the worker's DSN goes through PgBouncer in transaction mode).
    ``concurrency`` is how many ``def`` handlers run at once (threads) and, separately, how many
    ``async def`` handlers (coroutines on the worker's event loop; hundreds are fine).
    """

    queues: Sequence[str] | None = None
    concurrency: int = 1
    lease_duration: float = 30.0
    heartbeat_seconds: float | None = None
    poll_interval: float = 1.0
    shutdown_timeout: float = 10.0
    prefetch: Prefetch = "auto"
    prefetch_budget: float = 0.1
    poll_only: bool = False
    listen_url: str | None = None
    worker_id: str | None = None
    schema: str = "public"
    #: Stop (drain and return from run()) after this many jobs; the supervisor then recycles the process.
    max_jobs: int | None = None
    #: The largest handler result stored, in bytes of JSON (a larger one fails the attempt).
    max_result_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: Go round the groups of limited jobs from the last one down instead of from the first up.
    #: The supervisor sets it on every other worker (see :func:`miniqueue.worker.claiming.goes_down`,
    #: which :class:`~miniqueue.worker.claiming.ClaimPolicy` follows).
    descending: bool = False

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_seconds if self.heartbeat_seconds is not None else self.lease_duration / 3

    def validated(self) -> WorkerConfig:
        """Return this config if it is consistent, else raise ConfigError naming the problem."""
        positive = {
            "lease_duration": self.lease_duration,
            "poll_interval": self.poll_interval,
            "heartbeat interval": self.heartbeat_interval,
            "prefetch_budget": self.prefetch_budget,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{name} {value!r} is invalid: use a positive number of seconds")
        if self.heartbeat_interval >= self.lease_duration:
            raise ConfigError(
                f"heartbeat interval {self.heartbeat_interval:g}s must be below the lease "
                f"({self.lease_duration:g}s), or leases expire between renewals"
            )
        if self.concurrency < 1:
            raise ConfigError(
                f"concurrency {self.concurrency!r} is invalid: use 1 or more (handler threads, and coroutines "
                "for async tasks)"
            )
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError(f"max_jobs {self.max_jobs} is invalid: use 1 or more")
        parse_prefetch(self.prefetch)
        if self.shutdown_timeout < 0:
            raise ConfigError(f"shutdown_timeout {self.shutdown_timeout!r} is invalid: use 0 or more seconds")
        for queue in self.queues or ():
            check_queue_name(queue)
        if self.listen_url is not None:
            check_dsn(self.listen_url)
        return self
