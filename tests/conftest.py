"""Fixtures: a real PostgreSQL for every test, never a mock.

The server is ``TEST_DATABASE_URL`` when set, otherwise an embedded PostgreSQL started once per
test session in pytest's temporary folder. Either way the session creates a database of its
own, migrates it once, and every test starts from an empty queue.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from miniqueue import Client, run_migrations
from miniqueue.db import Connection, connect
from miniqueue.store import Store


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A DSN for the server the tests use (any database on it)."""
    if os.environ.get("TEST_DATABASE_URL"):
        return os.environ["TEST_DATABASE_URL"]
    from miniqueue import embedded

    return embedded.start(tmp_path_factory.mktemp("embedded") / "pgdata")


@pytest.fixture(scope="session")
def database_dsn(server_dsn: str) -> Iterator[str]:
    """A database created for this test session and migrated once; dropped at the end."""
    name = f"miniqueue_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = make_conninfo(server_dsn, dbname=name)
    run_migrations(dsn)
    yield dsn
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fresh_database(server_dsn: str) -> Iterator[str]:
    """An empty, unmigrated database of the test's own (for migration tests)."""
    name = f"miniqueue_fresh_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield make_conninfo(server_dsn, dbname=name)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def dsn(database_dsn: str) -> str:
    """The test database, with an empty queue."""
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(
            "TRUNCATE miniqueue_jobs, miniqueue_periodic, miniqueue_queues, miniqueue_processes, miniqueue_counts"
            " RESTART IDENTITY"
        )
    return database_dsn


@pytest.fixture
def conn(dsn: str) -> Iterator[Connection]:
    """An autocommit connection to the test database."""
    with connect(dsn, purpose="test") as c:
        yield c


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client(dsn) as c:
        yield c


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
