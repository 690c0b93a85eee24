"""Unique keys: a conflict stores nothing (keep), changes the waiting holder (replace, debounce),
or is refused inside a window; enforced by PostgreSQL, whatever the timing of the enqueues; on
every path a job arrives by."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
from typing import Any

import psycopg
import pytest

from miniqueue import App, AsyncClient, Client, Debounce, InvalidInput, JobSpec
from miniqueue.core.db import Connection
from miniqueue.core.records import State
from miniqueue.store.store import Store
from miniqueue.testing import run_jobs

from ..helpers import count, db_now, row, run_on_threads, wait_until

W = "worker-1"


def claim(store: Store, conn: Connection, queue: str = "default") -> tuple[int, int]:
    (lease,) = store.claim(conn, [queue], W, 30, 1)
    return lease.id, lease.attempt


def test_a_second_job_of_a_held_key_stores_nothing_and_names_the_holder(client: Client, conn: Connection) -> None:
    first = client.enqueue("t", {"n": 1}, unique_key="report:7")
    second = client.enqueue("t", {"n": 2}, unique_key="report:7")
    assert (first.duplicate, second.duplicate, second.id, second.replaced) == (False, True, first.id, False)
    assert count(conn) == 1 and row(conn, first.id)["payload"] == {"n": 1}
    assert client.enqueue("t", {"n": 3}, unique_key="report:8").duplicate is False


def test_a_finished_job_frees_its_key(client: Client, store: Store, conn: Connection) -> None:
    first = client.enqueue("t", unique_key="k").id
    job_id, attempt = claim(store, conn)
    assert client.enqueue("t", unique_key="k").duplicate  # running holds it, by default
    store.complete(conn, job_id, W, attempt)
    again = client.enqueue("t", unique_key="k")
    assert not again.duplicate and again.id != first


def test_without_running_among_the_states_a_started_job_frees_its_key_and_its_retry_never_collides(
    client: Client, store: Store, conn: Connection
) -> None:
    pending_only = ["waiting", "scheduled", "available"]
    first = client.enqueue("t", unique_key="k", unique_states=pending_only).id
    assert client.enqueue("t", unique_key="k", unique_states=pending_only).duplicate
    job_id, attempt = claim(store, conn)
    second = client.enqueue("t", unique_key="k", unique_states=pending_only)
    assert not second.duplicate
    # The first job's retry goes back to available beside the second: no conflict, no error.
    assert store.record_failure(conn, job_id, W, attempt, "boom", 0) == State.AVAILABLE
    assert {row(conn, first)["state"], row(conn, second.id)["state"]} == {"available"}


def test_replace_changes_the_waiting_job_and_never_a_running_one(
    client: Client, store: Store, conn: Connection
) -> None:
    first = client.enqueue("t", {"v": 1}, unique_key="k", priority=1, delay=3600)
    replaced = client.enqueue("t", {"v": 2}, unique_key="k", priority=5, on_conflict="replace")
    assert replaced == (first.id, True, True)
    stored = row(conn, first.id)
    assert stored["payload"] == {"v": 2} and stored["priority"] == 5 and stored["scheduled_at"] <= db_now(conn)
    job_id, _ = claim(store, conn)
    late = client.enqueue("t", {"v": 3}, unique_key="k", on_conflict="replace")
    assert late == (job_id, True, False)
    assert row(conn, job_id)["payload"] == {"v": 2} and count(conn) == 1


def test_debounce_moves_the_run_at_but_never_past_the_first_enqueue_plus_max_wait(
    client: Client, conn: Connection
) -> None:
    first = client.enqueue("t", {"v": 1}, unique_key="k", on_conflict=Debounce(10, 25))
    created = row(conn, first.id)["created_at"]
    assert 9.9 < (row(conn, first.id)["scheduled_at"] - created).total_seconds() <= 10.1
    conn.execute("UPDATE miniqueue_jobs SET created_at = created_at - interval '20 seconds' WHERE id = %s", [first.id])
    again = client.enqueue("t", {"v": 2}, unique_key="k", on_conflict=Debounce(10, 25))
    assert again == (first.id, True, True)
    stored = row(conn, first.id)
    assert stored["payload"] == {"v": 2}
    # now + 10 s is past created + 25 s (created is now - 20 s): capped at created + 25 s.
    assert abs((stored["scheduled_at"] - stored["created_at"]).total_seconds() - 25) < 0.1


def test_a_window_refuses_a_second_job_whatever_the_first_ones_state(
    client: Client, store: Store, conn: Connection
) -> None:
    first = client.enqueue("t", unique_key="daily", unique_window=3600).id
    job_id, attempt = claim(store, conn)
    store.complete(conn, job_id, W, attempt)
    assert client.enqueue("t", unique_key="daily", unique_window=3600) == (first, True, False)
    conn.execute("UPDATE miniqueue_unique_windows SET until = now() - interval '1 second'")
    assert not client.enqueue("t", unique_key="daily", unique_window=3600).duplicate


def test_a_batch_resolves_its_own_conflicts_in_order(client: Client, conn: Connection) -> None:
    stored = client.enqueue("t", {"n": 0}, unique_key="a").id
    results = client.enqueue_many(
        [JobSpec("t", {"n": i}, unique_key=key) for i, key in enumerate(["a", "b", "b", "c", "a"], start=1)]
    )
    b = results[1].id
    assert [(r.id, r.duplicate) for r in results] == [
        (stored, True),
        (b, False),
        (b, True),
        (results[3].id, False),
        (stored, True),
    ]
    assert count(conn) == 3 and row(conn, b)["payload"] == {"n": 2}  # the first of the batch wins
    replacing = client.enqueue_many([JobSpec("t", {"n": i}, unique_key="d", on_conflict="replace") for i in range(3)])
    assert [r.duplicate for r in replacing] == [False, True, True]
    assert row(conn, replacing[0].id)["payload"] == {"n": 2}  # in order: the last one's payload


def test_inside_the_callers_transaction_a_rollback_keeps_nothing_and_frees_the_key(dsn: str, client: Client) -> None:
    with psycopg.connect(dsn) as own:
        assert not client.enqueue("t", unique_key="k", conn=own).duplicate
        assert client.enqueue("t", unique_key="k", conn=own).duplicate
        own.rollback()
    assert not client.enqueue("t", unique_key="k").duplicate


def test_requeueing_a_job_whose_key_another_job_holds_is_refused(
    client: Client, store: Store, conn: Connection
) -> None:
    first = client.enqueue("t", unique_key="k", max_attempts=1).id
    job_id, attempt = claim(store, conn)
    assert store.record_failure(conn, job_id, W, attempt, "boom", 0) == State.DEAD
    second = client.enqueue("t", unique_key="k").id
    with pytest.raises(InvalidInput, match="unique key"):
        client.requeue([first])
    assert row(conn, first)["state"] == "dead" and row(conn, second)["state"] == "available"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"unique_key": "x" * 256}, "unique_key"),
        ({"unique_key": "a\nb"}, "control character"),
        ({"unique_key": "k", "unique_window": 0}, "unique_window"),
        ({"unique_key": "k", "unique_window": -1}, "unique_window"),
        ({"unique_key": "k", "on_conflict": Debounce(5, 2)}, "max_wait"),
        ({"unique_key": "k", "on_conflict": "debounce"}, "on_conflict"),
        ({"unique_key": "k", "on_conflict": "replace", "idempotency_key": "i"}, "idempotency_key"),
        ({"unique_key": "k", "on_conflict": "replace", "unique_window": 10}, "unique_window"),
        ({"unique_key": "k", "on_conflict": Debounce(1, 2), "delay": 5}, "run-at"),
        ({"unique_key": "k", "unique_states": ["running"]}, "include"),
        ({"unique_key": "k", "unique_states": ["waiting", "scheduled", "available", "completed"]}, "completed"),
        ({"unique_window": 10}, "without a unique_key"),
    ],
)
def test_bad_key_options_are_one_clear_error_and_store_nothing(
    client: Client, conn: Connection, bad: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        client.enqueue("t", **bad)
    assert count(conn) == 0


def test_a_key_with_parents_is_refused(client: Client, conn: Connection) -> None:
    parent = client.enqueue("t").id
    with pytest.raises(InvalidInput, match="depends_on"):
        client.enqueue("t", unique_key="k", depends_on=[parent])
    assert count(conn) == 1


# -- every path a job arrives by ------------------------------------------------------------------

app = App()


@app.task("sync_account", queue="accounts", unique_key=lambda p: f"account:{p['id']}", on_conflict="replace")
def sync_account(job: Any) -> None:
    pass


@app.task("refresh", queue="accounts", unique_key="refresh", unique_window=3600)
def refresh(job: Any) -> None:
    pass


def test_the_tasks_declaration_holds_for_app_enqueue_client_async_client_and_cli(
    dsn: str, client: Client, conn: Connection, tmp_path: Any
) -> None:
    first = app.enqueue(client, "sync_account", {"id": 1, "v": 1})
    assert app.enqueue(client, "sync_account", {"id": 1, "v": 2}) == (first.id, True, True)
    client.declare(app)  # what a worker of the app publishes as it starts
    # A client without the app must pass a computed key itself, and then the task's mode applies.
    with pytest.raises(InvalidInput, match="unique_key"):
        client.enqueue("sync_account", {"id": 1})
    assert client.enqueue("sync_account", {"id": 1, "v": 3}, unique_key="account:1") == (first.id, True, True)
    assert row(conn, first.id)["payload"] == {"id": 1, "v": 3}
    # A declared string key and window apply to a bare client, an async client and the CLI.
    held = client.enqueue("refresh").id
    assert client.enqueue("refresh") == (held, True, False)

    async def from_async() -> Any:
        async with AsyncClient(dsn) as aclient:
            return await aclient.enqueue("refresh")

    assert asyncio.run(from_async()) == (held, True, False)
    from click.testing import CliRunner

    from miniqueue.cli.main import main

    out = CliRunner().invoke(main, ["enqueue", "refresh", "--json", "--database-url", dsn])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"id": held, "duplicate": True, "replaced": False}
    out = CliRunner().invoke(main, ["enqueue", "t", "--unique-key", "cli", "--database-url", dsn])
    again = CliRunner().invoke(main, ["enqueue", "t", "--unique-key", "cli", "--database-url", dsn])
    assert again.output.endswith("already existed (same idempotency key or unique key): nothing stored\n")
    assert count(conn, "unique_key = 'cli'") == 1
    run_jobs(app, client)
    assert count(conn, "state = 'completed'") == 2


# -- races -----------------------------------------------------------------------------------------

MODES: list[Any] = ["keep", "replace", Debounce(0.05, 60)]


@pytest.mark.parametrize("mode", MODES, ids=["keep", "replace", "debounce"])
def test_fifty_threads_enqueueing_one_key_at_once_store_exactly_one_job(dsn: str, conn: Connection, mode: Any) -> None:
    barrier = threading.Barrier(50)
    results: list[Any] = []

    with Client(dsn) as shared:  # one client, as an application server has, and 50 connections

        def produce(n: int) -> None:
            with psycopg.connect(dsn, autocommit=True) as own:  # so that the 50 reach the server at once
                barrier.wait()
                results.append(shared.enqueue("t", {"n": n}, unique_key="hot", on_conflict=mode, conn=own))

        run_on_threads(produce, 50)
    assert count(conn) == 1
    (job_id,) = {r.id for r in results}
    assert sum(not r.duplicate for r in results) == 1
    if mode != "keep":  # the stored payload is the last one enqueued: the last replaced, or the insert
        last = max((r for r in results if r.replaced or not r.duplicate), key=lambda r: r.replaced)
        assert last.id == job_id
        assert row(conn, job_id)["payload"]["n"] in range(50)


def _produce_in_process(dsn: str, mode: Any, start: Any, out: Any) -> None:
    with Client(dsn) as client:
        start.wait()
        out.put([tuple(client.enqueue("t", {"n": i}, unique_key="proc", on_conflict=mode)) for i in range(20)])


@pytest.mark.parametrize("mode", MODES, ids=["keep", "replace", "debounce"])
def test_four_processes_enqueueing_one_key_store_exactly_one_job(dsn: str, conn: Connection, mode: Any) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_produce_in_process, args=(dsn, mode, start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [r for _ in procs for r in out.get(timeout=60)]
    for p in procs:
        p.join(timeout=30)
    assert count(conn) == 1
    assert len({r[0] for r in results}) == 1 and sum(not r[1] for r in results) == 1


def test_the_job_that_runs_carries_the_last_payload_enqueued_before_it_started(dsn: str, conn: Connection) -> None:
    ran: list[int] = []
    runs = App()

    @runs.task("collect", queue="debounced")
    def collect(job: Any) -> None:
        ran.append(job.payload["n"])

    with Client(dsn) as client:
        for n in range(20):
            client.enqueue("collect", {"n": n}, queue="debounced", unique_key="k", on_conflict="replace")
        run_jobs(runs, client)
        assert ran == [19]
        job_id = client.enqueue("collect", {"n": 20}, queue="debounced", unique_key="k", on_conflict="replace").id
        wait_until(lambda: row(conn, job_id)["state"] == "available")
        run_jobs(runs, client)
    assert ran == [19, 20]


def test_group_members_keep_their_keys_and_a_chained_step_with_a_key_is_refused(
    client: Client, conn: Connection
) -> None:
    group = client.group(
        [JobSpec("t", {"n": 1}, unique_key="g"), JobSpec("t", {"n": 2}, unique_key="g")], then=JobSpec("t")
    )
    assert [m.duplicate for m in group.members] == [False, True] and group.members[1].id == group.members[0].id
    with pytest.raises(InvalidInput, match="step 1: a job with depends_on cannot have a unique_key"):
        client.chain([JobSpec("t"), JobSpec("t", unique_key="c")])
    assert count(conn) == 2  # the group's member and its callback; nothing of the chain


def test_a_periodic_tasks_jobs_keep_their_unique_key_and_a_replacing_one_is_refused(dsn: str, conn: Connection) -> None:
    from miniqueue import ConfigError, Reaper, ReaperConfig

    app = App()

    @app.task("nightly", queue="reports", cron="* * * * *", unique_key="nightly")
    def nightly(job: Any) -> None:
        pass

    # The schedule last ran a minute and a half ago: the slot since is due.
    conn.execute("INSERT INTO miniqueue_periodic (name, last_slot) VALUES ('nightly', now() - interval '90 seconds')")
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False), app=app).run_once()
    assert count(conn, "unique_key = 'nightly'") == 1
    with pytest.raises(ConfigError, match="replaces or debounces"):

        @app.task("hourly", cron="0 * * * *", unique_key="hourly", on_conflict="replace")
        def hourly(job: Any) -> None:
            pass

    assert "hourly" not in app.tasks  # refused before anything was registered


def test_a_large_batch_of_unique_keys_goes_by_copy_and_a_held_key_by_the_statement(
    client: Client, conn: Connection, dsn: str
) -> None:
    fresh = client.enqueue_many([JobSpec("t", {"n": n}, unique_key=f"big{n}", expires_in=60) for n in range(600)])
    assert not any(r.duplicate for r in fresh) and count(conn) == 600
    deadline = conn.execute(
        "SELECT min(expires_at - created_at), max(expires_at - created_at) FROM miniqueue_jobs"
    ).fetchone()
    assert deadline is not None and {d.total_seconds() for d in deadline} == {60.0}
    # A key held already, and one twice in the batch: the COPY gives way to the batch statement.
    again = [JobSpec("t", {"n": n}, unique_key=f"next{n}") for n in range(599)] + [JobSpec("t", unique_key="big7")]
    results = client.enqueue_many([*again, JobSpec("t", unique_key="next3")])
    assert results[599] == (fresh[7].id, True, False) and results[600] == (results[3].id, True, False)
    assert sum(not r.duplicate for r in results) == 599 and count(conn) == 1199
    # Inside the caller's transaction too: the failed COPY rolls back to its savepoint only.
    with psycopg.connect(dsn) as own:
        own.execute("INSERT INTO miniqueue_served_queues (queue) VALUES ('mine')")
        inside = client.enqueue_many([JobSpec("t", unique_key=f"big{n}") for n in range(500)], conn=own)
        assert all(r.duplicate for r in inside)
        own.commit()
    assert count(conn) == 1199 and conn.execute("SELECT count(*) FROM miniqueue_served_queues").fetchone() == (1,)


def test_a_bad_job_in_a_large_keyed_batch_stores_nothing(client: Client, conn: Connection) -> None:
    jobs = [JobSpec("t", {"n": n}, unique_key=f"k{n}") for n in range(600)]
    jobs[550] = JobSpec("t", {"n": float("nan")}, unique_key="bad")
    with pytest.raises(InvalidInput, match="job 550"):
        client.enqueue_many(jobs)
    assert count(conn) == 0
