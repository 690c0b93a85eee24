"""Databases for tests: a server, a database of the test session's own, migrated once, and an
empty queue for every test.

The same steps miniqueue's own suite takes, for yours: the server is ``TEST_DATABASE_URL`` when
it is set, otherwise a private embedded PostgreSQL (the ``embedded`` extra); each test session
creates a database of its own on it (so parallel sessions, pytest-xdist's processes among
them, never share one), migrates it once, and drops it at the end; each test starts from an
empty queue, which a ``TRUNCATE`` of the queue's tables gives in milliseconds (creating a
database per test costs a checkpoint each).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..core.db import connect
from ..store.migrate import run_migrations

#: The server tests use when set (any database on it: each session creates its own).
TEST_DATABASE_ENV = "TEST_DATABASE_URL"

#: Every table whose rows are queue data (jobs, their idempotency keys, schedules and those made
#: at run time, queue settings, processes, counts, limits and pauses, finished jobs per minute, task
#: declarations, served queues, sequence keys, unique keys' windows, signals kept for no job
#: yet, fair keys and key rules); ``miniqueue_migrations`` stays, so the schema stays migrated, and so do the history's
#: partitions (``miniqueue_history_partitions``), which hold no rows then.
QUEUE_TABLES = (
    "miniqueue_jobs",
    "miniqueue_idempotency_keys",
    "miniqueue_periodic",
    "miniqueue_schedules",
    "miniqueue_queues",
    "miniqueue_processes",
    "miniqueue_counts",
    "miniqueue_limits",
    "miniqueue_pauses",
    "miniqueue_finished_minutes",
    "miniqueue_tasks",
    "miniqueue_served_queues",
    "miniqueue_sequences",
    "miniqueue_unique_windows",
    "miniqueue_signals",
    "miniqueue_fair_keys",
    "miniqueue_key_rules",
)

_CREATE_DATABASE = "CREATE DATABASE {name}"
_DROP_DATABASE = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
_TRUNCATE = "TRUNCATE {tables} RESTART IDENTITY"
_LOCK_JOBS = "LOCK TABLE {jobs} IN ACCESS EXCLUSIVE MODE"
# The partitions of the jobs table that hold rows (of a test's few jobs).
_HOLDING = "SELECT DISTINCT c.relname FROM {jobs} j JOIN pg_class c ON c.oid = j.tableoid"
_RESTART_IDS = "ALTER SEQUENCE {ids} RESTART"
# A test that left a transaction open on a queue table (a handler thread still running, say)
# makes TRUNCATE wait: fail the next test with a lock timeout rather than hang the suite.
_LOCK_TIMEOUT = "SET lock_timeout = '10s'"


def server_dsn(data_dir: Path | None = None) -> str:
    """A DSN for the server tests use: ``$TEST_DATABASE_URL``, else an embedded PostgreSQL whose
    data lives in ``data_dir`` (started, or reused if it runs; stopped when this process exits).

    Without ``data_dir`` the data goes to a folder of its own in the system's temporary
    directory, deleted when this process exits. Not pytest's ``tmp_path``: another pytest run
    on the machine resets that base folder to mode 0700, and a server running as its own user
    (as it does when the tests run as root) can then no longer read its data.
    """
    if os.environ.get(TEST_DATABASE_ENV):
        return os.environ[TEST_DATABASE_ENV]
    from .. import embedded

    if data_dir is not None:
        return embedded.start(data_dir)
    folder = Path(tempfile.mkdtemp(prefix="miniqueue-test-pg-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # runs after the server's own stop
    return embedded.start(folder / "pgdata", delete_at_exit=True)


def create_database(
    server: str, *, prefix: str = "miniqueue_test", migrate: bool = True, schema: str = "public"
) -> str:
    """Create a database with a unique name on ``server`` and return its DSN, migrated unless
    ``migrate`` is false."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with connect(server, purpose="testing") as admin:
        admin.execute(sql.SQL(_CREATE_DATABASE).format(name=sql.Identifier(name)))
    dsn = make_conninfo(server, dbname=name)
    if migrate:
        run_migrations(dsn, schema)
    return dsn


def drop_database(server: str, dsn: str) -> None:
    """Drop the database ``dsn`` names (on ``server``), disconnecting whoever is still on it."""
    name = conninfo_to_dict(dsn)["dbname"]
    with connect(server, purpose="testing") as admin:
        admin.execute(sql.SQL(_DROP_DATABASE).format(name=sql.Identifier(str(name))))


@contextlib.contextmanager
def temporary_database(server: str, *, prefix: str = "miniqueue_test", schema: str = "public") -> Iterator[str]:
    """``with temporary_database(server) as dsn``: a migrated :func:`create_database`, dropped at the end."""
    dsn = create_database(server, prefix=prefix, schema=schema)
    try:
        yield dsn
    finally:
        drop_database(server, dsn)


def clean_database(dsn: str, *, schema: str = "public") -> None:
    """Empty the queue: delete every job, schedule, queue setting, process, count, limit and task
    declaration, and restart job ids at 1. The schema and its migrations stay.

    Of the jobs table's partitions only those that hold rows are truncated (under a lock on the
    whole table, so none fills meanwhile): a TRUNCATE makes new files for each table and index
    it empties, and the history has a dozen partitions or more, nearly all of them empty."""
    with connect(dsn, purpose="testing", schema=schema) as conn, conn.transaction():
        conn.execute(_LOCK_TIMEOUT)
        conn.execute(sql.SQL(_LOCK_JOBS).format(jobs=sql.Identifier(schema, "miniqueue_jobs")))
        holding = [
            row[0] for row in conn.execute(sql.SQL(_HOLDING).format(jobs=sql.Identifier(schema, "miniqueue_jobs")))
        ]
        names = [*holding, *(table for table in QUEUE_TABLES if table != "miniqueue_jobs")]
        tables = sql.SQL(", ").join(sql.Identifier(schema, table) for table in names)
        conn.execute(sql.SQL(_TRUNCATE).format(tables=tables))
        conn.execute(sql.SQL(_RESTART_IDS).format(ids=sql.Identifier(schema, "miniqueue_jobs_id_seq")))
