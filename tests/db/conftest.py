"""Fixtures of the database tests: in-process workers (``start_worker``, ``run_one``), the
tables handlers write (``effects``, ``executions``), and the handler kinds a test written once
runs for (``kind``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.tasks.app import App

from ..handlers import KINDS, Handler, HandlerKind
from ..helpers import row, wait_until
from ..running import RunOne, StartWorker, worker_starter
from ..supervised import create_executions


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    """Start workers on threads (fast leases and intervals); all stopped at the end. A module
    whose tests want other defaults defines its own."""
    yield from worker_starter(dsn)


@pytest.fixture
def run_one(client: Client, conn: Connection, start_worker: StartWorker) -> RunOne:
    """Run one job (of ``payload``) of a task ``t`` (with ``options``) whose handler is
    ``handler``, on a worker of the test's; once the job is in ``state``, its row."""

    def run(handler: Handler, state: str, payload: Any = None, **options: Any) -> dict[str, Any]:
        app = App()
        app.task("t", **options)(handler)
        job_id = app.enqueue(client, "t", payload).id
        start_worker(app)
        wait_until(lambda: row(conn, job_id)["state"] == state, what=f"the job {state}")
        return row(conn, job_id)

    return run


@pytest.fixture
def effects(conn: Connection) -> None:
    """An empty table for handlers' transactional writes."""
    conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id BIGINT PRIMARY KEY)")
    conn.execute("TRUNCATE effects")


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> HandlerKind:
    """Each handler kind in turn, ``def`` and ``async def``: the test runs once for each."""
    return HandlerKind(request.param)


@pytest.fixture
def executions(conn: Connection) -> Connection:
    """The ``executions`` table, made afresh, where the apps of ``tests/apps`` record each run;
    the test's connection."""
    create_executions(conn)
    return conn
