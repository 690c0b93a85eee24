"""A forked child as the supervisor sees it: what it is, what it said, why it is going away."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from ..worker.inflight import InflightBoard
from . import reports


@dataclass
class RunningJob:
    """A job a worker reported running (the supervisor times it against its task's timeout)."""

    attempt: int
    task: str
    started: float
    timeout: float | None


@dataclass
class Child:
    """A worker (``worker_id`` set) or the reaper, from fork to ``waitpid``."""

    slot: str
    pid: int
    read_fd: int
    worker_id: str | None  # None for the reaper
    started: float
    last_report: float
    board: InflightBoard | None = None  # a worker's running handlers (see miniqueue.inflight)
    ready: bool = False
    retiring: bool = False
    #: Why we asked it to stop (TERM, HUP, TTOU...): what it leaves behind is not charged.
    stop_reason: str | None = None
    #: Why we killed it or made it leave in a way that charges the job it ran (a hard timeout,
    #: silence, the memory ceiling): that job may be what went wrong.
    kill_reason: str | None = None
    #: The one job a kill was on account of (a hard timeout), when there is one: only that job is
    #: charged; its neighbours in the process were interrupted by a stop we chose, uncharged.
    killed_for: int | None = None
    error: str | None = None
    jobs: dict[int, RunningJob] = field(default_factory=dict)
    listening: bool | None = None  # the worker's LISTEN connection, as last reported
    jobs_done: int = 0
    #: The queues a worker claims from and the tasks its app declares, as it reported them.
    serves: dict[str, list[str]] = field(default_factory=lambda: {"queue": [], "task": []})
    reader: reports.Reader = field(default_factory=reports.Reader)

    @property
    def kind(self) -> str:
        return "reaper" if self.worker_id is None else "worker"

    def read(self) -> list[reports.Report]:
        """Everything the child wrote since the last read, applied to what we know of it."""
        received = []
        try:
            while chunk := os.read(self.read_fd, 65536):
                received += self.reader.feed(chunk)
        except OSError:  # nothing more for now (BlockingIOError), or the pipe is gone
            pass
        for report in received:
            self.note(report)
        return received

    def note(self, report: reports.Report) -> None:
        self.last_report = now = time.monotonic()
        if isinstance(report, reports.Beat):
            self.listening = report.listening
        elif isinstance(report, reports.Ready):
            self.ready = True
        elif isinstance(report, reports.Serves):
            self.serves.setdefault(report.kind, []).append(report.name)
        elif isinstance(report, reports.Start):
            self.jobs[report.job_id] = RunningJob(report.attempt, report.task, now, report.timeout)
        elif isinstance(report, reports.End):
            self.jobs.pop(report.job_id, None)
        elif isinstance(report, reports.Done):
            self.jobs_done += report.tally.count
        elif isinstance(report, reports.Error):
            self.error = report.text

    def close(self) -> None:
        """Let go of the pipe (after ``waitpid``, and after reading its last words)."""
        os.close(self.read_fd)
