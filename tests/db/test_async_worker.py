"""``async def`` handlers against a real PostgreSQL: one event loop per worker, coroutines
cancelled when the job should stop, the same outcomes and fencing as threads, and
``job.atransaction()``; in process and under a real ``miniqueue-supervise``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miniqueue import Client, LeaseLost
from miniqueue.core.db import Connection
from miniqueue.core.errors import ConfigError
from miniqueue.maintenance.reaper import Reaper, ReaperConfig
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job, PermanentError, Snooze

from ..helpers import count, row, take_lease_away, take_over, wait_until
from ..running import StartWorker
from ..supervised import Fleet, StartSupervisor
from . import test_worker

# The sync tests' fixtures, shared: a worker on a thread, stopped at the end; the effects table.
start_worker = test_worker.start_worker
effects = test_worker.effects

LOOP_THREAD = "miniqueue-loop"


class Stops:
    """What handlers saw when they were cancelled, for the test thread to wait on."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, bool, str]] = []  # (stop_reason, should_stop, CancelledError's message)

    async def sleep_until_cancelled(self, job: Job, seconds: float = 30) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError as exc:
            self.seen.append((job.stop_reason, job.should_stop(), str(exc)))
            raise


def test_async_handlers_register_and_async_generators_are_refused() -> None:
    app = App()

    async def fetch(job: Job) -> None: ...

    class Callback:
        async def __call__(self, job: Job) -> None: ...

    async def stream(job: Job) -> Any:
        yield job.id

    app.task("fetch")(fetch)
    app.task("callback")(Callback())
    with pytest.raises(ConfigError, match="the handler is an async generator function"):
        app.task("stream")(stream)
    assert sorted(app.tasks) == ["callback", "fetch"]


def test_processes_a_job_on_the_event_loop(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    seen: list[tuple[Any, int, str]] = []

    @app.task("greet")
    async def greet(job: Job) -> None:
        await asyncio.sleep(0.01)
        seen.append((job.payload, job.run, threading.current_thread().name))

    job_id = app.enqueue(client, "greet", {"name": "ada"}).id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    assert seen == [({"name": "ada"}, 1, LOOP_THREAD)]
    stored = row(conn, job_id)
    assert stored["lease_expires_at"] is None and stored["leased_by"] is None and stored["errors"] == []


def test_concurrency_is_the_number_of_coroutines_on_one_thread(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    active, peak, threads = [0], [0], set()

    @app.task("together")
    async def together(job: Job) -> None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        threads.add(threading.get_ident())
        try:  # each job waits until 20 run at once: fewer slots would never get there
            for _ in range(500):
                if peak[0] >= 20:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
        finally:
            active[0] -= 1

    for i in range(60):
        app.enqueue(client, "together", {"i": i})
    start_worker(app, concurrency=20, prefetch=40)
    wait_until(lambda: count(conn, "state = 'completed'") == 60, timeout=20, what="60 completed")
    assert peak[0] == 20, "never more coroutines at once than --concurrency, and that many"
    assert len(threads) == 1


def test_heartbeat_keeps_a_short_lease_alive_through_a_long_coroutine(
    client: Client, conn: Connection, dsn: str, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("slow")
    async def slow(job: Job) -> None:
        await asyncio.sleep(4)

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


def test_error_retries_then_dead_with_the_error_recorded(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("explode", max_attempts=3, backoff=lambda attempt: 0.0)
    async def explode(job: Job) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"bad input on attempt {job.run}")

    job_id = app.enqueue(client, "explode").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="job dead")
    stored = row(conn, job_id)
    assert stored["attempt"] == 3
    assert "ValueError: bad input on attempt 3" in stored["last_error"]
    assert "Traceback" in stored["last_error"] and "in explode" in stored["last_error"]
    assert [e["attempt"] for e in stored["errors"]] == [1, 2, 3]


def test_graceful_shutdown_completes_the_in_flight_coroutine(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    started = threading.Event()

    @app.task("long")
    async def long(job: Job) -> None:
        started.set()
        await asyncio.sleep(1.5)

    job_id = app.enqueue(client, "long").id
    running = start_worker(app, shutdown_timeout=10.0)
    assert started.wait(10)
    running.stop()
    assert row(conn, job_id)["state"] == "completed"


def test_shutdown_timeout_cancels_the_coroutine(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    stops = Stops()
    started = threading.Event()

    @app.task("stubborn")
    async def stubborn(job: Job) -> None:
        started.set()
        await stops.sleep_until_cancelled(job)

    job_id = app.enqueue(client, "stubborn").id
    running = start_worker(app, shutdown_timeout=0.3)
    assert started.wait(10)
    running.stop()
    assert stops.seen == [("shutdown", True, "the job should stop: shutdown")]
    assert row(conn, job_id)["state"] == "running", "an abandoned job waits for its lease to expire"


def test_three_workers_thirty_jobs_no_duplicates(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()
    runs: list[tuple[int, str]] = []

    @app.task("count")
    async def count_job(job: Job) -> None:
        runs.append((job.id, job.worker_id))  # one loop thread per worker: no lock needed within one
        await asyncio.sleep(0.05)

    ids = {app.enqueue(client, "count", {"i": i}).id for i in range(30)}
    workers = [start_worker(app, concurrency=3, prefetch=0) for _ in range(3)]
    wait_until(lambda: count(conn, "state = 'completed'") == 30, what="30 completed")
    assert sorted(job_id for job_id, _ in runs) == sorted(ids)
    assert len({worker for _, worker in runs}) >= 2, "the work was not shared"
    assert len({w.worker.worker_id for w in workers}) == 3


def test_lease_lost_cancels_the_coroutine_and_its_outcome_is_discarded(
    client: Client, conn: Connection, store: Store, dsn: str, start_worker: StartWorker
) -> None:
    app = App()
    stops = Stops()
    started = threading.Event()

    @app.task("contested")
    async def contested(job: Job) -> None:
        started.set()
        await stops.sleep_until_cancelled(job, 10)

    job_id = app.enqueue(client, "contested").id
    start_worker(app, lease_duration=2.0, heartbeat_seconds=0.5)
    assert started.wait(10)
    take_lease_away(conn, store, job_id)  # as the reaper does, while the worker still heartbeats
    lease = take_over(conn, store, job_id, "other-worker")  # as if its retry delay passed
    store.complete(conn, job_id, "other-worker", lease.attempt)
    wait_until(lambda: stops.seen, what="the coroutine cancelled")
    assert stops.seen == [("lease lost", True, "the job should stop: lease lost")]
    stored = row(conn, job_id)
    assert stored["state"] == "completed" and stored["attempt"] == 2
    assert [e["error"] for e in stored["errors"]] == ["worker lost: lease expired without renewal"]


def test_an_operator_cancel_cancels_the_coroutine(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker
) -> None:
    app = App()
    stops = Stops()
    started = threading.Event()

    @app.task("doomed")
    async def doomed(job: Job) -> None:
        started.set()
        await stops.sleep_until_cancelled(job)

    job_id = app.enqueue(client, "doomed").id
    start_worker(app)
    assert started.wait(10)
    store.cancel(conn, [job_id])
    wait_until(lambda: stops.seen, what="the coroutine cancelled")
    assert stops.seen == [("cancelled", True, "the job should stop: cancelled")]
    assert row(conn, job_id)["state"] == "cancelled"


def test_timeout_cancels_the_coroutine_and_fails_the_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    stops = Stops()

    @app.task("bounded", timeout=0.3, max_attempts=1)
    async def bounded(job: Job) -> None:
        await stops.sleep_until_cancelled(job, 10)

    job_id = app.enqueue(client, "bounded").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "dead", what="the timed-out job dead")
    assert stops.seen == [("timeout", True, "the job should stop: timeout")]
    assert row(conn, job_id)["last_error"].endswith("CancelledError: the job should stop: timeout")


def test_snooze_runs_again_later_without_spending_an_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    runs: list[int] = []

    @app.task("later", max_attempts=1)
    async def later(job: Job) -> None:
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
    async def refuse(job: Job) -> None:
        runs.append(job.run)
        raise PermanentError("card declined")

    job_id = app.enqueue(client, "refuse").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["state"] == "failed", what="job failed")
    assert runs == [1]
    assert "miniqueue.PermanentError: card declined" in row(conn, job_id)["last_error"]


def test_a_mixed_app_runs_each_kind_within_its_own_slots(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    threads: dict[str, set[str]] = {"sync": set(), "async": set()}
    async_done = threading.Event()

    @app.task("blocking")
    def blocking(job: Job) -> None:
        threads["sync"].add(threading.current_thread().name)
        async_done.wait(10)  # both threads busy: the coroutines must still run

    @app.task("waiting")
    async def waiting(job: Job) -> None:
        threads["async"].add(threading.current_thread().name)
        await asyncio.sleep(0.01)

    sync_ids = [app.enqueue(client, "blocking").id for _ in range(2)]
    async_ids = [app.enqueue(client, "waiting").id for _ in range(6)]
    start_worker(app, concurrency=2, prefetch=10)
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in async_ids), what="async jobs completed")
    assert all(row(conn, i)["state"] == "running" for i in sync_ids), "the threads are still busy"
    async_done.set()
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in sync_ids), what="sync jobs completed")
    assert threads["async"] == {LOOP_THREAD}
    assert len(threads["sync"]) == 2 and all(name.startswith("miniqueue-handler") for name in threads["sync"])


def test_atransaction_commits_writes_with_the_completion(
    client: Client, conn: Connection, start_worker: StartWorker, effects: None
) -> None:
    app = App()

    @app.task("effect")
    async def effect(job: Job) -> None:
        async with job.atransaction() as tx:
            await tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])

    ids = [app.enqueue(client, "effect").id for _ in range(20)]
    start_worker(app, concurrency=10)
    wait_until(lambda: count(conn, "state = 'completed'") == 20, what="jobs completed")
    assert sorted(i for (i,) in conn.execute("SELECT job_id FROM effects").fetchall()) == ids
    pool_connections = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'miniqueue:handler' "
        "AND datname = current_database()"
    ).fetchone()
    assert pool_connections is not None and 1 <= pool_connections[0] <= 10


def test_atransaction_rolls_back_when_the_lease_is_lost(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, effects: None
) -> None:
    app = App()
    may_commit, started = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    @app.task("late")
    async def late(job: Job) -> None:
        started.set()
        await asyncio.to_thread(may_commit.wait, 10)
        try:
            async with job.atransaction() as tx:
                await tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])
        except LeaseLost as exc:
            raised.append(exc)
            raise

    job_id = app.enqueue(client, "late").id
    # A heartbeat that does not beat during the test: the fence, not the cancellation, catches it.
    start_worker(app, lease_duration=60.0, heartbeat_seconds=30.0)
    assert started.wait(10)
    store.cancel(conn, [job_id])
    may_commit.set()
    wait_until(lambda: raised, what="LeaseLost raised in the handler")
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
    assert row(conn, job_id)["state"] == "cancelled"


def test_atransaction_rolls_back_when_the_coroutine_is_cancelled_inside_it(
    client: Client, conn: Connection, store: Store, start_worker: StartWorker, effects: None
) -> None:
    app = App()
    stops = Stops()
    wrote = threading.Event()

    @app.task("interrupted")
    async def interrupted(job: Job) -> None:
        async with job.atransaction() as tx:
            await tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])
            wrote.set()
            await stops.sleep_until_cancelled(job)

    job_id = app.enqueue(client, "interrupted").id
    start_worker(app)
    assert wrote.wait(10)
    store.cancel(conn, [job_id])  # the open transaction has not touched the job row yet
    wait_until(lambda: stops.seen, what="the coroutine cancelled")
    assert stops.seen == [("cancelled", True, "the job should stop: cancelled")]
    wait_until(lambda: not _in_transaction(conn), what="the handler's transaction rolled back")
    conn.execute("INSERT INTO effects (job_id) VALUES (%s)", [job_id])  # would wait on an open one
    assert row(conn, job_id)["state"] == "cancelled"


def _in_transaction(conn: Connection) -> int:
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'miniqueue:handler' "
        "AND datname = current_database() AND state LIKE 'idle in transaction%%'"
    ).fetchone()
    return int(found[0]) if found else 0


def test_a_def_handler_cannot_use_atransaction_nor_an_async_one_transaction(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    errors: list[str] = []

    @app.task("sync_side")
    def sync_side(job: Job) -> None:
        try:
            job.atransaction()
        except RuntimeError as exc:
            errors.append(str(exc))

    @app.task("async_side")
    async def async_side(job: Job) -> None:
        try:
            with job.transaction():
                pass
        except RuntimeError as exc:
            errors.append(str(exc))

    app.enqueue(client, "sync_side")
    app.enqueue(client, "async_side")
    start_worker(app)
    wait_until(lambda: len(errors) == 2, what="both refused")
    assert any("uses 'async with job.atransaction()'" in e for e in errors)
    assert any("(a 'def' handler uses job.transaction())" in e for e in errors)


# -- under a real supervisor -------------------------------------------------------------------

ASYNC_APP = "tests.apps.async_app:app"


@pytest.fixture
def supervise(dsn: str, conn: Connection, tmp_path: Path, repo_root: Path) -> Iterator[StartSupervisor]:
    conn.execute("DROP TABLE IF EXISTS executions")
    conn.execute("CREATE TABLE executions (job_id BIGINT, attempt INT, pid INT)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id BIGINT PRIMARY KEY)")
    conn.execute("TRUNCATE effects")
    fleet = Fleet(dsn, tmp_path, repo_root, ASYNC_APP)
    yield fleet.start
    fleet.stop_all()


def executions(conn: Connection, job_id: int) -> int:
    found = conn.execute("SELECT count(*) FROM executions WHERE job_id = %s", [job_id]).fetchone()
    return int(found[0]) if found else 0


def test_supervised_async_app_drains_survives_a_kill_and_stops_gracefully(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise("--concurrency", "10", workers=2)
    sup.wait_ready(2)
    ids = [client.enqueue("effect").id for _ in range(100)]
    wait_until(lambda: count(conn, "state = 'completed'") == 100, timeout=20, what="100 effects completed")
    assert sorted(i for (i,) in conn.execute("SELECT job_id FROM effects").fetchall()) == ids

    # SIGKILL the worker running a coroutine: the supervisor charges it and another runs it.
    victim = client.enqueue("nap", {"sleep_on": [1], "seconds": 30}).id
    wait_until(lambda: executions(conn, victim), what="the coroutine running")
    pid = int(row(conn, victim)["leased_by"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: row(conn, victim)["state"] == "completed", timeout=15, what="job completed after the kill")
    stored = row(conn, victim)
    assert stored["attempt"] == 2
    assert stored["errors"][0]["error"] == f"worker process died: SIGKILL (pid {pid})"

    # TERM while a coroutine runs: it finishes, the supervisor exits 0.
    last = client.enqueue("nap", {"sleep_on": [1], "seconds": 1.5}).id
    wait_until(lambda: executions(conn, last), what="the last coroutine running")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0
    assert row(conn, last)["state"] == "completed" and row(conn, last)["attempt"] == 1


def test_a_crash_charges_none_of_the_coroutines_that_were_running_and_each_runs_alone_next(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    """Which coroutine killed the worker is not known: none is charged, each runs alone next."""
    sup = supervise("--concurrency", "5", workers=1)
    sup.wait_ready(1)
    with conn.transaction():
        ids = [client.enqueue("nap", {"sleep_on": [1], "seconds": 30}, conn=conn).id for _ in range(3)]
    wait_until(lambda: all(executions(conn, i) for i in ids), what="three coroutines running")
    pid = int(row(conn, ids[0])["leased_by"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(row(conn, i)["errors"] for i in ids), timeout=15, what="all three returned")
    notes = [row(conn, i)["errors"][0]["error"] for i in ids]
    died = f"worker process died: SIGKILL (pid {pid}) while 3 jobs ran in the process; attempt not charged"
    assert all(note.startswith("interrupted after ") and died in note for note in notes), notes
    uncharged = [(r := row(conn, i))["run_alone"] and r["max_attempts"] == r["attempt_budget"] + 1 for i in ids]
    assert all(uncharged), "uncharged, alone next"


def test_a_kill_for_one_coroutines_hard_timeout_charges_that_job_only(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    """The kill was ours, on one job's account: its neighbours on the event loop go back
    uncharged, as any job interrupted by a stop we asked for."""
    sup = supervise("--concurrency", "5", workers=1)
    sup.wait_ready(1)
    with conn.transaction():
        naps = [client.enqueue("nap", {"sleep_on": [1], "seconds": 30}, conn=conn).id for _ in range(3)]
        deaf = client.enqueue("deaf", conn=conn).id
    budget = {i: row(conn, i)["max_attempts"] for i in [*naps, deaf]}
    wait_until(lambda: row(conn, deaf)["state"] == "completed", timeout=30, what="the deaf job's retry completed")
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in naps), timeout=30, what="neighbours done")
    [killed] = row(conn, deaf)["errors"]
    assert killed["error"].startswith(f"worker process killed: job {deaf} (deaf) exceeded its 0.5s timeout")
    assert (row(conn, deaf)["attempt"], row(conn, deaf)["max_attempts"]) == (2, budget[deaf]), "one attempt charged"
    for job_id in naps:
        [note] = row(conn, job_id)["errors"]
        assert note["error"].startswith("interrupted after ") and note["error"].endswith("attempt not charged")
        assert f"job {deaf} (deaf) exceeded its 0.5s timeout" in note["error"]
        assert (row(conn, job_id)["attempt"], row(conn, job_id)["max_attempts"]) == (2, budget[job_id] + 1), (
            "no attempt charged"
        )
