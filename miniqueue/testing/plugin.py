"""The pytest fixtures of :mod:`miniqueue.testing` (loaded by ``-p miniqueue.testing``).

``miniqueue_dsn`` gives each test a migrated database with an empty queue: the server is
``TEST_DATABASE_URL`` or an embedded PostgreSQL started once per test session, the database is
created and migrated once per session (per process under pytest-xdist) and dropped at the end,
and the queue's tables are emptied before each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..client.client import Client
from .database import clean_database, server_dsn, temporary_database


@pytest.fixture(scope="session")
def miniqueue_server_dsn() -> str:
    """The PostgreSQL server of this test session: ``$TEST_DATABASE_URL``, else an embedded one
    (its data in a temporary folder of its own, deleted at the end)."""
    return server_dsn()


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
def miniqueue_client(miniqueue_dsn: str, request: pytest.FixtureRequest) -> Iterator[Client]:
    """A :class:`miniqueue.Client` on the test database, closed after the test.

    If the suite defines a ``miniqueue_app`` fixture (returning its :class:`miniqueue.App`),
    the client declares that app's tasks first (:meth:`Client.declare`), so that jobs the test
    enqueues by task name get their task's queue and options before any worker has run.
    """
    with Client(miniqueue_dsn) as client:
        try:
            app = request.getfixturevalue("miniqueue_app")
        except pytest.FixtureLookupError:  # the suite defines none
            app = None
        if app is not None:
            client.declare(app)
        yield client
