"""The process registry: this supervisor and its children, as rows in ``miniqueue_processes``
that the dashboard shows for every host (host, pid, title, current jobs, RSS, jobs done,
restarts). Refreshed every few seconds on a connection opened and closed each time, so none is
held across ``fork()``; whether the refresh worked is what ``/readyz`` reports as the
database's health."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import time
from collections.abc import Iterable

import psutil

from ..core.db import connect
from ..core.errors import MiniqueueError
from ..core.records import ProcessInfo
from ..store.store import Store
from .children import Child

log = logging.getLogger("miniqueue.supervisor")

REFRESH_SECONDS = 5.0


class ProcessRegistry:
    """One supervisor's rows in the registry."""

    def __init__(self, dsn: str, store: Store, host: str, supervisor_id: str) -> None:
        self.dsn, self.store, self.host, self.supervisor_id = dsn, store, host, supervisor_id
        self.db_ok = True
        self._next = 0.0
        #: Each worker's jobs done at the last refresh, and when: its rate since, for autoscalers
        #: (miniqueue_desired_workers).
        self._done: dict[str, tuple[int, float]] = {}

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def refresh(self, children: Iterable[Child], restarts: dict[str, int]) -> int:
        """Record this supervisor and ``children``; return how many jobs they run."""
        now = time.monotonic()
        self._next = now + REFRESH_SECONDS
        rows = [_info(os.getpid(), self.supervisor_id, "supervisor", "miniqueue supervisor", 0, ())]
        done: dict[str, tuple[int, float]] = {}
        busy = 0
        for child in children:
            jobs = tuple(sorted(child.jobs))
            busy += len(jobs)
            doing = f"job {jobs[0]} {child.jobs[jobs[0]].task}" if jobs else "idle"
            title = "miniqueue reaper" if child.worker_id is None else f"miniqueue {child.slot} {doing}"
            ident = child.worker_id or f"{self.host}:{child.pid}"
            row = _info(child.pid, ident, child.kind, title, child.jobs_done, jobs, restarts.get(child.slot, 0))
            if child.worker_id is not None and child.ready:
                row = dataclasses.replace(row, queues=tuple(child.serves["queue"]), tasks=tuple(child.serves["task"]))
                done[ident] = child.jobs_done, now
                if ident in self._done and now > self._done[ident][1]:
                    before, then = self._done[ident]
                    row = dataclasses.replace(row, jobs_per_second=(child.jobs_done - before) / (now - then))
            rows.append(row)
        self._done = done
        try:
            with connect(self.dsn, purpose="supervisor", schema=self.store.schema, connect_timeout=2) as conn:
                self.store.register_processes(conn, self.supervisor_id, self.host, rows)
            self.db_ok = True
        except MiniqueueError as exc:
            if self.db_ok:
                log.warning("cannot reach the database to refresh the process registry: %s", exc)
            self.db_ok = False
        return busy

    def unregister(self) -> None:
        with (
            contextlib.suppress(MiniqueueError),
            connect(self.dsn, purpose="supervisor", schema=self.store.schema, connect_timeout=2) as conn,
        ):
            self.store.unregister_processes(conn, self.supervisor_id)


def _info(
    pid: int, ident: str, kind: str, title: str, jobs_done: int, jobs: tuple[int, ...], restarts: int = 0
) -> ProcessInfo:
    try:
        proc = psutil.Process(pid)
        started = dt.datetime.fromtimestamp(proc.create_time(), dt.timezone.utc)
        rss: int | None = proc.memory_info().rss
    except psutil.Error:
        started, rss = dt.datetime.now(dt.timezone.utc), None
    return ProcessInfo(
        id=ident,
        kind=kind,
        pid=pid,
        title=title,
        started_at=started,
        rss_bytes=rss,
        jobs_done=jobs_done,
        restarts=restarts,
        current_jobs=jobs,
    )
