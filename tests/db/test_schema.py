"""One schema setting for a deployment: every command takes ``--schema`` (or $MINIQUEUE_SCHEMA),
and a supervisor's workers and reaper always run in the supervisor's schema."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from miniqueue import App, Client, ConfigError, Job, State
from miniqueue.core.db import MAX_SCHEMA_LENGTH, Connection, check_schema, connect
from miniqueue.maintenance.reaper import ReaperConfig
from miniqueue.store.store import Store
from miniqueue.supervise.config import SupervisorConfig
from miniqueue.worker.worker import Worker, WorkerConfig

from ..helpers import wait_until
from ..running import FAST, Running
from ..supervised import Fleet
from .test_cli import Invoke, ok, run, usage_error


@pytest.fixture
def cli(dsn: str) -> Invoke:
    return lambda *args: run(dsn, *args)


def dropped_at_the_end(dsn: str, name: str) -> Iterator[str]:
    """The body of a fixture handing a test schema ``name``, dropped after the test."""
    yield name
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def tenant(dsn: str) -> Iterator[str]:
    yield from dropped_at_the_end(dsn, f"tenant_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def longest_tenant(dsn: str) -> Iterator[str]:
    """A schema name of the longest length miniqueue accepts."""
    yield from dropped_at_the_end(dsn, f"tenant_{uuid.uuid4().hex}".ljust(MAX_SCHEMA_LENGTH, "x"))


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


SCHEMAS_POSTGRESQL_REFUSES = {
    "the pg_ prefix": ("pg_mq", "PostgreSQL reserves names starting with 'pg_' for its system schemas"),
    "pg_temp": ("pg_temp", "PostgreSQL reserves names starting with 'pg_'"),
    "pg_catalog": ("pg_catalog", "PostgreSQL reserves names starting with 'pg_'"),
    "information_schema": ("information_schema", "it is PostgreSQL's own schema"),
    "a channel name too long": (
        "q" * (MAX_SCHEMA_LENGTH + 1),
        f"it is {MAX_SCHEMA_LENGTH + 1} characters long, and at "
        f"most {MAX_SCHEMA_LENGTH} keep the names miniqueue derives from it within "
        "PostgreSQL's 63 bytes ('miniqueue_<schema>_finished' would be 64)",
    ),
    "an identifier too long": ("q" * 64, "it is 64 characters long"),
    "upper case": ("Tenant", f"use 1-{MAX_SCHEMA_LENGTH} characters of a-z, 0-9 or '_'"),
}


@pytest.mark.parametrize(
    ("name", "problem"), list(SCHEMAS_POSTGRESQL_REFUSES.values()), ids=list(SCHEMAS_POSTGRESQL_REFUSES)
)
def test_a_schema_postgresql_would_refuse_is_one_line_and_changes_nothing(
    cli: Invoke, conn: Connection, name: str, problem: str
) -> None:
    schemas = "SELECT nspname FROM pg_namespace ORDER BY nspname"
    before = conn.execute(schemas).fetchall()
    for command in (["migrate"], ["enqueue", "t"], ["stats"]):
        usage_error(cli(*command, "--schema", name), f"schema name '{name}' is invalid: {problem}")
    with pytest.raises(ConfigError, match=f"schema name '{name}' is invalid: "):
        check_schema(name)
    with pytest.raises(ConfigError, match=f"schema name '{name}' is invalid: "):
        Client(conn.info.dsn, schema=name)
    assert conn.execute(schemas).fetchall() == before, "no schema was created"


def test_every_name_derived_from_the_longest_schema_fits_postgresql(longest_tenant: str) -> None:
    store = Store(longest_tenant)
    assert max(len(name.encode()) for name in (store.schema, store.channel, store.finished_channel)) == 63


def test_the_longest_schema_name_runs_a_job_end_to_end(
    cli: Invoke, dsn: str, longest_tenant: str, conn: Connection
) -> None:
    ok(cli("migrate", "--schema", longest_tenant))
    jobs = sql.Identifier(longest_tenant, "miniqueue_jobs")
    awaited = sql.SQL("SELECT awaited FROM {} WHERE id = %s").format(jobs)

    def echo(job: Job) -> dict[str, Any]:
        # Finish only once the waiter has asked to be notified: its wake-up is the completion's
        # notification on the schema's finished-jobs channel.
        with connect(dsn, purpose="test") as own:
            wait_until(lambda: own.execute(awaited, [job.id]).fetchone() == (True,), what="the job awaited")
        return {"echo": job.payload}

    app = App()
    app.task("echo")(echo)
    # A poll far longer than the test: the job starts only if the enqueue's notification arrives.
    worker = Running(Worker(app, dsn, dataclasses.replace(FAST, schema=longest_tenant, poll_interval=600)))
    try:
        wait_until(lambda: worker.worker.listening, what="the worker listening in the long schema")
        with Client(dsn, schema=longest_tenant) as client:
            job_id = client.enqueue("echo", {"n": 1}).id
            wait_until(lambda: client.get(job_id).state is State.RUNNING, what="the job started on its notification")
            assert client.wait(job_id, timeout=30) == {"echo": {"n": 1}}
    finally:
        worker.stop()
    assert conn.execute(sql.SQL("SELECT id, state FROM {}").format(jobs)).fetchall() == [(job_id, "completed")]


def test_the_supervisors_schema_is_its_childrens() -> None:
    config = SupervisorConfig(
        dsn="",
        app_ref="a:b",
        schema="tenant_a",
        worker=WorkerConfig(schema="public"),
        reaper=ReaperConfig(schema="other"),
    )
    assert (config.worker.schema, config.reaper.schema) == ("tenant_a", "tenant_a")


def test_a_supervisor_runs_its_jobs_in_its_schema(
    cli: Invoke, tenant: str, dsn: str, tmp_path: Path, repo_root: Path, conn: Connection
) -> None:
    ok(cli("migrate", "--schema", tenant))
    ok(cli("enqueue", "work", "--schema", tenant))
    conn.execute("CREATE TABLE IF NOT EXISTS executions (job_id BIGINT, attempt INT, pid INT)")
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.supervised:app") as fleet:
        sup = fleet.start("--schema", tenant, workers=1)
        sup.wait_ready(1)
        jobs = sql.SQL("SELECT state FROM {}").format(sql.Identifier(tenant, "miniqueue_jobs"))
        wait_until(lambda: conn.execute(jobs).fetchall() == [("completed",)], what="the job completed in its schema")
