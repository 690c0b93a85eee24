"""Two apps that share one database and one queue, for the shared-queue tests: each records the
app that ran each job."""

from __future__ import annotations

from typing import Any

from miniqueue import App
from miniqueue.tasks.job import Job

from . import own_connection

app_a = App()
app_b = App()


def ran_by(name: str) -> Any:
    """A handler that commits a row saying that app ``name`` ran the job."""

    def handler(job: Job) -> None:
        own_connection().execute("INSERT INTO runs (job_id, app, task) VALUES (%s, %s, %s)", [job.id, name, job.task])

    return handler


app_a.task("a1", queue="shared", max_attempts=3)(ran_by("a"))
app_a.task("a2", queue="shared", max_attempts=3)(ran_by("a"))
app_b.task("b1", queue="shared", max_attempts=3)(ran_by("b"))
