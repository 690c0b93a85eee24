"""Tasks for the supervisor tests: each records its execution, some misbehave on purpose."""

from __future__ import annotations

import ctypes
import os
import time

from miniqueue import App, exponential_backoff
from miniqueue.tasks.job import Job

from . import own_connection

app = App()


def record(job: Job) -> None:
    """Commit a row per execution before the handler returns."""
    own_connection().execute(
        "INSERT INTO executions (job_id, attempt, pid) VALUES (%s, %s, %s)", [job.id, job.run, os.getpid()]
    )


@app.task("work", max_attempts=3)
def work(job: Job) -> None:
    """Record, then sleep ``seconds`` on the attempts listed in ``sleep_on`` (default: none),
    waking early when told to stop unless ``deaf``."""
    record(job)
    if job.run in job.payload.get("sleep_on", []):
        seconds = job.payload.get("seconds", 30)
        if job.payload.get("deaf"):
            time.sleep(seconds)
        else:
            job.wait(seconds)


@app.task("patient", max_attempts=3, backoff=exponential_backoff(base=1e6, cap=1e7))
def patient(job: Job) -> None:
    """Like ``work``, with a backoff of days: a retry that comes back soon was not its own."""
    work(job)


@app.task("segfault", max_attempts=2)
def segfault(job: Job) -> None:
    record(job)
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@app.task("abort", max_attempts=2)
def abort(job: Job) -> None:
    record(job)
    os.abort()


#: What the hog task keeps alive in its worker process, so that its resident set grows.
HOARD: list[bytearray] = []


@app.task("hog", max_attempts=3)
def hog(job: Job) -> None:
    record(job)
    HOARD.append(bytearray(job.payload.get("mb", 64) * 1024 * 1024))


@app.task("stuck", max_attempts=2, timeout=0.5)
def stuck(job: Job) -> None:
    """Ignores should_stop(): only the supervisor's hard timeout ends it."""
    record(job)
    time.sleep(60)
