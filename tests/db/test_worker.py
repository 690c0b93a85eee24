"""The in-process worker runtime against a real PostgreSQL: claims, heartbeats, outcomes, shutdown."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from miniqueue import Client, LeaseLost, State
from miniqueue.core.db import Connection
from miniqueue.maintenance.reaper import Reaper
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job, PermanentError, Snooze
from miniqueue.worker.worker import Worker, WorkerConfig

from ..helpers import count, expire_lease, row, take_lease_away, take_over, wait_until
from ..running import FAST, Running, StartWorker, worker_starter


@pytest.fixture
def effects(conn: Connection) -> None:
    """An empty table for handlers' transactional writes."""
    conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id BIGINT PRIMARY KEY)")
    conn.execute("TRUNCATE effects")


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    yield from worker_starter(dsn)


def test_processes_a_job(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    seen: list[Any] = []
    app.task("greet")(lambda job: seen.append((job.payload, job.run)))
    job_id = app.enqueue(client, "greet", {"name": "ada"}).id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    assert seen == [({"name": "ada"}, 1)]
    stored = row(conn, job_id)
    assert stored["lease_expires_at"] is None and stored["leased_by"] is None
    assert stored["completed_at"] is not None


def test_heartbeat_keeps_a_short_lease_alive_through_a_long_handler(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    app.task("slow")(lambda job: time.sleep(6))
    job_id = app.enqueue(client, "slow").id
    start_worker(app, lease_duration=2.0, heartbeat_seconds=0.5)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=15, what="slow job completed")
    stored = row(conn, job_id)
    assert stored["attempt"] == 1, "the lease expired and the job was re-run"
    assert stored["errors"] == []


def test_error_retries_then_dead_with_the_error_recorded(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("explode", max_attempts=3, backoff=lambda attempt: 0.0)
    def explode(job: Job) -> None:
        raise ValueError(f"bad input on attempt {job.run}")

    job_id = app.enqueue(client, "explode").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead")
    stored = row(conn, job_id)
    assert stored["attempt"] == 3
    assert "ValueError: bad input on attempt 3" in stored["last_error"]
    assert "Traceback" in stored["last_error"]
    assert [e["attempt"] for e in stored["errors"]] == [1, 2, 3]
    assert all(e["worker"] for e in stored["errors"])


def test_fails_twice_then_succeeds(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("flaky", max_attempts=5, backoff=lambda attempt: 0.0)
    def flaky(job: Job) -> None:
        if job.run < 3:
            raise RuntimeError("transient")

    job_id = app.enqueue(client, "flaky").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    stored = row(conn, job_id)
    assert stored["attempt"] == 3
    assert len(stored["errors"]) == 2


def test_always_failing_goes_dead_after_max_attempts(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    calls: list[int] = []

    @app.task("never", max_attempts=4, backoff=lambda attempt: 0.0)
    def never(job: Job) -> None:
        calls.append(job.run)
        raise RuntimeError("always")

    job_id = app.enqueue(client, "never").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead")
    assert calls == [1, 2, 3, 4]


def test_graceful_shutdown_completes_the_in_flight_job(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    started = threading.Event()

    @app.task("long")
    def long(job: Job) -> None:
        started.set()
        time.sleep(1.5)

    job_id = app.enqueue(client, "long").id
    running = start_worker(app, shutdown_timeout=10.0)
    assert started.wait(10)
    running.stop()
    assert row(conn, job_id)["state"] == "completed"


def test_shutdown_timeout_abandons_the_handler_and_tells_it(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    reasons: list[str | None] = []
    started = threading.Event()

    @app.task("stubborn")
    def stubborn(job: Job) -> None:
        started.set()
        job.wait(30)
        reasons.append(job.stop_reason)

    job_id = app.enqueue(client, "stubborn").id
    running = start_worker(app, shutdown_timeout=0.3)
    assert started.wait(10)
    running.stop()
    wait_until(lambda: reasons, what="handler told to stop")
    assert reasons == ["shutdown"]
    assert row(conn, job_id)["state"] == "running", "an abandoned job waits for its lease to expire"


def test_killed_worker_is_recovered_by_the_reaper_and_completed_as_attempt_2(
    client: Client, conn: Connection, store: Store, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    app.task("work")(lambda job: None)
    job_id = app.enqueue(client, "work").id
    # A worker that "crashed" right after claiming: it holds the lease and will never renew it.
    (lease,) = store.claim(conn, ["default"], "crashed-worker", 30, 1)
    expire_lease(conn, job_id)
    Reaper(dsn).run_once()
    assert row(conn, job_id)["state"] == "available"
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    stored = row(conn, job_id)
    assert stored["attempt"] == 2 == lease.attempt + 1
    assert stored["errors"][0]["worker"] == "crashed-worker"


def test_three_workers_thirty_jobs_no_duplicates(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    runs: list[tuple[int, str]] = []
    lock = threading.Lock()

    @app.task("count")
    def count_job(job: Job) -> None:
        with lock:
            runs.append((job.id, job.worker_id))
        time.sleep(0.01)

    ids = {app.enqueue(client, "count", {"i": i}).id for i in range(30)}
    workers = [start_worker(app, concurrency=2) for _ in range(3)]
    wait_until(lambda: count(conn, "state = 'completed'") == 30, what="30 completed")
    assert sorted(job_id for job_id, _ in runs) == sorted(ids)
    assert len({worker for _, worker in runs}) >= 2, "the work was not shared"
    assert len({w.worker.worker_id for w in workers}) == 3


def test_lease_lost_mid_handler_is_signalled_and_its_completion_rejected(
    client: Client, conn: Connection, store: Store, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    first_started = threading.Event()
    reasons: list[str | None] = []

    @app.task("contested")
    def contested(job: Job) -> None:
        first_started.set()
        job.wait(10)
        reasons.append(job.stop_reason)

    job_id = app.enqueue(client, "contested").id
    start_worker(app, lease_duration=2.0, heartbeat_seconds=0.5)
    assert first_started.wait(10)
    # Take the job away from the worker: expire it, recover it, and complete it elsewhere.
    take_lease_away(conn, store, job_id)  # as the reaper does, while the worker still heartbeats
    lease = take_over(conn, store, job_id, "other-worker")  # as if its retry delay passed
    store.complete(conn, job_id, "other-worker", lease.attempt)
    wait_until(lambda: reasons, what="the first handler told its lease was lost")
    assert reasons == ["lease lost"]
    stored = row(conn, job_id)
    assert stored["state"] == "completed" and stored["attempt"] == 2


def test_notify_wakes_an_idle_worker_long_before_the_poll_interval(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    started: list[float] = []
    app.task("ping")(lambda job: started.append(time.monotonic()))
    running = start_worker(app, poll_interval=30.0)
    listener_ready = wait_until(lambda: running.worker.jobs_done == 0 and _listening(conn), what="listener")
    assert listener_ready
    enqueued = time.monotonic()
    app.enqueue(client, "ping")
    wait_until(lambda: started, timeout=10, what="job started")
    assert started[0] - enqueued < 5.0, "the worker waited for its 30 s poll instead of the notification"


def test_poll_only_worker_still_finds_jobs(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    app.task("quiet")(lambda job: None)
    start_worker(app, poll_only=True, poll_interval=0.1)
    job_id = app.enqueue(client, "quiet").id
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    assert not _listening(conn)


def test_worker_survives_terminated_connections(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    app.task("steady")(lambda job: time.sleep(0.005))
    running = start_worker(app, concurrency=2)
    first = [app.enqueue(client, "steady", {"i": i}).id for i in range(20)]
    wait_until(lambda: count(conn, "state = 'completed'") == 20, what="first batch")
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name IN ('miniqueue:worker', 'miniqueue:heartbeat', 'miniqueue:listen')"
    ).fetchone()
    assert killed and killed[0] >= 2
    second = [app.enqueue(client, "steady", {"i": i}).id for i in range(20)]
    wait_until(lambda: count(conn, "state = 'completed'") == 40, timeout=20, what="second batch after reconnect")
    assert len(set(first + second)) == 40
    assert running.thread.is_alive()


def test_transactional_completion_commits_writes_with_the_completion(
    client: Client, conn: Connection, start_worker: StartWorker, effects: None
) -> None:
    app = App()

    @app.task("effect")
    def effect(job: Job) -> None:
        with job.transaction() as tx:
            tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])

    job_id = app.enqueue(client, "effect").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    assert conn.execute("SELECT job_id FROM effects").fetchall() == [(job_id,)]


def test_transactional_completion_rolls_back_when_the_lease_is_lost(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, effects: None
) -> None:
    app = App()
    may_commit = threading.Event()
    started = threading.Event()
    raised: list[BaseException] = []

    @app.task("late")
    def late(job: Job) -> None:
        started.set()
        may_commit.wait(10)
        try:
            with job.transaction() as tx:
                tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])
        except LeaseLost as exc:
            raised.append(exc)
            raise

    job_id = app.enqueue(client, "late").id
    start_worker(app)
    assert started.wait(10)
    store.cancel(conn, [job_id])
    may_commit.set()
    wait_until(lambda: raised, what="LeaseLost raised in the handler")
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert row(conn, job_id)["state"] == "cancelled"


def test_snooze_runs_again_later_without_spending_an_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    runs: list[int] = []

    @app.task("later", max_attempts=1)
    def later(job: Job) -> None:
        runs.append(job.run)
        if len(runs) == 1:
            raise Snooze(0.2)

    job_id = app.enqueue(client, "later").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed after snooze")
    assert len(runs) == 2
    stored = row(conn, job_id)
    assert stored["errors"] == [] and stored["max_attempts"] - stored["attempt"] == 0


def test_permanent_error_fails_without_retry(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    runs: list[int] = []

    @app.task("refuse", max_attempts=5)
    def refuse(job: Job) -> None:
        runs.append(job.run)
        raise PermanentError("card declined")

    job_id = app.enqueue(client, "refuse").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "failed", what="job failed")
    assert runs == [1]
    assert "card declined" in row(conn, job_id)["last_error"]


def test_a_worker_claims_only_the_tasks_its_app_declares(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    other = App()
    other.task("known")(lambda job: None)
    ids = [client.enqueue("unknown", max_attempts=1).id for _ in range(3)]
    start_worker(other)
    known = client.enqueue("known").id  # after the others: claimed past them
    wait_until(lambda: row(conn, known)["state"] == "completed", what="the known task's job ran")
    assert [(row(conn, i)["state"], row(conn, i)["attempt"]) for i in ids] == [("available", 0)] * 3, "never claimed"
    owner = App()
    owner.task("unknown")(lambda job: None)
    start_worker(owner)
    wait_until(lambda: count(conn, "state = 'completed'") == 4, what="run by the app that declares it")
    assert all(row(conn, i)["attempt"] == 1 for i in ids), "one run each, by the app that declares the task"


def test_every_failed_attempt_leaves_a_log_line(
    client: Client, conn: Connection, start_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    app = App()

    @app.task("flaky", max_attempts=2, backoff=lambda attempt: 0.0)
    def flaky(job: Job) -> None:
        raise ValueError(f"bad input on attempt {job.run}")

    @app.task("refuse")
    def refuse(job: Job) -> None:
        raise PermanentError("card declined")

    flaky_id, refuse_id = app.enqueue(client, "flaky").id, app.enqueue(client, "refuse").id
    with caplog.at_level(logging.WARNING, logger="miniqueue.worker"):
        start_worker(app)
        wait_until(lambda: count(conn, "state IN ('dead', 'failed')") == 2, what="both jobs finished")
        # The worker logs an outcome once the database has it: the line may follow the commit.
        wait_until(lambda: len([r for r in caplog.records if hasattr(r, "job")]) == 3, what="three lines logged")
    lines = {(r.job["job_id"], r.job["attempt"]): r for r in caplog.records if hasattr(r, "job")}
    retried, dead, failed = lines[(flaky_id, 1)], lines[(flaky_id, 2)], lines[(refuse_id, 1)]
    assert retried.levelno == logging.WARNING
    assert retried.message == (
        f"job {flaky_id} (flaky on default) attempt 1 of 2 failed; retrying in 0.0s: ValueError: bad input on attempt 1"
    )
    assert dead.levelno == logging.ERROR and "the job is dead" in dead.message
    assert "Traceback" in dead.message and "ValueError: bad input on attempt 2" in dead.message
    assert failed.levelno == logging.WARNING and "failed permanently" in failed.message
    assert "miniqueue.PermanentError: card declined" in failed.message  # named as users import it
    assert dead.job == {
        "job_id": flaky_id,
        "task": "flaky",
        "queue": "default",
        "attempt": 2,
        "max_attempts": 2,
        "run": 2,
        "outcome": "dead",
        "error": row(conn, flaky_id)["last_error"],
    }


def test_a_handler_returning_an_awaitable_fails_its_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    ran: list[int] = []

    async def body(job: Job) -> None:
        ran.append(job.id)

    @app.task("sneaky", max_attempts=1)
    def sneaky(job: Job) -> Any:
        return body(job)  # a coroutine nobody awaits: the work never happens

    job_id = app.enqueue(client, "sneaky").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead, not completed")
    assert ran == []
    assert "returned coroutine instead of running" in row(conn, job_id)["last_error"]


def test_timeout_tells_the_handler_to_stop(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    reasons: list[str | None] = []

    @app.task("bounded", timeout=0.3)
    def bounded(job: Job) -> None:
        job.wait(10)
        reasons.append(job.stop_reason)

    app.enqueue(client, "bounded")
    start_worker(app)
    wait_until(lambda: reasons, what="handler told about its timeout")
    assert reasons == ["timeout"]


def test_multiple_queues_and_priorities(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    order: list[str] = []
    app.task("a", queue="alpha")(lambda job: order.append(job.payload["n"]))
    app.task("b", queue="beta")(lambda job: order.append(job.payload["n"]))
    for name, task, priority in [("low", "a", 1), ("high", "b", 10), ("mid", "a", 5)]:
        app.enqueue(client, task, {"n": name}, priority=priority)
    start_worker(app, concurrency=1)
    wait_until(lambda: len(order) == 3, what="three jobs")
    assert order == ["high", "mid", "low"]
    # The last handler has returned; its completion commits a moment later.
    wait_until(lambda: {c.state for c in client.counts()} == {State.COMPLETED}, what="three jobs completed")


def _listening(conn: Connection) -> bool:
    result = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'miniqueue:listen' "
        "AND datname = current_database() AND query LIKE 'LISTEN%%'"
    ).fetchone()
    return bool(result and result[0])


def test_worker_rejects_a_heartbeat_not_below_the_lease(dsn: str) -> None:
    app = App()
    app.task("x")(lambda job: None)
    from miniqueue import ConfigError

    with pytest.raises(ConfigError, match="heartbeat interval 5s must be below the lease"):
        Worker(app, dsn, WorkerConfig(lease_duration=5, heartbeat_seconds=5))
    with pytest.raises(ConfigError, match="concurrency 0"):
        Worker(app, dsn, WorkerConfig(concurrency=0))


def test_worker_with_a_pool_uses_it_for_transactions(client: Client, conn: Connection, dsn: str, effects: None) -> None:
    from miniqueue.core.db import create_pool

    app = App()

    @app.task("pooled")
    def pooled(job: Job) -> None:
        with job.transaction() as tx:
            tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])

    job_id = app.enqueue(client, "pooled").id
    with create_pool(dsn, purpose="app") as pool:
        running = Running(Worker(app, pool, FAST))
        try:
            wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
        finally:
            running.stop()
    assert conn.execute("SELECT job_id FROM effects").fetchall() == [(job_id,)]


def test_prefetched_jobs_go_back_unstarted_at_shutdown(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    started = threading.Event()
    release = threading.Event()

    @app.task("first")
    def first(job: Job) -> None:
        started.set()
        release.wait(10)

    app.task("rest")(lambda job: None)
    first_id = app.enqueue(client, "first").id
    rest = [app.enqueue(client, "rest").id for _ in range(5)]
    running = start_worker(app, concurrency=1, prefetch=5)
    assert started.wait(10)
    wait_until(lambda: count(conn, "state = 'running'") == 6, what="one running and five prefetched")
    running.worker.stop()
    release.set()
    running.thread.join(10)
    assert row(conn, first_id)["state"] == "completed"
    for job_id in rest:
        stored = row(conn, job_id)
        assert (stored["state"], stored["leased_by"]) == ("available", None)
        assert stored["max_attempts"] - stored["attempt"] == 5, "the budget of attempts is unchanged"
        [entry] = stored["errors"]
        assert entry["error"] == "handed back unstarted: the worker stopped; attempt not charged"


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_payload_the_worker_cannot_decode_fails_that_job_alone(
    client: Client, conn: Connection, start_worker: StartWorker, kind: str
) -> None:
    """A row's payload that this process cannot decode (here JSON nested deeper than Python's
    recursion limit, written by plain SQL) never fails the claim that read it: the rows are
    decoded after the claim committed every lease, so the batch's other jobs would be stranded
    until their leases expired, charged, while the worker crashed and claimed them again. The
    one job fails for good without running; the others run once."""
    app = App()
    ran: list[int] = []
    if kind == "def":
        app.task("t")(lambda job: ran.append(job.id))
    else:

        @app.task("t")
        async def handler(job: Job) -> None:
            ran.append(job.id)

    with conn.transaction():  # one commit: one claim reads all five
        ids = [app.enqueue(client, "t", {"n": n}, conn=conn).id for n in range(5)]
        poison = ids[2]
        conn.execute(
            "UPDATE miniqueue_jobs SET payload = (repeat('[', 5000) || repeat(']', 5000))::jsonb WHERE id = %s",
            [poison],
        )
    start_worker(app, concurrency=2)
    wait_until(lambda: count(conn, "state IN ('completed', 'failed')") == 5, what="every job finished")
    assert sorted(ran) == sorted(i for i in ids if i != poison), "the others ran, the poisoned one did not"
    # (the test's own connection could not decode that payload either: read the other columns)
    state, attempt, error = conn.execute(
        "SELECT state, attempt, last_error FROM miniqueue_jobs WHERE id = %s", [poison]
    ).fetchone() or (None, None, None)
    assert (state, attempt) == ("failed", 1)
    assert "the job's payload could not be decoded (RecursionError: maximum recursion depth" in str(error)
    assert all(row(conn, i)["attempt"] == 1 for i in ids if i != poison), "nothing was claimed twice"
