"""Fixtures: a real PostgreSQL for every test, never a mock.

The server is ``TEST_DATABASE_URL`` when set, otherwise an embedded PostgreSQL started once per
test process in pytest's temporary folder. Either way the process creates a database of its
own, migrates it once, and every test starts from an empty queue: the steps of
:mod:`miniqueue.testing.database`, which users' suites take too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from miniqueue import Client
from miniqueue.core.db import Connection, connect
from miniqueue.store.store import Store
from miniqueue.testing import database as testing_db

from .servers import start_servers


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """A DSN for the server the tests use (any database on it)."""
    return testing_db.server_dsn()


@pytest.fixture(scope="session")
def servers(server_dsn: str) -> list[str]:
    """Three servers for the tests of several databases: the suite's and two embedded ones of the
    session's own (started on first use, stopped and deleted when the test process exits)."""
    return start_servers(server_dsn)


@pytest.fixture(scope="session")
def database_dsn(server_dsn: str) -> Iterator[str]:
    """A database created for this test session and migrated once; dropped at the end."""
    with testing_db.temporary_database(server_dsn) as dsn:
        yield dsn


@pytest.fixture
def fresh_database(server_dsn: str) -> Iterator[str]:
    """An empty, unmigrated database of the test's own (for migration tests)."""
    dsn = testing_db.create_database(server_dsn, prefix="miniqueue_fresh", migrate=False)
    yield dsn
    testing_db.drop_database(server_dsn, dsn)


@pytest.fixture
def dsn(database_dsn: str) -> str:
    """The test database, with an empty queue."""
    testing_db.clean_database(database_dsn)
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
