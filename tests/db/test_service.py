"""The base of every background thread: start, stop, join, and an error that ends the thread
is logged and kept rather than lost. Also the claim loop's connection and the handlers' pool,
the worker's parts that run SQL of their own, on a real PostgreSQL."""

from __future__ import annotations

import logging
import threading

import pytest

from miniqueue.core.db import Connection
from miniqueue.core.service import Service
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.worker.connection import ClaimConnection
from miniqueue.worker.handlerdb import HandlerConnections

from ..helpers import wait_until


class Ticker(Service):
    """Counts ticks until stopped."""

    def __init__(self, stopping: threading.Event | None = None) -> None:
        super().__init__("test-ticker", stopping=stopping)
        self.ticks = 0

    def run(self) -> None:
        while not self.stopping.wait(0.001):
            self.ticks += 1


def test_a_service_runs_on_a_daemon_thread_of_its_name_until_stopped() -> None:
    ticker = Ticker()
    assert ticker.join(0) and not ticker.is_alive(), "joining a service never started returns at once"
    ticker.start()
    wait_until(lambda: ticker.ticks > 2, what="ticks")
    thread = next(t for t in threading.enumerate() if t.name == "test-ticker")
    assert thread.daemon and ticker.name == "test-ticker"
    ticker.stop()
    assert not ticker.is_alive() and ticker.error is None


def test_services_stop_together_on_a_shared_event() -> None:
    stopping = threading.Event()
    tickers = [Ticker(stopping), Ticker(stopping)]
    for ticker in tickers:
        ticker.start()
    stopping.set()
    assert all(ticker.join(5) for ticker in tickers)


def test_an_error_that_ends_the_thread_is_logged_and_kept(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("the loop broke")

    service = Service("test-broken", target=broken)
    with caplog.at_level(logging.ERROR, logger="miniqueue.service"):
        service.start()
        assert service.join(5)
    assert isinstance(service.error, RuntimeError)
    assert "test-broken: the thread ended on an error" in caplog.text
    assert "RuntimeError: the loop broke" in caplog.text


def test_a_service_logs_on_its_own_logger(caplog: pytest.LogCaptureFixture) -> None:
    class Mine(Service):
        log = logging.getLogger("miniqueue.test-mine")

        def run(self) -> None:
            raise ValueError("mine")

    with caplog.at_level(logging.ERROR, logger="miniqueue.test-mine"):
        service = Mine("test-mine")
        service.start()
        service.join(5)
    assert [record.name for record in caplog.records] == ["miniqueue.test-mine"]
    caplog.clear()
    given = Service("test-given", target=service.run, log=logging.getLogger("miniqueue.test-given"))
    with caplog.at_level(logging.ERROR, logger="miniqueue.test-given"):
        given.start()
        given.join(5)
    assert [record.name for record in caplog.records] == ["miniqueue.test-given"]


def test_a_service_without_a_body_says_so(caplog: pytest.LogCaptureFixture) -> None:
    service = Service("test-empty")
    service.start()
    service.join(5)
    assert isinstance(service.error, NotImplementedError)


def test_the_claim_connection_publishes_once_per_worker(dsn: str, conn: Connection) -> None:
    app = App()
    app.task("mail", queue="outbox")(lambda job: None)
    claim = ClaimConnection(dsn, Store(), app, ["outbox"], schema="public")
    assert not claim.is_open
    first = claim.get()
    assert claim.get() is first
    published = conn.execute("SELECT task, queue FROM miniqueue_tasks").fetchall()
    assert published == [("mail", "outbox")]
    claim.close()
    assert not claim.is_open and first.closed
    conn.execute("DELETE FROM miniqueue_tasks")
    assert claim.get() is not first, "opened again"
    assert conn.execute("SELECT count(*) FROM miniqueue_tasks").fetchone() == (0,), "published once per worker"
    claim.close()


def test_the_handlers_pool_opens_on_first_use_and_closes_only_its_own(dsn: str) -> None:
    handlers = HandlerConnections(dsn, Store(), "w", schema="public", max_size=2)
    pool = handlers.pool()
    assert handlers.pool() is pool
    given = HandlerConnections(dsn, Store(), "w", schema="public", max_size=2, pool=pool)
    assert given.pool() is pool
    given.close()
    assert not pool.closed, "a pool the worker was given is left open"
    handlers.close()
    assert pool.closed
