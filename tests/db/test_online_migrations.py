"""Online migrations: a file may run outside a transaction (an index built CONCURRENTLY while the
queue drains), every statement waits for its lock only a moment and tries again, and a schema a
worker cannot serve is refused with a clear message."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from miniqueue import App, Client, JobSpec, MiniqueueError, SchemaOutOfDate
from miniqueue.core.db import Connection, connect
from miniqueue.store import schema as schema_statements
from miniqueue.store.migrate import check_schema_version, latest_version, run_migrations
from miniqueue.store.schema import split_statements
from miniqueue.store.store import Store
from miniqueue.testing import run_jobs

from ..helpers import count, wait_until
from ..supervised import Fleet

CONCURRENT_INDEX = """-- miniqueue: no transaction
-- An index built without blocking the queue (a failed build leaves it invalid: drop it first).
DROP INDEX CONCURRENTLY IF EXISTS idx_test_by_task;
CREATE INDEX CONCURRENTLY idx_test_by_task ON miniqueue_jobs_live (task) WHERE state = 'available';
"""


@pytest.fixture
def own(fresh_database: str) -> Iterator[tuple[str, Connection]]:
    """A migrated database of the test's own (these tests apply migrations of their own to it)."""
    run_migrations(fresh_database)
    with connect(fresh_database, purpose="test") as conn:
        yield fresh_database, conn


def valid(conn: Connection, index: str) -> bool | None:
    row = conn.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s", [index]
    ).fetchone()
    return None if row is None else bool(row[0])


def test_an_index_built_concurrently_while_a_worker_drains_loses_nothing(own: tuple[str, Connection]) -> None:
    dsn, conn = own
    app = App()
    done: list[int] = []

    @app.task("drain", queue="busy")
    def drain(job: Any) -> None:
        done.append(job.id)

    with Client(dsn) as client:
        client.enqueue_many([JobSpec("drain", {"n": n}, queue="busy") for n in range(5000)])
        runner = threading.Thread(target=run_jobs, args=(app, client), kwargs={"timeout": 120})
        runner.start()
        wait_until(lambda: done, what="the drain under way")
        Store().apply_migrations(conn, [(latest_version() + 1, "test_by_task", CONCURRENT_INDEX)])
        runner.join()
    assert valid(conn, "idx_test_by_task") is True
    assert count(conn, "state = 'completed'") == 5000 and len(set(done)) == 5000
    assert Store().schema_version(conn) == latest_version() + 1


def test_a_statement_that_cannot_get_its_lock_gives_way_and_tries_again(
    own: tuple[str, Connection], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dsn, conn = own
    monkeypatch.setattr(schema_statements, "LOCK_TIMEOUT_SECONDS", 0.2)
    caplog.set_level(logging.WARNING, logger="miniqueue.migrate")
    migration = (latest_version() + 1, "test_column", "ALTER TABLE miniqueue_jobs ADD COLUMN test_note TEXT;")
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE miniqueue_jobs IN ACCESS SHARE MODE")  # a long reader, say
        release = threading.Timer(1.0, holder.rollback)
        release.start()
        Store().apply_migrations(conn, [migration])
        release.join()
    assert any("trying again" in r.getMessage() for r in caplog.records)
    assert Store().schema_version(conn) == latest_version() + 1
    conn.execute("SELECT test_note FROM miniqueue_jobs")


def test_a_lock_held_too_long_fails_the_migration_with_a_clear_error_and_records_nothing(
    own: tuple[str, Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, conn = own
    monkeypatch.setattr(schema_statements, "LOCK_TIMEOUT_SECONDS", 0.05)
    monkeypatch.setattr(schema_statements, "LOCK_ATTEMPTS", 2)
    migration = (latest_version() + 1, "test_column", "ALTER TABLE miniqueue_jobs ADD COLUMN test_note TEXT;")
    with psycopg.connect(dsn) as holder:
        holder.execute("LOCK TABLE miniqueue_jobs IN ACCESS SHARE MODE")
        with pytest.raises(MiniqueueError, match=r"test_column: a lock it needs was held for over 0\.05s, 2 times"):
            Store().apply_migrations(conn, [migration])
        holder.rollback()
    assert Store().schema_version(conn) == latest_version()


def test_a_schema_that_needs_newer_workers_is_refused_with_a_clear_message(own: tuple[str, Connection]) -> None:
    _, conn = own
    check_schema_version(conn)
    future = (latest_version() + 1, "future", f"-- miniqueue: workers from {latest_version() + 1}\nSELECT 1;")
    Store().apply_migrations(conn, [future])
    with pytest.raises(SchemaOutOfDate, match=f"workers before version {latest_version() + 1} cannot serve"):
        check_schema_version(conn)


def test_statements_split_where_they_end_and_never_inside_a_function_body() -> None:
    text = """-- miniqueue: no transaction
-- a comment; with a semicolon
CREATE INDEX CONCURRENTLY a ON t (x);
CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN 1;
END
$$;
DROP INDEX CONCURRENTLY IF EXISTS b;
"""
    parts = split_statements(text)
    assert len(parts) == 3
    assert parts[0].endswith("CREATE INDEX CONCURRENTLY a ON t (x);") and "RETURN 1;" in parts[1]
    assert parts[2] == "DROP INDEX CONCURRENTLY IF EXISTS b;"


def test_old_workers_left_running_across_a_migration_they_cannot_serve_stop_with_one_line(
    own: tuple[str, Connection], tmp_path: Path, repo_root: Path
) -> None:
    """A supervisor of the version before a migration that says which workers it needs: its
    running workers fail on their next claim, each child says why in one line, and the supervisor
    stops (exit code non-zero) instead of forking children that fail again, forever."""
    dsn, conn = own
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.supervised:app") as fleet:
        old = fleet.start(workers=2)
        old.harness.wait_ready(60)
        future = latest_version() + 1
        breaking = (
            future,
            "breaking",
            f"-- miniqueue: workers from {future}\nALTER TABLE miniqueue_jobs RENAME COLUMN run_alone TO run_apart;",
        )
        Store().apply_migrations(conn, [breaking])
        code = old.proc.wait(60)
    output = old.output()
    refusal = f"workers before version {future} cannot serve"
    assert code != 0 and refusal in output, output[-3000:]
    assert "restarting worker" not in output and output.count("Traceback") == 0, output[-3000:]
