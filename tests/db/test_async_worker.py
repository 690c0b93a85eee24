"""What is particular to ``async def`` handlers, against a real PostgreSQL: one event loop per
worker, a cancelled coroutine's attempt, apps of both kinds, ``job.atransaction()`` cancelled
inside; in process and under a real ``miniqueue-supervise``. What holds for every handler
(outcomes, fencing, being told to stop) is in ``test_worker.py``, run for both kinds."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.core.errors import ConfigError
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job

from ..handlers import LOOP_THREAD, HandlerKind, Stops
from ..helpers import count, row, wait_until
from ..running import StartWorker
from ..supervised import Fleet, StartSupervisor

#: What an ``async def`` handler sees when told to stop (a ``CancelledError`` with the reason).
ASYNC = HandlerKind("async def")


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
    assert stops.seen == [ASYNC.told("timeout")]
    assert row(conn, job_id)["last_error"].endswith("CancelledError: the job should stop: timeout")


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
    assert stops.seen == [ASYNC.told("cancelled")]
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
def supervise(
    dsn: str, executions: Connection, effects: None, tmp_path: Path, repo_root: Path
) -> Iterator[StartSupervisor]:
    with Fleet(dsn, tmp_path, repo_root, ASYNC_APP) as fleet:
        yield fleet.start


def runs(conn: Connection, job_id: int) -> int:
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
    wait_until(lambda: runs(conn, victim), what="the coroutine running")
    pid = int(row(conn, victim)["leased_by"].split(":")[1])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: row(conn, victim)["state"] == "completed", timeout=15, what="job completed after the kill")
    stored = row(conn, victim)
    assert stored["attempt"] == 2
    assert stored["errors"][0]["error"] == f"worker process died: SIGKILL (pid {pid})"

    # TERM while a coroutine runs: it finishes, the supervisor exits 0.
    last = client.enqueue("nap", {"sleep_on": [1], "seconds": 1.5}).id
    wait_until(lambda: runs(conn, last), what="the last coroutine running")
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
    wait_until(lambda: all(runs(conn, i) for i in ids), what="three coroutines running")
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
