"""Counts of finished jobs kept by the statements that finish, requeue, prune and delete them,
so that stats never count finished rows: checked against count(*) after every kind of
transition, and by the stats query's plan."""

from __future__ import annotations

from typing import Any

import pytest

from miniqueue import Client, JobSpec, Reaper, ReaperConfig, State
from miniqueue.core.db import Connection
from miniqueue.maintenance import reaper as reaper_module
from miniqueue.store.store import Failure, Store

W = "test-host:1:counts"


def by_count(conn: Connection) -> dict[tuple[str, str], int]:
    """What count(*) says, for the states the counters keep."""
    rows = conn.execute(
        "SELECT queue, state, count(*) FROM miniqueue_jobs"
        " WHERE state IN ('completed', 'failed', 'dead', 'cancelled') GROUP BY 1, 2"
    ).fetchall()
    return {(q, s): int(n) for q, s, n in rows}


def by_stats(store: Store, conn: Connection) -> dict[tuple[str, str], int]:
    finished = (State.COMPLETED, State.FAILED, State.DEAD, State.CANCELLED)
    return {(q.queue, s.value): q.counts[s] for q in store.queue_stats(conn) for s in finished if q.counts[s]}


def claim(store: Store, conn: Connection, queue: str, n: int) -> list[tuple[int, int]]:
    return [(lease.id, lease.attempt) for lease in store.claim(conn, [queue], W, 30, n)]


def test_counts_follow_every_transition_in_and_out_of_a_finished_state(
    client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue_many([JobSpec("t", queue=q, max_attempts=1) for q in ("a", "b") for _ in range(10)])
    done = claim(store, conn, "a", 4)
    store.complete_many(conn, W, done[:3])
    completed, _ = store.complete_and_claim(conn, W, done[3:], ["b"], 30, 5)
    assert by_stats(store, conn) == by_count(conn) == {("a", "completed"): 4}

    held = [(i, a) for i, a in (store.leases_of(conn, W)) if i not in completed]
    store.record_failures(conn, W, [Failure(i, a, "boom", 0) for i, a in held[:2]])  # max_attempts 1: dead
    store.fail(conn, held[2][0], W, held[2][1], "never")
    store.cancel(conn, [held[3][0], *[i for i, _ in claim(store, conn, "a", 1)]])
    assert by_stats(store, conn) == by_count(conn)
    assert by_count(conn)[("b", "dead")] == 2

    store.requeue(conn, [held[0][0], held[2][0]])
    assert by_stats(store, conn) == by_count(conn)
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '2 days' WHERE state = 'completed'")
    assert store.prune(conn, [State.COMPLETED], 3600) == 4
    store.delete(conn, [i for (_, s), i in _ids_by_state(conn).items() if s == "cancelled"][:1])
    assert by_stats(store, conn) == by_count(conn)


def _ids_by_state(conn: Connection) -> dict[tuple[int, str], int]:
    return {(int(i), s): int(i) for i, s in conn.execute("SELECT id, state FROM miniqueue_jobs").fetchall()}


def test_recount_repairs_counts_changed_behind_the_stores_back(client: Client, store: Store, conn: Connection) -> None:
    client.enqueue_many([JobSpec("t", queue="a") for _ in range(5)])
    conn.execute("UPDATE miniqueue_jobs SET state = 'completed', finished_at = now() WHERE id <= 3")
    assert by_stats(store, conn) == {}
    store.recount(conn)
    assert by_stats(store, conn) == by_count(conn) == {("a", "completed"): 3}


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *[node for child in plan.get("Plans", []) for node in _plan_nodes(child)]]


def test_stats_read_no_finished_row(client: Client, store: Store, conn: Connection) -> None:
    client.enqueue_many([JobSpec("t", queue=f"q{i % 3}") for i in range(3000)])
    conn.execute("UPDATE miniqueue_jobs SET state = 'completed', finished_at = now() WHERE id % 10 <> 0")
    conn.execute("ANALYZE miniqueue_jobs")
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")  # a scan of the table would show as a full index scan
        row = conn.execute("EXPLAIN (FORMAT JSON) " + store._queue_stats).fetchone()
    assert row is not None
    nodes = _plan_nodes(row[0][0]["Plan"])
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "miniqueue_jobs" for n in nodes)
    indexes = {n["Index Name"] for n in nodes if "Index Name" in n}
    assert indexes and indexes <= {
        "idx_miniqueue_jobs_claim",
        "idx_miniqueue_jobs_limited",
        "idx_miniqueue_jobs_expired_leases",
        "idx_miniqueue_jobs_waiting",
        "miniqueue_counts_pkey",
    }, indexes


def test_pruning_a_backlog_comes_in_slices_and_keeps_the_counts(
    client: Client, store: Store, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.enqueue_many([JobSpec("t", queue="a") for _ in range(2500)])
    conn.execute("UPDATE miniqueue_jobs SET state = 'completed', finished_at = now() - interval '2 days'")
    store.recount(conn)
    monkeypatch.setattr(reaper_module, "PRUNE_SLICE", 0.0)  # one batch per pass
    reaper = Reaper(dsn, ReaperConfig(batch_size=1000))
    try:
        passes = [reaper.run_once() for _ in range(3)]
    finally:
        reaper.close()
    assert [(p.pruned, p.more_to_prune) for p in passes] == [(1000, True), (1000, True), (500, False)]
    assert by_count(conn) == by_stats(store, conn) == {}


def test_throughput_counts_each_minutes_finished_jobs_and_old_minutes_are_trimmed(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    client.enqueue_many([JobSpec("t", queue="a") for _ in range(5)])
    leases = claim(store, conn, "a", 5)
    done, failing = leases[:3], leases[3:]
    store.complete_many(conn, W, done)
    for job_id, attempt in failing:
        store.fail(conn, job_id, W, attempt, "PermanentError: no")
    assert per_state(store, conn) == {State.COMPLETED: 3, State.FAILED: 2}

    # Finishing events stay counted in their minute: pruning the jobs later changes nothing.
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '2 days'")
    assert store.prune(conn, [State.COMPLETED], 3600) == 3
    assert per_state(store, conn) == {State.COMPLETED: 3, State.FAILED: 2}

    # Minutes older than the chart shows are dropped by the reaper's pass.
    conn.execute(
        "INSERT INTO miniqueue_finished_minutes VALUES (date_trunc('minute', now()) - interval '3 hours', "
        "'completed', 0, 7)"
    )
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    kept = conn.execute("SELECT count(*) FROM miniqueue_finished_minutes WHERE minute < now() - interval '1 hour'")
    assert kept.fetchone() == (0,)
    assert per_state(store, conn) == {State.COMPLETED: 3, State.FAILED: 2}


def per_state(store: Store, conn: Connection) -> dict[State, int]:
    """The last hour's throughput by state (the minutes may straddle a boundary)."""
    totals: dict[State, int] = {}
    for _, state, n in store.throughput(conn):
        totals[state] = totals.get(state, 0) + n
    return totals
