"""Durable jobs: steps that run once, durable sleep, waiting for a signal (docs/guides/durable.md).

Each test runs a real worker on a real database and asserts what the rows say: the steps
recorded, the runs counted in a table of the handler's own, the attempts charged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from miniqueue import AsyncClient, Client, SignalTimeout, State, StepError
from miniqueue.core.db import Connection
from miniqueue.core.errors import InvalidInput, LeaseLost
from miniqueue.core.steps import run
from miniqueue.maintenance.reaper import Reaper
from miniqueue.store.store import Store
from miniqueue.supervise.reports import QueueGauges, decode, encode
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.web import create_app

from ..helpers import expire_lease, row, take_lease_away, take_over, wait_until
from ..running import RunOne, StartWorker, worker_starter
from .test_web import on_localhost


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    """Workers with a 10 s lease unless a test asks for less: these tests never wait for a lease to
    expire (but the stale attempt's), and a claimed job must not outlive its lease unstarted when
    the machine is slow."""
    yield from worker_starter(dsn, lease_duration=10.0, heartbeat_seconds=2.0)


@pytest.fixture
def runs(conn: Connection) -> Connection:
    """A table where each step's function counts its runs (committed at once)."""
    conn.execute("CREATE TABLE IF NOT EXISTS step_runs (job_id BIGINT, step TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS ledger (job_id BIGINT PRIMARY KEY, amount INT)")
    conn.execute("TRUNCATE step_runs, ledger")
    return conn


def counter(dsn: str, job: Job, step: str) -> Any:
    """A step's function: counts its run in step_runs, returns a value."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO step_runs VALUES (%s, %s)", [job.id, step])
    return {"step": step, "job": job.id}


def step_runs(conn: Connection, job_id: int) -> list[str]:
    return [r[0] for r in conn.execute("SELECT step FROM step_runs WHERE job_id = %s ORDER BY step", [job_id])]


def finished(conn: Connection, job_id: int) -> bool:
    return row(conn, job_id)["state"] in ("completed", "failed", "dead")


def parked(client: Client, conn: Connection, start_worker: StartWorker, key: str) -> int:
    """A job that returns the data of signal ``key``, parked waiting for it (its worker runs on)."""
    app = App()
    app.task("w")(lambda job: job.wait_for(key))
    job_id = app.enqueue(client, "w").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "waiting", what="parked")
    return job_id


def test_a_recorded_step_does_not_run_again_when_the_job_retries(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    seen: list[Any] = []

    @app.task("order", max_attempts=3)
    def order(job: Job) -> str:
        reserved = job.step("reserve", counter, dsn, job, "reserve")
        charged = job.step("charge", counter, dsn, job, "charge")
        seen.append((reserved, charged))
        if job.run == 1:
            raise RuntimeError("the mailer is down")
        job.step("mail", counter, dsn, job, "mail")
        return "done"

    job_id = app.enqueue(client, "order").id
    start_worker(app)
    stored = row_when_finished(runs, job_id, client)
    assert stored["state"] == "completed" and stored["result"] == "done"
    assert step_runs(runs, job_id) == ["charge", "mail", "reserve"], "each step ran once"
    assert seen[0] == seen[1] == ({"step": "reserve", "job": job_id}, {"step": "charge", "job": job_id})
    assert [s["name"] for s in stored["steps"]] == ["reserve", "charge", "mail"]
    assert [s["attempt"] for s in stored["steps"]] == [1, 1, 2]


def row_when_finished(conn: Connection, job_id: int, client: Client, timeout: float = 20.0) -> dict[str, Any]:
    """The job's row once it finished, making its retries due at once."""

    def done() -> bool:
        try:
            conn.execute(
                "UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s AND state = 'available'", [job_id]
            )
        except psycopg.errors.SerializationFailure:
            return False  # a worker claimed or finished the job meanwhile (its row moved): look again
        return finished(conn, job_id)

    wait_until(done, timeout=timeout, what=f"job {job_id} finished")
    return row(conn, job_id)


def test_a_step_transactions_writes_commit_with_its_record_exactly_once(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()

    def book(conn: Connection, job: Job, amount: int) -> int:
        conn.execute("INSERT INTO ledger VALUES (%s, %s)", [job.id, amount])
        return amount

    @app.task("ledger", max_attempts=3)
    def ledger(job: Job) -> int:
        amount: int = job.step_transaction("book", book, job, 42)
        if job.run == 1:
            raise RuntimeError("after the booking")
        return amount

    job_id = app.enqueue(client, "ledger").id
    start_worker(app)
    stored = row_when_finished(runs, job_id, client)
    assert stored["state"] == "completed" and stored["result"] == 42
    assert runs.execute("SELECT job_id, amount FROM ledger").fetchall() == [(job_id, 42)]


def test_a_step_transaction_of_a_lost_lease_rolls_back(client: Client, runs: Connection, store: Store) -> None:
    job_id = client.enqueue("x", {}).id
    (lease,) = store.claim(runs, ["default"], "w1", 30, 1)
    expire_lease(runs, job_id)
    store.recover_expired_leases(runs)
    take_over(runs, store, job_id, "w2")
    with pytest.raises(LeaseLost):
        run(runs, store.record_step_steps(job_id, "w1", lease.attempt, "stale", "1"))
    assert row(runs, job_id)["steps"] is None, "a stale attempt records no step"


def test_a_durable_sleep_hands_the_job_back_without_spending_an_attempt(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    parked = threading.Event()

    @app.task("nap", max_attempts=1)
    def nap(job: Job) -> str:
        job.step("before", counter, dsn, job, "before")
        job.sleep(3600)
        job.step("after", counter, dsn, job, "after")
        return "woke"

    job_id = app.enqueue(client, "nap").id
    start_worker(app)
    slept = wait_until(lambda: (r := row(runs, job_id))["state"] == "available" and r["steps"] and r, what="asleep")
    parked.set()
    assert slept["leased_by"] is None and slept["lease_expires_at"] is None
    assert [s["kind"] for s in slept["steps"]] == ["step", "sleep"]
    due_in = runs.execute("SELECT scheduled_at - now() FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
    assert due_in is not None and due_in[0].total_seconds() > 3500, "due when the sleep ends, on the database clock"
    runs.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [job_id])  # the hour passed
    stored = row_when_finished(runs, job_id, client)
    assert stored["state"] == "completed" and stored["result"] == "woke", "max_attempts=1: the sleep spent none"
    assert client.get(job_id).charged_attempts == 1
    assert step_runs(runs, job_id) == ["after", "before"]


def test_a_signal_resumes_the_job_waiting_for_it(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("approve", max_attempts=1)
    def approve(job: Job) -> Any:
        job.step("asked", counter, dsn, job, "asked")
        decision = job.wait_for(f"approval:{job.id}")
        return {"decision": decision}

    job_id = app.enqueue(client, "approve").id
    start_worker(app)
    wait_until(lambda: row(runs, job_id)["state"] == "waiting", what="parked")
    parked = client.get(job_id)
    assert parked.signal_key == f"approval:{job_id}" and parked.leased_by is None
    assert parked.steps[-1].waiting and parked.steps[-1].key == f"approval:{job_id}"
    assert client.list_jobs(state=State.WAITING)[0].id == job_id
    assert client.signal(f"approval:{job_id}", "yes") == job_id
    stored = row_when_finished(runs, job_id, client)
    assert stored["state"] == "completed" and stored["result"] == {"decision": "yes"}
    assert step_runs(runs, job_id) == ["asked"]
    assert client.get(job_id).charged_attempts == 1


def test_a_signal_sent_before_anyone_waits_is_kept_and_delivered_once(
    client: Client, runs: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("early")
    def early(job: Job) -> Any:
        return [job.wait_for("early-bird"), job.wait_for("early-bird", timeout=0.5)]

    assert client.signal("early-bird", {"n": 1}) is None, "no one waits: kept"
    job_id = app.enqueue(client, "early").id
    start_worker(app)
    # The first wait takes the kept signal; the second finds none and parks until its timeout.
    wait_until(lambda: row(runs, job_id)["state"] == "waiting", what="parked on the second wait")
    assert runs.execute("SELECT count(*) FROM miniqueue_signals").fetchone() == (0,), "delivered once"
    assert client.signal("early-bird", {"n": 2}) == job_id
    stored = row_when_finished(runs, job_id, client)
    assert stored["result"] == [{"n": 1}, {"n": 2}]


def test_a_wait_that_times_out_raises_signal_timeout_when_the_job_runs_again(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    caught: list[str] = []

    @app.task("impatient", max_attempts=1)
    def impatient(job: Job) -> str:
        try:
            job.wait_for("never", timeout=0.2)
        except SignalTimeout as exc:
            caught.append(str(exc))
            return "gave up"
        return "signalled"

    job_id = app.enqueue(client, "impatient").id
    start_worker(app)
    wait_until(lambda: row(runs, job_id)["state"] == "waiting", what="parked")
    reaper = Reaper(dsn)
    wait_until(lambda: reaper.run_once().timed_out, what="the reaper resumes it at its timeout")
    stored = row_when_finished(runs, job_id, client)
    assert stored["result"] == "gave up"
    assert caught == ["no signal 'never' came before the timeout of step 'signal never #1'"]
    assert stored["steps"][-1]["timed_out"] is True
    assert client.signal("never", 1) is None, "a signal after the timeout is kept for the next waiter"


def test_signal_many_resumes_each_waiter_once_and_keeps_the_rest(
    client: Client, runs: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("waiter")
    def waiter(job: Job) -> Any:
        return job.wait_for(job.payload["key"])

    ids = [app.enqueue(client, "waiter", {"key": key}).id for key in ("a", "a", "b")]
    start_worker(app)
    wait_until(lambda: all(row(runs, i)["state"] == "waiting" for i in ids), what="all parked")
    resumed = client.signal_many([("a", 1), ("b", 2), ("a", 3), ("a", 4), ("c", 5)])
    assert resumed == [ids[0], ids[2], ids[1], None, None], "the n-th signal of a key to its n-th waiter"
    for job_id in ids:
        row_when_finished(runs, job_id, client)
    assert [row(runs, i)["result"] for i in ids] == [1, 3, 2]
    kept = runs.execute("SELECT key, data FROM miniqueue_signals ORDER BY id").fetchall()
    assert kept == [("a", 4), ("c", 5)]


def test_a_signal_inside_the_callers_transaction_counts_only_if_it_commits(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    job_id = parked(client, runs, start_worker, "gate")
    import psycopg

    with psycopg.connect(dsn) as caller, caller.transaction() as tx:
        assert client.signal("gate", "rolled back", conn=caller) == job_id
        raise psycopg.Rollback(tx)
    assert row(runs, job_id)["state"] == "waiting", "the rollback took the signal back"
    with psycopg.connect(dsn) as caller, caller.transaction():
        client.signal("gate", "committed", conn=caller)
    assert row_when_finished(runs, job_id, client)["result"] == "committed"


def test_steps_asked_for_in_another_order_fail_the_attempt_with_a_clear_error(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    order = ["one", "two"]

    @app.task("fickle", max_attempts=2)
    def fickle(job: Job) -> None:
        for name in order:
            job.step(name, counter, dsn, job, name)
        if job.run == 1:
            order.reverse()  # the next run asks for them the other way round
            raise RuntimeError("retry")

    @app.task("twice", max_attempts=1)
    def twice(job: Job) -> None:
        job.step("same", lambda: 1)
        job.step("same", lambda: 2)

    fickle_id, twice_id = app.enqueue(client, "fickle").id, app.enqueue(client, "twice").id
    start_worker(app)
    stored = row_when_finished(runs, fickle_id, client)
    assert stored["state"] == "dead"
    expected = f"StepError: job {fickle_id}: step 1 was recorded as step 'one', and this run asks for step 'two'"
    assert expected in stored["last_error"]
    assert step_runs(runs, fickle_id) == ["one", "two"], "no recorded step ran again"
    twice_row = row_when_finished(runs, twice_id, client)
    assert "step 'same' was asked for twice in one run" in twice_row["last_error"]
    assert issubclass(StepError, Exception)


def test_a_step_value_that_is_not_json_fails_the_attempt_unrecorded(runs: Connection, run_one: RunOne) -> None:
    stored = run_one(lambda job: job.step("set", lambda: {1, 2}), "dead", max_attempts=1)
    assert "the value of step 'set' is not JSON-serialisable" in stored["last_error"] and stored["steps"] is None


def test_async_handlers_have_the_same_steps_sleeps_and_waits(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()

    async def fetch(n: int) -> int:
        return n * 2

    async def book(conn: Any, job_id: int) -> str:
        await conn.execute("INSERT INTO ledger VALUES (%s, 1)", [job_id])
        return "booked"

    @app.task("flow", max_attempts=1)
    async def flow(job: Job) -> Any:
        doubled = await job.astep("double", fetch, 21)
        booked = await job.astep_transaction("book", book, job.id)
        await job.asleep(0)
        signalled = await job.await_for(f"go:{job.id}")
        return [doubled, booked, signalled]

    job_id = app.enqueue(client, "flow").id
    start_worker(app)
    wait_until(lambda: row(runs, job_id)["state"] == "waiting", what="parked")
    assert [s.kind for s in client.get(job_id).steps] == ["step", "step", "sleep", "signal"]
    assert client.signal(f"go:{job_id}", "now") == job_id
    stored = row_when_finished(runs, job_id, client)
    assert stored["result"] == [42, "booked", "now"]
    assert runs.execute("SELECT count(*) FROM ledger").fetchone() == (1,)


def test_the_async_client_signals(dsn: str, client: Client, runs: Connection, start_worker: StartWorker) -> None:
    job_id = parked(client, runs, start_worker, "async-key")

    async def send() -> list[int | None]:
        async with AsyncClient(dsn) as aclient:
            return await aclient.signal_many([("async-key", 7)])

    assert asyncio.run(send()) == [job_id]
    assert row_when_finished(runs, job_id, client)["result"] == 7


def test_bad_signals_are_refused_before_anything_is_stored(client: Client, runs: Connection) -> None:
    with pytest.raises(InvalidInput, match="signal key '' is invalid"):
        client.signal("", 1)
    with pytest.raises(InvalidInput, match="the data of signal 'k' contains a float nan"):
        client.signal_many([("k", 1), ("k", float("nan"))])
    assert runs.execute("SELECT count(*) FROM miniqueue_signals").fetchone() == (0,)


def test_a_cancelled_waiting_job_stops_waiting_and_a_requeue_waits_again(
    client: Client, runs: Connection, start_worker: StartWorker
) -> None:
    job_id = parked(client, runs, start_worker, "k")
    client.cancel([job_id])
    assert client.signal("k", 1) is None, "a cancelled job waits for nothing"
    assert client.get(job_id).signal_key is None
    client.requeue([job_id])
    stored = row_when_finished(runs, job_id, client)
    assert stored["result"] == 1, "the requeued job waited again, and took the kept signal"
    assert [s["name"] for s in stored["steps"]] == ["signal k #1"]


def test_a_parked_job_shows_its_key_and_steps_on_the_dashboard_in_stats_and_the_gauge(
    client: Client, runs: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("shown")
    def shown(job: Job) -> Any:
        job.step("first <step>", lambda: {"n": 1})
        return job.wait_for("approval:<7>", timeout=3600)

    job_id = app.enqueue(client, "shown").id
    start_worker(app)
    wait_until(lambda: row(runs, job_id)["state"] == "waiting", what="parked")
    with on_localhost(create_app(client)) as web:
        html = web.get(f"/jobs/{job_id}").text
    assert "Waits for signal</dt><dd><code>approval:&lt;7&gt;</code>" in html
    assert "<strong>first &lt;step&gt;</strong>" in html and "waiting for <code>approval:&lt;7&gt;</code>" in html
    (stats,) = client.queue_stats()
    assert stats.counts[State.WAITING] == 1 and stats.signal_waits == 1
    line = encode(QueueGauges(stats))
    decoded = decode(line.rstrip(b"\n"))
    assert isinstance(decoded, QueueGauges) and decoded.stats.signal_waits == 1, "the gauge reaches the supervisor"


def test_the_wrong_form_for_the_handlers_kind_is_a_clear_error(
    client: Client, runs: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("blocking", max_attempts=1)
    async def blocking(job: Job) -> None:
        job.step("s", lambda: 1)  # would block the event loop

    job_id = client.enqueue("blocking", max_attempts=1).id
    start_worker(app)
    stored = row_when_finished(runs, job_id, client)
    assert "an 'async def' handler awaits job.astep()" in stored["last_error"] and stored["steps"] is None


def test_the_worker_that_put_a_job_to_sleep_looks_for_it_when_the_sleep_ends_not_at_its_poll(
    client: Client, runs: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("nap")
    def nap(job: Job) -> str:
        job.sleep(0.2)
        return "woke"

    start_worker(app, poll_interval=60.0)  # its poll would come a minute later
    job_id = app.enqueue(client, "nap").id
    wait_until(lambda: row(runs, job_id)["state"] == "completed", what="woke up without a poll")
    assert row(runs, job_id)["result"] == "woke"


def test_a_stale_attempt_cannot_record_a_step_after_another_worker_resumed_the_job(
    client: Client,
    runs: Connection,
    store: Store,
    dsn: str,
    start_worker: StartWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a SIGSTOP past the lease does it: the first run stalls between two steps, its lease is
    taken back and the job runs on elsewhere; when the first run wakes, its step is refused."""
    app = App()
    stalled, wake = threading.Event(), threading.Event()

    @app.task("stale", max_attempts=5)
    def stale(job: Job) -> None:
        job.step("a", counter, dsn, job, "a")
        if job.run == 1:
            stalled.set()
            wake.wait(20)  # frozen: its lease is taken back meanwhile
        job.step("b", counter, dsn, job, "b")

    job_id = app.enqueue(client, "stale").id
    start_worker(app, lease_duration=2.0, heartbeat_seconds=0.5)
    assert stalled.wait(10)
    take_lease_away(runs, store, job_id)  # as the reaper does, while the worker still heartbeats
    lease = take_over(runs, store, job_id, "other-worker")
    run(runs, store.record_step_steps(job_id, "other-worker", lease.attempt, "b", '"the other worker"'))
    with caplog.at_level(logging.WARNING, logger="miniqueue.worker"):
        wake.set()
        wait_until(lambda: "outcome discarded" in caplog.text, what="the stale run's outcome discarded")
    steps = row(runs, job_id)["steps"]
    assert [(s["name"], s["attempt"], s.get("value")) for s in steps] == [
        ("a", 1, {"step": "a", "job": job_id}),
        ("b", lease.attempt, "the other worker"),
    ], "the stale attempt recorded nothing after the takeover"
    assert step_runs(runs, job_id) == ["a", "b"], "its step ran (counted), but its record was refused"
