"""Autoscaling's readings: the served queues' backlog and the worker processes that would drain
it in time, from the schema's functions (migration 033), at a cost that does not grow with the
backlog (see docs/operations/autoscaling.md)."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.db import Connection
from ..core.scaling import Backlog
from .base import Statement, StoreBase

# The backlog of the queues: a bounded walk of their available jobs in the claim's order.
_BACKLOG = "SELECT due, walked, oldest_seconds, running FROM {backlog}(%(queues)s::text[])"

# How many worker processes would drain the queues within the target, at most max_workers.
_DESIRED_WORKERS = "SELECT {desired_workers}(%(queues)s::text[], %(target)s::float8, %(max_workers)s::int)"


class Scaling(StoreBase):
    """The readings an autoscaler acts on."""

    _backlog = Statement(_BACKLOG)
    _desired_workers = Statement(_DESIRED_WORKERS)

    def backlog(self, conn: Connection, queues: Sequence[str]) -> Backlog:
        """The backlog of ``queues`` (see :class:`~miniqueue.core.scaling.Backlog`)."""
        row = conn.execute(self._backlog, {"queues": list(queues)}).fetchone()
        assert row is not None
        return Backlog(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    def desired_workers(self, conn: Connection, queues: Sequence[str], target: float, max_workers: int) -> int:
        """The worker processes that would drain ``queues`` within ``target`` seconds (at most
        ``max_workers``), as ``miniqueue_desired_workers`` computes it for any autoscaler."""
        params = {"queues": list(queues), "target": target, "max_workers": max_workers}
        row = conn.execute(self._desired_workers, params).fetchone()
        assert row is not None
        return int(row[0])
