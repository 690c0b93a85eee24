"""Two apps that share one database and one queue, for the shared-queue tests: each records the
app that ran each job."""

from __future__ import annotations

import os
from typing import Any

import psycopg

from miniqueue import App
from miniqueue.tasks.job import Job

app_a = App()
app_b = App()
_conn: psycopg.Connection[Any] | None = None


def ran_by(name: str) -> Any:
    """A handler that commits a row saying that app ``name`` ran the job (opened after fork)."""

    def handler(job: Job) -> None:
        global _conn
        if _conn is None:
            _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn.execute("INSERT INTO runs (job_id, app, task) VALUES (%s, %s, %s)", [job.id, name, job.task])

    return handler


app_a.task("a1", queue="shared", max_attempts=3)(ran_by("a"))
app_a.task("a2", queue="shared", max_attempts=3)(ran_by("a"))
app_b.task("b1", queue="shared", max_attempts=3)(ran_by("b"))
