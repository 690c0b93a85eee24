"""The heartbeat: renews every lease a worker holds, in one statement, on its own connection.

A lease that is not renewed (the job was recovered, cancelled or claimed elsewhere) is reported
through ``on_lost`` so the handler can be told to stop; its outcome will be discarded by the
fenced completion anyway. The progress handlers reported since the last renewal is written by
the same statement (a report that a failed renewal did not write is kept for the next one).
The heartbeat runs every ``interval`` seconds (by default a third of the lease, so two renewals
can fail before a lease expires) and ticks more often than that to enforce handler timeouts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from ..core.db import Connection, connect
from ..core.errors import DatabaseUnavailable
from ..core.records import State
from ..core.service import Service
from ..store.store import Store
from .slots import HeldLeases

log = logging.getLogger("miniqueue.heartbeat")

#: How often the heartbeat thread wakes to check timeouts, at most.
TICK_SECONDS = 0.25


class Heartbeat(Service):
    """A thread that keeps a worker's leases alive."""

    log = log

    def __init__(
        self,
        dsn: str,
        store: Store,
        worker_id: str,
        *,
        lease_duration: float,
        interval: float,
        leases: Callable[[], HeldLeases],
        on_lost: Callable[[dict[tuple[int, int], str]], None],
        on_tick: Callable[[], None] = lambda: None,
        on_renewed: Callable[[Collection[int], float], None] = lambda ids, sent_at: None,
    ) -> None:
        super().__init__("miniqueue-heartbeat")
        self.dsn, self.store, self.worker_id = dsn, store, worker_id
        self.lease_duration, self.interval = lease_duration, interval
        self.leases, self.on_lost, self.on_tick, self.on_renewed = leases, on_lost, on_tick, on_renewed
        self._conn: Connection | None = None
        # Progress taken from the handlers and not yet written (a renewal failed), by job id.
        self._unwritten: dict[int, str] = {}

    def run(self) -> None:
        next_beat = time.monotonic() + self.interval
        retry = 0.0
        while not self.stopping.wait(min(TICK_SECONDS, self.interval)):
            self.on_tick()
            if time.monotonic() < next_beat:
                continue
            try:
                self.beat()
                next_beat, retry = time.monotonic() + self.interval, 0.0
            except DatabaseUnavailable as exc:
                # The lease still has two intervals of slack: retry soon, backing off from a tick
                # to half an interval while the database stays down (not a connection a tick).
                retry = min(max(retry * 2, TICK_SECONDS), self.interval / 2)
                log.warning("heartbeat failed (%s); retrying in %.2gs", exc, retry)
                next_beat = time.monotonic() + retry
                self._close()
        self._close()

    def beat(self) -> None:
        """Renew every held lease now; report those that were lost."""
        held = self.leases()
        self._unwritten.update(held.progress)  # a newer report replaces an unwritten older one
        if not held:
            self._unwritten.clear()
            return
        if self._conn is None:
            self._conn = connect(self.dsn, purpose="heartbeat", schema=self.store.schema)
        sent_at = time.monotonic()  # the renewed leases end no sooner than lease_duration after this
        progress = self._unwritten
        renewed = self.store.renew_leases(self._conn, self.worker_id, held, self.lease_duration, progress=progress)
        self._unwritten = {}  # written, or its lease is lost: either way nothing is left to write
        self.on_renewed(renewed.keys(), sent_at)
        # Each by its run: the worker may hold a newer lease of the same job by now (it claimed
        # the job again after this lease expired), which is not lost.
        lost = [(job_id, run) for job_id, run in held if job_id not in renewed]
        if lost:
            states = self.store.states(self._conn, [job_id for job_id, _ in lost])
            cancelled = {job_id for job_id, state in states.items() if state == State.CANCELLED}
            self.on_lost({(job_id, run): "cancelled" if job_id in cancelled else "lease lost" for job_id, run in lost})

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
