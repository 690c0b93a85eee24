"""Autoscaling on a real database: ``miniqueue_desired_workers`` against real backlogs, its cost
against the backlog's size, and ``miniqueue-supervise --workers MIN:MAX`` growing with a backlog
and shrinking back once idle (see docs/operations/autoscaling.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection
from miniqueue.store.store import Store

from ..helpers import count, wait_until
from ..scraping import scrape_until, value
from ..supervised import Fleet, StartSupervisor, free_ports_after

APP = "tests.apps.supervised:app"
QUEUE = "scaled"


def desired(conn: Connection, target: float = 10.0, max_workers: int = 100, queues: tuple[str, ...] = (QUEUE,)) -> int:
    return Store().desired_workers(conn, queues, target, max_workers)


def enqueue(client: Client, n: int, **options: object) -> None:
    client.enqueue_many([JobSpec("work", {"n": i}, queue=QUEUE, **options) for i in range(n)])  # type: ignore[arg-type]


def worker_row(conn: Connection, ident: str, jobs_per_second: float | None, queues: tuple[str, ...] = (QUEUE,)) -> None:
    """A live worker in the process registry, as its supervisor's refresh writes it."""
    conn.execute(
        "INSERT INTO miniqueue_processes (id, supervisor, kind, host, pid, title, started_at, queues, jobs_per_second)"
        " VALUES (%s, 'sup', 'worker', 'host', 1, 'miniqueue worker', now(), %s, %s)",
        [ident, list(queues), jobs_per_second],
    )


@pytest.fixture
def registry(conn: Connection) -> Iterator[Connection]:
    conn.execute("DELETE FROM miniqueue_processes")
    yield conn
    conn.execute("DELETE FROM miniqueue_processes")


def test_an_empty_queue_wants_no_worker(registry: Connection) -> None:
    assert desired(registry) == 0
    worker_row(registry, "w1", 50.0)
    assert desired(registry) == 0, "idle workers are not wanted"


def test_a_backlog_with_no_worker_yet_wants_one(client: Client, registry: Connection) -> None:
    enqueue(client, 30)
    assert desired(registry) == 1, "from zero: one, whose rate then tells"


def test_the_workers_wanted_grow_with_the_backlog_and_the_job_time(client: Client, registry: Connection) -> None:
    worker_row(registry, "w1", 10.0)  # one worker finishing 10 jobs a second
    enqueue(client, 300)
    assert desired(registry, target=10) == 3  # 300 jobs at 10/s per worker: 3 workers drain them in 10 s
    enqueue(client, 300)
    assert desired(registry, target=10) == 6
    registry.execute("UPDATE miniqueue_processes SET jobs_per_second = 5")  # jobs twice as long
    assert desired(registry, target=10) == 12
    assert desired(registry, target=60) == 2
    worker_row(registry, "w2", 5.0)  # two workers at 5/s each: the same 5 per worker
    assert desired(registry, target=10) == 12


def test_the_workers_wanted_are_capped(client: Client, registry: Connection) -> None:
    worker_row(registry, "w1", 1.0)
    enqueue(client, 500)
    assert desired(registry, target=10, max_workers=8) == 8
    assert desired(registry, target=10) == 50


def test_a_worker_of_another_queue_or_gone_is_not_counted(client: Client, registry: Connection) -> None:
    enqueue(client, 100)
    worker_row(registry, "other", 1000.0, queues=("elsewhere",))
    worker_row(registry, "gone", 1000.0)
    registry.execute("UPDATE miniqueue_processes SET last_seen = now() - interval '1 minute' WHERE id = 'gone'")
    assert desired(registry) == 1, "neither gives a rate: as from zero"


def test_jobs_waiting_past_the_target_want_one_more_worker(client: Client, registry: Connection) -> None:
    worker_row(registry, "w1", 1000.0)  # fast: the count alone wants one worker
    client.enqueue_many([JobSpec("work", {}, queue=QUEUE)])
    assert desired(registry, target=10) == 1
    registry.execute("UPDATE miniqueue_jobs SET scheduled_at = now() - interval '1 minute' WHERE queue = %s", [QUEUE])
    assert desired(registry, target=10) == 2


def test_with_nothing_due_the_workers_running_jobs_are_wanted(client: Client, registry: Connection) -> None:
    worker_row(registry, "w1", 5.0)
    worker_row(registry, "w2", 5.0)
    worker_row(registry, "w3", 5.0)
    enqueue(client, 2)
    registry.execute(
        "UPDATE miniqueue_jobs SET state = 'running', leased_by = 'w', attempt = 1,"
        " lease_expires_at = now() + interval '30 seconds' WHERE queue = %s",
        [QUEUE],
    )
    assert desired(registry) == 2, "the two that run jobs; the third may go"


@pytest.mark.parametrize(
    ("target", "max_workers", "says"),
    [(0, 4, "target_seconds 0"), (-5, 4, "target_seconds -5"), (10, 0, "max_workers 0")],
)
def test_bad_arguments_are_errors_that_name_them(
    registry: Connection, target: float, max_workers: int, says: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
        desired(registry, target=target, max_workers=max_workers)


def buffers(conn: Connection, walk: int) -> int:
    """Shared buffers the backlog's reading touched (its second run: the plan is cached)."""
    statement = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM miniqueue_backlog(ARRAY['{QUEUE}'], {walk})"
    conn.execute(statement)
    row = conn.execute(statement).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def test_the_backlogs_cost_is_the_same_at_1_000_000_queued_jobs(client: Client, conn: Connection) -> None:
    enqueue(client, 3_000)
    conn.execute("VACUUM ANALYZE miniqueue_jobs_live")
    small = buffers(conn, 1_000)
    assert Store().backlog(conn, [QUEUE]).due == 3_000
    # The rest of a million, written by SQL for speed (jobs as the client stores them, bar payloads).
    conn.execute(
        "INSERT INTO miniqueue_jobs (queue, task, payload, state, max_attempts, attempt_budget)"
        " SELECT %s, 'work', '{}', 'available', 1, 1 FROM generate_series(1, 997000)",
        [QUEUE],
    )
    conn.execute("VACUUM ANALYZE miniqueue_jobs_live")
    large = buffers(conn, 1_000)
    assert large <= small * 1.5 + 10, f"{small} buffers at 3,000 jobs, {large} at 1,000,000: the walk is not bounded"
    reading = Store().backlog(conn, [QUEUE])
    assert (reading.due, reading.walked) == (10_000, 10_000), "the default walk's bound: a lower bound past it"
    assert desired(conn) == 1, "no worker yet: one"


@pytest.fixture
def supervise(dsn: str, conn: Connection, tmp_path: Path, repo_root: Path) -> Iterator[StartSupervisor]:
    conn.execute("DROP TABLE IF EXISTS executions")
    conn.execute("CREATE TABLE executions (job_id BIGINT, attempt INT, pid INT)")
    fleet = Fleet(dsn, tmp_path, repo_root, APP)
    yield fleet.start
    fleet.stop_all()


def test_a_backlog_grows_the_workers_and_an_idle_spell_takes_them_back_uncharged(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    # 240 jobs of 50 ms: 12 s for one worker, over the 1 s target; the CPU is not looked at
    # (the other tests share this host's cores).
    enqueue(client, 240, max_attempts=1)
    conn.execute(
        "UPDATE miniqueue_jobs SET payload = %s WHERE queue = %s",
        [json.dumps({"sleep_on": [1], "seconds": 0.05, "deaf": True}), QUEUE],
    )
    scaling = ("--workers", "1:3", "--scale-target", "1", "--scale-cooldown", "2", "--scale-cpu-ceiling", "off")
    port = free_ports_after(1) + 1
    sup = supervise(*scaling, "--queues", QUEUE, "--metrics-port", str(port), workers=1)
    wait_until(lambda: len(sup.workers()) == 3, timeout=30, what="three workers, the maximum")
    samples = scrape_until(
        port, lambda s: value(s, "miniqueue_supervisor_workers", state="target") == 3, "the target on /metrics"
    )
    assert value(samples, "miniqueue_supervisor_workers", state="running") in (2, 3)
    assert (value(samples, "miniqueue_desired_workers") or 0) >= 1
    # Each supervisor's refresh writes its workers' rates, which miniqueue_desired_workers reads.
    rate = "SELECT coalesce(max(jobs_per_second), 0) FROM miniqueue_processes WHERE kind = 'worker'"
    wait_until(lambda: (conn.execute(rate).fetchone() or (0,))[0] > 0, timeout=15, what="the workers' rates")
    wait_until(lambda: count(conn, "state = 'completed'") == 240, timeout=60, what="the backlog drained")
    wait_until(lambda: len(sup.workers()) == 1, timeout=30, what="back to one worker, the minimum")
    log = sup.output()
    assert "autoscaling: 2" in log or "autoscaling: 1" in log, log[-3000:]  # a reason that names the due jobs
    assert "to drain at" in log and "target 1s" in log, log[-3000:]
    assert log.count("retired by autoscaling") == 2, log[-3000:]
    ran = conn.execute("SELECT count(*), count(DISTINCT job_id) FROM executions").fetchone()
    assert ran == (240, 240), "each job ran once: none lost, none run again by a worker's retirement"
    assert count(conn, "state <> 'completed'") == 0
