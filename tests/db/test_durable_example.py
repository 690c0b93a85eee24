"""examples/durable_order.py, as docs/guides/durable.md shows it: an order run by the testing
kit's real worker through its wait for the shipment, its day's sleep and its last step, and an
order whose shipment never comes."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from miniqueue import Client, Reaper
from miniqueue.core.db import Connection
from miniqueue.testing import run_jobs

from ..helpers import row


@pytest.fixture
def example(conn: Connection, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(repo_root))
    conn.execute("DROP TABLE IF EXISTS payments")
    conn.execute("CREATE TABLE payments (order_id BIGINT PRIMARY KEY, cents INT NOT NULL)")
    yield importlib.import_module("examples.durable_order")
    conn.execute("DROP TABLE payments")


def test_an_order_waits_for_its_shipment_sleeps_a_day_and_asks_for_a_review(
    example: ModuleType, client: Client, conn: Connection
) -> None:
    job_id = example.app.enqueue(client, "order", {"order": 7, "cents": 1999}).id
    first = run_jobs(example.app, client)
    assert [run.outcome for run in first.runs] == ["waiting"]
    assert client.get(job_id).signal_key == "shipped:7"
    assert client.signal("shipped:7", {"carrier": "DHL"}) == job_id
    second = run_jobs(example.app, client)
    assert [run.outcome for run in second.runs] == ["slept"]
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [job_id])  # a day later
    run_jobs(example.app, client)
    done = row(conn, job_id)
    assert done["state"] == "completed"
    assert done["result"] == {"charge": "charge-7", "shipped": True, "carrier": "DHL"}
    assert [s["name"] for s in done["steps"]] == ["reserve", "charge", "signal shipped:7 #1", "sleep #1", "review"]
    assert conn.execute("SELECT order_id, cents FROM payments").fetchall() == [(7, 1999)], "charged once"
    assert client.get(job_id).charged_attempts == 1, "neither the wait nor the sleep spent an attempt"


def test_an_order_whose_shipment_never_comes_is_followed_up(
    example: ModuleType, client: Client, conn: Connection, dsn: str
) -> None:
    job_id = example.app.enqueue(client, "order", {"order": 8, "cents": 500}).id
    run_jobs(example.app, client)
    conn.execute("UPDATE miniqueue_jobs SET signal_timeout_at = now() WHERE id = %s", [job_id])  # three days later
    assert Reaper(dsn).run_once().timed_out == 1
    run_jobs(example.app, client)
    assert row(conn, job_id)["result"] == {"charge": "charge-8", "shipped": False}
