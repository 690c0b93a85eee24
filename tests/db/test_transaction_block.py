"""Inside ``with job.transaction()``, every job API that reads or writes the database works, at
``--concurrency 1`` too: the block holds the handler pool's only connection, so the job's own
reads and writes (its parents' results, its steps) run on the block's connection, in its
transaction. A sleep or a wait, which hands the job back, is refused there with a clear error.

Each test runs a real worker of concurrency 1 on a real database and asserts the rows: the job
completed on its first attempt, and what the block wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from miniqueue import Client, State
from miniqueue.core.db import Connection
from miniqueue.core.records import JobSpec
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job

from ..helpers import row, wait_until
from ..running import StartWorker, worker_starter


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    """Workers of concurrency 1 (a handler pool of one connection), with a lease long enough
    that no test waits on one."""
    yield from worker_starter(dsn, concurrency=1, lease_duration=10.0, heartbeat_seconds=2.0)


@pytest.fixture
def notes(conn: Connection) -> Connection:
    """A table the blocks write to."""
    conn.execute("CREATE TABLE IF NOT EXISTS block_notes (job_id BIGINT PRIMARY KEY, note JSONB)")
    conn.execute("TRUNCATE block_notes")
    return conn


def finished(conn: Connection, job_id: int) -> dict[str, Any]:
    """The job's row once it is no longer available or running."""

    def ended() -> dict[str, Any] | None:
        found = row(conn, job_id)
        return found if found["state"] not in ("available", "running", "waiting") else None

    return wait_until(ended, what=f"job {job_id} to end")


def test_a_group_callback_reads_its_parents_results_inside_its_transaction(
    client: Client, notes: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("member", queue="block")
    def member(job: Job) -> int:
        return int(job.payload["n"]) * 10

    @app.task("callback", queue="block")
    def callback(job: Job) -> None:
        with job.transaction() as conn:
            results = sorted(job.parent_results.values())
            conn.execute("INSERT INTO block_notes VALUES (%s, %s::jsonb)", [job.id, str(results)])

    members = [JobSpec("member", {"n": n}, queue="block") for n in (1, 2, 3)]
    group = client.group(members, on_complete=JobSpec("callback", queue="block"))
    assert group.on_complete is not None
    callback_id = group.on_complete.id
    start_worker(app)
    done = finished(notes, callback_id)
    assert (done["state"], done["attempt"]) == (State.COMPLETED, 1), done
    assert notes.execute("SELECT note FROM block_notes").fetchall() == [([10, 20, 30],)]


def test_a_job_runs_its_steps_inside_its_transaction(
    client: Client, notes: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("stepped", queue="block")
    def stepped(job: Job) -> None:
        with job.transaction() as conn:
            first = job.step("first", lambda: 41)
            second = job.step_transaction("second", lambda c: c.execute("SELECT %s::int + 1", [first]).fetchone()[0])
            conn.execute("INSERT INTO block_notes VALUES (%s, %s::jsonb)", [job.id, str([first, second])])

    job_id = client.enqueue("stepped", queue="block").id
    start_worker(app)
    done = finished(notes, job_id)
    assert (done["state"], done["attempt"]) == (State.COMPLETED, 1), done
    assert notes.execute("SELECT note FROM block_notes").fetchall() == [([41, 42],)]
    recorded = notes.execute("SELECT steps FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
    assert recorded is not None
    assert [(s["name"], s["value"]) for s in recorded[0]] == [("first", 41), ("second", 42)]


def test_a_step_of_a_block_that_rolls_back_is_not_recorded_and_runs_again(
    client: Client, notes: Connection, start_worker: StartWorker
) -> None:
    app = App()
    calls: list[int] = []

    @app.task("flaky", queue="block", max_attempts=2)
    def flaky(job: Job) -> None:
        with job.transaction() as conn:
            job.step("counted", calls.append, job.run)
            conn.execute("INSERT INTO block_notes VALUES (%s, '[]'::jsonb)", [job.id])
            if job.run == 1:
                raise RuntimeError("the block fails on the first attempt")

    job_id = client.enqueue("flaky", queue="block", max_attempts=2).id
    start_worker(app)
    done = finished(notes, job_id)
    assert (done["state"], done["attempt"]) == (State.COMPLETED, 2), done
    assert calls == [1, 2], "the step's record rolled back with its block, so it ran again"


def test_a_sleep_inside_the_block_is_refused_with_a_clear_error(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("sleepy", queue="block", max_attempts=1)
    def sleepy(job: Job) -> None:
        with job.transaction():
            job.sleep(5)

    job_id = client.enqueue("sleepy", queue="block", max_attempts=1).id
    start_worker(app)
    done = finished(conn, job_id)
    assert done["state"] == State.DEAD
    assert "job.sleep() cannot run inside 'with job.transaction()'" in done["last_error"]


def test_an_async_job_runs_its_steps_inside_its_transaction(
    client: Client, notes: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("astepped", queue="block")
    async def astepped(job: Job) -> None:
        async with job.atransaction() as conn:
            value = await job.astep("first", lambda: 7)
            await conn.execute("INSERT INTO block_notes VALUES (%s, %s::jsonb)", [job.id, str([value])])

    job_id = client.enqueue("astepped", queue="block").id
    start_worker(app)
    done = finished(notes, job_id)
    assert (done["state"], done["attempt"]) == (State.COMPLETED, 1), done
    assert notes.execute("SELECT note FROM block_notes").fetchall() == [([7],)]
