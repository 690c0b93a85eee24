"""One meaning of "attempt" everywhere: what was charged since the job was enqueued or last
requeued. After a requeue, the handler's ``job.attempt``, ``client.get``, ``miniqueue jobs show``
and the dashboard agree; the history shows how the job ended before the requeue and the requeue
itself between the runs, and each run's start as well as its end. Real worker, real database."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from miniqueue import App, Client, Job, State
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.web import create_app

from ..helpers import row, wait_until
from ..running import StartWorker, worker_starter
from .test_web import on_localhost


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    yield from worker_starter(dsn, lease_duration=10.0, heartbeat_seconds=2.0)


def test_after_a_requeue_every_surface_counts_the_same_attempt_and_the_history_shows_the_requeue(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    seen: list[tuple[int, int, str]] = []

    @app.task("once", max_attempts=1)
    def once(job: Job) -> None:
        seen.append((job.attempt, job.run, job.describe_attempts()))
        if job.run == 1:
            raise RuntimeError("the first run fails")

    job_id = client.enqueue("once", max_attempts=1).id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="dead after its one attempt")
    assert client.requeue([job_id]) == [job_id]
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="completed after the requeue")

    assert seen == [(1, 1, "attempt 1 of 1"), (1, 2, "attempt 1 of 1, 2 runs")], "the handler's own view"
    record = client.get(job_id)
    assert (record.attempt, record.run, record.describe_attempts()) == (1, 2, "attempt 1 of 1, 2 runs")
    failed, requeued = record.errors
    assert (failed.attempt, failed.run, requeued.attempt, requeued.requeued) == (1, 1, None, "dead")
    assert failed.started is not None and failed.started <= failed.at
    assert requeued.finished is not None and failed.at <= requeued.finished <= requeued.at
    assert record.started_at is not None and record.started_at >= requeued.at, "the last run's start"

    shown = CliRunner().invoke(main, ["jobs", "show", str(job_id), "--database-url", dsn], env={"DATABASE_URL": None})
    assert shown.exit_code == 0, shown.output
    assert "attempt: 1 of 1, 2 runs\n" in shown.output
    assert re.search(r"--- attempt 1 ended at .* \(run 1, started .*\) on ", shown.output)
    assert re.search(r"--- requeued at .* \(it was dead since .*\)", shown.output)

    with on_localhost(create_app(client)) as web:
        html = web.get(f"/jobs/{job_id}").text
    labels = re.findall(r'<span class="event-label">([^<]+)</span>', html)
    assert labels == [
        "Created",
        "Attempt 1 started",
        "Attempt 1 failed",
        "Dead",
        "Requeued",
        "Scheduled",
        "Attempt 1 started",
        "Completed",
    ], labels
    assert "attempt 1 of 1, 2 runs" in html
    assert State(row(conn, job_id)["state"]) is State.COMPLETED
