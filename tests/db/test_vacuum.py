"""The reaper's upkeep of the jobs table (miniqueue.vacuum): vacuum and analyze as claims churn
it, only ANALYZE for rows that are new, nothing for a role that does not own the table."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from miniqueue import Client, JobSpec, State
from miniqueue.core.db import connect
from miniqueue.maintenance.reaper import Reaper, ReaperConfig
from miniqueue.maintenance.vacuum import Vacuum
from miniqueue.store.store import JobsChurn, Store
from miniqueue.testing import database as testing_db

from ..helpers import wait_until

JOBS = 300
AFTER_ROWS = 100  # upkeep is due past this many rows here, so that a few hundred jobs call for it


@pytest.fixture
def own_dsn(server_dsn: str) -> Iterator[str]:
    """A migrated database of the test's own (the table statistics must be this test's alone),
    where autovacuum leaves the jobs table to the reaper."""
    dsn = testing_db.create_database(server_dsn, prefix="miniqueue_vacuum")
    with connect(dsn, purpose="test") as conn:
        conn.execute("ALTER TABLE miniqueue_jobs_live SET (autovacuum_enabled = false)")
    yield dsn
    testing_db.drop_database(server_dsn, dsn)


def churn(dsn: str) -> JobsChurn:
    with connect(dsn, purpose="test") as conn:
        return Store().jobs_churn(conn)


def maintenance(dsn: str) -> tuple[int, int]:
    """How often the jobs table was vacuumed and analyzed by hand (not by autovacuum)."""
    with connect(dsn, purpose="test") as conn:
        row = conn.execute(
            "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relname = 'miniqueue_jobs_live'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def wait_for_churn(dsn: str, *, updated: int = 0, changed: int = 0) -> None:
    """Poll until the server's statistics show the rows a finished connection wrote (each
    backend reports its counts when it goes idle or exits, a moment later)."""
    wait_until(
        lambda: (seen := churn(dsn)).updated >= updated and seen.changed >= changed,
        timeout=20,
        interval=0.05,
        what=f"statistics showing {updated} updated and {changed} changed rows",
    )


def enqueue(dsn: str, jobs: int) -> None:
    with Client(dsn) as client:
        client.enqueue_many([JobSpec("t", {"n": n}) for n in range(jobs)])


def claim_and_complete(dsn: str, jobs: int) -> None:
    """Claim and complete ``jobs`` available jobs, on a connection closed afterwards."""
    store = Store()
    with connect(dsn, purpose="test") as conn:
        leases = store.claim(conn, ["default"], "w1", 60, jobs)
        assert len(leases) == jobs
        assert len(store.complete_many(conn, "w1", [(lease.id, lease.attempt) for lease in leases])) == jobs


def upkeep(dsn: str) -> Vacuum:
    return Vacuum(dsn, Store(), threading.Event(), after_rows=AFTER_ROWS)


def test_claims_and_completions_get_the_table_vacuumed_and_analyzed(own_dsn: str) -> None:
    enqueue(own_dsn, JOBS)
    vacuum = upkeep(own_dsn)
    vacuum.step()  # the first reading: rows are counted from here
    before = maintenance(own_dsn)

    claim_and_complete(own_dsn, JOBS)
    wait_for_churn(own_dsn, updated=2 * JOBS)  # a claim and a completion update one row each
    rest = vacuum.step()

    assert rest >= 1.0
    assert maintenance(own_dsn) == (before[0] + 1, before[1] + 1)
    assert vacuum.step() == 1.0, "nothing more is due right after"
    assert maintenance(own_dsn) == (before[0] + 1, before[1] + 1)


def test_new_rows_are_analyzed_without_a_vacuum(own_dsn: str) -> None:
    vacuum = upkeep(own_dsn)
    vacuum.step()
    before = maintenance(own_dsn)

    enqueue(own_dsn, JOBS)
    wait_for_churn(own_dsn, changed=JOBS)
    vacuum.step()

    assert maintenance(own_dsn) == (before[0], before[1] + 1)
    assert churn(own_dsn).changed == 0


def test_analyze_describes_the_columns_plans_read_and_not_the_jobs_contents(own_dsn: str) -> None:
    enqueue(own_dsn, JOBS)
    with connect(own_dsn, purpose="test") as conn:
        Store().vacuum_jobs(conn, analyze_only=True)
        stats = conn.execute("SELECT attname FROM pg_stats WHERE tablename = 'miniqueue_jobs_live'")
        described = {row[0] for row in stats}
    assert {"state", "queue", "priority", "scheduled_at", "limits"} <= described
    assert not described & {"payload", "result", "errors", "last_error", "trace_context"}
    # ANALYZE samples 300 rows per unit of the largest target: 3,000 rows, not 30,000.
    targets = statistics_targets(own_dsn)
    assert targets and max(targets.values()) == 10, targets


def statistics_targets(dsn: str) -> dict[str, int]:
    """The jobs table's columns with their statistics targets (-1: the server's default)."""
    with connect(dsn, purpose="test") as conn:
        rows = conn.execute(
            "SELECT attname, attstattarget FROM pg_attribute"
            " WHERE attrelid = 'miniqueue_jobs_live'::regclass AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
    return {name: -1 if target is None else int(target) for name, target in rows}


def test_pruned_rows_call_for_no_upkeep(own_dsn: str) -> None:
    """Pruning deletes from the history, never from the hot table: it changes nothing the hot
    table's upkeep counts (a claim updates a row there, a completion moves it out)."""
    enqueue(own_dsn, 20)
    claim_and_complete(own_dsn, 20)
    wait_for_churn(own_dsn, updated=40, changed=60)
    vacuum = upkeep(own_dsn)
    vacuum.step()
    with connect(own_dsn, purpose="test") as conn:
        conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '2 days'")
        assert Store().prune(conn, [State.COMPLETED], 3600) == 20
    before = maintenance(own_dsn)

    assert vacuum.step() == 1.0

    assert maintenance(own_dsn) == before


def test_a_role_that_does_not_own_the_table_leaves_it_to_autovacuum(
    own_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"miniqueue_tenant_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        enqueue(own_dsn, JOBS)
        wait_for_churn(own_dsn, changed=JOBS)
        before = maintenance(own_dsn)
        tenant = make_conninfo(own_dsn, user=role, password="")

        with caplog.at_level(logging.INFO, logger="miniqueue.vacuum"):
            assert upkeep(tenant).step() < 0

        assert "does not own" in caplog.text and "left to autovacuum" in caplog.text
        assert maintenance(own_dsn) == before
    finally:
        with psycopg.connect(own_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_reaper_runs_the_upkeep_unless_told_not_to(own_dsn: str) -> None:
    upkeep_threads = {False: 0, True: 1}
    for vacuum, expected in upkeep_threads.items():
        with running_reaper(own_dsn, vacuum=vacuum):
            assert sum(t.name == "miniqueue-vacuum" for t in threading.enumerate()) == expected


@contextlib.contextmanager
def running_reaper(dsn: str, *, vacuum: bool) -> Iterator[Reaper]:
    """A reaper on a thread, yielded once its first pass has started."""
    reaper = Reaper(dsn, ReaperConfig(interval=0.05, vacuum=vacuum))
    runner = threading.Thread(target=reaper.run)
    runner.start()
    try:
        wait_until(lambda: reaper._conn is not None, timeout=20, what="the reaper connected")
        yield reaper
    finally:
        reaper.stop()
        runner.join()


def test_upkeep_that_fails_says_so_and_carries_on(fresh_database: str, caplog: pytest.LogCaptureFixture) -> None:
    # An unmigrated database: the statistics cannot be read. The loop logs it and rests; it
    # never ends the reaper's process.
    stopping = threading.Event()
    vacuum = Vacuum(fresh_database, Store(), stopping, after_rows=AFTER_ROWS)
    runner = threading.Thread(target=vacuum.run)
    with caplog.at_level(logging.WARNING, logger="miniqueue.vacuum"):
        runner.start()
        try:
            wait_until(lambda: "run `miniqueue migrate` first" in caplog.text, timeout=20, what="the failure logged")
            assert runner.is_alive()
        finally:
            stopping.set()
            runner.join()
