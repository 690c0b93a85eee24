"""Tasks for the metrics and JSON-log tests: one that succeeds, one that always fails."""

from __future__ import annotations

import os

from miniqueue import App
from miniqueue.tasks.job import Job

from . import own_connection

app = App()


@app.task("ok", queue="fast")
def ok(job: Job) -> None:
    """Record which worker process ran the job, then take ``seconds`` (default 0)."""
    own_connection().execute("INSERT INTO metrics_runs (job_id, pid) VALUES (%s, %s)", [job.id, os.getpid()])
    job.wait(job.payload.get("seconds", 0))


@app.task("boom", queue="flaky", max_attempts=2, backoff=lambda attempt: 0.0)
def boom(job: Job) -> None:
    raise RuntimeError(f"boom on attempt {job.attempt}")
