"""The in-process worker runtime against a real PostgreSQL: claims, heartbeats, outcomes, shutdown.

What holds for every handler runs once for a ``def`` handler and once for an ``async def``
one (the ``kind`` fixture; :mod:`tests.handlers` makes a handler of either kind from the same
steps). What is particular to one kind is in ``test_sync_worker.py`` and
``test_async_worker.py``; the claim loop's own behaviour (notifications, reconnection,
which tasks a worker claims) is tested here once, with ``def`` handlers.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from miniqueue import Client, LeaseLost, State
from miniqueue.core.db import Connection
from miniqueue.maintenance.reaper import Reaper, ReaperConfig
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job, PermanentError, Snooze
from miniqueue.worker.worker import Worker, WorkerConfig

from ..handlers import HandlerKind, Stops
from ..helpers import count, expire_lease, row, take_lease_away, take_over, wait_until
from ..running import RunOne, StartWorker

# -- what holds for both kinds of handler --------------------------------------------------------


def test_processes_a_job(run_one: RunOne, kind: HandlerKind) -> None:
    seen: list[tuple[Any, int, str]] = []

    def greet(job: Job) -> None:
        seen.append((job.payload, job.run, threading.current_thread().name))

    stored = run_one(kind.calling(greet), "completed", {"name": "ada"})
    [(payload, run, thread)] = seen
    assert (payload, run) == ({"name": "ada"}, 1) and kind.ran_on(thread), thread
    assert stored["lease_expires_at"] is None and stored["leased_by"] is None and stored["errors"] == []
    assert stored["completed_at"] is not None


def test_heartbeat_keeps_a_short_lease_alive_through_a_long_handler(
    client: Client, conn: Connection, dsn: str, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    app.task("slow")(kind.sleeping(4))
    job_id = app.enqueue(client, "slow").id
    reaper = Reaper(dsn, ReaperConfig(interval=0.2))  # recovers any lease that lapses
    threading.Thread(target=reaper.run, daemon=True).start()
    try:
        start_worker(app, lease_duration=1.0, heartbeat_seconds=0.25)
        wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=15, what="slow job completed")
    finally:
        reaper.stop()
    stored = row(conn, job_id)
    assert stored["attempt"] == 1, "the lease expired and the job was re-run"
    assert stored["errors"] == []


def test_error_retries_then_dead_with_the_error_recorded(run_one: RunOne, kind: HandlerKind) -> None:
    def explode(job: Job) -> None:
        raise ValueError(f"bad input on attempt {job.run}")

    stored = run_one(kind.calling(explode), "dead", max_attempts=3, backoff=lambda attempt: 0.0)
    assert stored["attempt"] == 3
    assert "ValueError: bad input on attempt 3" in stored["last_error"]
    assert "Traceback" in stored["last_error"] and "in explode" in stored["last_error"]
    assert [e["attempt"] for e in stored["errors"]] == [1, 2, 3]
    assert all(e["worker"] for e in stored["errors"])


def test_fails_twice_then_succeeds(run_one: RunOne, kind: HandlerKind) -> None:
    def flaky(job: Job) -> None:
        if job.run < 3:
            raise RuntimeError("transient")

    stored = run_one(kind.calling(flaky), "completed", max_attempts=5, backoff=lambda attempt: 0.0)
    assert stored["attempt"] == 3
    assert len(stored["errors"]) == 2


def test_always_failing_goes_dead_after_max_attempts(run_one: RunOne, kind: HandlerKind) -> None:
    calls: list[int] = []

    def never(job: Job) -> None:
        calls.append(job.run)
        raise RuntimeError("always")

    run_one(kind.calling(never), "dead", max_attempts=4, backoff=lambda attempt: 0.0)
    assert calls == [1, 2, 3, 4]


def test_snooze_runs_again_later_without_spending_an_attempt(run_one: RunOne, kind: HandlerKind) -> None:
    runs: list[int] = []

    def later(job: Job) -> None:
        runs.append(job.run)
        if len(runs) == 1:
            raise Snooze(0.2)

    stored = run_one(kind.calling(later), "completed", max_attempts=1)
    assert len(runs) == 2
    assert stored["errors"] == [] and stored["max_attempts"] - stored["attempt"] == 0


def test_permanent_error_fails_without_retry(run_one: RunOne, kind: HandlerKind) -> None:
    runs: list[int] = []

    def refuse(job: Job) -> None:
        runs.append(job.run)
        raise PermanentError("card declined")

    stored = run_one(kind.calling(refuse), "failed", max_attempts=5)
    assert runs == [1]
    assert "miniqueue.PermanentError: card declined" in stored["last_error"]


def test_graceful_shutdown_completes_the_in_flight_job(
    client: Client, conn: Connection, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    started = threading.Event()
    app.task("long")(kind.sleeping(1.5, first=lambda job: started.set()))
    job_id = app.enqueue(client, "long").id
    running = start_worker(app, shutdown_timeout=10.0)
    assert started.wait(10)
    running.stop()
    assert row(conn, job_id)["state"] == "completed"


def test_shutdown_timeout_abandons_the_handler_and_tells_it(
    client: Client, conn: Connection, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    stops, started = Stops(), threading.Event()
    app.task("stubborn")(kind.until_told(stops, first=lambda job: started.set()))
    job_id = app.enqueue(client, "stubborn").id
    running = start_worker(app, shutdown_timeout=0.3)
    assert started.wait(10)
    running.stop()
    wait_until(lambda: stops.seen, what="handler told to stop")
    assert stops.seen == [kind.told("shutdown")]
    assert row(conn, job_id)["state"] == "running", "an abandoned job waits for its lease to expire"


def test_lease_lost_mid_handler_is_signalled_and_its_outcome_discarded(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    stops, started = Stops(), threading.Event()
    app.task("contested")(kind.until_told(stops, first=lambda job: started.set(), seconds=10))
    job_id = app.enqueue(client, "contested").id
    start_worker(app, lease_duration=2.0, heartbeat_seconds=0.5)
    assert started.wait(10)
    # Take the job away from the worker: expire it, recover it, and complete it elsewhere.
    take_lease_away(conn, store, job_id)  # as the reaper does, while the worker still heartbeats
    lease = take_over(conn, store, job_id, "other-worker")  # as if its retry delay passed
    store.complete(conn, job_id, "other-worker", lease.attempt)
    wait_until(lambda: stops.seen, what="the first handler told its lease was lost")
    assert stops.seen == [kind.told("lease lost")]
    stored = row(conn, job_id)
    assert stored["state"] == "completed" and stored["attempt"] == 2
    assert [e["error"] for e in stored["errors"]] == ["worker lost: lease expired without renewal"]


def test_an_operator_cancel_tells_the_handler_to_stop(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    stops, started = Stops(), threading.Event()
    app.task("doomed")(kind.until_told(stops, first=lambda job: started.set()))
    job_id = app.enqueue(client, "doomed").id
    start_worker(app)
    assert started.wait(10)
    store.cancel(conn, [job_id])
    wait_until(lambda: stops.seen, what="the handler told to stop")
    assert stops.seen == [kind.told("cancelled")]
    assert row(conn, job_id)["state"] == "cancelled"


def test_timeout_tells_the_handler_to_stop(
    client: Client, conn: Connection, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    stops = Stops()
    app.task("bounded", timeout=0.3, max_attempts=1)(kind.until_told(stops, seconds=10))
    app.enqueue(client, "bounded")
    start_worker(app)
    wait_until(lambda: stops.seen, what="handler told about its timeout")
    assert stops.seen == [kind.told("timeout")]


def test_three_workers_thirty_jobs_no_duplicates(
    client: Client, conn: Connection, start_worker: StartWorker, kind: HandlerKind
) -> None:
    app = App()
    runs: list[tuple[int, str]] = []
    lock = threading.Lock()

    def record(job: Job) -> None:
        with lock:
            runs.append((job.id, job.worker_id))

    app.task("count")(kind.sleeping(0.05, first=record))
    ids = {app.enqueue(client, "count", {"i": i}).id for i in range(30)}
    workers = [start_worker(app, concurrency=3, prefetch=0) for _ in range(3)]
    wait_until(lambda: count(conn, "state = 'completed'") == 30, what="30 completed")
    assert sorted(job_id for job_id, _ in runs) == sorted(ids)
    assert len({worker for _, worker in runs}) >= 2, "the work was not shared"
    assert len({w.worker.worker_id for w in workers}) == 3


def test_transactional_completion_commits_writes_with_the_completion(
    client: Client, conn: Connection, start_worker: StartWorker, effects: None, kind: HandlerKind
) -> None:
    """``job.transaction()`` (``job.atransaction()``): the handler's writes commit with its job's
    completion; the handlers' pool holds no more connections than the worker's concurrency."""
    app = App()
    app.task("effect")(kind.writing())
    ids = [app.enqueue(client, "effect").id for _ in range(20)]
    earlier = _handler_connections(conn)  # (of workers gone: see below)
    start_worker(app, concurrency=10)
    wait_until(lambda: count(conn, "state = 'completed'") == 20, what="jobs completed")
    assert sorted(i for (i,) in conn.execute("SELECT job_id FROM effects").fetchall()) == ids
    # Ten handler threads ask for the pool at once: one pool is opened, not one each.
    assert 1 <= len(_handler_connections(conn) - earlier) <= 10


def _handler_connections(conn: Connection) -> set[int]:
    """The backends of handlers' connections to the test database."""
    found = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'miniqueue:handler' AND datname = current_database()"
    ).fetchall()
    return {pid for (pid,) in found}


def test_transactional_completion_rolls_back_when_the_lease_is_lost(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, effects: None, kind: HandlerKind
) -> None:
    app = App()
    may_commit, started = threading.Event(), threading.Event()
    lost: list[LeaseLost] = []

    def hold(job: Job) -> None:
        started.set()
        may_commit.wait(10)

    app.task("late")(kind.writing(first=hold, lost=lost))
    job_id = app.enqueue(client, "late").id
    # A heartbeat that does not beat during the test: the fence, not the stop it would tell, catches it.
    start_worker(app, lease_duration=60.0, heartbeat_seconds=30.0)
    assert started.wait(10)
    store.cancel(conn, [job_id])
    may_commit.set()
    wait_until(lambda: lost, what="LeaseLost raised in the handler")
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert row(conn, job_id)["state"] == "cancelled"


def test_every_failed_attempt_leaves_a_log_line(
    client: Client, conn: Connection, start_worker: StartWorker, caplog: pytest.LogCaptureFixture, kind: HandlerKind
) -> None:
    app = App()

    def flaky(job: Job) -> None:
        raise ValueError(f"bad input on attempt {job.run}")

    def refuse(job: Job) -> None:
        raise PermanentError("card declined")

    app.task("flaky", max_attempts=2, backoff=lambda attempt: 0.0)(kind.calling(flaky))
    app.task("refuse")(kind.calling(refuse))
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


def test_a_payload_the_worker_cannot_decode_fails_that_job_alone(
    client: Client, conn: Connection, start_worker: StartWorker, kind: HandlerKind
) -> None:
    """A row's payload that this process cannot decode (here JSON nested deeper than Python's
    recursion limit, written by plain SQL) never fails the claim that read it: the rows are
    decoded after the claim committed every lease, so the batch's other jobs would be stranded
    until their leases expired, charged, while the worker crashed and claimed them again. The
    one job fails for good without running; the others run once."""
    app = App()
    ran: list[int] = []
    app.task("t")(kind.calling(lambda job: ran.append(job.id)))
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


# -- the claim loop, whatever the handler ----------------------------------------------------------


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
