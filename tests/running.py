"""In-process workers on threads, for tests of what handlers see and return."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

from miniqueue import tracing
from miniqueue.tasks.app import App
from miniqueue.worker.worker import Worker, WorkerConfig

#: Short leases and intervals so tests stay fast.
FAST = WorkerConfig(lease_duration=2.0, heartbeat_seconds=0.5, poll_interval=0.2, shutdown_timeout=5.0)


class Running:
    """A worker running on a thread, stopped and joined at the end of the test."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"


StartWorker = Callable[..., Running]
#: The ``run_one`` fixture: ``run_one(handler, state, payload=None, **task_options)``, the job's row.
RunOne = Callable[..., dict[str, Any]]


def worker_starter(dsn: str, **defaults: Any) -> Iterator[StartWorker]:
    """The body of a ``start_worker`` fixture: starts workers (FAST, with ``defaults`` and then
    each call's options over it), stops them all at the end."""
    started: list[Running] = []

    def start(app: App, **config: Any) -> Running:
        # Built as docs/operations/supervise.md builds an in-process worker, traced as it says.
        worker = Worker(app, dsn, dataclasses.replace(FAST, **{**defaults, **config}), hooks=tracing.worker_hooks())
        running = Running(worker)
        started.append(running)
        return running

    yield start
    for running in started:
        running.worker.stop()
    for running in started:
        running.thread.join(10)
