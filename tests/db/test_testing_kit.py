"""miniqueue.testing: run_jobs through the real worker and store, the assertions, the database
helpers, and the pytest plugin as a user's suite loads it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from unittest.mock import ANY

import psycopg
import pytest
from psycopg.types.string import TextLoader

import miniqueue
from miniqueue import Client, State
from miniqueue.core.db import Connection
from miniqueue.testing import (
    RunTimeout,
    assert_enqueued,
    clean_database,
    enqueued_jobs,
    run_jobs,
    temporary_database,
)

from ..helpers import count


def make_app(calls: list[tuple[str, int]]) -> miniqueue.App:
    app = miniqueue.App()

    @app.task("ok")
    def ok(job: miniqueue.Job) -> None:
        calls.append(("ok", job.run))

    @app.task("flaky", max_attempts=3)
    def flaky(job: miniqueue.Job) -> None:
        calls.append(("flaky", job.run))
        if job.run < 2:
            raise ValueError(f"flaky attempt {job.run}")

    @app.task("broken", max_attempts=2)
    def broken(job: miniqueue.Job) -> None:
        calls.append(("broken", job.run))
        raise RuntimeError("always broken")

    @app.task("refused")
    def refused(job: miniqueue.Job) -> None:
        raise miniqueue.PermanentError("not this one")

    return app


def test_run_jobs_records_every_outcome_through_the_real_store(client: Client, conn: Connection) -> None:
    calls: list[tuple[str, int]] = []
    app = make_app(calls)
    ids = {task: app.enqueue(client, task, {"n": i}).id for i, task in enumerate(["ok", "flaky", "broken", "refused"])}

    result = run_jobs(app, client)

    assert result.stopped_by == "idle"
    assert [job.id for job in result.completed] == [ids["ok"], ids["flaky"]]
    assert [job.id for job in result.dead] == [ids["broken"]]
    assert [job.id for job in result.failed] == [ids["refused"]]
    assert result.pending == []
    # Immediate retries: each job's whole story in one call, attempts charged as in production.
    assert sorted(calls) == [("broken", 1), ("broken", 2), ("flaky", 1), ("flaky", 2), ("ok", 1)]
    outcomes = [(run.task, run.attempt, run.outcome) for run in result.runs if run.task == "flaky"]
    assert outcomes == [("flaky", 1, "retried"), ("flaky", 2, "completed")]
    assert "ValueError: flaky attempt 1" in result.errors(ids["flaky"])[0]
    assert len(result.errors(ids["broken"])) == 2
    assert "not this one" in (result.job(ids["refused"]).last_error or "")
    # The rows say the same: written by the worker's fenced statements, not by the kit.
    assert count(conn, "state = 'completed'") == 2
    assert count(conn, "state = 'dead' AND attempt = 2") == 1
    assert "job 3 broken attempt 2: dead: RuntimeError: always broken" in str(result)


def test_retries_later_leave_the_job_scheduled(client: Client, conn: Connection) -> None:
    calls: list[tuple[str, int]] = []
    app = make_app(calls)
    job_id = app.enqueue(client, "flaky").id

    result = run_jobs(app, client, retries="later", timeout=5)

    assert calls == [("flaky", 1)]
    assert [run.outcome for run in result.runs] == ["retried"]
    assert result.runs[0].delay >= 5
    assert [job.id for job in result.pending] == [job_id]
    assert count(conn, "id = %s AND state = 'available' AND scheduled_at > now() + interval '4 seconds'", [job_id]) == 1
    # Nothing is due: a second run does nothing.
    assert run_jobs(app, client).runs == ()


def test_run_jobs_skips_scheduled_jobs_and_other_queues(client: Client) -> None:
    calls: list[tuple[str, int]] = []
    app = make_app(calls)
    app.enqueue(client, "ok", delay=3600)
    client.enqueue("ok", queue="elsewhere")
    assert run_jobs(app, client).runs == ()
    result = run_jobs(app, client, queues=["elsewhere"])
    assert [(run.queue, run.outcome) for run in result.runs] == [("elsewhere", "completed")]


def test_jobs_enqueued_by_handlers_run_in_the_same_call(dsn: str, client: Client) -> None:
    app = miniqueue.App()

    @app.task("parent")
    def parent(job: miniqueue.Job) -> None:
        with job.transaction() as conn:  # the child exists only if the parent completes
            client.enqueue("child", {"of": job.id}, conn=conn)

    @app.task("child")
    def child(job: miniqueue.Job) -> None:
        pass

    client.enqueue("parent")
    result = run_jobs(app, dsn)
    assert [(run.task, run.outcome) for run in result.runs] == [
        ("parent", "completed_in_transaction"),
        ("child", "completed"),
    ]
    assert_enqueued(client, task="child", payload={"of": 1}, state=State.COMPLETED, count=1)


def test_max_jobs_stops_the_run(client: Client) -> None:
    calls: list[tuple[str, int]] = []
    app = make_app(calls)
    client.enqueue_many([miniqueue.JobSpec("ok", {"n": i}) for i in range(5)])
    result = run_jobs(app, client, max_jobs=2)
    assert result.stopped_by == "max_jobs"
    assert len(result.completed) == 2
    assert len(enqueued_jobs(client, state="available")) == 3


def test_timeout_raises_with_what_ran(client: Client) -> None:
    release = threading.Event()
    app = miniqueue.App()

    @app.task("slow")
    def slow(job: miniqueue.Job) -> None:
        release.wait(10)

    @app.task("quick")
    def quick(job: miniqueue.Job) -> None:
        pass

    client.enqueue("quick", priority=1)
    client.enqueue("slow")
    with pytest.raises(RunTimeout) as caught:
        run_jobs(app, client, timeout=0.5)
    release.set()
    assert caught.value.result.stopped_by == "timeout"
    assert [run.task for run in caught.value.result.runs] == ["quick"]
    assert "still due or running after 0.5s" in str(caught.value)


HANGING_TEST = """
import time

import miniqueue
from miniqueue.testing import run_jobs

app = miniqueue.App()

@app.task("hang", timeout=1)
def hang(job: miniqueue.Job) -> None:
    time.sleep(600)  # deaf to its timeout

def test_a_handler_that_never_returns(miniqueue_client: miniqueue.Client) -> None:
    miniqueue_client.declare(app)
    miniqueue_client.enqueue("hang")
    run_jobs(app, miniqueue_client, timeout=2)
"""


def run_users_suite(folder: Path, server_dsn: str, repo_root: Path, test: str) -> subprocess.CompletedProcess[str]:
    """``test`` as a user's ``test_user.py`` in ``folder``, run by pytest in a process of its own
    with the plugin, on the suite's server; the process must end by itself (a timeout here is
    the failure)."""
    (folder / "test_user.py").write_text(textwrap.dedent(test))
    env = {**os.environ, "TEST_DATABASE_URL": server_dsn, "PYTHONPATH": str(repo_root)}
    # A --basetemp of its own: pytest prunes old numbered temporary folders, the outer session's
    # (where its embedded server's data lives) among them.
    args = ["-p", "miniqueue.testing", "-p", "no:cacheprovider", "-q", "--basetemp", str(folder / "tmp")]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "test_user.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_a_handler_that_never_returns_fails_the_test_names_its_job_and_lets_the_process_end(
    tmp_path: Path, server_dsn: str, repo_root: Path
) -> None:
    done = run_users_suite(tmp_path, server_dsn, repo_root, HANGING_TEST)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed" in done.stdout, done.stdout
    assert "RunTimeout: run_jobs: jobs still due or running after 2s" in done.stdout, done.stdout
    assert "job 1 hang attempt 1: its handler is still running after" in done.stdout, done.stdout


def test_run_jobs_on_an_unmigrated_database_raises(fresh_database: str) -> None:
    with pytest.raises(miniqueue.SchemaOutOfDate):
        run_jobs(make_app([]), fresh_database)


def test_retries_must_be_named() -> None:
    with pytest.raises(miniqueue.ConfigError, match="retries 'soon' is invalid"):
        run_jobs(make_app([]), "postgresql://nowhere/db", retries="soon")  # type: ignore[arg-type]


def test_assertions_read_the_rows(client: Client) -> None:
    client.enqueue("send", {"to": "a@example.com", "n": 1}, queue="mail")
    client.enqueue("send", {"to": "b@example.com", "n": 2}, queue="mail", delay=60)
    client.enqueue("other")

    jobs = assert_enqueued(client, task="send", payload={"to": "b@example.com", "n": ANY}, count=1)
    assert jobs[0].queue == "mail"
    assert [job.payload["n"] for job in enqueued_jobs(client, queue="mail")] == [1, 2]  # oldest first
    assert enqueued_jobs(client, task="send", state="completed") == []

    with pytest.raises(AssertionError) as caught:
        assert_enqueued(client, task="send", payload={"to": "c@example.com"})
    message = str(caught.value)
    assert "expected at least 1 job(s) matching task='send', payload={'to': 'c@example.com'}, found 0" in message
    assert "job 1: task='send' queue='mail' state=available payload={'n': 1, 'to': 'a@example.com'}" in message
    with pytest.raises(AssertionError, match="expected 1 job"):
        assert_enqueued(client, task="send", count=1)


def test_assertions_read_an_open_transaction_on_conn(client: Client, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as own, own.transaction() as block:
        own.adapters.register_loader("jsonb", TextLoader)  # as Django's connections load jsonb
        job = client.enqueue("welcome", {"user": "ada"}, conn=own)
        assert enqueued_jobs(client) == []  # not committed: the pool's connections see nothing
        [found] = assert_enqueued(client, task="welcome", payload={"user": "ada"}, conn=own)
        assert (found.id, found.payload, found.errors) == (job.id, {"user": "ada"}, ())
        with pytest.raises(AssertionError, match=r"found 1\nstored jobs:\n  job \d+: task='welcome' .*'ada'"):
            assert_enqueued(client, task="welcome", count=2, conn=own)
        raise psycopg.Rollback(block)  # leaves the block, rolled back
    assert enqueued_jobs(client) == []


def test_database_helpers_create_clean_and_drop(server_dsn: str) -> None:
    with temporary_database(server_dsn, prefix="miniqueue_kit") as dsn:
        with Client(dsn) as client:
            client.enqueue("t")
            client.pause_queues(["default"])
            clean_database(dsn)
            assert enqueued_jobs(client) == []
            assert client.list_queues() == {}
            assert client.enqueue("t").id == 1  # ids restart
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn) as admin:
        assert admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name]).fetchone() == (0,)


USER_TEST = """
import miniqueue
import pytest
from miniqueue.testing import assert_enqueued, run_jobs

app = miniqueue.App()
sent = []

@app.task("welcome", queue="mail")
def welcome(job: miniqueue.Job) -> None:
    sent.append(job.payload["user"])

def sign_up(client: miniqueue.Client, user: str) -> None:
    app.enqueue(client, "welcome", {"user": user})

def test_sign_up_sends_a_welcome(miniqueue_client: miniqueue.Client) -> None:
    sign_up(miniqueue_client, "ada")
    assert_enqueued(miniqueue_client, task="welcome", payload={"user": "ada"}, queue="mail")
    result = run_jobs(app, miniqueue_client)
    assert [job.payload for job in result.completed] == [{"user": "ada"}]
    assert sent == ["ada"]

def test_each_test_starts_from_an_empty_queue(miniqueue_dsn: str) -> None:
    with miniqueue.Client(miniqueue_dsn) as client:
        assert client.enqueue("welcome").id == 1

@pytest.fixture
def miniqueue_app() -> miniqueue.App:
    return app

def test_jobs_enqueued_by_name_take_their_tasks_queue(miniqueue_client: miniqueue.Client) -> None:
    miniqueue_client.chain([miniqueue.JobSpec("welcome", {"user": "bo"}), miniqueue.JobSpec("welcome", {"user": "cy"})])
    assert_enqueued(miniqueue_client, task="welcome", payload={"user": "bo"}, queue="mail")
    result = run_jobs(app, miniqueue_client)
    assert [job.payload["user"] for job in result.completed] == ["bo", "cy"]
"""


def test_the_plugin_in_a_users_suite(tmp_path: Path, server_dsn: str, repo_root: Path) -> None:
    done = run_users_suite(tmp_path, server_dsn, repo_root, USER_TEST)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
