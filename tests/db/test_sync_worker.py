"""What is particular to ``def`` handlers, against a real PostgreSQL: a handler that returns a
coroutine instead of running it, and a worker given a pool for their ``job.transaction()``.
What holds for every handler is in ``test_worker.py``, run for both kinds."""

from __future__ import annotations

import datetime as dt
from typing import Any

from psycopg.conninfo import make_conninfo

from miniqueue import Client
from miniqueue.core.db import Connection, create_pool
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.worker.worker import Worker

from ..helpers import row, wait_until
from ..running import FAST, Running, StartWorker


def test_a_handler_returning_an_awaitable_fails_its_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    ran: list[int] = []

    async def body(job: Job) -> None:
        ran.append(job.id)

    @app.task("sneaky", max_attempts=1)
    def sneaky(job: Job) -> Any:
        return body(job)  # a coroutine nobody awaits: the work never happens

    job_id = app.enqueue(client, "sneaky").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead, not completed")
    assert ran == []
    assert "returned coroutine instead of running" in row(conn, job_id)["last_error"]


def test_worker_with_a_pool_uses_it_for_transactions(client: Client, conn: Connection, dsn: str, effects: None) -> None:
    app = App()

    @app.task("pooled")
    def pooled(job: Job) -> None:
        with job.transaction() as tx:
            tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])

    job_id = app.enqueue(client, "pooled").id
    with create_pool(dsn, purpose="app") as pool:
        running = Running(Worker(app, pool, FAST))
        try:
            wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
        finally:
            running.stop()
    assert conn.execute("SELECT job_id FROM effects").fetchall() == [(job_id,)]


def test_a_jobs_timestamps_reach_its_handler_in_utc(client: Client, conn: Connection, dsn: str) -> None:
    """The claim connection reads timestamps in UTC whatever the session's zone would be (here
    New York, from the DSN): the same instants as stored, as aware datetimes in UTC."""
    app = App()
    seen: list[tuple[dt.datetime, dt.datetime]] = []

    @app.task("stamped")
    def stamped(job: Job) -> None:
        seen.append((job.scheduled_at, job.created_at))

    job_id = app.enqueue(client, "stamped").id
    running = Running(Worker(app, make_conninfo(dsn, options="-c TimeZone=America/New_York"), FAST))
    try:
        wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    finally:
        running.stop()
    stored = row(conn, job_id)
    assert seen == [(stored["scheduled_at"], stored["created_at"])]
    assert all(stamp.utcoffset() == dt.timedelta(0) for stamp in seen[0])
