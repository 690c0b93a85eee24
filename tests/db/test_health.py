"""The database's health for the queue: what holds the MVCC horizon back is named (by pid,
application and start) by `miniqueue doctor`, the reaper's log and the dashboard; and each check
of the diagnosis says when it needs a human."""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from miniqueue import Client, Reaper, ReaperConfig
from miniqueue.cli.main import main
from miniqueue.core import health
from miniqueue.core.db import Connection
from miniqueue.core.health import Reading, check_horizon, diagnose
from miniqueue.core.records import HorizonHolder, Partition, TableHealth
from miniqueue.web import create_app, pages

from ..helpers import wait_until
from .test_web import on_localhost


def doctor(dsn: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["doctor", *args, "--database-url", dsn])


@pytest.fixture
def snapshot_held(dsn: str) -> Iterator[int]:
    """A session idle in a transaction that keeps a snapshot (as a long report or a forgotten
    BEGIN does): its pid."""
    with psycopg.connect(dsn, application_name="nightly-report") as other:
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM miniqueue_jobs")
        yield other.info.backend_pid
        other.rollback()


def test_doctor_says_all_is_well_on_a_quiet_database(dsn: str, conn: Connection) -> None:
    out = doctor(dsn, "--json")
    report = json.loads(out.output)
    checks = {c["name"]: c for c in report["checks"]}
    autovacuum = conn.execute("SELECT current_setting('autovacuum')::boolean").fetchone()[0]  # type: ignore[index]
    assert checks["autovacuum"]["ok"] == autovacuum
    assert all(c["ok"] for name, c in checks.items() if name != "autovacuum"), checks
    assert out.exit_code == (0 if autovacuum else 1)
    assert set(checks) == {"horizon", "dead rows", "sizes", "history", "autovacuum", "connections", "schema", "clock"}


def test_a_long_transaction_is_named_by_doctor_with_its_pid_and_application(dsn: str, snapshot_held: int) -> None:
    def horizon_line() -> str | None:
        out = doctor(dsn, "--horizon-seconds", "0.2")
        line = next(line for line in out.output.splitlines() if " horizon " in line)
        return line if out.exit_code == 1 and line.startswith("FAIL") else None

    line = wait_until(horizon_line, what="doctor's horizon check")
    assert f"pid {snapshot_held} 'nightly-report' idle in transaction" in line
    report = json.loads(doctor(dsn, "--json", "--horizon-seconds", "0.2").output)
    [holder] = [h for h in report["horizon"] if h["pid"] == snapshot_held]
    assert (holder["kind"], holder["name"], holder["query"]) == (
        "transaction",
        "nightly-report",
        "SELECT count(*) FROM miniqueue_jobs",
    )
    assert report["healthy"] is False


def test_an_uncommitted_write_holds_the_horizon_too(dsn: str) -> None:
    with psycopg.connect(dsn, application_name="batch-import") as other:
        other.execute("INSERT INTO miniqueue_served_queues (queue) VALUES ('imports')")
        pid = other.info.backend_pid
        with Client(dsn) as client:
            [holder] = [h for h in client.horizon() if h.pid == pid]
        assert (holder.kind, holder.name, holder.state) == ("transaction", "batch-import", "idle in transaction")
        other.rollback()


def test_the_reaper_warns_once_naming_the_holder(
    dsn: str, snapshot_held: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="miniqueue.reaper")
    reaper = Reaper(dsn, ReaperConfig(prune=False, vacuum=False, horizon_seconds=0.2))

    def warned() -> list[str]:
        reaper.run_once()
        return [r.getMessage() for r in caplog.records if f"pid {snapshot_held} " in r.getMessage()]

    [line] = wait_until(warned, what="the reaper's warning")
    assert f"MVCC horizon is held back by transaction pid {snapshot_held} 'nightly-report' idle in transaction" in line
    reaper.run_once()
    assert len(warned()) == 1  # once per holder, not at every pass


def test_the_dashboard_shows_a_banner_naming_the_holder(
    client: Client, snapshot_held: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The threshold made short (30 s by default), so that the test need not wait for it.
    monkeypatch.setattr(pages, "held_too_long", functools.partial(health.held_too_long, seconds=0.2))
    with on_localhost(create_app(client)) as web:

        def banner() -> str | None:
            html = web.get("/").text
            return html if "MVCC horizon is held back" in html else None

        page = wait_until(banner, what="the banner")
    assert f"pid {snapshot_held} &#39;nightly-report&#39;" in page or f"pid {snapshot_held} 'nightly-report'" in page


# -- each cause and check, as the diagnosis judges them ---------------------------------------------

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
TABLE = TableHealth(1000, 10, 8192, 16384, 8192, None, True, 0.01, 1000, NOW.timestamp())
HOUR, DAY = dt.timedelta(hours=1), dt.timedelta(days=1)
#: The history's partitions as a reaper leaves them: this hour's and this day's, and the next ones.
HISTORY = (
    Partition("miniqueue_jobs_done_20261201t12", "done", NOW, NOW + HOUR, 1200, 8192),
    Partition("miniqueue_jobs_done_20261201t13", "done", NOW + HOUR, NOW + 2 * HOUR, 0, 8192),
    Partition("miniqueue_jobs_failed_20261201", "failed", NOW - 12 * HOUR, NOW + 12 * HOUR, 3, 8192),
)


def reading(**changes: Any) -> Reading:
    base = Reading(
        horizon=[],
        table=TABLE,
        connections=(100, 3, 10),
        schema_version=21,
        latest_version=21,
        host_clock=NOW.timestamp(),
        history=HISTORY,
    )
    return base._replace(**changes)


@pytest.mark.parametrize(
    "holder, named",
    [
        (HorizonHolder("prepared transaction", None, "tx-7", None, NOW, 90.0, 12, None), "prepared transaction 'tx-7'"),
        (
            HorizonHolder("replication slot", None, "replica_a", "inactive", None, None, 5000, None),
            "replication slot 'replica_a' inactive",
        ),
        (
            HorizonHolder("standby feedback", 4242, "standby1", "streaming", NOW, 600.0, 80, None),
            "standby pid 4242 'standby1'",
        ),
    ],
)
def test_each_kind_of_holder_is_named(holder: HorizonHolder, named: str) -> None:
    check = check_horizon([holder], 30)
    assert not check.ok and named in check.detail


def test_a_fresh_snapshot_is_fine_and_a_slot_always_counts() -> None:
    fresh = HorizonHolder("transaction", 1, "app", "active", NOW, 1.0, 2, "SELECT 1")
    assert check_horizon([fresh], 30).ok
    assert not check_horizon([fresh._replace(kind="replication slot", seconds=None)], 30).ok


@pytest.mark.parametrize(
    "changes, failing",
    [
        ({"table": TABLE._replace(dead_rows=500_000, live_rows=1000)}, "dead rows"),
        ({"table": TABLE._replace(autovacuum=False)}, "autovacuum"),
        ({"connections": (100, 3, 90)}, "connections"),
        ({"schema_version": 20}, "schema"),
        ({"schema_version": 22}, "schema"),
        ({"host_clock": NOW.timestamp() + 5}, "clock"),
        ({"history": HISTORY[1:]}, "history"),  # no partition of completed jobs for this hour
        ({"history": ()}, "history"),
    ],
)
def test_each_check_says_when_it_needs_a_human(changes: dict[str, Any], failing: str) -> None:
    assert all(c.ok for c in diagnose(reading()))
    checks = {c.name: c for c in diagnose(reading(**changes))}
    assert [name for name, c in checks.items() if not c.ok] == [failing]
