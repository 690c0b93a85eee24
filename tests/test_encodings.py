"""A database whose encoding is not UTF8 serves the queue as one in UTF8 does: miniqueue's
connections ask for UTF8 whatever the server's encoding, so that text comes back as text."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from miniqueue import App, Client, Job, Reaper, ReaperConfig, State
from miniqueue.core.db import connect
from miniqueue.store.migrate import run_migrations
from miniqueue.testing import run_jobs


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

    Reaper(sql_ascii, ReaperConfig(vacuum=False)).run_once()  # makes the history's partitions by name
    with Client(sql_ascii) as client:
        job_id = app.enqueue(client, "greet", {"name": "Zoë 東京"}).id
        result = run_jobs(app, client)
        assert [job.id for job in result.completed] == [job_id]
        assert seen == [{"name": "Zoë 東京"}]
        assert client.get(job_id).state == State.COMPLETED
        assert client.result(job_id) == "bonjour Zoë 東京"
