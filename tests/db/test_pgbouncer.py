"""miniqueue through a real PgBouncer in transaction mode (pool of 3 server connections).

With ``MINIQUEUE_PGBOUNCER=1`` every connection is pooler-safe (no ``options`` startup
parameter, no server-side prepared statements): enqueue, claims, completions, transactional
completion, heartbeats and a supervised drain all go through the pooler, and LISTEN through a
direct URL of its own (or not at all).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from miniqueue import Client, DatabaseUnavailable, JobSpec
from miniqueue.core.db import POOLER_ENV, Connection, behind_pooler
from miniqueue.core.errors import ConfigError
from miniqueue.store.migrate import check_schema_version, load_migrations, run_migrations
from miniqueue.tasks.app import App
from miniqueue.worker.worker import WorkerConfig

from ..helpers import count, row, run_on_threads, wait_until
from ..pgbouncer import PGBOUNCER, POOL_SIZE, PgBouncer
from ..running import StartWorker, worker_starter
from ..supervised import FAST, Supervised


@pytest.fixture(scope="module")
def bouncer(database_dsn: str) -> Iterator[PgBouncer]:
    if not PGBOUNCER.exists():  # nothing here is skipped: a test that did not run proves nothing
        pytest.fail(f"{PGBOUNCER} is missing: install Debian's pgbouncer (apt-get install -y pgbouncer)")
    running = PgBouncer(database_dsn)
    yield running
    running.stop()


@pytest.fixture
def pooled(dsn: str, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The (emptied) test database through pgbouncer, with pooler-safe connections switched on."""
    monkeypatch.setenv(POOLER_ENV, "1")
    return bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))


@pytest.fixture
def executions(conn: Connection) -> None:
    """An empty table for handlers' transactional writes."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS pooled_executions (job_id BIGINT, attempt INT, PRIMARY KEY (job_id, attempt))"
    )
    conn.execute("TRUNCATE pooled_executions")


@pytest.fixture
def start_pooled_worker(pooled: str) -> Iterator[StartWorker]:
    """Start workers on threads that reach the database through the pooler."""
    yield from worker_starter(pooled)


def server_connections(bouncer: PgBouncer) -> int:
    """Server connections pgbouncer holds to the test database, in any state."""
    pools = [p for p in bouncer.admin("SHOW POOLS") if p["database"] != "pgbouncer"]
    return sum(int(p[k]) for p in pools for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))


def clients(bouncer: PgBouncer) -> int:
    return sum(1 for c in bouncer.admin("SHOW CLIENTS") if c["database"] != "pgbouncer")


# -- the fixture itself: transaction pooling, as PgBouncer does it ------------------------------


def test_a_direct_connection_setup_is_refused_with_a_hint(pooled: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POOLER_ENV)
    with pytest.raises(DatabaseUnavailable, match=f"unsupported startup parameter: options.*{POOLER_ENV}=1"):
        Client(pooled)


def test_prepared_statements_break_across_pooled_clients(pooled: str) -> None:
    """The control: psycopg's default (prepare after 5 executions) fails here, so the fixture
    really hands transactions to shared server connections."""
    first = psycopg.connect(pooled, autocommit=True)
    second = psycopg.connect(pooled, autocommit=True)
    with first, second, pytest.raises(psycopg.errors.DuplicatePreparedStatement):
        for _ in range(10):
            for conn in (first, second):
                conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE id > %s", [0])


def test_the_setting_accepts_only_yes_or_no(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("1", True), ("on", True), ("0", False), ("", False)):
        monkeypatch.setenv(POOLER_ENV, value)
        assert behind_pooler() is expected
    monkeypatch.setenv(POOLER_ENV, "transaction")
    with pytest.raises(ConfigError, match=f"{POOLER_ENV}='transaction' is invalid: use 1"):
        behind_pooler()


# -- the queue through the pooler ---------------------------------------------------------------


def test_enqueue_from_more_clients_than_server_connections(pooled: str, conn: Connection, bouncer: PgBouncer) -> None:
    """Six clients enqueue one by one, each statement far past psycopg's prepare threshold,
    interleaved over 3 server connections; then two large batches (INSERT and COPY)."""

    def produce(n: int) -> None:
        with Client(pooled) as client:
            for i in range(25):
                client.enqueue("work", {"client": n, "i": i}, idempotency_key=f"{n}-{i}" if i % 2 else None)

    run_on_threads(produce, 6)
    assert count(conn) == 150
    with Client(pooled) as client:
        client.enqueue_many([JobSpec("work", {"i": i}, idempotency_key=f"batch-{i}") for i in range(300)])
        client.enqueue_many([JobSpec("work", {"i": i}) for i in range(2000)])  # COPY
        assert client.enqueue("work", idempotency_key="batch-7").duplicate
    assert count(conn) == 2450
    assert server_connections(bouncer) <= POOL_SIZE


def test_claim_and_complete_through_the_pooler(
    pooled: str, conn: Connection, bouncer: PgBouncer, start_pooled_worker: StartWorker
) -> None:
    app = App()
    seen: list[int] = []
    app.task("work")(lambda job: seen.append(job.id))
    with Client(pooled) as client:
        ids = [app.enqueue(client, "work", {"i": i}).id for i in range(200)]
        for _ in range(2):
            start_pooled_worker(app, concurrency=2, poll_only=True)
        wait_until(lambda: count(conn, "state = 'completed'") == 200, timeout=30, what="200 jobs completed")
    assert sorted(seen) == sorted(ids)
    assert count(conn, "attempt = 1 AND leased_by IS NULL AND lease_expires_at IS NULL") == 200
    assert server_connections(bouncer) <= POOL_SIZE


def test_transactional_completion_through_the_pooler(
    pooled: str, conn: Connection, executions: None, start_pooled_worker: StartWorker
) -> None:
    from ..pgbouncer import app

    with Client(pooled) as client:
        ids = [app.enqueue(client, "record").id for _ in range(60)]
    # 4 handler threads each with a job.transaction() connection, plus claims and heartbeats.
    start_pooled_worker(app, concurrency=4, poll_only=True)
    wait_until(lambda: count(conn, "state = 'completed'") == 60, timeout=30, what="60 jobs completed")
    assert_ran_once(conn, ids)


def test_heartbeats_renew_the_lease_through_the_pooler(
    pooled: str, conn: Connection, start_pooled_worker: StartWorker
) -> None:
    app = App()
    app.task("slow")(lambda job: job.wait(5))
    with Client(pooled) as client:
        job_id = app.enqueue(client, "slow").id
    start_pooled_worker(app, lease_duration=2.0, heartbeat_seconds=0.5, poll_only=True)
    first = wait_until(lambda: row(conn, job_id)["lease_expires_at"], what="job claimed")
    wait_until(lambda: (row(conn, job_id)["lease_expires_at"] or first) > first, what="lease renewed")
    wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=15, what="slow job completed")
    stored = row(conn, job_id)
    assert stored["attempt"] == 1, "the lease expired while the handler ran"
    assert stored["errors"] == []


def test_migrations_through_the_pooler(
    fresh_database: str, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four migrators at once on an empty database, through 3 server connections: one applies
    every migration (in a schema of its own: nothing relies on the connection's search_path)."""
    monkeypatch.setenv(POOLER_ENV, "1")
    pooled = bouncer.dsn(str(conninfo_to_dict(fresh_database)["dbname"]))
    applied: list[int] = []

    def migrate(_: int) -> None:
        applied.extend(m.version for m in run_migrations(pooled, schema="queue"))

    run_on_threads(migrate, 4)
    assert sorted(applied) == [m.version for m in load_migrations()]
    with psycopg.connect(fresh_database, autocommit=True) as direct:
        check_schema_version(direct, "queue")
        found = direct.execute("SELECT count(*) FROM queue.miniqueue_jobs").fetchone()
    assert found == (0,)


# -- LISTEN: a direct URL of its own, or polling -----------------------------------------------


def listening_backends(conn: Connection) -> int:
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'miniqueue:listen' AND query LIKE 'LISTEN %'"
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_listen_goes_to_the_direct_url(
    dsn: str, pooled: str, conn: Connection, start_pooled_worker: StartWorker
) -> None:
    app = App()
    app.task("work")(lambda job: None)
    # A 60 s poll: only a notification can start the job in time.
    running = start_pooled_worker(app, poll_interval=60.0, listen_url=dsn)
    wait_until(lambda: running.worker.listening, what="worker listening")
    assert listening_backends(conn) == 1
    time.sleep(0.1)  # past the worker's first poll, which would find the job without a notification
    with Client(pooled) as client:
        job_id = app.enqueue(client, "work").id
    wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=5, what="job completed on notification")


def test_without_a_listen_url_a_pooled_worker_polls_and_says_why(
    pooled: str, conn: Connection, start_pooled_worker: StartWorker, caplog: pytest.LogCaptureFixture
) -> None:
    app = App()
    app.task("work")(lambda job: None)
    with caplog.at_level(logging.WARNING, logger="miniqueue.notify"):
        running = start_pooled_worker(app)
        with Client(pooled) as client:
            job_id = app.enqueue(client, "work").id
        wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed by polling")
    assert running.worker.listening is None
    assert listening_backends(conn) == 0
    assert "LISTEN needs a session" in caplog.text


def test_a_malformed_listen_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="database URL 'postgresql://u:\\*\\*\\*@h:x/d' is invalid"):
        WorkerConfig(listen_url="postgresql://u:secret@h:x/d").validated()


# -- a real miniqueue-supervise through the pooler -----------------------------------------------


@pytest.mark.parametrize("listen", ["--listen-url", "--poll-only"])
def test_supervised_drain_through_the_pooler(
    listen: str,
    dsn: str,
    pooled: str,
    conn: Connection,
    bouncer: PgBouncer,
    executions: None,
    repo_root: Path,
    tmp_path: Path,
) -> None:
    listen_args = ["--listen-url", dsn] if listen == "--listen-url" else ["--poll-only"]
    argv = ["--app", "tests.pgbouncer:app", "--workers", "2", "--concurrency", "2", *FAST, *listen_args]
    supervisor = Supervised(pooled, argv, tmp_path / "supervisor", repo_root)
    try:
        supervisor.wait_ready(2)
        with Client(pooled) as client:
            ids = [r.id for r in client.enqueue_many([JobSpec("record", {"i": i}) for i in range(300)])]
        peak_clients = 0

        def drained() -> bool:
            nonlocal peak_clients
            peak_clients = max(peak_clients, clients(bouncer))
            assert server_connections(bouncer) <= POOL_SIZE
            return count(conn, "state = 'completed'") == 300

        wait_until(drained, timeout=60, interval=0.1, what=f"300 jobs completed: {supervisor.output()[-2000:]}")
        assert listening_backends(conn) == (2 if listen == "--listen-url" else 0)
    finally:
        supervisor.stop()
    assert_ran_once(conn, ids)
    # Each worker's claim and heartbeat connections, the supervisor's and the reaper's: more
    # clients than the 3 server connections they shared.
    assert peak_clients > POOL_SIZE
    assert "Traceback" not in supervisor.output()


def assert_ran_once(conn: Connection, ids: list[int]) -> None:
    """Each job's handler committed exactly once, under the attempt that completed it. A job may
    complete on a later attempt only after a hand-back of its unstarted prefetched lease (the
    handler threads were busy past the prefetch budget), never after a failure."""
    rows = conn.execute("SELECT job_id, attempt FROM pooled_executions ORDER BY job_id").fetchall()
    stored = conn.execute(
        "SELECT id, attempt, errors FROM miniqueue_jobs WHERE id = ANY(%s) ORDER BY id", [ids]
    ).fetchall()
    assert rows == [(job_id, attempt) for job_id, attempt, _ in stored]
    notes = [entry["error"] for _, _, errors in stored for entry in errors]
    assert all(note.startswith("handed back unstarted") for note in notes), notes
