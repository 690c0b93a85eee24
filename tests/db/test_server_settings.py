"""A database whose settings differ from the defaults serves the queue as any other: its
encoding (miniqueue's connections ask for UTF8, so that text comes back as text), its time zone
and date and interval styles (they ask for the styles psycopg reads), its default isolation
(they ask for READ COMMITTED, which the store's statements are written for) and the options of
a DSN (kept). A role short of a privilege is told so in one line."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from miniqueue import App, Client, ConfigError, Job, Reaper, ReaperConfig, State
from miniqueue.core.db import connect, create_pool
from miniqueue.store.migrate import run_migrations
from miniqueue.store.store import Store
from miniqueue.testing import run_jobs
from miniqueue.testing.database import create_database, drop_database
from miniqueue.worker.connection import ClaimConnection

from ..helpers import run_on_threads
from ..serving import run_miniqueue


@pytest.fixture
def sql_ascii(server_dsn: str) -> Iterator[str]:
    """A migrated database in SQL_ASCII, the encoding of a cluster made with ``initdb --locale=C``."""
    name = f"miniqueue_sql_ascii_{uuid.uuid4().hex[:10]}"
    with connect(server_dsn, purpose="test") as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name)
            )
        )
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        run_migrations(dsn)
        yield dsn
    finally:
        with connect(server_dsn, purpose="test") as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_sql_ascii_database_runs_jobs_and_keeps_their_text(sql_ascii: str) -> None:
    app = App()
    seen: list[object] = []

    @app.task("greet")
    def greet(job: Job) -> str:
        seen.append(job.payload)
        return f"bonjour {job.payload['name']}"

    reaper = Reaper(sql_ascii, ReaperConfig(vacuum=False))
    reaper.run_once()  # makes the history's partitions by name
    reaper.close()
    with Client(sql_ascii) as client:
        job_id = app.enqueue(client, "greet", {"name": "Zoë 東京"}).id
        result = run_jobs(app, client)
        assert [job.id for job in result.completed] == [job_id]
        assert seen == [{"name": "Zoë 東京"}]
        assert client.get(job_id).state == State.COMPLETED
        assert client.result(job_id) == "bonjour Zoë 東京"


@pytest.fixture
def odd_styles(server_dsn: str) -> Iterator[str]:
    """A migrated database whose sessions default to another time zone, to the date and interval
    styles psycopg cannot read, and to REPEATABLE READ."""
    dsn = create_database(server_dsn, prefix="miniqueue_styles")
    name = sql.Identifier(str(conninfo_to_dict(dsn)["dbname"]))
    with connect(server_dsn, purpose="test") as admin:
        for setting in (
            "timezone = 'America/New_York'",
            "datestyle = 'SQL, DMY'",
            "intervalstyle = 'iso_8601'",
            "default_transaction_isolation = 'repeatable read'",
        ):
            admin.execute(sql.SQL("ALTER DATABASE {} SET " + setting).format(name))
    try:
        yield dsn
    finally:
        drop_database(server_dsn, dsn)


def test_a_database_with_other_time_zone_and_styles_runs_jobs_and_reads_their_times(odd_styles: str) -> None:
    app = App()

    @app.task("tick")
    def tick(job: Job) -> None:
        pass

    reaper = Reaper(odd_styles, ReaperConfig(vacuum=False))
    reaper.run_once()
    reaper.close()
    with Client(odd_styles) as client:
        job_id = app.enqueue(client, "tick", delay=0).id
        assert [job.id for job in run_jobs(app, client).completed] == [job_id]
        job = client.get(job_id)
        assert job.state == State.COMPLETED
        assert job.completed_at is not None and job.completed_at >= job.created_at
        assert job.completed_at.utcoffset() is not None


def test_twenty_clients_replacing_one_unique_key_at_once_store_one_job_under_a_repeatable_read_default(
    odd_styles: str,
) -> None:
    """Under REPEATABLE READ, an enqueue that met the key's row changed by another would fail
    (could not serialize access); miniqueue's own connections run READ COMMITTED."""
    barrier = threading.Barrier(20)

    def produce(n: int) -> None:
        with Client(odd_styles) as client:
            client.counts()  # connected before the race
            barrier.wait()
            client.enqueue("t", {"n": n}, unique_key="hot", on_conflict="replace")

    run_on_threads(produce, 20)
    with connect(odd_styles, purpose="test") as conn:
        assert conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE unique_key = 'hot'").fetchone() == (1,)


def test_the_dsns_own_options_stay_beside_miniqueues(dsn: str) -> None:
    """An ``options`` in the DSN (a statement_timeout, say) is kept; miniqueue's settings follow it."""
    with_options = make_conninfo(dsn, options="-c statement_timeout=4321 -c search_path=elsewhere")
    shown = "SELECT current_setting('statement_timeout'), current_setting('search_path')"
    with connect(with_options, purpose="test") as conn:
        assert conn.execute(shown).fetchone() == ("4321ms", "public,pg_catalog")
    with create_pool(with_options, purpose="test") as pool, pool.connection() as pooled:
        assert pooled.execute(shown).fetchone() == ("4321ms", "public,pg_catalog")


def test_a_workers_claim_connection_plans_each_statement_once_whatever_the_servers_default(dsn: str) -> None:
    """The claim connection asks for generic plans (see "Vacuum and planner statistics" in
    docs/guides/retention.md); other connections keep the server's plan_cache_mode."""
    claims = ClaimConnection(dsn, Store(), App(), ["default"], schema="public")
    try:
        assert claims.get().execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
    finally:
        claims.close()
    with connect(dsn, purpose="test") as conn, psycopg.connect(dsn) as bare:
        assert conn.execute("SHOW plan_cache_mode").fetchone() == bare.execute("SHOW plan_cache_mode").fetchone()


def test_a_role_short_of_a_privilege_is_told_so_in_one_line(fresh_database: str, server_dsn: str) -> None:
    """`miniqueue migrate` as a role that may not create in the database: an error naming the
    missing privilege and where the roles are described, no traceback, nothing applied."""
    role = f"miniqueue_visitor_{uuid.uuid4().hex[:8]}"
    with connect(server_dsn, purpose="test") as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        visitor = make_conninfo(fresh_database, user=role, password="")
        with pytest.raises(ConfigError, match="lacks a privilege miniqueue needs: permission denied for database"):
            run_migrations(visitor)
        cli = run_miniqueue("migrate", dsn=visitor, timeout=60)
        assert cli.returncode == 1
        assert "lacks a privilege" in cli.stderr and "Schema and migrations" in cli.stderr
        assert "Traceback" not in cli.stderr
        with connect(fresh_database, purpose="test") as conn:
            assert conn.execute("SELECT to_regclass('miniqueue_migrations')").fetchone() == (None,)
    finally:
        with connect(server_dsn, purpose="test") as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
