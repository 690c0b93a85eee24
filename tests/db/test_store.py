"""The store against a real PostgreSQL: the basics (enqueue, claim, complete, fail, renew,
recover, requeue), then fencing, recovery, ordering, batches, the operator side, and the claim plan."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from miniqueue import Client, InvalidInput, InvalidTransition, JobNotFound, JobSpec, LeaseLost, State
from miniqueue.core.db import Connection, connect
from miniqueue.core.records import Lease, QueueCount
from miniqueue.core.validation import validate
from miniqueue.store.store import Failure, Release, Store
from miniqueue.tasks.job import Job

from ..helpers import count, db_now, expire_lease, make_due, row

W1 = "host-a:101:aaaa"
W2 = "host-b:202:bbbb"
W3 = "host-c:303:cccc"


# --- helpers ------------------------------------------------------------------------------------


def enqueue(store: Store, conn: Connection, task: str = "task", payload: Any = None, **options: Any) -> int:
    """Enqueue one job through the store (validated exactly as the client does)."""
    return store.enqueue(conn, validate(JobSpec(task, payload, **options))).id


def claim_one(store: Store, conn: Connection, worker: str, queue: str = "default", lease: float = 30) -> Lease:
    leases = store.claim(conn, [queue], worker, lease, 1)
    assert len(leases) == 1, f"expected one job to claim from {queue!r}, got {leases}"
    return leases[0]


def seconds_from_now(conn: Connection, job_id: int, column: str) -> float:
    """How far in the future (database clock) a timestamp column of a job is."""
    assert column in {"lease_expires_at", "scheduled_at", "finished_at"}
    result = conn.execute(
        f"SELECT extract(epoch FROM {column} - now())::float8 FROM miniqueue_jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert result is not None and result[0] is not None
    return float(result[0])


def states(conn: Connection) -> dict[int, str]:
    return {r[0]: r[1] for r in conn.execute("SELECT id, state FROM miniqueue_jobs ORDER BY id")}


def run_to_dead_letter(store: Store, conn: Connection, job_id: int) -> None:
    """Fail a job's every attempt until it is dead."""
    while row(conn, job_id)["state"] != "dead":
        lease = claim_one(store, conn, W1, queue=row(conn, job_id)["queue"])
        assert lease.id == job_id
        store.record_failure(conn, job_id, W1, lease.attempt, "boom", 0)


# --- the basics: enqueue, claim, complete, fail, renew, recover, requeue --------------------------


def test_enqueue_simple(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, "send_email", {"to": "a@example.com"}, queue="emails")
    stored = row(conn, job_id)
    assert stored["state"] == "available"
    assert stored["attempt"] == 0
    assert stored["max_attempts"] == 5
    assert stored["priority"] == 0
    assert stored["queue"] == "emails"
    assert stored["task"] == "send_email"
    assert stored["payload"] == {"to": "a@example.com"}
    assert stored["leased_by"] is None and stored["lease_expires_at"] is None
    assert stored["last_error"] is None and stored["errors"] == []
    assert stored["scheduled_at"] <= db_now(conn)


def test_enqueue_idempotency_key_no_duplicates(store: Store, conn: Connection) -> None:
    first = store.enqueue(conn, validate(JobSpec("t", {"n": 1}, idempotency_key="order-12345")))
    second = store.enqueue(conn, validate(JobSpec("t", {"n": 2}, idempotency_key="order-12345")))
    assert not first.duplicate
    assert second.duplicate and second.id == first.id
    assert count(conn) == 1
    assert row(conn, first.id)["payload"] == {"n": 1}


def test_enqueue_requires_queue_name(client: Client, conn: Connection) -> None:
    with pytest.raises(InvalidInput, match="queue name ''"):
        client.enqueue("t", {}, queue="")
    assert count(conn) == 0


def test_claim_basic(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, "t", {"k": "v"})
    lease = claim_one(store, conn, W1, lease=30)
    assert lease.id == job_id and lease.attempt == 1 and lease.payload == {"k": "v"} and lease.task == "t"
    stored = row(conn, job_id)
    assert stored["state"] == "running"
    assert stored["leased_by"] == W1
    assert stored["attempt"] == 1
    assert stored["lease_expires_at"] == lease.lease_expires_at
    assert 28 < seconds_from_now(conn, job_id, "lease_expires_at") <= 30


def test_claim_empty_queue(store: Store, conn: Connection) -> None:
    assert store.claim(conn, ["default"], W1, 30, 10) == []
    enqueue(store, conn, queue="other")
    assert store.claim(conn, ["default"], W1, 30, 10) == []
    assert count(conn, "state = 'available'") == 1


def test_claim_priority_ordering(store: Store, conn: Connection) -> None:
    low = enqueue(store, conn, priority=1)
    high = enqueue(store, conn, priority=10)
    assert claim_one(store, conn, W1).id == high
    assert claim_one(store, conn, W1).id == low


def test_claim_scheduled_in_future(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, delay=3600)
    assert store.claim(conn, ["default"], W1, 30, 10) == []
    assert row(conn, job_id)["state"] == "available"
    # Move the schedule to the past on the database clock: now it is due.
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() - interval '1 second' WHERE id = %s", [job_id])
    assert claim_one(store, conn, W1).id == job_id


def test_complete(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    store.complete(conn, job_id, W1, lease.attempt)
    stored = row(conn, job_id)
    assert stored["state"] == "completed"
    assert stored["leased_by"] is None and stored["lease_expires_at"] is None
    assert stored["completed_at"] is not None and stored["finished_at"] is not None


def test_complete_wrong_worker(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    with pytest.raises(LeaseLost) as raised:
        store.complete(conn, job_id, W2, lease.attempt)
    assert raised.value.job_id == job_id and raised.value.worker_id == W2
    stored = row(conn, job_id)
    assert stored["state"] == "running" and stored["leased_by"] == W1


def test_fail(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    store.fail(conn, job_id, W1, lease.attempt, "card declined")
    stored = row(conn, job_id)
    assert stored["state"] == "failed"
    assert stored["last_error"] == "card declined"
    assert stored["leased_by"] is None and stored["finished_at"] is not None
    assert store.claim(conn, ["default"], W1, 30, 10) == []


def test_renew_lease(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1, lease=30)
    new_expiry = store.renew_lease(conn, job_id, W1, lease.attempt, 120)
    assert new_expiry > lease.lease_expires_at
    assert row(conn, job_id)["lease_expires_at"] == new_expiry
    assert 118 < seconds_from_now(conn, job_id, "lease_expires_at") <= 120


def test_recover_expired_leases(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    assert store.recover_expired_leases(conn) == {job_id: State.AVAILABLE}
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["leased_by"] is None
    assert "worker lost" in stored["last_error"]
    assert seconds_from_now(conn, job_id, "scheduled_at") <= 2.0, "after the default backoff (attempt 1: 0-2 s)"
    make_due(conn, job_id)
    again = claim_one(store, conn, W2)
    assert again.id == job_id and again.attempt == 2
    assert row(conn, job_id)["leased_by"] == W2


def test_concurrent_claim_skip_locked(store: Store, conn: Connection, dsn: str) -> None:
    ids = {enqueue(store, conn, payload={"i": i}) for i in range(20)}
    start = threading.Barrier(5)

    def claimer(worker: str) -> list[int]:
        claimed: list[int] = []
        with connect(dsn, purpose="test-claimer") as own:
            start.wait(timeout=10)
            while leases := store.claim(own, ["default"], worker, 30, 1):
                claimed.extend(lease.id for lease in leases)
        return claimed

    workers = [f"claimer-{n}" for n in range(5)]
    with ThreadPoolExecutor(max_workers=5) as pool:
        results = dict(zip(workers, pool.map(claimer, workers), strict=True))
    every = [job_id for claimed in results.values() for job_id in claimed]
    assert len(every) == 20, "every job claimed"
    assert len(set(every)) == 20, "no job claimed twice"
    assert set(every) == ids
    for worker, claimed in results.items():
        for job_id in claimed:
            stored = row(conn, job_id)
            assert stored["state"] == "running" and stored["leased_by"] == worker and stored["attempt"] == 1


def test_record_failure_retry(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=3)
    lease = claim_one(store, conn, W1)
    assert store.record_failure(conn, job_id, W1, lease.attempt, "timeout", 60) == State.AVAILABLE
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["attempt"] == 1
    assert stored["last_error"] == "timeout" and stored["leased_by"] is None
    assert 58 < seconds_from_now(conn, job_id, "scheduled_at") <= 60
    assert store.claim(conn, ["default"], W1, 30, 1) == [], "not claimable during the backoff"


def test_record_failure_dead_letter(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=2)
    lease = claim_one(store, conn, W1)
    assert store.record_failure(conn, job_id, W1, lease.attempt, "first", 0) == State.AVAILABLE
    lease = claim_one(store, conn, W1)
    assert store.record_failure(conn, job_id, W1, lease.attempt, "second", 0) == State.DEAD
    stored = row(conn, job_id)
    assert stored["state"] == "dead" and stored["attempt"] == 2
    assert stored["last_error"] == "second" and stored["finished_at"] is not None
    assert store.claim(conn, ["default"], W1, 30, 1) == []


def test_requeue(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=1)
    run_to_dead_letter(store, conn, job_id)
    assert store.requeue(conn, [job_id]) == [job_id]
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["finished_at"] is None
    assert claim_one(store, conn, W2).id == job_id


def test_requeue_non_dead_job(store: Store, conn: Connection) -> None:
    available = enqueue(store, conn, queue="idle")
    with pytest.raises(InvalidTransition, match=f"job {available}: it is available"):
        store.requeue(conn, [available])
    running = enqueue(store, conn)
    assert claim_one(store, conn, W1).id == running
    completed = enqueue(store, conn)
    store.complete(conn, completed, W1, claim_one(store, conn, W1).attempt)
    for job_id in (running, completed):
        with pytest.raises(InvalidTransition):
            store.requeue(conn, [job_id])
    assert states(conn) == {available: "available", running: "running", completed: "completed"}


# --- fencing --------------------------------------------------------------------------------------


def test_recovered_and_reclaimed_job_rejects_its_old_worker(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=5)
    old = claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    store.recover_expired_leases(conn)
    make_due(conn, job_id)
    new = claim_one(store, conn, W2, lease=30)
    before = row(conn, job_id)

    with pytest.raises(LeaseLost):
        store.complete(conn, job_id, W1, old.attempt)
    with pytest.raises(LeaseLost):
        store.fail(conn, job_id, W1, old.attempt, "late failure")
    with pytest.raises(LeaseLost):
        store.renew_lease(conn, job_id, W1, old.attempt, 600)
    with pytest.raises(LeaseLost):
        store.record_failure(conn, job_id, W1, old.attempt, "late retry", 0)
    with pytest.raises(LeaseLost):
        store.snooze(conn, job_id, W1, old.attempt, 0)

    assert row(conn, job_id) == before, "the old worker's writes changed nothing"
    store.complete(conn, job_id, W2, new.attempt)
    assert row(conn, job_id)["state"] == "completed"


def test_same_worker_with_an_older_attempt_cannot_complete(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    first = claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    store.recover_expired_leases(conn)
    make_due(conn, job_id)
    second = claim_one(store, conn, W1)
    assert (first.attempt, second.attempt) == (1, 2)
    with pytest.raises(LeaseLost) as raised:
        store.complete(conn, job_id, W1, first.attempt)
    assert raised.value.attempt == 1
    assert store.complete_many(conn, W1, [(job_id, first.attempt)]) == set()
    stored = row(conn, job_id)
    assert stored["state"] == "running" and stored["attempt"] == 2
    store.complete(conn, job_id, W1, second.attempt)
    assert row(conn, job_id)["state"] == "completed"


def test_completion_is_not_repeatable(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    store.complete(conn, job_id, W1, lease.attempt)
    with pytest.raises(LeaseLost):
        store.complete(conn, job_id, W1, lease.attempt)
    with pytest.raises(LeaseLost):
        store.record_failure(conn, job_id, W1, lease.attempt, "late", 0)
    assert row(conn, job_id)["state"] == "completed"


# --- the reaper re-check and poison pills -------------------------------------------------------------


def test_job_completed_between_expiry_and_recovery_stays_completed(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    store.complete(conn, job_id, W1, lease.attempt)  # the worker was slow, not dead
    assert store.recover_expired_leases(conn) == {}
    stored = row(conn, job_id)
    assert stored["state"] == "completed" and stored["last_error"] is None and stored["errors"] == []


def test_renewed_lease_is_not_recovered(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    store.renew_lease(conn, job_id, W1, lease.attempt, 30)
    assert store.recover_expired_leases(conn) == {}
    stored = row(conn, job_id)
    assert stored["state"] == "running" and stored["leased_by"] == W1 and stored["attempt"] == 1


def test_unexpired_lease_is_not_recovered(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    claim_one(store, conn, W1)
    assert store.recover_expired_leases(conn) == {}
    assert row(conn, job_id)["state"] == "running"


def test_recovery_skips_a_lease_being_renewed(store: Store, conn: Connection, dsn: str) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    expire_lease(conn, job_id)
    with psycopg.connect(dsn) as heartbeat:  # a heartbeat transaction, not committed yet
        store.renew_lease(heartbeat, job_id, W1, lease.attempt, 30)
        assert store.recover_expired_leases(conn) == {}, "a row locked by a renewal is left alone"
        heartbeat.commit()
    assert store.recover_expired_leases(conn) == {}
    stored = row(conn, job_id)
    assert stored["state"] == "running" and stored["leased_by"] == W1


def test_recovery_works_in_batches(store: Store, conn: Connection) -> None:
    ids = [enqueue(store, conn) for _ in range(5)]
    store.claim(conn, ["default"], W1, 30, 5)
    for job_id in ids:
        expire_lease(conn, job_id)
    batches = [store.recover_expired_leases(conn, limit=2) for _ in range(4)]
    assert [len(b) for b in batches] == [2, 2, 1, 0]
    assert set().union(*batches) == set(ids)
    assert count(conn, "state = 'available'") == 5


def test_poison_pill_goes_dead_at_max_attempts(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, "segfaults", max_attempts=3)
    outcomes = []
    for attempt in (1, 2, 3):
        lease = claim_one(store, conn, f"worker-{attempt}")
        assert lease.attempt == attempt
        expire_lease(conn, job_id)  # the worker died holding it
        outcomes.append(store.recover_expired_leases(conn)[job_id])
        make_due(conn, job_id)
    assert outcomes == [State.AVAILABLE, State.AVAILABLE, State.DEAD]
    stored = row(conn, job_id)
    assert stored["state"] == "dead" and stored["attempt"] == 3 and stored["finished_at"] is not None
    assert "worker lost" in stored["last_error"] and "worker-3" in stored["last_error"]
    history = store.get(conn, job_id).errors
    assert [(e.attempt, e.worker) for e in history] == [(1, "worker-1"), (2, "worker-2"), (3, "worker-3")]
    assert all("worker lost" in e.error for e in history)
    assert store.claim(conn, ["default"], W1, 30, 1) == []
    assert store.recover_expired_leases(conn) == {}


# --- claim ordering ---------------------------------------------------------------------------------


def test_multi_queue_claim_orders_across_queues_and_honours_limit(store: Store, conn: Connection) -> None:
    base = db_now(conn) - dt.timedelta(hours=1)

    def at(seconds: int) -> dt.datetime:
        return base + dt.timedelta(seconds=seconds)

    a_low_early = enqueue(store, conn, queue="a", priority=0, run_at=at(1))
    b_high_late = enqueue(store, conn, queue="b", priority=5, run_at=at(3))
    a_high_early = enqueue(store, conn, queue="a", priority=5, run_at=at(2))
    c_top = enqueue(store, conn, queue="c", priority=10, run_at=at(0))
    b_low_early = enqueue(store, conn, queue="b", priority=0, run_at=at(1))  # ties a_low_early: id decides
    a_low_late = enqueue(store, conn, queue="a", priority=0, run_at=at(5))

    leases = store.claim(conn, ["a", "b"], W1, 30, 4)
    assert [lease.id for lease in leases] == [a_high_early, b_high_late, a_low_early, b_low_early]
    assert count(conn, "state = 'running'") == 4
    assert row(conn, a_low_late)["state"] == "available"
    assert row(conn, c_top)["state"] == "available", "a queue not asked for is not claimed"
    assert [lease.id for lease in store.claim(conn, ["b", "a"], W1, 30, 10)] == [a_low_late]


def test_multi_queue_claim_limit_spans_queues(store: Store, conn: Connection) -> None:
    for queue in ("a", "b", "c"):
        for _ in range(3):
            enqueue(store, conn, queue=queue)
    leases = store.claim(conn, ["a", "b", "c"], W1, 30, 5)
    assert len(leases) == 5
    assert count(conn, "state = 'running'") == 5
    assert len({lease.id for lease in leases}) == 5


def test_claim_with_a_queue_named_twice_still_fills_the_limit(store: Store, conn: Connection) -> None:
    ids = [enqueue(store, conn, queue="a") for _ in range(3)]
    leases = store.claim(conn, ["a", "a"], W1, 30, 3)
    assert sorted(lease.id for lease in leases) == ids
    assert count(conn, "state = 'running'") == 3


def test_claim_of_nothing(store: Store, conn: Connection) -> None:
    enqueue(store, conn)
    assert store.claim(conn, [], W1, 30, 5) == []
    assert store.claim(conn, ["default"], W1, 30, 0) == []
    assert count(conn, "state = 'available'") == 1


def test_fifo_within_a_priority(store: Store, conn: Connection) -> None:
    ids = [enqueue(store, conn, priority=3, payload={"n": n}) for n in range(5)]
    assert [claim_one(store, conn, W1).id for _ in ids] == ids


def test_fifo_ties_on_scheduled_at_are_broken_by_id(store: Store, conn: Connection, client: Client) -> None:
    # One statement: every job has the same scheduled_at.
    ids = [r.id for r in client.enqueue_many([JobSpec("t", {"n": n}) for n in range(6)])]
    assert count(conn, "true") == 6
    distinct = conn.execute("SELECT count(DISTINCT scheduled_at) FROM miniqueue_jobs").fetchone()
    assert distinct == (1,)
    claimed = [lease.id for lease in store.claim(conn, ["default"], W1, 30, 3)]
    claimed += [claim_one(store, conn, W1).id for _ in range(3)]
    assert claimed == ids


def test_earlier_schedule_wins_over_lower_id(store: Store, conn: Connection) -> None:
    now = db_now(conn)
    later = enqueue(store, conn, run_at=now - dt.timedelta(seconds=10))
    earlier = enqueue(store, conn, run_at=now - dt.timedelta(seconds=20))
    assert [lease.id for lease in store.claim(conn, ["default"], W1, 30, 2)] == [earlier, later]


# --- batch forms, snooze, error history ---------------------------------------------------------------


def test_batch_complete_returns_only_held_ids(store: Store, conn: Connection) -> None:
    for _ in range(4):
        enqueue(store, conn)
    leases = store.claim(conn, ["default"], W1, 30, 4)
    kept, cancelled, expired, foreign = leases
    store.cancel(conn, [cancelled.id])
    expire_lease(conn, expired.id)
    store.recover_expired_leases(conn)
    make_due(conn, expired.id)
    stolen = claim_one(store, conn, W2)
    assert stolen.id == expired.id
    conn.execute("UPDATE miniqueue_jobs SET leased_by = %s WHERE id = %s", [W3, foreign.id])

    pairs = [(lease.id, lease.attempt) for lease in leases] + [(999_999, 1)]
    done = store.complete_many(conn, W1, pairs)
    assert done == {kept.id}
    assert states(conn) == {
        kept.id: "completed",
        cancelled.id: "cancelled",
        expired.id: "running",
        foreign.id: "running",
    }
    assert row(conn, expired.id)["leased_by"] == W2
    assert store.complete_many(conn, W1, []) == set()


def test_batch_complete_matches_each_lease_to_its_own_attempt_and_result(store: Store, conn: Connection) -> None:
    # The statement finds each job's attempt and result by binary search over the ids, so the
    # caller's order (here descending, ids far apart) must not matter.
    ids = [enqueue(store, conn) for _ in range(40)]
    conn.execute("UPDATE miniqueue_jobs SET id = id * 1000 + 7 WHERE id = ANY(%s)", [ids])
    leases = store.claim(conn, ["default"], W1, 30, 40)
    stale = {lease.id for lease in leases[::3]}
    pairs = [(lease.id, lease.attempt + (lease.id in stale)) for lease in reversed(leases)]
    results = {lease.id: f'{{"job": {lease.id}}}' for lease in leases}

    done = store.complete_many(conn, W1, pairs, results=results)

    assert done == {lease.id for lease in leases} - stale
    stored = dict(conn.execute("SELECT id, result FROM miniqueue_jobs WHERE state = 'completed'").fetchall())
    assert stored == {job_id: {"job": job_id} for job_id in done}
    assert {job_id for job_id, state in states(conn).items() if state == "running"} == stale


def test_batch_renew_returns_only_held_ids(store: Store, conn: Connection) -> None:
    for _ in range(3):
        enqueue(store, conn)
    held, cancelled, stale = store.claim(conn, ["default"], W1, 30, 3)
    store.cancel(conn, [cancelled.id])
    renewed = store.renew_leases(
        conn, W1, [(held.id, held.attempt), (cancelled.id, cancelled.attempt), (stale.id, stale.attempt + 1)], 300
    )
    assert set(renewed) == {held.id}
    assert renewed[held.id] > held.lease_expires_at
    assert 298 < seconds_from_now(conn, held.id, "lease_expires_at") <= 300
    assert row(conn, stale.id)["lease_expires_at"] == stale.lease_expires_at
    assert row(conn, cancelled.id)["lease_expires_at"] is None


def test_snooze_keeps_the_attempt_budget(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=2)
    lease = claim_one(store, conn, W1)
    store.snooze(conn, job_id, W1, lease.attempt, 3600)
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["leased_by"] is None
    assert 3598 < seconds_from_now(conn, job_id, "scheduled_at") <= 3600
    assert stored["errors"] == [] and stored["last_error"] is None
    assert store.claim(conn, ["default"], W1, 30, 1) == [], "snoozed job is invisible until due"

    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [job_id])
    # Two failures still allowed after the snooze: the budget of 2 is unchanged.
    lease = claim_one(store, conn, W1)
    assert lease.attempt == 2
    assert store.record_failure(conn, job_id, W1, lease.attempt, "one", 0) == State.AVAILABLE
    lease = claim_one(store, conn, W1)
    assert store.record_failure(conn, job_id, W1, lease.attempt, "two", 0) == State.DEAD


def test_error_history_has_one_entry_per_failed_attempt(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=5)
    for worker, error in ((W1, "connection reset"), (W2, "timeout")):
        lease = claim_one(store, conn, worker)
        store.record_failure(conn, job_id, worker, lease.attempt, error, 0)
    lease = claim_one(store, conn, W3)
    store.fail(conn, job_id, W3, lease.attempt, "bad request: never retry")

    record = store.get(conn, job_id)
    assert record.state == State.FAILED
    assert [(e.attempt, e.worker, e.error) for e in record.errors] == [
        (1, W1, "connection reset"),
        (2, W2, "timeout"),
        (3, W3, "bad request: never retry"),
    ]
    assert record.last_error == "bad request: never retry"
    times = [e.at for e in record.errors]
    assert all(t.tzinfo is not None for t in times) and times == sorted(times)


def test_batch_record_failures(store: Store, conn: Connection) -> None:
    retry_id = enqueue(store, conn, max_attempts=3)
    dead_id = enqueue(store, conn, max_attempts=1)
    leases = {lease.id: lease for lease in store.claim(conn, ["default"], W1, 30, 2)}
    result = store.record_failures(
        conn,
        W1,
        [
            Failure(retry_id, leases[retry_id].attempt, "retry me", 0),
            Failure(dead_id, leases[dead_id].attempt, "give up", 0),
            Failure(retry_id, leases[retry_id].attempt + 1, "stale", 0),
        ],
    )
    assert result == {retry_id: State.AVAILABLE, dead_id: State.DEAD}
    assert [e["error"] for e in row(conn, retry_id)["errors"]] == ["retry me"]


# --- operator side: cancel, requeue, prune, counts ------------------------------------------------------


def test_cancel_available_job(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    assert store.cancel(conn, [job_id]) == [job_id]
    stored = row(conn, job_id)
    assert stored["state"] == "cancelled" and stored["finished_at"] is not None
    assert store.claim(conn, ["default"], W1, 30, 1) == []


def test_cancel_running_job_discards_the_workers_outcome(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    lease = claim_one(store, conn, W1)
    store.cancel(conn, [job_id])
    stored = row(conn, job_id)
    assert stored["state"] == "cancelled" and stored["leased_by"] is None and stored["lease_expires_at"] is None
    with pytest.raises(LeaseLost):
        store.renew_lease(conn, job_id, W1, lease.attempt, 30)
    with pytest.raises(LeaseLost):
        store.complete(conn, job_id, W1, lease.attempt)
    assert row(conn, job_id)["state"] == "cancelled"
    expire_lease(conn, job_id)
    assert store.recover_expired_leases(conn) == {}


def test_cancel_completed_job_is_rejected_and_changes_nothing(store: Store, conn: Connection) -> None:
    done = enqueue(store, conn)
    store.complete(conn, done, W1, claim_one(store, conn, W1).attempt)
    waiting = enqueue(store, conn)
    before = row(conn, done)
    with pytest.raises(InvalidTransition, match=f"cannot cancel job {done}: it is completed"):
        store.cancel(conn, [waiting, done])
    assert row(conn, done) == before
    assert row(conn, waiting)["state"] == "available", "all or nothing: the valid id was not cancelled"


def test_cancel_unknown_job(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn)
    with pytest.raises(JobNotFound, match="job 424242 does not exist"):
        store.cancel(conn, [job_id, 424242])
    assert row(conn, job_id)["state"] == "available"


def test_requeue_gives_a_fresh_budget_and_keeps_attempt_monotonic(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, max_attempts=2)
    run_to_dead_letter(store, conn, job_id)
    assert (row(conn, job_id)["attempt"], row(conn, job_id)["max_attempts"]) == (2, 2)
    store.requeue(conn, [job_id])
    stored = row(conn, job_id)
    assert stored["state"] == "available" and stored["attempt"] == 2 and stored["max_attempts"] == 4
    seen = []
    while row(conn, job_id)["state"] != "dead":
        lease = claim_one(store, conn, W2)
        seen.append(lease.attempt)
        store.record_failure(conn, job_id, W2, lease.attempt, "again", 0)
    assert seen == [3, 4], "two fresh attempts, numbered after the old ones"


def test_requeue_failed_and_cancelled_jobs(store: Store, conn: Connection) -> None:
    failed = enqueue(store, conn)
    store.fail(conn, failed, W1, claim_one(store, conn, W1).attempt, "nope")
    cancelled = enqueue(store, conn)
    store.cancel(conn, [cancelled])
    assert sorted(store.requeue(conn, [failed, cancelled])) == sorted([failed, cancelled])
    assert states(conn) == {failed: "available", cancelled: "available"}


def test_requeue_is_all_or_nothing(store: Store, conn: Connection) -> None:
    dead = enqueue(store, conn, max_attempts=1)
    run_to_dead_letter(store, conn, dead)
    available = enqueue(store, conn)
    with pytest.raises(InvalidTransition):
        store.requeue(conn, [dead, available])
    with pytest.raises(JobNotFound):
        store.requeue(conn, [dead, 777_777])
    assert states(conn) == {dead: "dead", available: "available"}


def test_requeue_matching(store: Store, conn: Connection) -> None:
    dead_a = enqueue(store, conn, "x", queue="a", max_attempts=1)
    dead_b = enqueue(store, conn, "y", queue="b", max_attempts=1)
    run_to_dead_letter(store, conn, dead_a)
    run_to_dead_letter(store, conn, dead_b)
    failed_a = enqueue(store, conn, "x", queue="a")
    store.fail(conn, failed_a, W1, claim_one(store, conn, W1, queue="a").attempt, "permanent")
    completed_a = enqueue(store, conn, "x", queue="a")
    store.complete(conn, completed_a, W1, claim_one(store, conn, W1, queue="a").attempt)

    assert store.requeue_matching(conn, [State.DEAD], queue="a", task="y") == 0
    assert store.requeue_matching(conn, [State.DEAD], task="y") == 1
    assert states(conn) == {dead_a: "dead", dead_b: "available", failed_a: "failed", completed_a: "completed"}
    assert store.requeue_matching(conn, [State.DEAD, State.FAILED], queue="a") == 2
    assert states(conn) == {dead_a: "available", dead_b: "available", failed_a: "available", completed_a: "completed"}
    with pytest.raises(InvalidInput, match="requeue states"):
        store.requeue_matching(conn, [State.COMPLETED])
    with pytest.raises(InvalidInput):
        store.requeue_matching(conn, [])


def _finish_in_every_state(store: Store, conn: Connection) -> dict[str, int]:
    jobs = {name: enqueue(store, conn, payload={"name": name}) for name in ("completed", "failed", "dead", "cancelled")}
    store.cancel(conn, [jobs["cancelled"]])
    conn.execute("UPDATE miniqueue_jobs SET max_attempts = 1 WHERE id = %s", [jobs["dead"]])
    leases = {lease.id: lease.attempt for lease in store.claim(conn, ["default"], W1, 30, 3)}
    assert set(leases) == {jobs["completed"], jobs["failed"], jobs["dead"]}
    store.complete(conn, jobs["completed"], W1, leases[jobs["completed"]])
    store.fail(conn, jobs["failed"], W1, leases[jobs["failed"]], "x")
    store.record_failure(conn, jobs["dead"], W1, leases[jobs["dead"]], "x", 0)
    return jobs


def test_prune_deletes_only_terminal_jobs_older_than_the_age(store: Store, conn: Connection) -> None:
    old = _finish_in_every_state(store, conn)
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '2 hours'")
    recent = _finish_in_every_state(store, conn)
    running = enqueue(store, conn)
    claim_one(store, conn, W1)
    available = enqueue(store, conn)
    assert states(conn)[running] == "running"

    assert store.prune(conn, [State.COMPLETED], older_than_seconds=3600) == 1
    assert count(conn, "id = %s", [old["completed"]]) == 0
    terminal = [State.COMPLETED, State.FAILED, State.DEAD, State.CANCELLED]
    assert store.prune(conn, terminal, older_than_seconds=3600) == 3
    remaining = set(states(conn))
    assert remaining == set(recent.values()) | {available, running}


def test_prune_honours_the_limit(store: Store, conn: Connection) -> None:
    ids = [enqueue(store, conn) for _ in range(5)]
    store.cancel(conn, ids)
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '1 day'")
    assert store.prune(conn, [State.CANCELLED], older_than_seconds=60, limit=3) == 3
    assert store.prune(conn, [State.CANCELLED], older_than_seconds=60, limit=3) == 2
    assert count(conn) == 0


@pytest.mark.parametrize("age", [-3600.0, float("nan")])
def test_prune_rejects_a_negative_or_nan_age(store: Store, conn: Connection, age: float) -> None:
    # A negative age would reach into the future and delete jobs that finished a moment ago.
    job_id = enqueue(store, conn)
    store.cancel(conn, [job_id])
    with pytest.raises(InvalidInput, match="age"):
        store.prune(conn, [State.CANCELLED], older_than_seconds=age)
    assert row(conn, job_id)["state"] == "cancelled"


@pytest.mark.parametrize("bad", [[State.AVAILABLE], [State.RUNNING], [State.COMPLETED, State.RUNNING], []])
def test_prune_refuses_non_terminal_states(store: Store, conn: Connection, bad: list[State]) -> None:
    job_id = enqueue(store, conn)
    claim_one(store, conn, W1)
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '1 day'")  # even if it looked old
    with pytest.raises(InvalidInput, match="prune states"):
        store.prune(conn, bad, older_than_seconds=0)
    assert row(conn, job_id)["state"] == "running"


def test_counts_by_queue_and_state(store: Store, conn: Connection) -> None:
    assert store.counts(conn) == []
    for _ in range(3):
        enqueue(store, conn, queue="a")
    for _ in range(2):
        enqueue(store, conn, queue="b")
    lease = claim_one(store, conn, W1, queue="a")
    store.complete(conn, lease.id, W1, lease.attempt)
    claim_one(store, conn, W1, queue="b")
    assert store.counts(conn) == [
        QueueCount("a", State.AVAILABLE, 2),
        QueueCount("a", State.COMPLETED, 1),
        QueueCount("b", State.AVAILABLE, 1),
        QueueCount("b", State.RUNNING, 1),
    ]


def test_get_unknown_job(store: Store, conn: Connection) -> None:
    with pytest.raises(JobNotFound):
        store.get(conn, 31337)


def test_get_returns_the_full_record(store: Store, conn: Connection) -> None:
    job_id = enqueue(store, conn, "resize", {"w": 100}, queue="images", priority=7, max_attempts=9, idempotency_key="k")
    record = store.get(conn, job_id)
    assert (record.id, record.queue, record.task, record.payload) == (job_id, "images", "resize", {"w": 100})
    assert (record.state, record.priority, record.max_attempts, record.idempotency_key) == (State.AVAILABLE, 7, 9, "k")
    assert record.errors == ()


# --- the claim plan ------------------------------------------------------------------------------------

# The shape of the store's single-queue pick query (store._PICK_ONE_QUEUE).
_PICK = """
SELECT id FROM miniqueue_jobs
 WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now()
 ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
 LIMIT %(limit)s FOR UPDATE SKIP LOCKED
"""


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_claim_plan_uses_the_claim_index_without_sorting(client: Client, conn: Connection) -> None:
    specs = [JobSpec("t", {"i": i}, queue=f"q{i % 4}", priority=i % 3) for i in range(4000)]
    client.enqueue_many(specs)
    conn.execute("UPDATE miniqueue_jobs SET state = 'completed', finished_at = now() WHERE id % 2 = 0")
    conn.execute("ANALYZE miniqueue_jobs")
    setting = conn.execute("SHOW enable_seqscan").fetchone()
    assert setting == ("on",)

    plan_row = conn.execute("EXPLAIN (FORMAT JSON) " + _PICK, {"queue": "q1", "limit": 100}).fetchone()
    assert plan_row is not None
    nodes = list(_plan_nodes(plan_row[0][0]["Plan"]))
    assert "idx_miniqueue_jobs_claim" in {n.get("Index Name") for n in nodes}, nodes
    assert not any(n["Node Type"] in {"Sort", "Incremental Sort", "Seq Scan"} for n in nodes), nodes


def test_the_limited_claims_generic_plan_steps_through_indexes_never_the_backlog(
    client: Client, store: Store, conn: Connection
) -> None:
    """A worker keeps PostgreSQL's generic plan for its claim (the statement is prepared after a
    few runs, and planned once): for limited jobs too, that plan must step from key to key through
    the limited jobs' index and look up each key's limit row, never read the backlog or every
    limit row."""
    client.enqueue_many([JobSpec("t", {"i": i}, concurrency_key=f"k{i % 5000}") for i in range(20_000)])
    conn.execute("ANALYZE miniqueue_jobs_live")
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_format = json"):
        conn.execute(f"SET {setting}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.prepare_threshold = 0
    conn.execute("SET client_min_messages = log")
    try:
        leases = store.claim(conn, ["default"], "w", 30.0, 500, together=500, per_group=4)
    finally:
        conn.execute("RESET client_min_messages")
    assert len(leases) == 500
    claim_plans = [json.loads(text.partition("plan:")[2])["Plan"] for text in plans if "miniqueue_limits" in text]
    assert len(claim_plans) == 1, plans
    nodes = list(_plan_nodes(claim_plans[0]))
    assert "idx_miniqueue_jobs_limited" in {n.get("Index Name") for n in nodes}
    scanned = {n.get("Relation Name") for n in nodes if n["Node Type"] == "Seq Scan"}
    assert not scanned & {"miniqueue_jobs_live", "miniqueue_jobs", "miniqueue_limits"}, scanned


def test_copy_many_refuses_jobs_it_cannot_store_faithfully(store: Store, conn: Connection) -> None:
    keyed = [validate(JobSpec("t")), validate(JobSpec("t", idempotency_key="k"))]
    with pytest.raises(ValueError, match="without keys, limits or deadlines"):
        store.copy_many(conn, 2, keyed, scheduled=False)
    delayed = [validate(JobSpec("t")), validate(JobSpec("t", delay=60))]
    with pytest.raises(ValueError, match="scheduled=True"):
        store.copy_many(conn, 2, delayed, scheduled=False)
    with pytest.raises(ValueError, match="zip"):
        store.copy_many(conn, 3, delayed, scheduled=True)  # fewer jobs than it was told
    assert count(conn) == 0
    stored = store.copy_many(conn, 2, delayed, scheduled=True)
    assert [row(conn, r.id)["scheduled_at"] - row(conn, r.id)["created_at"] for r in stored] == [
        dt.timedelta(0),
        dt.timedelta(seconds=60),
    ]


def test_attempts_read_as_charged_of_the_budget_never_as_the_fencing_token(store: Store, conn: Connection) -> None:
    """``attempt`` moves on with every run (it fences), but runs handed back uncharged and runs
    before a requeue are not attempts: what people read is charged of budget, and the runs."""
    job_id = enqueue(store, conn, max_attempts=3)
    for _ in range(3):  # three runs handed back unstarted: no attempt charged
        lease = claim_one(store, conn, W1)
        store.release(conn, W1, [Release(job_id, lease.attempt, "handed back")])
    assert store.get(conn, job_id).describe_attempts() == "attempt 0 of 3, 3 runs"
    lease = claim_one(store, conn, W1)
    job = Job(lease, worker_id=W1)
    assert (job.run, job.charged_attempts, job.attempt_budget) == (4, 1, 3)
    assert repr(job) == f"<Job {job_id} task attempt 1 of 3, 4 runs>"
    store.record_failure(conn, job_id, W1, lease.attempt, "boom", 0)
    record = store.get(conn, job_id)
    assert (record.charged_attempts, record.attempt_budget) == (1, 3)
    run_to_dead_letter(store, conn, job_id)
    assert store.get(conn, job_id).describe_attempts() == "attempt 3 of 3, 6 runs"
    store.requeue(conn, [job_id])  # a fresh budget: the count starts again, the runs go on
    assert store.get(conn, job_id).describe_attempts() == "attempt 0 of 3, 6 runs"
    assert claim_one(store, conn, W1).attempt == 7
    assert store.get(conn, job_id).describe_attempts() == "attempt 1 of 3, 7 runs"
    fresh = enqueue(store, conn)
    claim_one(store, conn, W1)
    assert store.get(conn, fresh).describe_attempts() == "attempt 1 of 5"


def test_a_release_announces_the_jobs_queue(store: Store, conn: Connection, dsn: str) -> None:
    """A job handed back is available at once: its queue is announced at the commit, so an idle
    worker takes it now rather than at its next poll."""
    job_id = enqueue(store, conn, queue="q")
    lease = claim_one(store, conn, W1, queue="q")
    with connect(dsn, purpose="test") as listener:
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(store.channel)))
        assert store.release(conn, W1, [Release(job_id, lease.attempt, "handed back unstarted")]) == {job_id}
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == ["q"]
