"""Sequences: jobs of one key run one at a time in enqueue order; a retry holds the key; a failed
or dead job blocks it until an operator acts (unless its task says continue); cancelled, expired
and completed jobs hand it on; one key's line never delays another key."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from miniqueue import App, Client, InvalidInput, JobSpec
from miniqueue.core.db import Connection
from miniqueue.core.records import State
from miniqueue.store.store import Store
from miniqueue.testing import run_jobs

from ..helpers import count, row

W = "worker-1"


def states(conn: Connection, ids: list[int]) -> list[str]:
    return [row(conn, i)["state"] for i in ids]


def claim_all(store: Store, conn: Connection, queue: str = "default") -> list[tuple[int, int]]:
    return [(lease.id, lease.attempt) for lease in store.claim(conn, [queue], W, 30, 100)]


def enqueue_line(client: Client, n: int, key: str = "acct:1", **options: Any) -> list[int]:
    return [client.enqueue("t", {"n": i}, sequence_key=key, **options).id for i in range(n)]


def test_only_the_first_job_of_a_key_is_claimable_and_each_completion_hands_the_key_on(
    client: Client, store: Store, conn: Connection
) -> None:
    ids = enqueue_line(client, 3)
    assert states(conn, ids) == ["available", "waiting", "waiting"]
    for i, job_id in enumerate(ids):
        assert claim_all(store, conn) == [(job_id, 1)]  # one at a time, in enqueue order
        assert claim_all(store, conn) == []
        store.complete(conn, job_id, W, 1)
        assert states(conn, ids[i + 1 : i + 2]) in ([], ["available"])


def test_a_job_waiting_out_its_retry_still_holds_the_key(client: Client, store: Store, conn: Connection) -> None:
    ids = enqueue_line(client, 2)
    [(first, attempt)] = claim_all(store, conn)
    assert store.record_failure(conn, first, W, attempt, "boom", 3600) == State.AVAILABLE
    assert states(conn, ids) == ["available", "waiting"]  # the retry is due in an hour: the next waits
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [first])
    assert claim_all(store, conn) == [(first, 2)]


def test_a_dead_job_blocks_its_key_until_it_is_released(client: Client, store: Store, conn: Connection) -> None:
    ids = enqueue_line(client, 3, max_attempts=1)
    [(first, attempt)] = claim_all(store, conn)
    assert store.record_failure(conn, first, W, attempt, "boom", 0) == State.DEAD
    assert states(conn, ids) == ["dead", "waiting", "waiting"]
    [blocked] = client.blocked_sequences()
    assert (blocked.key, blocked.job_id, blocked.state, blocked.waiting) == ("acct:1", first, "dead", 2)
    assert client.release_sequence("acct:1") == (first, ids[1])
    assert states(conn, ids) == ["dead", "available", "waiting"] and client.blocked_sequences() == []
    with pytest.raises(InvalidInput, match=r"not blocked: job \d+ holds it"):
        client.release_sequence("acct:1")
    with pytest.raises(InvalidInput, match="unknown"):
        client.release_sequence("nobody")


def test_a_requeued_blocking_job_runs_next_and_then_the_rest(client: Client, store: Store, conn: Connection) -> None:
    ids = enqueue_line(client, 2, max_attempts=1)
    [(first, attempt)] = claim_all(store, conn)
    store.record_failure(conn, first, W, attempt, "boom", 0)
    client.requeue([first])
    assert states(conn, ids) == ["available", "waiting"]
    [(again, attempt)] = claim_all(store, conn)
    assert again == first
    store.complete(conn, first, W, attempt)
    assert states(conn, ids) == ["completed", "available"]


def test_on_failure_continue_lets_the_next_job_run(client: Client, store: Store, conn: Connection) -> None:
    ids = enqueue_line(client, 2, max_attempts=1, on_failure="continue")
    [(first, attempt)] = claim_all(store, conn)
    store.fail(conn, first, W, attempt, "never")
    assert states(conn, ids) == ["failed", "available"]


def test_cancelling_hands_the_key_on_and_a_cancelled_waiting_job_keeps_the_order(
    client: Client, store: Store, conn: Connection
) -> None:
    ids = enqueue_line(client, 4)
    client.cancel([ids[1]])  # a waiting one: the line closes up behind the head
    assert states(conn, ids) == ["available", "cancelled", "waiting", "waiting"]
    client.cancel([ids[0]])  # the head: the next in line runs
    assert states(conn, ids) == ["cancelled", "cancelled", "available", "waiting"]
    client.delete([ids[2]])
    assert states(conn, [ids[3]]) == ["available"]


def test_one_keys_long_line_never_delays_another_key(client: Client, store: Store, conn: Connection) -> None:
    client.enqueue_many([JobSpec("t", {"n": i}, sequence_key="busy") for i in range(2000)])
    other = client.enqueue("t", sequence_key="quiet").id
    claimed = {job_id for job_id, _ in claim_all(store, conn)}
    assert other in claimed and len(claimed) == 2
    assert count(conn, "state = 'waiting'") == 1999


def test_a_batch_keeps_the_order_of_each_key(client: Client, store: Store, conn: Connection) -> None:
    results = client.enqueue_many([JobSpec("t", {"n": i}, sequence_key=f"k{i % 3}") for i in range(9)])
    ids = [r.id for r in results]
    assert states(conn, ids) == ["available"] * 3 + ["waiting"] * 6
    order: list[int] = []
    while len(order) < 9:
        leases = claim_all(store, conn)
        for job_id, attempt in leases:
            store.complete(conn, job_id, W, attempt)
        order += sorted(job_id for job_id, _ in leases)
    assert order == ids


def test_jobs_of_one_key_run_one_at_a_time_in_order_under_four_handler_threads(dsn: str) -> None:
    app = App()
    lock = threading.Lock()
    running: set[str] = set()
    ran: dict[str, list[int]] = {}
    overlaps: list[str] = []

    @app.task("step", queue="ordered", sequence_key=lambda p: p["key"])
    def step(job: Any) -> None:
        key = job.payload["key"]
        with lock:
            if key in running:
                overlaps.append(key)
            running.add(key)
        time.sleep(0.002)
        with lock:
            running.discard(key)
            ran.setdefault(key, []).append(job.payload["n"])

    with Client(dsn) as client:
        app.enqueue(client, "step", {"key": "a", "n": 0})
        client.declare(app)
        # The task's key function applies through the app; a bare client passes the key itself.
        client.enqueue_many([JobSpec("step", {"key": k, "n": n}, sequence_key=k) for n in range(1, 30) for k in "ab"])
        run_jobs(app, client, concurrency=4)
    assert overlaps == []
    assert ran == {"a": list(range(30)), "b": list(range(1, 30))}


def test_the_cli_lists_the_blocked_keys_and_releases_one(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    from click.testing import CliRunner

    from miniqueue.cli.main import main

    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--database-url", dsn])

    assert cli("sequences").output == "no sequence key is blocked\n"
    ids = enqueue_line(client, 2, key="acct:3", max_attempts=1)
    [(first, attempt)] = claim_all(store, conn)
    store.record_failure(conn, first, W, attempt, "card declined", 0)
    listed = cli("sequences")
    assert listed.exit_code == 0
    assert listed.output == f"acct:3  blocked by job {first} (t, dead: card declined); 1 waiting\n"
    waiting = cli("jobs", "list", "--state", "waiting")
    assert "waiting its turn in sequence acct:3" in waiting.output
    shown_job = json.loads(cli("jobs", "show", str(ids[1]), "--json").output)
    assert (shown_job["sequence_key"], shown_job["state"]) == ("acct:3", "waiting")
    [shown] = json.loads(cli("sequences", "--json").output)
    assert (shown["key"], shown["job_id"], shown["waiting"]) == ("acct:3", first, 1)
    released = cli("sequences", "release", "acct:3")
    assert released.output == f"sequence 'acct:3' released from job {first}: job {ids[1]} runs next\n"
    again = cli("sequences", "release", "acct:3")
    assert again.exit_code == 2 and "is not blocked" in again.output
