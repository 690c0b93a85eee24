"""Tasks for the workflow tests under a real supervisor: each records its execution (with the
database clock), and whether every parent had completed when it started."""

from __future__ import annotations

import os
from typing import Any

from miniqueue import App, JobSpec
from miniqueue.tasks.job import Job, PermanentError

from . import own_connection

app = App()


def record(job: Job) -> None:
    """Commit a row per execution before the handler goes on."""
    own_connection().execute(
        "INSERT INTO executions (job_id, attempt, pid, parents_done) "
        "SELECT %s, %s, %s, NOT EXISTS (SELECT 1 FROM miniqueue_jobs WHERE id = ANY(%s) AND state <> 'completed')",
        [job.id, job.run, os.getpid(), list(job.parents)],
    )


@app.task("step", max_attempts=3)
def step(job: Job) -> Any:
    """Record; on the attempts in ``sleep_on``, wait ``seconds`` (a kill lands meanwhile); return
    ``value`` plus the parents' results, when they are numbers."""
    record(job)
    if job.run in job.payload.get("sleep_on", []):
        job.wait(job.payload.get("seconds", 30))
    return job.payload.get("value", 0) + sum(r for r in job.parent_results.values() if isinstance(r, int))


@app.task("tally", max_attempts=3)
def tally(job: Job) -> None:
    """A callback whose effect commits with its completion: one row per callback, ever (a second
    completion would collide with the first's row); it notes whether every parent had finished."""
    record(job)
    with job.transaction() as conn:
        conn.execute(
            "INSERT INTO callback_effects (job_id, parents_finished) SELECT %s, NOT EXISTS ("
            "SELECT 1 FROM miniqueue_jobs WHERE id = ANY(%s) AND state IN ('available', 'running', 'waiting'))",
            [job.id, list(job.parents)],
        )


@app.task("flaky", max_attempts=1)
def flaky(job: Job) -> None:
    """A member that fails for good."""
    record(job)
    raise PermanentError("a member that fails")


@app.task("spawner", max_attempts=3)
def spawner(job: Job) -> None:
    """A member that adds two jobs to its group in its completing transaction; on the attempts in
    ``sleep_on`` it waits first (a kill lands meanwhile: the adds of that attempt never commit)."""
    record(job)
    if job.run in job.payload.get("sleep_on", []):
        job.wait(job.payload.get("seconds", 30))
    with job.transaction():
        for value in (1000, 2000):
            job.add_to_group(JobSpec("step", {"value": value}))
