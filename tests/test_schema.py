"""One schema setting for a deployment: every command takes ``--schema`` (or $MINIQUEUE_SCHEMA),
and a supervisor's workers and reaper always run in the supervisor's schema."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from miniqueue.db import Connection
from miniqueue.reaper import ReaperConfig
from miniqueue.supervisor import SupervisorConfig
from miniqueue.worker import WorkerConfig

from .helpers import wait_until
from .supervised import Fleet
from .test_cli import Invoke, ok, run


@pytest.fixture
def cli(dsn: str) -> Invoke:
    return lambda *args: run(dsn, *args)


@pytest.fixture
def tenant(dsn: str) -> Iterator[str]:
    name = f"tenant_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_every_command_takes_the_schema(cli: Invoke, tenant: str, conn: Connection) -> None:
    ok(cli("migrate", "--schema", tenant))
    ok(cli("enqueue", "report", "--queue", "nightly", "--schema", tenant))
    stats = json.loads(ok(cli("stats", "--json", "--schema", tenant)))
    assert [(q["queue"], q["available"]) for q in stats] == [("nightly", 1)]
    assert json.loads(ok(cli("stats", "--json"))) == [], "the public schema holds no job"
    [job] = json.loads(ok(cli("jobs", "list", "--json", "--schema", tenant)))
    assert job["task"] == "report"
    rows = conn.execute(sql.SQL("SELECT task FROM {}").format(sql.Identifier(tenant, "miniqueue_jobs"))).fetchall()
    assert rows == [("report",)]


def test_a_bad_schema_name_is_a_usage_error(cli: Invoke) -> None:
    result = cli("stats", "--schema", "x; drop table")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Invalid value for '--schema': schema name 'x; drop table' is invalid" in result.output


def test_the_supervisors_schema_is_its_childrens() -> None:
    config = SupervisorConfig(
        dsn="", app_ref="a:b", schema="tenant_a", worker=WorkerConfig(schema="public"),
        reaper=ReaperConfig(schema="other"),
    )  # fmt: skip
    assert (config.worker.schema, config.reaper.schema) == ("tenant_a", "tenant_a")


def test_a_supervisor_runs_its_jobs_in_its_schema(
    cli: Invoke, tenant: str, dsn: str, tmp_path: Path, repo_root: Path, conn: Connection
) -> None:
    ok(cli("migrate", "--schema", tenant))
    ok(cli("enqueue", "work", "--schema", tenant))
    conn.execute("CREATE TABLE IF NOT EXISTS executions (job_id BIGINT, attempt INT, pid INT)")
    fleet = Fleet(dsn, tmp_path, repo_root, "tests.apps.supervised:app")
    try:
        sup = fleet.start("--schema", tenant, workers=1)
        sup.wait_ready(1)
        jobs = sql.SQL("SELECT state FROM {}").format(sql.Identifier(tenant, "miniqueue_jobs"))
        wait_until(lambda: conn.execute(jobs).fetchall() == [("completed",)], what="the job completed in its schema")
    finally:
        fleet.stop_all()
