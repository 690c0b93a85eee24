"""A task's declared options apply however its jobs are enqueued: the workers publish their app's
task declarations, and every producer (Client, AsyncClient, JobSpec batches, chains, groups, the
CLI, the integrations, a periodic schedule) fills what its caller left unset from them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from click.testing import CliRunner

import miniqueue
from miniqueue import AsyncClient, Client, JobSpec
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.testing import run_jobs

from ..helpers import row


def orders_app() -> miniqueue.App:
    app = miniqueue.App()

    @app.task("call_partner", queue="partner", rate_limit="20/s", max_attempts=2, priority=3)
    def call_partner(job: miniqueue.Job) -> None:
        pass

    @app.task("reserve_stock", queue="stock", concurrency_key="warehouse-1", max_concurrent=2)
    def reserve_stock(job: miniqueue.Job) -> None:
        pass

    @app.task("per_customer", queue="stock", concurrency_key=lambda payload: f"c{payload['customer']}")
    def per_customer(job: miniqueue.Job) -> None:
        pass

    return app


def published(client: Client) -> miniqueue.App:
    """The orders app, its declarations published by a worker of it (run_jobs runs a real one)."""
    app = orders_app()
    run_jobs(app, client)
    return app


def options(conn: Connection, job_id: int) -> tuple[Any, ...]:
    job = row(conn, job_id)
    return job["queue"], job["priority"], job["max_attempts"], job["limits"]


PARTNER = ("partner", 3, 2, ["rate call_partner"])
STOCK = ("stock", 0, 5, ["concurrency reserve_stock warehouse-1"])


def test_a_worker_publishes_its_apps_declarations(client: Client, conn: Connection) -> None:
    published(client)
    rows = conn.execute(
        "SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed, max_concurrent,"
        " rate_limit FROM miniqueue_tasks ORDER BY task"
    ).fetchall()
    assert rows == [
        ("call_partner", "partner", 3, 2, None, False, None, "20/s"),
        ("per_customer", "stock", 0, 5, None, True, None, None),
        ("reserve_stock", "stock", 0, 5, "warehouse-1", False, 2, None),
    ]
    served = conn.execute("SELECT queue FROM miniqueue_served_queues ORDER BY queue").fetchall()
    assert served == [("partner",), ("stock",)]


def test_client_enqueue_takes_the_tasks_options(client: Client, conn: Connection) -> None:
    published(client)
    assert options(conn, client.enqueue("call_partner").id) == PARTNER
    assert options(conn, client.enqueue("reserve_stock").id) == STOCK


def test_what_the_caller_sets_wins(client: Client, conn: Connection) -> None:
    published(client)
    job = client.enqueue("call_partner", queue="urgent", priority=9, max_attempts=7, rate_limit="5/s")
    assert options(conn, job.id) == ("urgent", 9, 7, ["rate call_partner"])
    limit = conn.execute("SELECT rate FROM miniqueue_limits WHERE scope = 'rate call_partner'").fetchone()
    assert limit == (5.0,)


def test_a_batch_of_jobspecs_takes_the_tasks_rate_limit(client: Client, conn: Connection) -> None:
    published(client)
    ids = [r.id for r in client.enqueue_many([JobSpec("call_partner", {"n": n}, queue="partner") for n in range(200)])]
    limited = conn.execute(
        "SELECT count(*) FROM miniqueue_jobs WHERE id = ANY(%s) AND limits = ARRAY['rate call_partner']", [ids]
    ).fetchone()
    assert limited == (200,)
    # A large batch goes by COPY: it fills the options the same way.
    big = client.enqueue_many([JobSpec("reserve_stock", {"n": n}) for n in range(600)])
    assert [options(conn, r.id) for r in (big[0], big[-1])] == [STOCK, STOCK]


def test_chain_and_group_steps_take_their_tasks_queues(client: Client, conn: Connection) -> None:
    published(client)
    chain = client.chain([JobSpec("reserve_stock", {"order": 1}), JobSpec("call_partner")])
    assert [options(conn, r.id) for r in chain] == [STOCK, PARTNER]
    group = client.group([JobSpec("reserve_stock"), JobSpec("reserve_stock")], then=JobSpec("call_partner"))
    assert [options(conn, r.id) for r in group.members] == [STOCK, STOCK]
    assert options(conn, group.then.id) == PARTNER


def test_async_client_takes_the_tasks_options(client: Client, conn: Connection, dsn: str) -> None:
    published(client)

    async def enqueue() -> list[int]:
        async with AsyncClient(dsn) as aclient:
            one = await aclient.enqueue("call_partner")
            many = await aclient.enqueue_many([JobSpec("reserve_stock")])
            chain = await aclient.chain([JobSpec("call_partner")])
            return [one.id, many[0].id, chain[0].id]

    ids = asyncio.run(enqueue())
    assert [options(conn, i) for i in ids] == [PARTNER, STOCK, PARTNER]


def test_the_cli_takes_the_tasks_options(client: Client, conn: Connection, dsn: str) -> None:
    published(client)
    result = CliRunner().invoke(main, ["enqueue", "call_partner", "--json", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    (job_id,) = [r[0] for r in conn.execute("SELECT id FROM miniqueue_jobs").fetchall()]
    assert options(conn, job_id) == PARTNER
    result = CliRunner().invoke(main, ["enqueue", "call_partner", "--max-attempts", "4", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    assert conn.execute("SELECT max_attempts FROM miniqueue_jobs ORDER BY id DESC LIMIT 1").fetchone() == (4,)


def test_the_sqlalchemy_helper_takes_the_tasks_options(client: Client, conn: Connection, dsn: str) -> None:
    from sqlalchemy import create_engine

    from miniqueue.integrations.sqlalchemy import enqueue

    from .test_sqlalchemy import sqlalchemy_url

    published(client)
    engine = create_engine(sqlalchemy_url(dsn))
    with engine.begin() as bind:
        job = enqueue(client, bind, "reserve_stock", {"order": 8})
    engine.dispose()
    assert options(conn, job.id) == STOCK


def test_a_key_computed_by_the_app_must_be_passed_without_it(client: Client, conn: Connection) -> None:
    published(client)
    with pytest.raises(miniqueue.InvalidInput, match="computes its concurrency_key from each payload"):
        client.enqueue("per_customer", {"customer": 7})
    assert conn.execute("SELECT count(*) FROM miniqueue_jobs").fetchone() == (0,)
    job = client.enqueue("per_customer", {"customer": 7}, concurrency_key="c7")
    assert options(conn, job.id) == ("stock", 0, 5, ["concurrency per_customer c7"])
    # With the app, its function computes the key.
    app = orders_app()
    assert options(conn, app.enqueue(client, "per_customer", {"customer": 8}).id)[3] == ["concurrency per_customer c8"]


def test_client_declare_publishes_before_any_worker_ran(client: Client, conn: Connection, dsn: str) -> None:
    client.declare(orders_app())
    with Client(dsn) as other:  # another producer, without the app
        assert options(conn, other.enqueue("call_partner").id) == PARTNER
    assert conn.execute("SELECT count(*) FROM miniqueue_served_queues").fetchone() == (0,)


def test_an_undeclared_task_goes_to_the_default_queue_with_a_warning(
    client: Client, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="miniqueue.client"):
        first = client.enqueue("nobody_knows")
        client.enqueue("nobody_knows")
    assert options(conn, first.id) == ("default", 0, 5, None)
    warnings = [r.getMessage() for r in caplog.records if "nobody_knows" in r.getMessage()]
    assert len(warnings) == 1 and "declared by no app" in warnings[0], warnings
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="miniqueue.client"):
        client.enqueue("another_unknown", queue="somewhere")  # the caller chose its queue: no warning
    assert not caplog.records


def test_a_periodic_job_keeps_its_tasks_limits(client: Client, conn: Connection, dsn: str) -> None:
    from miniqueue.maintenance.scheduler import schedule_due
    from miniqueue.store.store import Store

    app = orders_app()
    app.periodic("* * * * *", task="call_partner", name="ping", catch_up="latest")
    conn.execute("INSERT INTO miniqueue_periodic (name, last_slot) VALUES ('ping', now() - interval '1 hour')")
    specs = {s.name: app.task_spec(s.task, s.payload) for s in app.schedules.values()}
    (job_id,) = schedule_due(conn, Store(), list(app.schedules.values()), specs)
    assert options(conn, job_id) == PARTNER


def test_stats_mark_a_queue_no_worker_has_served(client: Client, dsn: str) -> None:
    client.enqueue("reserve_stock", {"order": 1})  # before any worker: it goes to "default"
    assert [(q.queue, q.served) for q in client.queue_stats()] == [("default", False)]
    result = CliRunner().invoke(main, ["stats", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    assert "note: no worker has ever served queue 'default', where 1 job(s) wait" in result.output
    published(client)  # serves partner and stock, not default
    client.enqueue("reserve_stock", {"order": 2})
    assert {q.queue: q.served for q in client.queue_stats()} == {"default": False, "stock": True}


def test_a_queue_any_command_lists_is_known(client: Client, dsn: str) -> None:
    app = orders_app()
    client.declare(app)
    client.enqueue("call_partner")
    run_jobs(app, client)  # the partner queue now holds only a completed job
    assert client.list_queues() == {"partner": False}
    result = CliRunner().invoke(main, ["queues", "pause", "partner", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    assert client.list_queues() == {"partner": True}
    # A queue a worker serves is known before its first job: "stock" was served by run_jobs.
    client.pause_queues(["stock"])
    with pytest.raises(miniqueue.InvalidInput, match="known: partner, stock"):
        client.pause_queues(["nowhere"])
