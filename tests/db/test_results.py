"""Handler results: stored by the completion, read with Client.result, waited for with Client.wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from psycopg import sql

from miniqueue import (
    Client,
    InvalidInput,
    JobFailed,
    JobNotFinished,
    JobNotFound,
    PermanentError,
    WaitTimeout,
)
from miniqueue.core.db import Connection, connect
from miniqueue.core.steps import run
from miniqueue.core.validation import DEFAULT_MAX_PAYLOAD_BYTES, encode_result
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job

from ..helpers import row, wait_until
from ..running import RunOne, StartWorker


def echo_app() -> App:
    """``echo`` returns its payload's ``value`` (or a string of ``big`` characters); ``silent``
    returns nothing."""
    app = App()

    @app.task("echo", max_attempts=1)
    def echo(job: Job) -> Any:
        if "big" in job.payload:  # too large to travel in a payload
            return "\u00e9" * job.payload["big"]
        return job.payload["value"]

    @app.task("silent")
    def silent(job: Job) -> None:
        pass

    return app


# A string that makes the result just under the size limit once encoded (quotes included).
NEAR_LIMIT = "é" * ((DEFAULT_MAX_PAYLOAD_BYTES - 2) // 2)

AWKWARD = [
    "h\u00e9llo \u2713 \U0001d11e \u0645\u0631\u062d\u0628\u0627",
    {"nested": [{"deep": [1, 2.5, None, True, {"k": "\\u0000 is text here"}]}], "": "empty key"},
    NEAR_LIMIT,
    False,
    0,
    "",
    [],
    {},
    -2.5,
]


def test_results_round_trip_awkward_json(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = echo_app()
    ids = [client.enqueue("echo", {"big": len(v)} if v is NEAR_LIMIT else {"value": v}).id for v in AWKWARD]
    silent = client.enqueue("silent").id
    start_worker(app)
    wait_until(lambda: all(row(conn, j)["state"] == "completed" for j in [*ids, silent]), what="every job completed")
    for job_id, value in zip(ids, AWKWARD, strict=True):
        result = client.result(job_id)
        assert result == value and type(result) is type(value)
        assert row(conn, job_id)["result"] == value
    # Returning nothing stores no result (SQL NULL), unlike returning False or 0.
    assert client.result(silent) is None
    stored = conn.execute(
        "SELECT result IS NULL, count(*) FILTER (WHERE result = 'null') FROM miniqueue_jobs "
        "WHERE id = %s GROUP BY result",
        [silent],
    ).fetchone()
    assert stored == (True, 0)
    assert conn.execute("SELECT result = 'false'::jsonb FROM miniqueue_jobs WHERE id = %s", [ids[3]]).fetchone() == (
        True,
    )


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({1, 2}, "not JSON-serialisable"),
        (float("nan"), "nan, inf or -inf"),
        ("x" * DEFAULT_MAX_PAYLOAD_BYTES, "the limit is"),
        ("a\x00b", "U+0000"),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_attempt(
    client: Client, conn: Connection, start_worker: StartWorker, value: Any, error: str
) -> None:
    app = App()
    app.task("bad", max_attempts=1)(lambda job: value)
    job_id = client.enqueue("bad", max_attempts=1).id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead")
    stored = row(conn, job_id)
    assert stored["result"] is None and stored["completed_at"] is None
    assert "returned a value that cannot be stored as its result" in stored["last_error"]
    assert error in stored["last_error"]
    with pytest.raises(JobFailed, match=f"job {job_id} ended dead"):
        client.result(job_id)


def test_result_says_why_there_is_none(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("refuse", max_attempts=1)
    def refuse(job: Job) -> None:
        raise PermanentError("no thanks")

    with pytest.raises(JobNotFound):
        client.result(12345)
    waiting = client.enqueue("refuse", max_attempts=1).id
    with pytest.raises(JobNotFinished, match=f"job {waiting} has not finished: it is available"):
        client.result(waiting)
    cancelled = client.enqueue("refuse").id
    client.cancel([cancelled])
    with pytest.raises(JobFailed, match="ended cancelled"):
        client.result(cancelled)
    start_worker(app)
    wait_until(lambda: row(conn, waiting)["state"] == "failed", what="job failed")
    with pytest.raises(JobFailed, match=r"ended failed.*no thanks") as failed:
        client.result(waiting)
    assert failed.value.state == "failed" and "PermanentError" in (failed.value.error or "")
    with pytest.raises(InvalidInput):
        client.result(0)


def test_wait_wakes_when_the_job_completes_and_returns_its_result(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    job_id = client.enqueue("echo", {"value": {"answer": 42}}).id
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(client.wait(job_id, timeout=60)))
    waiter.start()
    wait_until(lambda: row(conn, job_id)["awaited"], what="the waiter flagged the job")
    start_worker(echo_app())
    waiter.join(60)
    assert not waiter.is_alive() and got == [{"answer": 42}]
    # A job that already finished: no wait at all.
    assert client.wait(job_id, timeout=0) == {"answer": 42}


def test_wait_raises_when_the_job_fails_or_is_cancelled(client: Client, conn: Connection) -> None:
    job_id = client.enqueue("echo").id
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            client.wait(job_id, timeout=60)
        except JobFailed as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: row(conn, job_id)["awaited"], what="the waiter flagged the job")
    client.cancel([job_id])
    waiter.join(60)
    assert not waiter.is_alive() and len(raised) == 1 and "ended cancelled" in str(raised[0])


def test_wait_times_out_cleanly(client: Client, conn: Connection) -> None:
    job_id = client.enqueue("echo", {"value": 1}).id
    with pytest.raises(WaitTimeout, match=f"job {job_id} did not finish within 0.2s: it is still available"):
        client.wait(job_id, timeout=0.2)
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["attempt"] == 0
    # The wait's own connection is closed.
    gone = (
        "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'miniqueue:wait' "
        "AND datname = current_database()"
    )
    wait_until(lambda: conn.execute(gone).fetchone() == (True,), what="the wait's connection closed")
    with pytest.raises(WaitTimeout):
        client.wait(job_id, timeout=0)


def test_only_awaited_jobs_notify_when_they_finish(
    client: Client, conn: Connection, dsn: str, start_worker: StartWorker
) -> None:
    store = Store()
    with connect(dsn, purpose="test") as listener:
        run(listener, store.listen_finished_steps())
        plain = client.enqueue("echo", {"value": 1}).id
        awaited = client.enqueue("echo", {"value": 2}).id
        run(conn, store.await_job_steps(awaited))
        start_worker(echo_app())
        wait_until(lambda: all(row(conn, j)["state"] == "completed" for j in (plain, awaited)), what="completed")
        received = [n.payload for n in listener.notifies(timeout=0.5)]
    assert received == [str(awaited)]


def test_set_result_inside_a_transaction_commits_with_the_completion(client: Client, run_one: RunOne) -> None:
    def tx(job: Job) -> None:
        with job.transaction() as c:
            c.execute("SELECT 1")
            job.set_result({"written": job.id})

    job_id = run_one(tx, "completed")["id"]
    assert client.result(job_id) == {"written": job_id}


def test_an_async_handler_returns_a_result(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("aecho")
    async def aecho(job: Job) -> Any:
        return ["async", job.payload["n"]]

    @app.task("atx")
    async def atx(job: Job) -> None:
        async with job.atransaction() as c:
            await c.execute("SELECT 1")
            job.set_result("from the transaction")

    plain, tx = client.enqueue("aecho", {"n": 7}).id, client.enqueue("atx").id
    start_worker(app)
    assert client.wait(plain, timeout=30) == ["async", 7]
    assert client.wait(tx, timeout=30) == "from the transaction"


def test_encode_result_keeps_none_as_no_result() -> None:
    assert encode_result(None) is None
    assert encode_result(False) == "false" and encode_result(0) == "0" and encode_result("") == '""'


def test_waiting_for_a_due_job_announces_it_again(client: Client, dsn: str) -> None:
    """Marking a job awaited locks its row for a moment; a worker's claim that ran in that moment
    passed over it (SKIP LOCKED) and spent its wake-up, so the mark announces a job that is due
    now again on its queue's channel: it never waits for the next poll because of a waiter."""
    store = Store()
    due = client.enqueue("t", queue="q").id
    later = client.enqueue("t", queue="later", delay=3600).id
    with connect(dsn, purpose="test") as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.channel)))
        with connect(dsn, purpose="test") as conn:
            run(conn, store.await_job_steps(later))
            run(conn, store.await_job_steps(due))
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["q"], "the due job's queue, and only it, was announced"
