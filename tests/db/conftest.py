"""Fixtures of the database tests: in-process workers, a table for handlers' transactional
writes, and the handler kinds a test written once runs for."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from miniqueue.core.db import Connection

from ..handlers import KINDS, HandlerKind
from ..running import StartWorker, worker_starter


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    """Start workers on threads (fast leases and intervals); all stopped at the end. A module
    whose tests want other defaults defines its own."""
    yield from worker_starter(dsn)


@pytest.fixture
def effects(conn: Connection) -> None:
    """An empty table for handlers' transactional writes."""
    conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id BIGINT PRIMARY KEY)")
    conn.execute("TRUNCATE effects")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> HandlerKind:
    """Each handler kind in turn, ``def`` and ``async def``: the test runs once for each."""
    return HandlerKind(request.param)
