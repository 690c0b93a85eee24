"""The ``miniqueue`` command line on a real database, through click's CliRunner.

Every command is run for real against the test database; its effect is checked in the table
with SQL, and its errors are checked to be one clear line and a non-zero exit (never a traceback).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from miniqueue import App, Client, InvalidInput, State
from miniqueue.cli.main import main
from miniqueue.core.db import Connection, connect, mask_dsn
from miniqueue.observability.logs import JsonFormatter
from miniqueue.store.migrate import latest_version
from miniqueue.store.store import Release, Store
from miniqueue.tasks.job import Job
from miniqueue.worker.worker import Worker, WorkerConfig

from ..helpers import count, row, wait_until

Invoke = Callable[..., Result]

W = "test-host:1:cli"  # a worker id for jobs leased through the store
PASSWORD = "s3cr3t-pw"

#: An app with schedules, for `miniqueue periodic list --app tests.db.test_cli:PERIODIC_APP`.
PERIODIC_APP = App()
PERIODIC_APP.task("report", queue="reports")(lambda job: None)
PERIODIC_APP.task("cleanup", cron="*/5 * * * *")(lambda job: None)
PERIODIC_APP.periodic("0 9 * * *", task="report", name="morning-report", payload={"kind": "daily"})


def run(dsn: str, *args: str) -> Result:
    """``miniqueue <args> --database-url <dsn>``, with DATABASE_URL unset."""
    return CliRunner().invoke(main, [*args, "--database-url", dsn], env={"DATABASE_URL": None})


@pytest.fixture
def cli(dsn: str) -> Invoke:
    return lambda *args: run(dsn, *args)


@pytest.fixture
def periodic_table(conn: Connection) -> Connection:
    conn.execute("TRUNCATE miniqueue_periodic")
    return conn


def ok(result: Result) -> str:
    """The command's stdout, after checking that it succeeded."""
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output!r} {result.exception!r}"
    return result.stdout


def error_line(result: Result, *fragments: str, code: int = 1) -> str:
    """A command's error: exit ``code`` and exactly one line, ``Error: ...``, naming ``fragments``."""
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {result.output!r}"
    assert lines[0].startswith("Error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def bad_input(result: Result, *fragments: str) -> str:
    """Input that breaks a rule: exit 2 and one line, ``Error: ...``, naming ``fragments``."""
    return error_line(result, *fragments, code=2)


def usage_error(result: Result, *fragments: str) -> str:
    """A usage error: exit 2 and one line, ``Error: ...``, naming ``fragments`` and the command's
    ``--help`` (never click's usage block)."""
    line = error_line(result, *fragments, code=2)
    assert line.endswith(" --help')"), line
    return line


def claim(store: Store, conn: Connection, queue: str = "default") -> int:
    (lease,) = store.claim(conn, [queue], W, 30, 1)
    return lease.id


def make_dead(client: Client, store: Store, conn: Connection, *, queue: str = "default", task: str = "t") -> int:
    """A job that failed its only attempt, through the store's real transitions."""
    job_id = client.enqueue(task, {"n": 1}, queue=queue, max_attempts=1).id
    assert claim(store, conn, queue) == job_id
    assert store.record_failure(conn, job_id, W, 1, f"boom in {task}", 0) == State.DEAD
    return job_id


def finish(conn: Connection, job_id: int, state: str, ago: str) -> None:
    """Move a job to a terminal state that it reached ``ago`` (an SQL interval)."""
    conn.execute(
        "UPDATE miniqueue_jobs SET state = %s, attempt = 1, finished_at = now() - %s::interval,"
        " completed_at = CASE WHEN %s = 'completed' THEN now() - %s::interval END WHERE id = %s",
        [state, ago, state, ago, job_id],
    )
    Store().recount(conn)  # the finished-job counts, after a change made behind the store's back


def states(conn: Connection) -> dict[int, str]:
    return {i: s for i, s in conn.execute("SELECT id, state FROM miniqueue_jobs ORDER BY id").fetchall()}


# --- help and migrate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["migrate"],
        ["enqueue"],
        ["stats"],
        ["jobs"],
        ["jobs", "list"],
        ["jobs", "show"],
        ["requeue"],
        ["cancel"],
        ["prune"],
        ["periodic"],
        ["periodic", "list"],
        ["periodic", "enable"],
        ["periodic", "disable"],
        ["demo"],
        ["supervise"],
        ["queues", "pause"],
        ["queues", "resume"],
        ["queues", "list"],
        ["healthcheck"],
    ],
)
def test_every_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert ok(result).startswith("Usage: ")


def test_demo_help_says_what_the_demo_does() -> None:
    text = ok(CliRunner().invoke(main, ["demo", "--help"]))
    assert "five jobs" in text and "supervisor" in text and "priority" in text
    assert "seed" not in text.lower()


def test_migrate_creates_the_schema_once_and_commands_before_it_say_to_run_it(fresh_database: str) -> None:
    error_line(run(fresh_database, "stats"), "run `miniqueue migrate`")
    first = ok(run(fresh_database, "migrate"))
    assert first.startswith("applied ") and "001_create_jobs" in first and "008_periodic" in first
    assert ok(run(fresh_database, "migrate")).startswith("applied 0 migration(s)")
    assert ok(run(fresh_database, "stats", "--json")) == "[]\n"


# --- enqueue ----------------------------------------------------------------------------------------


def test_enqueue_with_every_option(cli: Invoke, conn: Connection) -> None:
    out = ok(
        cli(
            "enqueue",
            "send_email",
            "--queue",
            "emails",
            "--payload",
            '{"to": "ada@example.com"}',
            "--priority",
            "7",
            "--delay",
            "120",
            "--max-attempts",
            "3",
            "--idempotency-key",
            "welcome-ada",
            "--json",
        )
    )
    result = json.loads(out)
    assert result == {"id": result["id"], "duplicate": False, "replaced": False}
    stored = row(conn, result["id"])
    expected = {
        "task": "send_email",
        "queue": "emails",
        "payload": {"to": "ada@example.com"},
        "priority": 7,
        "max_attempts": 3,
        "idempotency_key": "welcome-ada",
        "state": "available",
    }
    assert {key: stored[key] for key in expected} == expected
    delay = (stored["scheduled_at"] - stored["created_at"]).total_seconds()
    assert 119 <= delay <= 121


def test_enqueue_at_a_time_with_an_offset(cli: Invoke, conn: Connection) -> None:
    out = ok(cli("enqueue", "report", "--run-at", "2031-01-02T09:30:00+02:00"))
    job_id = int(out.split()[1])
    assert out == f"job {job_id} enqueued\n"
    assert row(conn, job_id)["scheduled_at"] == dt.datetime(2031, 1, 2, 7, 30, tzinfo=dt.timezone.utc)
    assert row(conn, job_id)["payload"] == {}


def test_enqueue_a_duplicate_idempotency_key_reports_the_first_job(cli: Invoke, conn: Connection) -> None:
    first = json.loads(ok(cli("enqueue", "t", "--idempotency-key", "k-1", "--json")))
    again = ok(cli("enqueue", "t", "--idempotency-key", "k-1", "--payload", '{"other": true}'))
    assert again == f"job {first['id']} already existed (same idempotency key or unique key): nothing stored\n"
    assert json.loads(ok(cli("enqueue", "t", "--idempotency-key", "k-1", "--json"))) == {
        "id": first["id"],
        "duplicate": True,
        "replaced": False,
    }
    assert count(conn) == 1
    assert row(conn, first["id"])["payload"] == {}


def test_enqueue_a_payload_that_is_not_json_is_a_usage_error(cli: Invoke, conn: Connection) -> None:
    usage_error(cli("enqueue", "t", "--payload", "{nope"), "--payload", "not valid JSON")
    assert count(conn) == 0


def test_enqueue_a_naive_run_at_is_rejected(cli: Invoke, conn: Connection) -> None:
    usage_error(cli("enqueue", "t", "--run-at", "2031-01-02T09:30:00"), "--run-at", "2031-01-02T09:30:00")
    assert count(conn) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--payload", "NaN"], "nan"),
        (["--payload", '{"x": "\\u0000"}'], "U+0000"),
        (["--queue", "Bad Queue"], "queue name 'Bad Queue' is invalid"),
        (["--max-attempts", "0"], "max_attempts 0 is invalid"),
        (["--priority", "40000"], "priority 40000 is invalid"),
        (["--delay", "-5"], "delay -5.0 is invalid"),
        (["--delay", "5", "--run-at", "2031-01-02T09:30:00+00:00"], "mutually exclusive"),
        (["--idempotency-key", ""], "idempotency key '' is invalid"),
    ],
)
def test_enqueue_bad_input_is_one_line_and_stores_nothing(
    cli: Invoke, conn: Connection, args: list[str], message: str
) -> None:
    bad_input(cli("enqueue", "t", *args), message)
    assert count(conn) == 0


def test_enqueue_a_bad_task_name_is_one_line(cli: Invoke, conn: Connection) -> None:
    bad_input(cli("enqueue", "no spaces allowed"), "task name 'no spaces allowed' is invalid")
    assert count(conn) == 0


# --- stats ------------------------------------------------------------------------------------------


def test_stats_counts_states_the_oldest_waiting_job_and_expired_leases(
    cli: Invoke, client: Client, store: Store, conn: Connection
) -> None:
    old = client.enqueue("t", queue="emails").id
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() - interval '1 hour' WHERE id = %s", [old])
    client.enqueue("t", queue="emails")
    client.enqueue("t", queue="emails", delay=3600)
    expired = client.enqueue("t", queue="reports").id
    assert claim(store, conn, "reports") == expired
    conn.execute("UPDATE miniqueue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [expired])
    client.enqueue("t", queue="reports")
    assert claim(store, conn, "reports")  # running, lease still valid
    make_dead(client, store, conn, queue="reports")
    done = client.enqueue("t", queue="reports").id
    finish(conn, done, "completed", "1 minute")

    stats = {q["queue"]: q for q in json.loads(ok(cli("stats", "--json")))}
    assert set(stats) == {"emails", "reports"}
    emails, reports = stats["emails"], stats["reports"]
    assert {s.value: emails[s.value] for s in State} == {
        "available": 3,
        "running": 0,
        "completed": 0,
        "failed": 0,
        "dead": 0,
        "cancelled": 0,
        "waiting": 0,
        "expired": 0,
    }
    assert emails["scheduled"] == 1 and emails["expired_leases"] == 0
    assert 3600 <= emails["oldest_available_seconds"] < 3700
    assert {s.value: reports[s.value] for s in State} == {
        "available": 0,
        "running": 2,
        "completed": 1,
        "failed": 0,
        "dead": 1,
        "cancelled": 0,
        "waiting": 0,
        "expired": 0,
    }
    assert reports["expired_leases"] == 1 and reports["oldest_available_seconds"] is None

    # The JSON matches the table in the database ...
    for queue, state, n in conn.execute("SELECT queue, state, count(*) FROM miniqueue_jobs GROUP BY 1, 2"):
        assert stats[queue][state] == n
    # ... and the text table says the same.
    lines = ok(cli("stats")).splitlines()
    headers = lines[0].split("  ")
    headers = [h.strip() for h in headers if h.strip()]
    table = {cells[0]: dict(zip(headers, cells, strict=True)) for cells in (line.split() for line in lines[1:])}
    assert set(table) == {"emails", "reports"}
    for queue, values in stats.items():
        for state in State:
            assert table[queue][state.value] == str(values[state.value])
        assert table[queue]["expired leases"] == str(values["expired_leases"])
        assert table[queue]["scheduled"] == str(values["scheduled"])
    assert float(table["emails"]["oldest waiting (s)"]) >= 3600
    assert table["reports"]["oldest waiting (s)"] == "-"


def test_stats_of_an_empty_queue_table(cli: Invoke) -> None:
    assert json.loads(ok(cli("stats", "--json"))) == []
    assert ok(cli("stats")).startswith("queue")


# --- jobs list and jobs show ------------------------------------------------------------------------


@pytest.fixture
def mixed_jobs(client: Client, store: Store, conn: Connection) -> dict[str, list[int]]:
    """Seven jobs: 1-4 available alpha jobs in qa; in qb, beta jobs 5 dead, 6 running, 7 available."""
    jobs: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(4):
        jobs["a"].append(client.enqueue("alpha", {"i": i}, queue="qa", priority=i).id)
    jobs["b"].append(make_dead(client, store, conn, queue="qb", task="beta"))
    jobs["b"].append(client.enqueue("beta", queue="qb").id)
    assert claim(store, conn, "qb") == jobs["b"][-1]
    jobs["b"].append(client.enqueue("beta", queue="qb").id)
    return jobs


def test_jobs_list_is_newest_first_and_its_json_matches_the_rows(
    cli: Invoke, conn: Connection, mixed_jobs: dict[str, list[int]]
) -> None:
    found = json.loads(ok(cli("jobs", "list", "--json")))
    assert [j["id"] for j in found] == [7, 6, 5, 4, 3, 2, 1]
    for job in found:
        stored = row(conn, job["id"])
        for key in (
            "queue",
            "task",
            "payload",
            "state",
            "priority",
            "attempt",
            "max_attempts",
            "idempotency_key",
            "leased_by",
            "last_error",
        ):
            assert job[key] == stored[key], key
        assert dt.datetime.fromisoformat(job["created_at"]) == stored["created_at"]
        assert dt.datetime.fromisoformat(job["scheduled_at"]) == stored["scheduled_at"]
        assert len(job["errors"]) == len(stored["errors"])

    header, *lines = ok(cli("jobs", "list")).splitlines()
    assert header.split() == ["ID", "STATE", "QUEUE", "TASK", "ATTEMPT", "CREATED", "LAST", "ERROR", "OR", "PARENTS"]
    assert len(lines) == 7
    for line, job in zip(lines, found, strict=True):
        fields = line.split()
        assert fields[:5] == [
            str(job["id"]),
            job["state"],
            job["queue"],
            job["task"],
            f"{job['charged_attempts']}/{job['attempt_budget']}",
        ]
        assert header.index("STATE") == line.index(job["state"]), "each column under its header"
        assert header.index("TASK") == line.index(job["task"])
    assert lines[2].rstrip().endswith("boom in beta")  # the dead job shows its last error
    assert ok(cli("jobs", "list", "--queue", "nope")).splitlines() == [header.rstrip()], "the header alone"


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["--queue", "qa"], [4, 3, 2, 1]),
        (["--queue", "qb"], [7, 6, 5]),
        (["--task", "beta"], [7, 6, 5]),
        (["--state", "dead"], [5]),
        (["--state", "running"], [6]),
        (["--state", "available", "--queue", "qb"], [7]),
        (["--state", "available", "--task", "alpha", "--limit", "2"], [4, 3]),
        (["--queue", "nope"], []),
    ],
)
def test_jobs_list_filters(
    cli: Invoke, mixed_jobs: dict[str, list[int]], filters: list[str], expected: list[int]
) -> None:
    out = ok(cli("jobs", "list", *filters, "--json"))
    assert [job["id"] for job in json.loads(out)] == expected


def test_jobs_list_pages_with_before(cli: Invoke, mixed_jobs: dict[str, list[int]]) -> None:
    pages: list[list[int]] = []
    before: list[str] = []
    while True:
        out = ok(cli("jobs", "list", "--limit", "3", *before, "--json"))
        page = [job["id"] for job in json.loads(out)]
        if not page:
            break
        pages.append(page)
        before = ["--before", str(page[-1])]
    assert pages == [[7, 6, 5], [4, 3, 2], [1]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--state", "sleeping"], "'sleeping' is not one of"),
        (["--limit", "0"], "--limit"),
        (["--before", "x"], "'x' is not a valid integer"),
    ],
)
def test_jobs_list_bad_options_are_usage_errors(cli: Invoke, args: list[str], message: str) -> None:
    usage_error(cli("jobs", "list", *args), message)


def test_jobs_show_prints_every_field_and_the_error_history(
    cli: Invoke, client: Client, store: Store, conn: Connection
) -> None:
    job_id = client.enqueue("flaky", {"user": 42}, queue="emails", max_attempts=3, idempotency_key="f-42").id
    for attempt in (1, 2):
        claim(store, conn, "emails")
        store.record_failure(conn, job_id, W, attempt, f"Traceback ...\nValueError: failure {attempt}", 0)
    stored = row(conn, job_id)

    shown = json.loads(ok(cli("jobs", "show", str(job_id), "--json")))
    assert shown["id"] == job_id and shown["state"] == "available" and shown["attempt"] == 2
    assert (shown["task"], shown["queue"], shown["payload"], shown["idempotency_key"]) == (
        "flaky",
        "emails",
        {"user": 42},
        "f-42",
    )
    assert shown["last_error"] == "Traceback ...\nValueError: failure 2"
    assert [(e["attempt"], e["worker"], e["error"]) for e in shown["errors"]] == [
        (1, W, "Traceback ...\nValueError: failure 1"),
        (2, W, "Traceback ...\nValueError: failure 2"),
    ]
    assert [e["at"] for e in shown["errors"]] == [e.at.isoformat() for e in client.get(job_id).errors]
    assert len(stored["errors"]) == 2

    text = ok(cli("jobs", "show", str(job_id)))
    assert f"id: {job_id}" in text and "state: available" in text and 'payload: {"user": 42}' in text
    assert "attempt: 2 of 3\n" in text, "charged of the budget"
    assert "--- attempt 1 ended at " in text and f" on {W}\nTraceback ...\nValueError: failure 1" in text
    assert text.index("--- attempt 1 ") < text.index("--- attempt 2 ")
    assert text.rstrip().endswith("ValueError: failure 2")


def test_jobs_show_an_unknown_job_is_one_line(cli: Invoke) -> None:
    assert error_line(cli("jobs", "show", "999")) == "Error: job 999 does not exist"
    usage_error(cli("jobs", "show", "abc"), "'abc' is not a valid integer")


# --- requeue ----------------------------------------------------------------------------------------


def test_requeue_by_ids(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    dead = make_dead(client, store, conn)
    cancelled = client.enqueue("t").id
    client.cancel([cancelled])
    untouched = make_dead(client, store, conn)
    assert ok(cli("requeue", str(dead), str(cancelled))) == "requeued 2 job(s)\n"
    assert states(conn) == {dead: "available", cancelled: "available", untouched: "dead"}
    assert row(conn, dead)["max_attempts"] == 2  # attempt 1 + a fresh budget of 1
    assert row(conn, dead)["finished_at"] is None


def test_requeue_counts_a_repeated_id_once(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    dead = make_dead(client, store, conn)
    assert ok(cli("requeue", str(dead), str(dead))) == "requeued 1 job(s)\n"
    assert states(conn) == {dead: "available"}


def test_requeue_by_state_and_queue(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    dead_q = [make_dead(client, store, conn, queue="q") for _ in range(2)]
    dead_other = make_dead(client, store, conn, queue="other")
    failed_q = client.enqueue("t", queue="q").id
    finish(conn, failed_q, "failed", "1 minute")
    assert ok(cli("requeue", "--state", "dead", "--queue", "q")) == "requeued 2 job(s)\n"
    assert states(conn) == {dead_q[0]: "available", dead_q[1]: "available", dead_other: "dead", failed_q: "failed"}
    assert ok(cli("requeue", "--state", "dead", "--queue", "q")) == "requeued 0 job(s)\n"


def test_requeue_by_state_and_task(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    mine = make_dead(client, store, conn, task="mine")
    theirs = make_dead(client, store, conn, task="theirs")
    assert ok(cli("requeue", "--state", "dead", "--task", "mine")) == "requeued 1 job(s)\n"
    assert states(conn) == {mine: "available", theirs: "dead"}


@pytest.mark.parametrize(
    "args",
    [[], ["--queue", "q"], ["--task", "t"], ["1", "--state", "dead"]],
    ids=["no filter", "queue only", "task only", "ids and state"],
)
def test_requeue_needs_ids_or_a_state_but_not_both(
    cli: Invoke, client: Client, store: Store, conn: Connection, args: list[str]
) -> None:
    dead = make_dead(client, store, conn, queue="q", task="t")
    usage_error(cli("requeue", *args), "give job ids, or --state")
    assert states(conn) == {dead: "dead"}


def test_requeue_a_running_job_is_one_line_and_changes_nothing(
    cli: Invoke, client: Client, store: Store, conn: Connection
) -> None:
    dead = make_dead(client, store, conn)
    running = client.enqueue("t").id
    claim(store, conn)
    before = row(conn, running)
    error_line(cli("requeue", str(dead), str(running)), f"cannot requeue job {running}: it is running")
    assert states(conn) == {dead: "dead", running: "running"}
    assert row(conn, running) == before


def test_requeue_an_unknown_job_is_one_line(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    dead = make_dead(client, store, conn)
    assert error_line(cli("requeue", str(dead), "999")) == "Error: job 999 does not exist"
    assert states(conn) == {dead: "dead"}
    usage_error(cli("requeue", "--state", "running"), "'running' is not one of")


# --- cancel -----------------------------------------------------------------------------------------


def test_cancel_available_and_running_jobs(cli: Invoke, client: Client, store: Store, conn: Connection) -> None:
    available = client.enqueue("t").id
    running = client.enqueue("t").id
    conn.execute("UPDATE miniqueue_jobs SET priority = 1 WHERE id = %s", [running])
    assert claim(store, conn) == running
    assert ok(cli("cancel", str(available), str(running))) == "cancelled 2 job(s)\n"
    for job_id in (available, running):
        stored = row(conn, job_id)
        assert stored["state"] == "cancelled" and stored["finished_at"] is not None
        assert stored["leased_by"] is None and stored["lease_expires_at"] is None
    assert store.complete_many(conn, W, [(running, 1)]) == set(), "the old worker's completion must be rejected"
    assert row(conn, running)["state"] == "cancelled"


def test_cancel_counts_a_repeated_id_once(cli: Invoke, client: Client, conn: Connection) -> None:
    job_id = client.enqueue("t").id
    assert ok(cli("cancel", str(job_id), str(job_id))) == "cancelled 1 job(s)\n"
    assert states(conn) == {job_id: "cancelled"}


def test_cancel_an_unknown_or_finished_job_is_one_line_and_changes_nothing(
    cli: Invoke, client: Client, conn: Connection
) -> None:
    available = client.enqueue("t").id
    done = client.enqueue("t").id
    finish(conn, done, "completed", "1 minute")
    assert error_line(cli("cancel", str(available), "999")) == "Error: job 999 does not exist"
    error_line(cli("cancel", str(available), str(done)), f"cannot cancel job {done}: it is completed")
    assert states(conn) == {available: "available", done: "completed"}
    usage_error(cli("cancel"), "Missing argument")


def test_cancel_a_job_running_under_a_real_worker_tells_its_handler_to_stop(
    cli: Invoke, dsn: str, client: Client, conn: Connection
) -> None:
    app = App()
    started = threading.Event()
    reasons: list[str | None] = []

    @app.task("long")
    def long(job: Job) -> None:
        started.set()
        job.wait(30)
        reasons.append(job.stop_reason)

    job_id = app.enqueue(client, "long").id
    worker = Worker(app, dsn, WorkerConfig(lease_duration=2, heartbeat_seconds=0.3, poll_interval=0.2))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert started.wait(10), "the handler never started"
        assert ok(cli("cancel", str(job_id))) == "cancelled 1 job(s)\n"
        wait_until(lambda: reasons, timeout=5, what="the handler told to stop")
        assert reasons == ["cancelled"]
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()
    stored = row(conn, job_id)
    assert stored["state"] == "cancelled" and stored["attempt"] == 1 and stored["completed_at"] is None


# --- prune ------------------------------------------------------------------------------------------


@pytest.fixture
def aged_jobs(client: Client, store: Store, conn: Connection) -> dict[str, int]:
    """One job per state and age: finished two days ago, or one hour ago, or not finished."""
    jobs = {}
    for name, state, ago in [
        ("completed_old", "completed", "2 days"),
        ("completed_young", "completed", "1 hour"),
        ("cancelled_old", "cancelled", "2 days"),
        ("cancelled_young", "cancelled", "1 hour"),
        ("dead_old", "dead", "2 days"),
        ("failed_old", "failed", "2 days"),
        ("dead_young", "dead", "1 hour"),
    ]:
        jobs[name] = client.enqueue("t").id
        finish(conn, jobs[name], state, ago)
    jobs["available"] = client.enqueue("t").id
    conn.execute("UPDATE miniqueue_jobs SET created_at = now() - interval '3 days' WHERE id = %s", [jobs["available"]])
    jobs["running"] = client.enqueue("t").id
    conn.execute("UPDATE miniqueue_jobs SET priority = 1 WHERE id = %s", [jobs["running"]])
    assert claim(store, conn) == jobs["running"]
    return jobs


def remaining(conn: Connection, jobs: dict[str, int]) -> set[str]:
    present = {i for (i,) in conn.execute("SELECT id FROM miniqueue_jobs").fetchall()}
    return {name for name, job_id in jobs.items() if job_id in present}


def test_prune_deletes_completed_and_cancelled_jobs_older_than_the_age(
    cli: Invoke, conn: Connection, aged_jobs: dict[str, int]
) -> None:
    out = ok(cli("prune", "--older-than", "1d"))
    assert out == "deleted 2 job(s) (completed, cancelled) finished over 86400s ago\n"
    assert remaining(conn, aged_jobs) == set(aged_jobs) - {"completed_old", "cancelled_old"}


def test_prune_only_the_chosen_states(cli: Invoke, conn: Connection, aged_jobs: dict[str, int]) -> None:
    assert ok(cli("prune", "--older-than", "24h", "--state", "dead")) == (
        "deleted 1 job(s) (dead) finished over 86400s ago\n"
    )
    assert remaining(conn, aged_jobs) == set(aged_jobs) - {"dead_old"}
    assert ok(cli("prune", "--older-than", "30m", "--state", "failed", "--state", "completed")).startswith(
        "deleted 3 job(s) (failed, completed)"
    )
    assert remaining(conn, aged_jobs) == set(aged_jobs) - {"dead_old", "failed_old", "completed_old", "completed_young"}


@pytest.mark.parametrize(("age", "deleted"), [("3d", 0), ("2w", 0), ("90000", 2), ("1500m", 2), ("59m", 4)])
def test_prune_durations(cli: Invoke, conn: Connection, aged_jobs: dict[str, int], age: str, deleted: int) -> None:
    assert ok(cli("prune", "--older-than", age)).startswith(f"deleted {deleted} job(s)")
    assert len(remaining(conn, aged_jobs)) == len(aged_jobs) - deleted


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Missing option '--older-than'"),
        (["--older-than", "-1d"], "must not be negative"),
        (["--older-than", "soon"], "'soon' is not a duration"),
        (["--older-than", "nan"], "'nan' is not a duration"),
        (["--older-than", "1d", "--state", "running"], "'running' is not one of"),
        (["--older-than", "1d", "--state", "available"], "'available' is not one of"),
    ],
)
def test_prune_bad_options_are_usage_errors_and_delete_nothing(
    cli: Invoke, conn: Connection, aged_jobs: dict[str, int], args: list[str], message: str
) -> None:
    usage_error(cli("prune", *args), message)
    assert remaining(conn, aged_jobs) == set(aged_jobs)


def test_prune_an_absurd_age_is_one_line(cli: Invoke, conn: Connection, aged_jobs: dict[str, int]) -> None:
    bad_input(cli("prune", "--older-than", "inf"), "prune age inf is invalid")
    assert remaining(conn, aged_jobs) == set(aged_jobs)


# --- periodic ---------------------------------------------------------------------------------------


def test_periodic_disable_and_enable_toggle_the_row(cli: Invoke, store: Store, periodic_table: Connection) -> None:
    conn = periodic_table
    slot = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc)
    assert store.claim_periodic_slot(conn, "morning-report", slot)

    def stored() -> tuple[Any, ...] | None:
        return conn.execute(
            "SELECT last_slot, enabled FROM miniqueue_periodic WHERE name = 'morning-report'"
        ).fetchone()

    assert ok(cli("periodic", "disable", "morning-report")) == "schedule morning-report disabled\n"
    assert stored() == (slot, False)
    assert ok(cli("periodic", "disable", "morning-report")) == "schedule morning-report disabled\n"
    assert stored() == (slot, False)
    assert ok(cli("periodic", "enable", "morning-report")) == "schedule morning-report enabled\n"
    assert stored() == (slot, True)


def test_periodic_disable_a_schedule_never_run_yet(cli: Invoke, periodic_table: Connection) -> None:
    ok(cli("periodic", "disable", "cleanup", "--app", "tests.db.test_cli:PERIODIC_APP"))
    rows = periodic_table.execute("SELECT enabled FROM miniqueue_periodic WHERE name = 'cleanup'").fetchall()
    assert rows == [(False,)]


def test_periodic_list_shows_each_schedule_and_its_state(cli: Invoke, periodic_table: Connection) -> None:
    ok(cli("periodic", "disable", "cleanup", "--app", "tests.db.test_cli:PERIODIC_APP"))
    lines = ok(cli("periodic", "list", "--app", "tests.db.test_cli:PERIODIC_APP")).splitlines()
    assert len(lines) == 2
    cleanup, morning = lines
    assert cleanup.split()[:5] == ["cleanup", "*/5", "*", "*", "*"]
    assert "task cleanup" in cleanup and "disabled" in cleanup
    assert morning.startswith("morning-report") and "0 9 * * *" in morning and "task report" in morning
    assert " enabled " in morning and "last -" in morning
    next_slot = dt.datetime.fromisoformat(morning.split("next ")[1].strip())
    assert (next_slot.hour, next_slot.minute, next_slot.utcoffset()) == (9, 0, dt.timedelta(0))


def test_periodic_list_without_an_app_lists_what_the_database_holds(
    cli: Invoke, client: Client, store: Store, periodic_table: Connection
) -> None:
    """The schedules a scheduler has run or an operator switched (the code's: their definition is
    in the code, so '-' here) and those created at run time (in full), by name."""
    slot = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc)
    assert store.claim_periodic_slot(periodic_table, "morning-report", slot)
    ok(cli("periodic", "disable", "cleanup", "--app", "tests.db.test_cli:PERIODIC_APP"))
    client.schedules.create("digest", "0 8 * * 1", task="report", timezone="Europe/Berlin")

    cleanup, digest, morning = ok(cli("periodic", "list")).splitlines()
    assert cleanup.split()[:7] == ["cleanup", "-", "-", "code", "task", "-", "disabled"]
    assert cleanup.endswith("next -"), "no cron here: no next slot"
    assert digest.split()[:10] == ["digest", "0", "8", "*", "*", "1", "Europe/Berlin", "runtime", "task", "report"]
    next_digest = dt.datetime.fromisoformat(digest.split("next ")[1].strip())
    assert (next_digest.weekday(), next_digest.hour) == (0, 8), "on Berlin's clock"
    assert morning.split()[:8] == ["morning-report", "-", "-", "code", "task", "-", "enabled", "last"]
    assert "last 2030-01-01 09:00:00+00:00  next -" in morning, "its slot in UTC: its zone is the code's"
    as_json = json.loads(ok(cli("periodic", "list", "--json")))
    assert [(s["name"], s["kind"], s["cron"], s["enabled"]) for s in as_json] == [
        ("cleanup", "code", None, False),
        ("digest", "runtime", "0 8 * * 1", True),
        ("morning-report", "code", None, True),
    ]
    assert dt.datetime.fromisoformat(as_json[2]["last_slot"]) == slot and as_json[2]["next_slot"] is None
    # With --app: the app's schedules in full, then the runtime ones (as before).
    with_app = json.loads(ok(cli("periodic", "list", "--app", "tests.db.test_cli:PERIODIC_APP", "--json")))
    assert [(s["name"], s["kind"], s["cron"], s["enabled"]) for s in with_app] == [
        ("cleanup", "code", "*/5 * * * *", False),
        ("morning-report", "code", "0 9 * * *", True),
        ("digest", "runtime", "0 8 * * 1", True),
    ]


def test_periodic_list_of_an_empty_database_prints_nothing(cli: Invoke, periodic_table: Connection) -> None:
    assert ok(cli("periodic", "list")) == ""
    assert json.loads(ok(cli("periodic", "list", "--json"))) == []


def test_periodic_list_needs_a_loadable_app_when_given_one(cli: Invoke) -> None:
    bad_input(cli("periodic", "list", "--app", "nocolon"), "app reference 'nocolon' is invalid")
    bad_input(
        cli("periodic", "list", "--app", "tests.db.test_cli:NOPE"), "module 'tests.db.test_cli' has no attribute 'NOPE'"
    )


#: Each way an --app can fail to load, and what its one line says (where, for an error the app's own code raised).
BAD_APPS = {
    "a typo in the module": ("tests.apss.supervised:app", "ModuleNotFoundError: No module named 'tests.apss'"),
    "a module that raises": ("tests.apps.broken:app", "RuntimeError: this app is broken on purpose (at "),
}


@pytest.mark.parametrize("command", [["periodic", "list"], ["periodic", "enable", "x"], ["web"]], ids=" ".join)
@pytest.mark.parametrize(("app", "message"), list(BAD_APPS.values()), ids=list(BAD_APPS))
def test_an_app_that_does_not_load_is_one_line_and_exit_2(
    cli: Invoke, command: list[str], app: str, message: str
) -> None:
    module = app.split(":")[0]
    line = bad_input(cli(*command, "--app", app), f"cannot import module '{module}' for app '{app}'", message)
    assert "^" not in line and "importlib" not in line
    if "broken" in app:
        assert line.endswith("tests/apps/broken.py:3)"), "the file and line that raised"


# --- usage errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["enqueue", "t", "--priority", "abc"],
            "Error: Invalid value for '--priority': 'abc' is not a valid integer (see 'miniqueue enqueue --help')",
        ),
        (
            ["enqueue", "t", "--prioritty", "3"],
            "Error: No such option '--prioritty'. Did you mean '--priority'? (see 'miniqueue enqueue --help')",
        ),
        (["enqueue"], "Error: Missing argument 'TASK' (see 'miniqueue enqueue --help')"),
        (["nosuch"], "Error: No such command 'nosuch' (see 'miniqueue --help')"),
        (["--nosuch"], "Error: No such option '--nosuch' (see 'miniqueue --help')"),
        (
            ["queues", "limit", "mail"],
            "Error: give either MAX_RUNNING or --remove (see 'miniqueue queues limit --help')",
        ),
    ],
)
def test_a_usage_error_is_one_line_naming_the_problem_and_the_help(args: list[str], line: str) -> None:
    result = CliRunner().invoke(main, args, prog_name="miniqueue", env={"DATABASE_URL": "postgresql://unused/db"})
    assert (result.exit_code, result.output) == (2, line + "\n")


def test_a_usage_error_of_miniqueue_supervise_is_one_line(repo_root: Path) -> None:
    """The supervisor's own entry point, as an operator runs it."""
    code = "from miniqueue.cli import supervise_main; supervise_main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "--app", "a:b", "--workers", "x"],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "Error: Invalid value for '--workers': 'x': use a number (4) or a range MIN:MAX (2:16) "
        "(see 'miniqueue-supervise --help')\n"
    )


def test_a_group_without_a_command_still_shows_its_help() -> None:
    result = CliRunner().invoke(main, ["queues"], prog_name="miniqueue")
    assert "Usage: miniqueue queues [OPTIONS] COMMAND [ARGS]..." in result.output
    assert "Pause, resume and cap queues." in result.output


# --- the database URL -------------------------------------------------------------------------------

COMMANDS = [
    ["migrate"],
    ["enqueue", "t"],
    ["stats"],
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["requeue", "1"],
    ["cancel", "1"],
    ["prune", "--older-than", "1d"],
    ["periodic", "enable", "x"],
]


BAD_URLS = {
    "port not a number": f"postgresql://alice:{PASSWORD}@db.example:notaport/queue",
    "port out of range": f"postgresql://alice:{PASSWORD}@db.example:99999/queue",
    "unknown parameter": f"postgresql://alice:{PASSWORD}@db.example/queue?nosuch=1",
    "bad ipv6 host": f"postgresql://alice:{PASSWORD}@[::1/queue",
    "unterminated quote": f"host=db.example password='{PASSWORD}",
    "unknown keyword": f"host=db.example password={PASSWORD} nosuch=1",
}


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("url", list(BAD_URLS.values()), ids=list(BAD_URLS))
def test_an_unparseable_database_url_is_a_config_error_without_the_password(command: list[str], url: str) -> None:
    result = run(url, *command)
    line = error_line(result, "database URL", "is invalid")
    assert PASSWORD not in result.output, line


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://alice:s3cr3t/pw@db.example:5432/queue", "s3cr3t"),
        ("postgresql://alice:p4ss@w0rd@db.example:nope/queue", "w0rd"),
    ],
    ids=["unescaped slash", "unescaped at sign"],
)
def test_a_password_with_an_unescaped_character_is_never_echoed(url: str, secret: str) -> None:
    """A password holding '/' or '@' (not percent-encoded) is what makes such a URL unparseable."""
    result = run(url, "stats")
    error_line(result, "database URL", "is invalid")
    assert secret not in result.output


def test_the_database_url_can_come_from_the_environment(dsn: str, conn: Connection) -> None:
    result = CliRunner().invoke(main, ["enqueue", "from-env"], env={"DATABASE_URL": dsn})
    assert ok(result).endswith(" enqueued\n")
    assert count(conn, "task = 'from-env'") == 1
    bad = CliRunner().invoke(main, ["stats"], env={"DATABASE_URL": f"postgresql://a:{PASSWORD}@h:x/db"})
    error_line(bad, "database URL")
    assert PASSWORD not in bad.output


@pytest.mark.parametrize("command", [["migrate"], ["stats"]], ids=" ".join)
def test_an_unreachable_database_is_one_line_without_the_password(command: list[str]) -> None:
    result = run(f"postgresql://alice:{PASSWORD}@127.0.0.1:1/queue?connect_timeout=2", *command)
    error_line(result, "database unavailable")
    assert PASSWORD not in result.output


# --- demo -------------------------------------------------------------------------------------------


def test_demo_runs_its_jobs_through_a_supervisor(cli: Invoke, conn: Connection) -> None:
    out = ok(cli("demo"))
    assert out.count("enqueued ") == 5
    assert out.endswith("all 5 demo jobs completed, in priority order (FIFO within a priority)\n")
    assert count(conn, "state = 'completed'") == 5 and count(conn) == 5


def test_demo_migrates_the_database_it_is_given_and_says_so_without_the_password(fresh_database: str) -> None:
    """A fresh database, as `createdb` leaves it: the demo migrates it (one line, the password
    masked) instead of stopping at "run `miniqueue migrate` first"."""
    # The test servers trust their clients (embedded) or take the DSN's own password: one added
    # here is never checked, and stands for the one a user's DSN carries.
    with_password = (
        fresh_database
        if conninfo_to_dict(fresh_database).get("password")
        else make_conninfo(fresh_database, password=PASSWORD)
    )
    out = ok(run(with_password, "demo"))
    first = out.splitlines()[0]
    assert first == f"migrated {mask_dsn(with_password)} to schema version {latest_version()}", first
    assert str(conninfo_to_dict(with_password)["password"]) not in out
    assert out.endswith("all 5 demo jobs completed, in priority order (FIFO within a priority)\n")
    with connect(fresh_database, purpose="test") as conn:
        assert count(conn, "state = 'completed'") == 5 and count(conn) == 5


# --- a password in every form a DSN can take ------------------------------------------------------

#: Passwords holding an unescaped or a percent-encoded delimiter: libpq's URL parser cuts such a
#: password into host, port and database name, decoded, and may echo any of those pieces.
LEAKY_URLS = {
    "encoded @ and a bare /": ("postgresql://app:S3cret%40x/Wurd9@127.0.0.1:1/db", ["S3cret", "Wurd9", "S3cret@x"]),
    "short piece as port": ("postgresql://app:ab/Cdefgh@127.0.0.1:1/db", ["Cdefgh", ":ab", "'ab'"]),
    "password= query": ("postgresql://app@127.0.0.1:1/db?pass%77ord=Hunter%32x&connect_timeout=2", ["Hunter"]),
    "two-word key=value": ("host=127.0.0.1 port=1 password=Two Words dbname=db", ["Two", "Words"]),
}


@pytest.mark.parametrize("command", [["stats"], ["migrate"], ["healthcheck"]], ids=" ".join)
@pytest.mark.parametrize(("url", "secrets"), list(LEAKY_URLS.values()), ids=list(LEAKY_URLS))
def test_no_form_of_the_password_is_ever_printed(command: list[str], url: str, secrets: list[str]) -> None:
    result = run(url, *command)
    assert "Traceback" not in result.output and result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    for secret in secrets:
        assert secret not in result.output, result.output


def test_healthcheck_with_a_malformed_url_is_one_line() -> None:
    result = run("postgresql://app:S3cret%40x/word@127.0.0.1:1/db", "healthcheck")
    line = error_line(result, "database URL", "is invalid", "part of the password")
    assert "S3cret" not in line


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("not a url", 'missing "=" after "not" in connection info string'),
        ("postgresql://alice@db.example/queue?nosuch=1", 'invalid URI query parameter: "nosuch"'),
        ("host=db.example password=Two Words", 'missing "=" after "***"'),
    ],
)
def test_an_invalid_url_keeps_the_parsers_reason(url: str, reason: str) -> None:
    result = CliRunner().invoke(main, ["stats"], env={"DATABASE_URL": url})
    line = error_line(result, "database URL", "is invalid", reason, "postgresql://user:password@host")
    assert "Two" not in line and "Words" not in line


# --- inputs that must not end in a traceback ------------------------------------------------------


def test_a_payload_nested_too_deeply_is_a_usage_error(cli: Invoke, conn: Connection) -> None:
    usage_error(cli("enqueue", "t", "--payload", "[" * 5000 + "]" * 5000), "--payload", "nested too deeply")
    assert count(conn) == 0


@pytest.mark.parametrize("job_id", ["18446744073709551616", "9223372036854775808", "0"])
@pytest.mark.parametrize(
    "command",
    [["cancel"], ["requeue"], ["jobs", "show"], ["jobs", "list", "--before"]],
    ids=" ".join,
)
def test_a_job_id_outside_bigint_is_a_usage_error(
    cli: Invoke, client: Client, conn: Connection, command: list[str], job_id: str
) -> None:
    job = client.enqueue("t").id
    usage_error(cli(*command, job_id), job_id, "1<=x<=9223372036854775807")
    assert states(conn) == {job: "available"}


def test_the_largest_job_id_is_accepted(cli: Invoke) -> None:
    assert error_line(cli("jobs", "show", str(2**63 - 1))) == f"Error: job {2**63 - 1} does not exist"
    assert json.loads(ok(cli("jobs", "list", "--before", str(2**63 - 1), "--json"))) == []


# Bytes that are not UTF-8 on a command line reach click as str with lone surrogates (Python's
# surrogateescape): "\udcff" is the byte 0xff.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "t", "--idempotency-key", "key-\udcff"], "idempotency key 'key-\\udcff' is invalid"),
        (["enqueue", "t", "--payload", '{"s": "\udcff"}'], "lone surrogate"),
        (["enqueue", "t\udcff"], "task name 't\\udcff' is invalid"),
        (["enqueue", "t", "--queue", "q\udcff"], "queue name 'q\\udcff' is invalid"),
        (["jobs", "list", "--task", "t\udcff"], "task name 't\\udcff' is invalid"),
        (["jobs", "list", "--queue", "q\udcff"], "queue name 'q\\udcff' is invalid"),
        (["requeue", "--state", "dead", "--task", "t\udcff"], "task name 't\\udcff' is invalid"),
        (["periodic", "disable", "x\udcff"], "schedule name 'x\\udcff' is invalid"),
        (["queues", "pause", "q\udcff"], "queue name 'q\\udcff' is invalid"),
    ],
)
def test_text_that_is_not_utf8_is_one_line_and_stores_nothing(
    cli: Invoke, conn: Connection, args: list[str], message: str
) -> None:
    bad_input(cli(*args), message)
    assert count(conn) == 0
    assert conn.execute("SELECT count(*) FROM miniqueue_periodic").fetchone() == (0,)


def test_bytes_that_are_not_utf8_on_a_real_command_line(dsn: str, conn: Connection, repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", "enqueue", "t", "--idempotency-key", b"key-\xff"],
        env={**os.environ, "DATABASE_URL": dsn},
        cwd=repo_root,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode().strip() == "Error: idempotency key 'key-\\udcff' is invalid: " + (
        "'\\udcff' is a lone surrogate, not valid Unicode"
    )
    assert count(conn) == 0


def test_a_schedule_name_is_checked_like_the_dashboard_checks_it(cli: Invoke, periodic_table: Connection) -> None:
    bad_input(cli("periodic", "disable", "x'; drop table miniqueue_jobs;--"), "schedule name", "is invalid")
    assert periodic_table.execute("SELECT count(*) FROM miniqueue_periodic").fetchone() == (0,)


# --- unknown queue and schedule names ------------------------------------------------------------


def paused_rows(conn: Connection) -> dict[str, bool]:
    return dict(conn.execute("SELECT name, paused FROM miniqueue_queues").fetchall())


def test_pausing_an_unknown_queue_names_it_and_the_known_ones(cli: Invoke, client: Client, conn: Connection) -> None:
    client.enqueue("t", queue="emails")
    line = bad_input(cli("queues", "pause", "emials"), "queue 'emials' is unknown", "known: emails")
    assert line.endswith("to set a queue before its first job, pass --create"), "the command line's words"
    assert "create=True" not in line
    assert paused_rows(conn) == {}
    limited = bad_input(cli("queues", "limit", "emials", "3"), "queue 'emials' is unknown")
    assert limited.endswith("pass --create")
    with pytest.raises(InvalidInput, match=r"before its first job, pass create=True$"):  # the Python API's words
        client.pause_queues(["emials"])


def test_errors_of_the_command_line_name_its_options_not_python_arguments(
    cli: Invoke, client: Client, conn: Connection
) -> None:
    """An error that tells its reader what to pass says it in the words of where it was raised:
    the command's options on the command line, the keyword arguments in Python."""
    client.schedules.create("digest", "0 8 * * 1", task="report")
    line = bad_input(cli("periodic", "change", "digest"), "nothing to change in schedule 'digest'")
    assert line.endswith("pass --cron ..., --payload ..., --timezone ... or --enable/--disable"), line
    with pytest.raises(InvalidInput, match=r"pass cron=\.\.\., payload=\.\.\., timezone=\.\.\. or enabled=\.\.\.$"):
        client.schedules.change("digest")

    keyed = App()
    keyed.task("per_order", unique_key=lambda payload: f"order-{payload['order']}")(lambda job: None)
    client.declare(keyed)
    line = bad_input(cli("enqueue", "per_order", "--payload", '{"order": 1}'), "computes its unique_key")
    assert "pass --unique-key ... here" in line and "unique_key=..." not in line
    with pytest.raises(InvalidInput, match=r"pass unique_key=\.\.\. here"):
        client.enqueue("per_order", {"order": 1})
    assert ok(cli("enqueue", "per_order", "--payload", '{"order": 1}', "--unique-key", "order-1")).startswith("job ")
    assert count(conn) == 1


def test_pausing_several_queues_pauses_none_if_one_is_unknown(cli: Invoke, client: Client, conn: Connection) -> None:
    client.enqueue("t", queue="emails")
    client.enqueue("t", queue="reports")
    bad_input(cli("queues", "pause", "emails", "nosuch", "reports", "other"), "queues 'nosuch', 'other' are unknown")
    assert paused_rows(conn) == {}
    assert ok(cli("queues", "pause", "emails", "reports")) == "paused emails, reports\n"
    assert paused_rows(conn) == {"emails": True, "reports": True}


def test_known_queues_are_those_waiting_running_finished_or_already_set(
    cli: Invoke, client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue("t", queue="waiting")
    client.enqueue("t", queue="busy")
    claim(store, conn, "busy")
    done = client.enqueue("t", queue="finished").id
    finish(conn, done, "completed", "1 minute")
    assert ok(cli("queues", "pause", "waiting", "busy")) == "paused waiting, busy\n"
    # A queue whose jobs have all finished is known too (by its finished-job counts): `stats` and
    # `queues list` show it. One with no job at all needs --create.
    assert ok(cli("queues", "pause", "finished")) == "paused finished\n"
    assert ok(cli("queues", "resume", "finished")) == "resumed finished\n"
    bad_input(cli("queues", "pause", "later"), "queue 'later' is unknown", "known: busy, finished, waiting")
    assert ok(cli("queues", "pause", "later", "--create")) == "paused later\n"
    assert ok(cli("queues", "resume", "later")) == "resumed later\n"
    assert paused_rows(conn) == {"waiting": True, "busy": True, "finished": False, "later": False}
    assert json.loads(ok(cli("queues", "list", "--json"))) == [
        {"queue": "busy", "paused": True, "max_running": None, "age_after": None},
        {"queue": "finished", "paused": False, "max_running": None, "age_after": None},
        {"queue": "waiting", "paused": True, "max_running": None, "age_after": None},
    ]


def test_resuming_an_unknown_queue_is_an_error_too(cli: Invoke, conn: Connection) -> None:
    bad_input(cli("queues", "resume", "nosuch"), "queue 'nosuch' is unknown", "known: none yet")
    assert paused_rows(conn) == {}


def test_client_pause_and_resume_queues(client: Client, conn: Connection) -> None:
    client.enqueue("t", queue="emails")
    with pytest.raises(InvalidInput, match="queue 'nosuch' is unknown"):
        client.pause_queues(["emails", "nosuch"])
    assert paused_rows(conn) == {}
    assert client.pause_queues(["emails", "emails", "later"], create=True) == ["emails", "later"]
    assert client.list_queues() == {"emails": True, "later": True}
    assert client.resume_queues(["later"]) == ["later"]
    assert client.list_queues() == {"emails": True}  # "later" has no jobs and is not paused
    with pytest.raises(InvalidInput, match="no queue name given"):
        client.pause_queues([])


@pytest.mark.parametrize("statement", ["_known_queues", "_known_queue_names"])
def test_the_known_queue_lookups_never_scan_the_jobs_table(store: Store, conn: Connection, statement: str) -> None:
    # With sequential scans priced out, a plan still holding one has no index to use instead.
    params = {"names": ["a", "b"], "limit": 20}
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + getattr(store, statement), params).fetchall())
    assert "Seq Scan on miniqueue_jobs" not in plan, plan


def test_switching_an_unknown_schedule_names_it_and_the_known_ones(
    cli: Invoke, store: Store, periodic_table: Connection
) -> None:
    store.claim_periodic_slot(periodic_table, "morning-report", dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc))
    line = bad_input(
        cli("periodic", "disable", "mornig-report"), "schedule 'mornig-report' is unknown", "known: morning-report"
    )
    assert "needs the app" in line
    bad_input(
        cli("periodic", "enable", "nosuch", "--app", "tests.db.test_cli:PERIODIC_APP"), "known: cleanup, morning-report"
    )
    rows = periodic_table.execute("SELECT name, enabled FROM miniqueue_periodic").fetchall()
    assert rows == [("morning-report", True)]


def test_client_enable_and_disable_schedule(client: Client, periodic_table: Connection) -> None:
    with pytest.raises(InvalidInput, match="schedule 'cleanup' is unknown"):
        client.disable_schedule("cleanup")
    client.disable_schedule("cleanup", app=PERIODIC_APP)
    assert client.periodic_state()["cleanup"][1] is False
    client.enable_schedule("cleanup")  # it has a row now
    assert client.periodic_state()["cleanup"][1] is True
    with pytest.raises(InvalidInput, match="schedule name"):
        client.enable_schedule("no spaces")


# --- output formats ------------------------------------------------------------------------------


def test_requeue_of_a_job_in_the_wrong_state_says_which_states_can_be_requeued(
    cli: Invoke, client: Client, conn: Connection
) -> None:
    done = client.enqueue("t").id
    finish(conn, done, "completed", "1 minute")
    line = error_line(cli("requeue", str(done)))
    assert line.endswith(
        f"cannot requeue job {done}: it is completed; only cancelled, dead, expired, failed jobs can be requeued"
    )
    line = error_line(cli("cancel", str(done)))
    assert line.endswith("only available, running, waiting jobs can be cancelled")


def test_every_list_prints_one_json_array(cli: Invoke, client: Client) -> None:
    client.enqueue("t", queue="emails")
    client.pause_queues(["emails"])
    for command in (["stats"], ["jobs", "list"], ["queues", "list"]):
        out = ok(cli(*command, "--json"))
        assert out.count("\n") == 1, out
        found = json.loads(out)
        assert isinstance(found, list) and len(found) == 1, command


def test_json_timestamps_are_iso_8601_with_t_and_offset(cli: Invoke, client: Client, conn: Connection) -> None:
    job_id = client.enqueue("t").id
    shown = json.loads(ok(cli("jobs", "show", str(job_id), "--json")))
    (listed,) = json.loads(ok(cli("jobs", "list", "--json")))
    for job in (shown, listed):
        text = job["created_at"]
        assert "T" in text and " " not in text, text
        parsed = dt.datetime.fromisoformat(text)
        assert parsed.utcoffset() is not None and parsed == row(conn, job_id)["created_at"]


def test_the_json_log_time_is_utc_with_its_zone() -> None:
    record = logging.LogRecord("miniqueue.test", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "hello there"
    assert entry["time"].endswith("Z"), entry["time"]
    logged = dt.datetime.fromisoformat(entry["time"].replace("Z", "+00:00"))
    assert logged.utcoffset() == dt.timedelta(0)
    assert abs(logged.timestamp() - record.created) < 0.001


def test_jobs_list_and_show_read_attempts_as_charged_of_the_budget(
    cli: Invoke, client: Client, store: Store, conn: Connection
) -> None:
    """Runs handed back uncharged move the attempt number (a fencing token) but charge nothing:
    what an operator reads is charged of the budget, and the runs."""
    job_id = client.enqueue("t", queue="q", max_attempts=5).id
    for run in (1, 2, 3):
        claim(store, conn, "q")
        store.release(conn, W, [Release(job_id, run, "handed back unstarted")])
    claim(store, conn, "q")
    store.record_failure(conn, job_id, W, 4, "boom", 0)
    assert (row(conn, job_id)["attempt"], row(conn, job_id)["max_attempts"]) == (4, 8)
    [line] = ok(cli("jobs", "list")).splitlines()[1:]
    assert line.split()[4] == "1/5"
    assert "attempt: 1 of 5, 4 runs\n" in ok(cli("jobs", "show", str(job_id)))
