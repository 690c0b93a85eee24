"""Batch handlers against a real PostgreSQL: a task's ready jobs reach one handler call, up to
its batch size or after its wait; each job keeps its own outcome, attempts, limits and history;
in process, with the testing kit, and under a real ``miniqueue-supervise`` killed mid-batch."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from miniqueue import Batch, Client, ConfigError, PermanentError, Snooze
from miniqueue.core.db import Connection
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.testing import run_jobs
from miniqueue.worker.batching import batch_capacity

from ..helpers import count, row, wait_until
from ..running import StartWorker
from ..supervised import Fleet, StartSupervisor

BATCH_APP = "tests.apps.batch_app:app"


def enqueue_together(
    client: Client, conn: Connection, task: str, payloads: list[Any], app: App | None = None
) -> list[int]:
    """Enqueue in one transaction (with ``app``'s options for the task), so that one claim
    sees them all."""
    with conn.transaction():
        if app is None:
            return [client.enqueue(task, payload, conn=conn).id for payload in payloads]
        return [app.enqueue(client, task, payload, conn=conn).id for payload in payloads]


def test_batch_options_are_checked() -> None:
    app = App()
    for bad in (Batch(size=0), Batch(size=1001), Batch(wait=-1.0), Batch(wait=float("nan"))):
        with pytest.raises(ConfigError, match=r"task 'index': batch (size|wait) .* is invalid"):
            app.task("index", batch=bad)(lambda jobs: None)
    assert "index" not in app.tasks


def test_a_worker_holds_whole_batches_and_at_least_two_of_them() -> None:
    """What the prefetch asks for, rounded up to whole batches of the largest batch task: a
    claim one job over whole batches left a one-job batch waiting to fill after every claim."""
    batches = {"index": Batch(size=100, wait=1.0), "small": Batch(size=10, wait=1.0)}
    assert [batch_capacity(asked, batches) for asked in (1, 200, 201, 1000, 1001)] == [200, 200, 300, 1000, 1100]
    assert batch_capacity(7, {}) == 7, "a worker without batch tasks holds what its prefetch asks"


def test_a_full_batch_reaches_one_call(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    calls: list[list[Any]] = []

    @app.task("index", batch=Batch(size=5, wait=30))
    def index(jobs: list[Job]) -> None:
        calls.append([job.payload for job in jobs])

    ids = enqueue_together(client, conn, "index", list(range(5)))
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'completed'") == 5, what="the batch completed")
    assert calls == [[0, 1, 2, 3, 4]]
    assert all(row(conn, job_id)["attempt"] == 1 for job_id in ids)


def test_a_partial_batch_runs_after_its_wait(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    calls: list[tuple[int, float]] = []

    @app.task("index", batch=Batch(size=50, wait=0.5))
    def index(jobs: list[Job]) -> None:
        calls.append((len(jobs), time.monotonic()))

    enqueue_together(client, conn, "index", [1, 2, 3])
    started = time.monotonic()
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'completed'") == 3, what="the partial batch completed")
    [(size, at)] = calls
    assert size == 3 and at - started >= 0.5


def test_each_job_of_a_batch_keeps_its_own_outcome(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("index", max_attempts=3, batch=Batch(size=5, wait=30))
    def index(jobs: list[Job]) -> dict[int, object]:
        by_name = {job.payload: job for job in jobs}
        by_name["set"].set_result({"set": True})
        return {
            by_name["returned"].id: {"doubled": 2},
            by_name["retried"].id: ValueError("index unavailable"),
            by_name["failed"].id: PermanentError("malformed document"),
            by_name["snoozed"].id: Snooze(3600),
        }

    names = ["returned", "set", "retried", "failed", "snoozed"]
    ids = dict(zip(names, enqueue_together(client, conn, "index", names, app), strict=True))
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'running'") == 0 and count(conn, "attempt = 1") == 5, what="outcomes")
    wait_until(lambda: row(conn, ids["snoozed"])["state"] == "available", what="all recorded")
    rows = {name: row(conn, job_id) for name, job_id in ids.items()}
    assert (rows["returned"]["state"], rows["returned"]["result"]) == ("completed", {"doubled": 2})
    assert (rows["set"]["state"], rows["set"]["result"]) == ("completed", {"set": True})
    assert (
        rows["retried"]["state"] == "available"
        and "ValueError: index unavailable" in rows["retried"]["errors"][0]["error"]
    )
    assert rows["failed"]["state"] == "failed" and "malformed document" in rows["failed"]["errors"][0]["error"]
    assert rows["snoozed"]["state"] == "available" and not rows["snoozed"]["errors"]
    assert rows["snoozed"]["scheduled_at"] > rows["retried"]["scheduled_at"]


def test_a_raising_batch_handler_fails_every_job_once_in_one_statement(
    client: Client, conn: Connection, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App()
    calls: list[int] = []

    @app.task("index", max_attempts=1, batch=Batch(size=4, wait=30))
    def index(jobs: list[Job]) -> None:
        calls.append(len(jobs))
        raise RuntimeError("search cluster down")

    failure_statements = []
    execute = psycopg.Cursor.execute

    def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(query, str) and query.startswith("\nWITH failed AS ("):
            failure_statements.append(query)
        return execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    ids = enqueue_together(client, conn, "index", [1, 2, 3, 4], app)
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'dead'") == 4, what="every job dead")
    assert calls == [4]
    assert len(failure_statements) == 1, "the batch's four failed attempts are recorded in one statement"
    for job_id in ids:
        stored = row(conn, job_id)
        assert stored["attempt"] == 1 and len(stored["errors"]) == 1
        assert "RuntimeError: search cluster down" in stored["errors"][0]["error"]


def test_a_batch_handler_returning_something_else_fails_its_jobs(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    app.task("index", max_attempts=1, batch=Batch(size=2, wait=30))(lambda jobs: [1, 2])
    [first, _] = enqueue_together(client, conn, "index", [1, 2], app)
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'dead'") == 2, what="both jobs dead")
    [error] = row(conn, first)["errors"]
    assert "returned list: return None or a dict" in error["error"]


def test_async_batch_handlers_run_on_the_event_loop(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    threads: list[str] = []

    @app.task("index", batch=Batch(size=3, wait=30))
    async def index(jobs: list[Job]) -> dict[int, object]:
        await asyncio.sleep(0.01)
        threads.append(threading.current_thread().name)
        return {job.id: job.payload * 10 for job in jobs}

    ids = enqueue_together(client, conn, "index", [1, 2, 3])
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'completed'") == 3, what="the async batch completed")
    assert threads == ["miniqueue-loop"]
    assert [row(conn, job_id)["result"] for job_id in ids] == [10, 20, 30]


def test_limits_hold_per_job_in_batches(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    sizes: list[int] = []

    @app.task("index", concurrency_key="shard", max_concurrent=2, batch=Batch(size=10, wait=0.05))
    def index(jobs: list[Job]) -> None:
        sizes.append(len(jobs))

    enqueue_together(client, conn, "index", list(range(6)), app)
    start_worker(app)
    wait_until(lambda: count(conn, "state = 'completed'") == 6, what="every job completed")
    assert sum(sizes) == 6 and max(sizes) <= 2, sizes


def test_the_testing_kit_runs_batch_tasks(dsn: str, client: Client, conn: Connection) -> None:
    app = App()
    calls: list[int] = []

    @app.task("index", max_attempts=2, batch=Batch(size=10, wait=0.05))
    def index(jobs: list[Job]) -> dict[int, object]:
        calls.append(len(jobs))
        return {job.id: ValueError("flaky") for job in jobs if job.payload == "flaky" and job.run == 1}

    enqueue_together(client, conn, "index", ["a", "b", "flaky"], app)
    result = run_jobs(app, dsn)
    assert len(result.completed) == 3 and calls[0] == 3 and sum(calls) == 4
    assert [record.attempt for record in result.completed if record.payload == "flaky"] == [2]


@pytest.fixture
def supervise(dsn: str, executions: Connection, tmp_path: Path, repo_root: Path) -> Iterator[StartSupervisor]:
    conn = executions
    conn.execute("DROP TABLE IF EXISTS batch_effects")
    conn.execute("CREATE TABLE batch_effects (job_id BIGINT)")  # no key: a second write would show
    with Fleet(dsn, tmp_path, repo_root, BATCH_APP) as fleet:
        yield fleet.start


def test_a_worker_killed_mid_batch_loses_nothing_and_writes_each_effect_once(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise("--concurrency", "4", workers=1)
    sup.wait_ready(1)
    ids = enqueue_together(client, conn, "index", [{"stall_after": 8}] * 20)
    wait_until(lambda: count(conn, "state = 'completed'") == 8, timeout=20, what="8 jobs of the batch completed")
    ran = conn.execute("SELECT DISTINCT pid FROM executions").fetchall()
    assert len(ran) == 1 and count(conn, "state = 'running'") == 12
    os.kill(int(ran[0][0]), signal.SIGKILL)
    wait_until(lambda: count(conn, "state = 'completed'") == 20, timeout=30, what="every job completed")
    effects = conn.execute("SELECT job_id, count(*) FROM batch_effects GROUP BY job_id ORDER BY job_id").fetchall()
    assert effects == [(job_id, 1) for job_id in ids]
    reruns = conn.execute("SELECT count(DISTINCT job_id) FROM executions WHERE attempt > 1").fetchone()
    assert reruns == (12,)
    # Which job of the batch killed the worker is not known: none is charged (each budget is
    # extended as an uncharged stop's is), and each ran alone the next time.
    budgets = conn.execute(
        "SELECT DISTINCT max_attempts, run_alone FROM miniqueue_jobs"
        " WHERE id IN (SELECT job_id FROM executions WHERE attempt > 1)"
    ).fetchall()
    assert budgets == [(6, True)]
    batches = conn.execute("SELECT count(*) FROM executions WHERE attempt > 1 GROUP BY pid, attempt").fetchall()
    assert sum(n for (n,) in batches) == 12


def poisoned_batches(client: Client, conn: Connection, rounds: int, max_attempts: int) -> tuple[list[int], list[int]]:
    """``rounds`` batches of 10 jobs of task ``poisoned``, each with one poison job (the fifth);
    the ids of the poison jobs and of the healthy ones."""
    poison, healthy = [], []
    for _ in range(rounds):
        payloads = [{"poison": n == 4} for n in range(10)]
        with conn.transaction():
            ids = [client.enqueue("poisoned", p, max_attempts=max_attempts, conn=conn).id for p in payloads]
        poison.append(ids[4])
        healthy += ids[:4] + ids[5:]
    return poison, healthy


def test_a_poison_job_in_a_batch_is_charged_alone_and_its_batch_mates_complete(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise(workers=1)
    sup.wait_ready(1)
    [poison], healthy = poisoned_batches(client, conn, rounds=1, max_attempts=1)
    wait_until(lambda: count(conn, "state IN ('completed', 'dead')") == 10, timeout=60, what="every job ended")
    assert row(conn, poison)["state"] == "dead"
    assert "SIGKILL" in row(conn, poison)["last_error"]
    assert count(conn, "state = 'completed'") == 9
    effects = conn.execute("SELECT job_id, count(*) FROM batch_effects GROUP BY job_id ORDER BY job_id").fetchall()
    assert effects == [(job_id, 1) for job_id in healthy]
    # Each job ran twice: in the batch of 10, then alone (see test_slots for "alone").
    runs = conn.execute("SELECT job_id, count(*) FROM executions GROUP BY job_id ORDER BY job_id").fetchall()
    assert runs == [(job_id, 2) for job_id in sorted([poison, *healthy])]
    assert "none is charged, each runs alone next" in sup.output()


def test_poison_jobs_at_three_attempts_over_five_batches_leave_no_healthy_job_dead(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    # Four worker slots: 20 deaths or so in all, each slot's restarts backing off less.
    sup = supervise(workers=4)
    sup.wait_ready(4)
    poison, healthy = poisoned_batches(client, conn, rounds=5, max_attempts=3)
    wait_until(lambda: count(conn, "state IN ('completed', 'dead')") == 50, timeout=100, what="every job ended")
    dead = {r[0] for r in conn.execute("SELECT id FROM miniqueue_jobs WHERE state = 'dead'")}
    assert dead == set(poison), "only the poison jobs are dead"
    assert count(conn, "state = 'completed'") == len(healthy) == 45
    # Each poison job was charged its three attempts, each alone in its process.
    for job_id in poison:
        charged = row(conn, job_id)
        assert charged["attempt_budget"] - (charged["max_attempts"] - charged["attempt"]) == 3
    effects = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM batch_effects").fetchone()
    assert effects == (45, 45)
