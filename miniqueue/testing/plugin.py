"""The pytest fixtures of :mod:`miniqueue.testing` (loaded by ``-p miniqueue.testing``).

``miniqueue_dsn`` gives each test a migrated database with an empty queue: the server is
``TEST_DATABASE_URL`` or an embedded PostgreSQL started once per test session, the database is
created and migrated once per session (per process under pytest-xdist) and dropped at the end,
and the queue's tables are emptied before each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..client import Client
from .database import clean_database, server_dsn, temporary_database


@pytest.fixture(scope="session")
def miniqueue_server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The PostgreSQL server of this test session: ``$TEST_DATABASE_URL``, else an embedded one."""
    return server_dsn(tmp_path_factory.mktemp("miniqueue-embedded") / "pgdata")


@pytest.fixture(scope="session")
def miniqueue_database(miniqueue_server_dsn: str) -> Iterator[str]:
    """A database of this test session's own, migrated once, dropped at the end (not emptied
    between tests: use ``miniqueue_dsn``)."""
    with temporary_database(miniqueue_server_dsn) as dsn:
        yield dsn


@pytest.fixture
def miniqueue_dsn(miniqueue_database: str) -> str:
    """The test database's DSN, its queue emptied for this test (job ids start at 1)."""
    clean_database(miniqueue_database)
    return miniqueue_database


@pytest.fixture
def miniqueue_client(miniqueue_dsn: str) -> Iterator[Client]:
    """A :class:`miniqueue.Client` on the test database, closed after the test."""
    with Client(miniqueue_dsn) as client:
        yield client
