"""``miniqueue-supervise --metrics-port`` scraped over HTTP while a real supervisor runs jobs, and
``--log-format json`` read back from a real process tree."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection

from ..helpers import count, make_running, wait_until
from ..scraping import Samples, get, scrape, scrape_until, value
from ..serving import run_miniqueue
from ..supervised import FAST, Fleet, StartSupervisor, Supervised, free_port

APP = "tests.apps.metrics_app:app"


@pytest.fixture
def runs(conn: Connection) -> Connection:
    """The table the ``ok`` task records its runs in."""
    conn.execute("CREATE TABLE IF NOT EXISTS metrics_runs (job_id BIGINT, pid INT)")
    conn.execute("TRUNCATE metrics_runs")
    return conn


@pytest.fixture
def supervise(dsn: str, tmp_path: Path, repo_root: Path, runs: Connection) -> Iterator[StartSupervisor]:
    with Fleet(dsn, tmp_path, repo_root, APP) as fleet:
        yield fleet.start


StartScraped = Callable[..., tuple[Supervised, int]]


@pytest.fixture
def supervise_scraped(supervise: StartSupervisor) -> StartScraped:
    """Start a supervisor of ``workers`` whose /metrics answers on a free port (its gauges read
    every 0.2 s), ready: the supervisor and its port."""

    def start(*args: str, workers: int) -> tuple[Supervised, int]:
        port = free_port()
        sup = supervise("--metrics-port", str(port), "--metrics-interval", "0.2", *args, workers=workers)
        sup.wait_ready(workers)
        return sup, port

    return start


def finished(samples: Samples, queue: str, task: str, outcome: str) -> float | None:
    return value(samples, "miniqueue_jobs_finished_total", queue=queue, task=task, outcome=outcome)


def test_job_counters_durations_and_gauges_with_several_workers(
    supervise_scraped: StartScraped, client: Client, conn: Connection
) -> None:
    sup, port = supervise_scraped(workers=3)
    client.enqueue_many(
        [JobSpec("ok", {"seconds": 0.1}, queue="fast") for _ in range(12)]
        + [JobSpec("boom", queue="flaky", max_attempts=2) for _ in range(2)]
    )
    wait_until(lambda: count(conn, "queue = 'fast' AND state = 'completed'") == 12, timeout=30, what="ok jobs")
    wait_until(lambda: count(conn, "queue = 'flaky' AND state = 'dead'") == 2, timeout=30, what="boom jobs dead")

    samples = scrape_until(
        port,
        # Each worker reports on its own tick: one's "dead" can arrive before another's "retried".
        lambda s: (
            finished(s, "fast", "ok", "completed") == 12
            and finished(s, "flaky", "boom", "dead") == 2
            and finished(s, "flaky", "boom", "retried") == 2
            # The queue gauges are the reaper's latest reading, taken every 0.2 s here.
            and value(s, "miniqueue_jobs", queue="fast", state="completed") == 12
            and value(s, "miniqueue_jobs", queue="flaky", state="dead") == 2
        ),
        "the job counters to catch up",
    )
    outcomes = {
        dict(labels)["outcome"]: n
        for (name, labels), n in samples.items()
        if name == "miniqueue_jobs_finished_total" and dict(labels)["task"] == "ok"
    }
    assert outcomes == {"completed": 12.0}
    assert finished(samples, "flaky", "boom", "retried") == 2
    assert finished(samples, "flaky", "boom", "dead") == 2
    assert finished(samples, "flaky", "boom", "completed") is None

    histogram = "miniqueue_job_duration_seconds"
    assert value(samples, f"{histogram}_count", queue="fast", task="ok") == 12
    assert value(samples, f"{histogram}_bucket", queue="fast", task="ok", le="+Inf") == 12
    assert value(samples, f"{histogram}_bucket", queue="fast", task="ok", le="0.05") == 0  # each ran ≥ 0.1 s
    assert (value(samples, f"{histogram}_sum", queue="fast", task="ok") or 0) >= 12 * 0.1
    assert value(samples, f"{histogram}_count", queue="flaky", task="boom") == 4  # two attempts each

    assert value(samples, "miniqueue_jobs", queue="fast", state="completed") == 12
    assert value(samples, "miniqueue_jobs", queue="fast", state="available") == 0
    assert value(samples, "miniqueue_jobs", queue="flaky", state="dead") == 2
    assert value(samples, "miniqueue_processes", kind="worker") == 3
    assert value(samples, "miniqueue_processes", kind="reaper") == 1
    assert value(samples, "miniqueue_database_up") == 1

    # The jobs really were spread over several forked workers, and none was counted twice.
    pids = {pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM metrics_runs").fetchall()}
    assert len(pids) >= 2 and pids <= set(sup.workers())
    assert count(conn, "true") == 14


def test_queue_gauges_for_waiting_and_expired_jobs(
    supervise_scraped: StartScraped, client: Client, conn: Connection
) -> None:
    """Jobs of a queue no worker serves: their ages and leases, as the database has them."""
    canary = client.enqueue("t", queue="idle").id
    make_running(conn, canary, "gone:1:x", lease_left=-1)
    _, port = supervise_scraped("--reaper-interval", "600", workers=1)
    # The reaper's first pass recovers the canary; the next pass is ten minutes away.
    wait_until(lambda: count(conn, "id = %s AND state = 'available'", [canary]), what="the reaper's first pass")
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() - interval '1 hour' WHERE id = %s", [canary])
    client.enqueue("t", queue="idle")
    client.enqueue("t", queue="idle", delay=3600)
    for expired in (False, True):
        job_id = client.enqueue("t", queue="idle").id
        make_running(conn, job_id, "elsewhere:1:x", lease_left=-60 if expired else 3600)

    # The gauges are the reaper's latest reading (every 0.2 s here), not a query at scrape time.
    samples = scrape_until(
        port,
        lambda s: (
            value(s, "miniqueue_jobs", queue="idle", state="running") == 2
            and value(s, "miniqueue_jobs", queue="idle", state="available") == 3
        ),
        "a reading taken after the last change",
    )
    assert value(samples, "miniqueue_jobs", queue="idle", state="available") == 3
    assert value(samples, "miniqueue_jobs", queue="idle", state="running") == 2
    assert value(samples, "miniqueue_expired_leases", queue="idle") == 1
    oldest = value(samples, "miniqueue_oldest_available_seconds", queue="idle")
    assert oldest is not None and 3600 <= oldest < 3700
    assert value(samples, "miniqueue_database_up") == 1


def test_a_blocked_sequence_key_is_a_gauge_naming_the_job_that_blocks_it(
    supervise_scraped: StartScraped, client: Client, conn: Connection
) -> None:
    dead = client.enqueue("t", queue="idle", sequence_key="acct:9").id
    for _ in range(2):
        client.enqueue("t", queue="idle", sequence_key="acct:9")
    conn.execute("UPDATE miniqueue_jobs SET state = 'dead', attempt = 1, finished_at = now() WHERE id = %s", [dead])
    _, port = supervise_scraped(workers=1)
    samples = scrape_until(
        port,
        lambda s: value(s, "miniqueue_sequence_blocked_jobs", key="acct:9", job=str(dead)) == 2,
        "the blocked key in a reading",
    )
    assert value(samples, "miniqueue_sequence_blocked_jobs", key="acct:9", job=str(dead)) == 2
    client.release_sequence("acct:9")
    scrape_until(
        port,
        lambda s: value(s, "miniqueue_sequence_blocked_jobs", key="acct:9", job=str(dead)) is None,
        "a reading without the released key",
    )


def test_what_holds_the_horizon_back_is_a_gauge_naming_its_pid(
    supervise_scraped: StartScraped, dsn: str, conn: Connection
) -> None:
    _, port = supervise_scraped(workers=1)
    with psycopg.connect(dsn, application_name="nightly-report") as other:
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM miniqueue_jobs")
        pid = str(other.info.backend_pid)
        held = (
            "miniqueue_horizon_held_seconds",
            frozenset({"kind": "transaction", "pid": pid, "name": "nightly-report"}.items()),
        )
        samples = scrape_until(port, lambda s: (s.get(held) or 0) > 0.5, "the open transaction in a reading")
        assert value(samples, "miniqueue_jobs_dead_rows") is not None
        other.rollback()
    scrape_until(port, lambda s: held not in s, "a reading after it ended")


def test_other_paths_and_methods_are_refused(supervise_scraped: StartScraped) -> None:
    _, port = supervise_scraped(workers=1)
    assert get(port, "/nope")[0] == 404
    assert get(port, "/metrics/extra")[0] == 404
    assert get(port, "/metrics", data=b"x=1")[0] == 405
    status, body = get(port, "/metrics?name=x")
    assert status == 200 and "miniqueue_processes" in body


def test_a_killed_worker_counts_as_a_restart(supervise_scraped: StartScraped) -> None:
    sup, port = supervise_scraped(workers=2)
    assert value(scrape(port), "miniqueue_child_restarts_total", kind="worker") in (None, 0)
    victim = sup.workers()[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(sup.workers()) == 2 and victim not in sup.workers(), what="the worker replaced")
    # The gauge read 2 before the kill too: wait for the restart to be counted as well.
    samples = scrape_until(
        port,
        lambda s: (
            value(s, "miniqueue_processes", kind="worker") == 2
            and value(s, "miniqueue_child_restarts_total", kind="worker") == 1
        ),
        "two workers, one restart",
    )
    assert value(samples, "miniqueue_processes", kind="worker") == 2
    assert value(samples, "miniqueue_child_restarts_total", kind="worker") == 1
    assert value(samples, "miniqueue_child_restarts_total", kind="reaper") in (None, 0)


def test_a_metrics_port_in_use_is_one_clear_line(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_miniqueue("supervise", "--app", APP, "--workers", "1", "--metrics-port", str(port), dsn=dsn)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert str(port) in result.stderr.strip().splitlines()[-1]


# --- JSON logs --------------------------------------------------------------------------------------


def json_entries(output: str) -> list[dict[str, Any]]:
    """Every line of ``output`` as a JSON log entry, asserting that each is one."""
    entries = []
    for line in output.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(entry, dict), line
        assert {"time", "level", "process", "pid", "logger", "message"} <= set(entry), line
        assert isinstance(entry["pid"], int) and entry["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        entries.append(entry)
    assert entries
    return entries


def test_json_logs_from_every_process_are_one_object_per_line(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    # An expired lease makes the reaper speak; a failing job and a completed one make workers run.
    lost = client.enqueue("t", queue="idle").id
    make_running(conn, lost, "gone:1:x", lease_left=-1)
    sup = supervise("--log-format", "json", workers=2)
    sup.wait_ready(2)
    done = client.enqueue("ok", queue="fast").id
    failed = client.enqueue("boom", queue="flaky", max_attempts=1).id
    wait_until(lambda: count(conn, "id = ANY(%s) AND state IN ('completed', 'dead')", [[done, failed]]) == 2)
    wait_until(lambda: f"job(s) {lost} available again" in sup.output(), what="the reaper's log line")
    workers = set(sup.workers())
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0

    entries = json_entries(sup.output())
    by_process: dict[str, set[int]] = {}
    for entry in entries:
        by_process.setdefault(entry["process"], set()).add(entry["pid"])
    assert by_process["supervisor"] == {sup.proc.pid}
    assert {"worker-1", "worker-2", "reaper"} <= set(by_process)
    assert by_process["worker-1"] | by_process["worker-2"] >= workers
    assert sup.proc.pid not in by_process["reaper"] | by_process["worker-1"] | by_process["worker-2"]
    messages = [e["message"] for e in entries]
    assert any(m.startswith("lease expired without renewal") for m in messages)
    [dead] = [e for e in entries if e.get("job", {}).get("job_id") == failed]
    assert dead["level"] == "ERROR" and dead["process"] in ("worker-1", "worker-2")
    assert {k: v for k, v in dead["job"].items() if k != "error"} == {
        "job_id": failed,
        "task": "boom",
        "queue": "flaky",
        "attempt": 1,
        "max_attempts": 1,
        "run": 1,
        "outcome": "dead",
    }
    assert "Traceback" in dead["job"]["error"] and dead["job"]["error"] in dead["message"]
    assert messages[-1] == "supervisor stopped"


def test_json_logs_with_the_embedded_server_are_json_too(tmp_path: Path, repo_root: Path) -> None:
    """Without a database URL the supervisor starts the embedded server; that is logged as JSON too."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["MINIQUEUE_DATA_DIR"] = str(tmp_path / "pgdata")
    sup = Supervised(None, ["--app", APP, "--workers", "1", "--log-format", "json", *FAST], tmp_path, repo_root, env)
    try:
        sup.harness.wait_ready(60)
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0
    finally:
        sup.stop()
    entries = json_entries(sup.output())
    assert {e["process"] for e in entries} >= {"supervisor", "worker-1", "reaper"}
