"""A batch task for the supervised batch tests: it records each run of each job, and writes
each job's effect in the transaction that completes it."""

from __future__ import annotations

import os
import signal
import time

from miniqueue import App, Batch, exponential_backoff
from miniqueue.tasks.job import Job

from . import own_connection

app = App()


def record(jobs: list[Job]) -> None:
    """Commit a row per job run before any effect."""
    with own_connection().cursor() as cur:
        cur.executemany(
            "INSERT INTO executions (job_id, attempt, pid) VALUES (%s, %s, %s)",
            [(job.id, job.run, os.getpid()) for job in jobs],
        )


@app.task("index", max_attempts=5, batch=Batch(size=20, wait=0.5))
def index(jobs: list[Job]) -> None:
    """Record every job, then complete each with its effect in its own transaction; on a first
    attempt of a job whose payload says ``stall_after``, stop for a long time after that many
    jobs (so a test can kill the worker mid-batch)."""
    record(jobs)
    for done, job in enumerate(jobs):
        stall = job.payload.get("stall_after") if isinstance(job.payload, dict) else None
        if job.run == 1 and stall == done:
            time.sleep(60)
        with job.transaction() as conn:
            conn.execute("INSERT INTO batch_effects (job_id) VALUES (%s)", [job.id])


# Retried at once: the tests wait for each poison job's three deaths, not for its backoff.
@app.task("poisoned", batch=Batch(size=10, wait=0.3), backoff=exponential_backoff(base=0.01, cap=0.05))
def poisoned(jobs: list[Job]) -> None:
    """Record every job, then kill this process if one of them is poison (a segfault, the memory
    ceiling: a death the handler cannot catch), else complete each with its effect."""
    record(jobs)
    if any(isinstance(job.payload, dict) and job.payload.get("poison") for job in jobs):
        os.kill(os.getpid(), signal.SIGKILL)
    for job in jobs:
        with job.transaction() as conn:
            conn.execute("INSERT INTO batch_effects (job_id) VALUES (%s)", [job.id])
