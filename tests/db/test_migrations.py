"""Migrations: recorded, idempotent, atomic, safe when many processes run them at once."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from miniqueue import JobSpec, SchemaOutOfDate, run_migrations
from miniqueue.core.db import Connection, connect
from miniqueue.core.validation import validate
from miniqueue.store.migrate import check_schema_version, latest_version, load_migrations
from miniqueue.store.store import Store

SHIPPED = [(m.version, m.name) for m in load_migrations()]


def recorded(conn: Connection, schema: str = "public") -> list[tuple[int, str]]:
    return [
        (r[0], r[1]) for r in conn.execute(f"SELECT version, name FROM {schema}.miniqueue_migrations ORDER BY version")
    ]


QUEUE_TABLES = [
    "miniqueue_counts",
    "miniqueue_fair_keys",
    "miniqueue_finished_minutes",
    "miniqueue_history_partitions",
    "miniqueue_idempotency_keys",
    "miniqueue_jobs",
    "miniqueue_jobs_done",
    "miniqueue_jobs_done_default",
    "miniqueue_jobs_failed",
    "miniqueue_jobs_failed_default",
    "miniqueue_jobs_live",
    "miniqueue_key_rules",
    "miniqueue_limits",
    "miniqueue_migrations",
    "miniqueue_pauses",
    "miniqueue_periodic",
    "miniqueue_processes",
    "miniqueue_queues",
    "miniqueue_schedules",
    "miniqueue_sequences",
    "miniqueue_served_queues",
    "miniqueue_shard",
    "miniqueue_signals",
    "miniqueue_tasks",
    "miniqueue_unique_windows",
]


def tables(conn: Connection, schema: str = "public") -> list[str]:
    """The schema's tables, but for the history's partitions by finish time (named by their start)."""
    query = "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename !~ '_[0-9]{8}' ORDER BY 1"
    return [r[0] for r in conn.execute(query, [schema])]


def test_shipped_migrations_are_numbered_from_one_without_gaps() -> None:
    assert [v for v, _ in SHIPPED] == list(range(1, len(SHIPPED) + 1))
    assert latest_version() == SHIPPED[-1][0]


def test_migrations_are_idempotent_and_recorded(fresh_database: str) -> None:
    first = run_migrations(fresh_database)
    assert [(m.version, m.name) for m in first] == SHIPPED
    assert run_migrations(fresh_database) == [], "a second run applies nothing"
    with connect(fresh_database, purpose="test") as conn:
        assert recorded(conn) == SHIPPED
        applied_at = conn.execute("SELECT count(*) FROM miniqueue_migrations WHERE applied_at IS NULL").fetchone()
        assert applied_at == (0,)
        assert tables(conn) == QUEUE_TABLES
        check_schema_version(conn)


def _migrate_at_once(dsn: str, start: Barrier, results: multiprocessing.Queue[Any]) -> None:
    """One of many processes racing to migrate the same fresh database."""
    try:
        start.wait(timeout=60)
        results.put(("ok", [m.version for m in run_migrations(dsn)]))
    except BaseException as exc:  # report everything: the parent asserts there was nothing to report
        results.put(("error", repr(exc)))


def test_twenty_processes_migrating_at_once(fresh_database: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(20)
    results: multiprocessing.Queue[Any] = ctx.Queue()
    processes = [ctx.Process(target=_migrate_at_once, args=(fresh_database, start, results)) for _ in range(20)]
    for process in processes:
        process.start()
    try:
        outcomes = [results.get(timeout=90) for _ in processes]
    except queue.Empty:
        pytest.fail("a migrating process neither finished nor reported an error")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [p.exitcode for p in processes] == [0] * 20
    errors = [detail for status, detail in outcomes if status != "ok"]
    assert errors == []
    applied = sorted((detail for _, detail in outcomes), key=len)
    assert applied[:-1] == [[]] * 19, "exactly one process applied the migrations"
    assert applied[-1] == [v for v, _ in SHIPPED]
    with connect(fresh_database, purpose="test") as conn:
        assert recorded(conn) == SHIPPED, "each version recorded once"
        assert tables(conn) == QUEUE_TABLES
        check_schema_version(conn)
        Store().enqueue(conn, validate(JobSpec("t")))


def test_check_schema_version_on_an_unmigrated_database(fresh_database: str) -> None:
    with connect(fresh_database, purpose="test") as conn:
        with pytest.raises(SchemaOutOfDate, match=f"version 0, this miniqueue needs {latest_version()}"):
            check_schema_version(conn)
        assert tables(conn) == [], "checking creates nothing"


def test_check_schema_version_on_a_partly_migrated_database(fresh_database: str) -> None:
    migrations = [(m.version, m.name, m.sql) for m in load_migrations()]
    with connect(fresh_database, purpose="test") as conn:
        assert Store().apply_migrations(conn, migrations[:3]) == {1, 2, 3}
        with pytest.raises(SchemaOutOfDate, match="version 3"):
            check_schema_version(conn)
        assert Store().apply_migrations(conn, migrations) == {m[0] for m in migrations[3:]}
        check_schema_version(conn)


@pytest.mark.parametrize("operation", ["enqueue", "claim", "get", "counts", "recover"])
def test_store_on_an_unmigrated_database_raises_schema_out_of_date(fresh_database: str, operation: str) -> None:
    store = Store()
    calls: dict[str, Callable[[Connection], object]] = {
        "enqueue": lambda c: store.enqueue(c, validate(JobSpec("t"))),
        "claim": lambda c: store.claim(c, ["default"], "w", 30, 1),
        "get": lambda c: store.get(c, 1),
        "counts": lambda c: store.counts(c),
        "recover": lambda c: store.recover_expired_leases(c),
    }
    with connect(fresh_database, purpose="test") as conn:
        with pytest.raises(SchemaOutOfDate, match="miniqueue migrate") as raised:
            calls[operation](conn)
        assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedTable)


def test_store_on_an_outdated_schema_raises_schema_out_of_date(fresh_database: str) -> None:
    first = load_migrations()[0]
    with connect(fresh_database, purpose="test") as conn:
        Store().apply_migrations(conn, [(first.version, first.name, first.sql)])
        with pytest.raises(SchemaOutOfDate, match="out of date") as raised:
            Store().get(conn, 1)
        assert isinstance(raised.value.__cause__, psycopg.errors.UndefinedColumn)


def test_a_failing_migration_leaves_the_schema_as_it_was(fresh_database: str) -> None:
    migrations = [(m.version, m.name, m.sql) for m in load_migrations()]
    broken = (len(migrations) + 1, "broken", "CREATE TABLE half_done (id int); SELECT 1 / 0;")
    with connect(fresh_database, purpose="test") as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            Store().apply_migrations(conn, [*migrations, broken])
        assert tables(conn) == [], "nothing applied, not even the good migrations before it"
        assert Store().apply_migrations(conn, migrations) == {v for v, *_ in migrations}


def test_migrations_into_another_schema_are_independent(fresh_database: str) -> None:
    assert [m.version for m in run_migrations(fresh_database, schema="tenant_b")] == [v for v, _ in SHIPPED]
    with connect(fresh_database, purpose="test") as conn:
        assert tables(conn, "tenant_b") == QUEUE_TABLES
        assert tables(conn, "public") == []
        with pytest.raises(SchemaOutOfDate):
            check_schema_version(conn)
        check_schema_version(conn, "tenant_b")
        job = Store("tenant_b").enqueue(conn, validate(JobSpec("t")))
        assert Store("tenant_b").get(conn, job.id).task == "t"
    assert len(run_migrations(fresh_database)) == len(SHIPPED), "public is migrated on its own"


def test_migration_runs_on_a_pinned_search_path(fresh_database: str) -> None:
    name = conninfo_to_dict(fresh_database)["dbname"]
    with psycopg.connect(fresh_database, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA decoy")
        # What a DBA might have set: unqualified names would otherwise land in "decoy".
        admin.execute(sql.SQL("ALTER DATABASE {} SET search_path = decoy, public").format(sql.Identifier(str(name))))
    run_migrations(fresh_database)
    with connect(fresh_database, purpose="test") as conn:
        assert tables(conn, "decoy") == []
        assert tables(conn, "public") == QUEUE_TABLES
