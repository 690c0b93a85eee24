"""Back-pressure: a handler (or a middleware) raises RateLimited and no worker on any host claims a
job of that key until the pause ends, by the database's clock; the raising job goes back
without spending an attempt, due when the pause ends."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from miniqueue import App, Client, InvalidInput, LeaseLost, Middleware, RateLimited, RunHook
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.store.store import Store
from miniqueue.tasks.job import Job
from miniqueue.web import create_app

from ..helpers import row, wait_until
from ..running import StartWorker

PAUSE = 2.0


@pytest.fixture
def starts(conn: Connection) -> str:
    """A table where handlers record each start on the database's clock."""
    conn.execute("CREATE TABLE IF NOT EXISTS starts (job BIGINT, key TEXT, at TIMESTAMPTZ DEFAULT clock_timestamp())")
    conn.execute("TRUNCATE starts")
    return "starts"


def record_start(dsn: str, job: Job) -> None:
    with psycopg.connect(dsn, autocommit=True) as own:
        own.execute("INSERT INTO starts (job, key) VALUES (%s, %s)", [job.id, job.payload.get("host")])


def paused_until(conn: Connection, scope: str) -> dt.datetime | None:
    found = conn.execute("SELECT paused_until FROM miniqueue_limits WHERE scope = %s", [scope]).fetchone()
    return found[0] if found else None


def enqueue(client: Client, task: str, payload: dict[str, Any], **options: Any) -> int:
    """A job of the app's tasks, with the limits its task declares (a Client has not the app's
    key functions)."""
    host = payload.get("host")
    if task == "call":
        options.update(rate_limit="1000/s", rate_limit_key=host)
    elif task == "upload":
        options.update(concurrency_key=host, max_concurrent=10)
    return client.enqueue(task, payload, **options).id


def app_calling(dsn: str) -> App:
    """Two tasks naming a host as their key (a rate limit, a concurrency limit): the first run of
    a job with ``trip`` hears "too many requests" and pauses its host."""
    app = App()

    def call(job: Job) -> None:
        record_start(dsn, job)
        if job.payload.get("trip") and job.run == 1:
            raise RateLimited(key=job.payload["host"], retry_after=PAUSE)

    app.task("call", rate_limit="1000/s", rate_limit_key=lambda p: p["host"])(call)
    app.task("upload", concurrency_key=lambda p: p["host"], max_concurrent=10)(lambda job: record_start(dsn, job))
    app.task("plain")(lambda job: record_start(dsn, job))
    return app


def test_a_paused_key_starts_no_job_before_the_pause_ends_and_others_run_on(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker, starts: str
) -> None:
    app = app_calling(dsn)
    # A job of the other task with the key, due later: its concurrency scope exists when the pause is raised.
    later = enqueue(client, "upload", {"host": "api"}, run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    trip = enqueue(client, "call", {"host": "api", "trip": True})
    for _ in range(4):
        start_worker(app)
    until = wait_until(lambda: paused_until(conn, "rate call api"), what="the key paused")
    assert paused_until(conn, "concurrency upload api") == until, "every task's scope of the key is paused"
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [later])
    paused = [enqueue(client, "call", {"host": "api", "i": i}) for i in range(6)]
    others = [enqueue(client, "call", {"host": "other", "i": i}) for i in range(6)]
    others += [enqueue(client, "plain", {"i": i}) for i in range(6)]
    everything = [trip, later, *paused, *others]
    wait_until(
        lambda: all(row(conn, job)["state"] == "completed" for job in everything), timeout=20, what="all completed"
    )
    recorded = conn.execute("SELECT job, at FROM starts ORDER BY at").fetchall()
    first_start = {job: at for job, at in reversed(recorded)}
    assert min(first_start[job] for job in [later, *paused]) >= until, "no job of the key starts inside the pause"
    assert [at for job, at in recorded if job == trip][1] >= until, "the raising job runs again once it ends"
    assert any(first_start[job] < until for job in others), "the other keys and unlimited jobs run on"


def test_a_limit_first_named_during_the_pause_is_paused_too_and_the_reaper_forgets_an_ended_pause(
    dsn: str, client: Client, store: Store, conn: Connection, start_worker: StartWorker, starts: str
) -> None:
    app = app_calling(dsn)
    trip = enqueue(client, "call", {"host": "api", "trip": True})
    start_worker(app)
    until = wait_until(lambda: paused_until(conn, "rate call api"), what="the key paused")
    assert paused_until(conn, "concurrency upload api") is None, "no job of the upload task named the key yet"
    late = app.enqueue(client, "upload", {"host": "api"}).id  # its task's first job of the key: a new limit row
    assert paused_until(conn, "concurrency upload api") == until
    wait_until(lambda: row(conn, late)["state"] == "completed", timeout=20, what="the late job completed")
    [(first,)] = conn.execute("SELECT min(at) FROM starts WHERE job = %s", [late]).fetchall()
    assert first >= until, "the job of a limit created during the pause waited for its end"
    # Both jobs are due when the pause ends; either may finish first.
    wait_until(lambda: row(conn, trip)["state"] == "completed", timeout=20, what="the raising job completed")
    assert conn.execute("SELECT count(*) FROM miniqueue_pauses").fetchone() == (1,)
    store.drop_ended_keys(conn)
    assert conn.execute("SELECT count(*) FROM miniqueue_pauses").fetchone() == (0,), "an ended pause is dropped"
    enqueue(client, "upload", {"host": "api", "after": True}, concurrency_key="api-2")
    assert paused_until(conn, "concurrency upload api-2") is None


def test_the_raising_job_spends_no_attempt_and_its_history_says_why(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker, starts: str
) -> None:
    app = app_calling(dsn)
    trip = enqueue(client, "call", {"host": "api", "trip": True}, max_attempts=1)
    start_worker(app)
    until = wait_until(lambda: paused_until(conn, "rate call api"), what="the key paused")
    raised = wait_until(lambda: (found := row(conn, trip))["errors"] and found, what="the history entry")
    assert (raised["state"], raised["scheduled_at"]) == ("available", until), "due when the pause ends"
    assert raised["max_attempts"] == 2, "its budget moved up with the attempt number: no attempt spent"
    assert raised["errors"][0]["error"] == "rate limited: key 'api' paused for 2s (RateLimited)"
    done = wait_until(lambda: (found := row(conn, trip))["state"] == "completed" and found, what="completed")
    assert (done["attempt"], done["max_attempts"]) == (2, 2), "the second run was within its one attempt"


def test_middleware_may_raise_it_and_the_pause_shows_in_limits(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker, starts: str
) -> None:
    class TooManyRequests(Middleware):
        def run(self, job: Job) -> RunHook:
            if job.run == 1:
                raise RateLimited(key="api", retry_after=60)
            return (yield)

    app = app_calling(dsn)
    app.middleware(TooManyRequests())
    trip = enqueue(client, "call", {"host": "api"})
    start_worker(app)
    until = wait_until(lambda: paused_until(conn, "rate call api"), what="the key paused by a middleware")
    result = CliRunner().invoke(main, ["limits", "--json", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    shown = {w["scope"]: w for w in json.loads(result.output)}["rate call api"]
    assert (shown["paused_until"], shown["paused_by"]) == (until.isoformat(), trip)
    text = CliRunner().invoke(main, ["limits", "--database-url", dsn]).output
    assert f"paused until {until.isoformat(timespec='seconds')} by job {trip}" in text
    with TestClient(create_app(client), base_url="http://localhost") as web:
        page = web.get("/queues").text
    limits = page[page.index("limits-heading") :]
    assert f'paused</strong> until {until.isoformat(timespec="seconds")} by <a href="/jobs/{trip}">' in limits


def test_a_longer_pause_is_not_shortened_and_a_stale_attempt_pauses_nothing(
    client: Client, store: Store, conn: Connection
) -> None:
    job = enqueue(client, "call", {"host": "api"})
    enqueue(client, "upload", {"host": "api"}, run_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    assert [lease.id for lease in store.claim(conn, ["default"], "w", 30.0, 1)] == [job]
    with pytest.raises(LeaseLost):
        store.rate_limit(conn, job, "w", 2, "api", 5)
    assert paused_until(conn, "rate call api") is None, "a stale attempt pauses nothing"
    conn.execute("UPDATE miniqueue_limits SET paused_until = now() + interval '1 hour' WHERE scope = 'rate call api'")
    longer = paused_until(conn, "rate call api")
    assert store.rate_limit(conn, job, "w", 1, "api", 5) == 2, "both tasks' scopes of the key"
    assert paused_until(conn, "rate call api") == longer
    assert row(conn, job)["scheduled_at"] == longer, "due when the longest pause ends"
    shorter = paused_until(conn, "concurrency upload api")
    assert shorter is not None and shorter < longer


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "api", "retry_after": -1}, "retry_after -1 is invalid: use a non-negative number of seconds"),
        ({"key": "", "retry_after": 30}, "rate-limited key '' is invalid: use 1-255 characters"),
        ({"key": "a\nb", "retry_after": 30}, "rate-limited key 'a\\nb' is invalid"),
        ({"key": "api", "retry_after": float("inf")}, "retry_after inf is invalid"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        RateLimited(**kwargs)
    assert message in str(caught.value)
