"""The producer API: idempotent, batched, transactional and scheduled enqueue."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest

from miniqueue import Client, EnqueueResult, InvalidInput, JobNotFound, JobOptions, JobSpec, QueueCount, State
from miniqueue.core.db import Connection, PooledConnection, connect
from miniqueue.store.store import Store

from ..helpers import count, row, wait_until

W1 = "host-a:101:aaaa"


def db_now(conn: Connection) -> dt.datetime:
    result = conn.execute("SELECT now()").fetchone()
    assert result is not None
    value: dt.datetime = result[0]
    return value


def waiting_on_a_lock(conn: Connection, application_name: str) -> bool:
    result = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        [application_name],
    ).fetchone()
    return result is not None and result[0] == 1


# --- idempotency ------------------------------------------------------------------------------------


def test_repeated_key_returns_the_original_id_and_says_duplicate(client: Client, conn: Connection) -> None:
    first = client.enqueue("charge", {"amount": 10}, queue="payments", idempotency_key="order-1")
    again = client.enqueue("charge", {"amount": 99}, queue="other", priority=9, idempotency_key="order-1")
    assert first == EnqueueResult(id=first.id, duplicate=False)
    assert again == EnqueueResult(id=first.id, duplicate=True)
    assert count(conn) == 1
    stored = row(conn, first.id)
    assert (stored["payload"], stored["queue"], stored["priority"]) == ({"amount": 10}, "payments", 0)


def test_keys_are_independent_and_no_key_never_deduplicates(client: Client, conn: Connection) -> None:
    a = client.enqueue("t", idempotency_key="a")
    b = client.enqueue("t", idempotency_key="b")
    plain = [client.enqueue("t", {"same": True}) for _ in range(3)]
    assert len({a.id, b.id, *(p.id for p in plain)}) == 5
    assert not any(r.duplicate for r in (a, b, *plain))
    assert count(conn) == 5


def test_key_still_deduplicates_after_the_job_finished(client: Client, conn: Connection, store: Store) -> None:
    first = client.enqueue("t", idempotency_key="once")
    lease = store.claim(conn, ["default"], W1, 30, 1)[0]
    store.complete(conn, first.id, W1, lease.attempt)
    assert client.enqueue("t", idempotency_key="once") == EnqueueResult(first.id, duplicate=True)
    assert count(conn) == 1


@pytest.mark.parametrize("key", ["order-\udcff", "\ud800", "ok-" + "\udfff" * 3])
def test_a_key_with_a_lone_surrogate_is_invalid_input_on_every_path(client: Client, conn: Connection, key: str) -> None:
    # What Python makes of bytes that are not UTF-8: no text PostgreSQL can store, so no key.
    with pytest.raises(InvalidInput, match=r"^idempotency key .* is invalid: .* lone surrogate"):
        client.enqueue("t", idempotency_key=key)
    for size in (10, 499, 500, 2000):  # around Store.copy_threshold: small and large batches
        specs = [JobSpec("t", {"i": i}, idempotency_key=f"k-{i}") for i in range(size)]
        specs[size // 2] = JobSpec("t", idempotency_key=key)
        with pytest.raises(InvalidInput, match=rf"^job {size // 2}: idempotency key .* lone surrogate"):
            client.enqueue_many(specs)
    assert count(conn) == 0
    assert client.enqueue("t", idempotency_key="order-1").duplicate is False  # the pool is still usable


# --- enqueue_many -----------------------------------------------------------------------------------


def test_enqueue_many_stores_thousands_in_one_transaction_in_input_order(client: Client, conn: Connection) -> None:
    specs = [JobSpec("bulk", {"i": i}, queue=f"q{i % 3}", priority=i % 5) for i in range(5000)]
    results = client.enqueue_many(specs)
    assert len(results) == 5000
    assert not any(r.duplicate for r in results)
    assert len({r.id for r in results}) == 5000
    stored = {
        r[0]: (r[1], r[2], r[3]) for r in conn.execute("SELECT id, payload->>'i', queue, priority FROM miniqueue_jobs")
    }
    assert len(stored) == 5000
    for i, result in enumerate(results):
        assert stored[result.id] == (str(i), f"q{i % 3}", i % 5)
    # One transaction: every row has the same now().
    assert conn.execute("SELECT count(DISTINCT created_at) FROM miniqueue_jobs").fetchone() == (1,)


def test_enqueue_many_honours_keys_against_stored_jobs_and_within_the_batch(client: Client, conn: Connection) -> None:
    stored = client.enqueue("t", {"v": "stored"}, idempotency_key="k1")
    results = client.enqueue_many(
        [
            JobSpec("t", {"v": 0}, idempotency_key="k1"),
            JobSpec("t", {"v": 1}, idempotency_key="k2"),
            JobSpec("t", {"v": 2}),
            JobSpec("t", {"v": 3}, idempotency_key="k2"),
            JobSpec("t", {"v": 4}, idempotency_key="k3"),
            JobSpec("t", {"v": 5}, idempotency_key="k1"),
            JobSpec("t", {"v": 6}),
        ]
    )
    assert [r.duplicate for r in results] == [True, False, False, True, False, True, False]
    assert results[0].id == results[5].id == stored.id
    assert results[3].id == results[1].id
    assert len({results[i].id for i in (1, 2, 4, 6)}) == 4
    assert count(conn) == 5
    assert row(conn, stored.id)["payload"] == {"v": "stored"}
    assert row(conn, results[1].id)["payload"] == {"v": 1}, "the first occurrence in the batch wins"


def test_enqueue_many_of_nothing(client: Client, conn: Connection) -> None:
    assert client.enqueue_many([]) == []
    assert count(conn) == 0


@pytest.fixture(params=["copy", "insert", "insert-keyed"])
def path(request: pytest.FixtureRequest, client: Client) -> str:
    """enqueue_many's two ways in: COPY for a large batch without idempotency keys (here any
    batch without keys), else INSERT ... ON CONFLICT (here any batch, with or without keys)."""
    client.store.copy_threshold = 1 if request.param == "copy" else 10**9
    return str(request.param)


def key_for(path: str, n: int) -> str | None:
    return f"key-{n}" if path == "insert-keyed" else None


def test_enqueue_many_schedules_each_job(path: str, client: Client, conn: Connection, store: Store) -> None:
    now = db_now(conn)
    due, later, delayed, plain = client.enqueue_many(
        [
            JobSpec("t", run_at=now - dt.timedelta(minutes=1), idempotency_key=key_for(path, 0)),
            JobSpec("t", run_at=now + dt.timedelta(hours=1), idempotency_key=key_for(path, 1)),
            JobSpec("t", delay=dt.timedelta(minutes=10), idempotency_key=key_for(path, 2)),
            JobSpec("t", idempotency_key=key_for(path, 3)),
        ]
    )
    assert row(conn, due.id)["scheduled_at"] == now - dt.timedelta(minutes=1)
    assert row(conn, later.id)["scheduled_at"] == now + dt.timedelta(hours=1)
    delayed_row, plain_row = row(conn, delayed.id), row(conn, plain.id)
    assert delayed_row["scheduled_at"] - delayed_row["created_at"] == dt.timedelta(minutes=10)
    assert plain_row["scheduled_at"] == plain_row["created_at"], "counted from the database clock"
    assert [lease.id for lease in store.claim(conn, ["default"], W1, 30, 10)] == [due.id, plain.id]


AWKWARD_PAYLOADS = [
    {"tab": "a\tb", "newline": "a\nb", "cr": "a\rb", "backslash": "a\\b", "end-of-copy": "\\.", "nul-text": "\\u0000"},
    {"unicode": "ünïcødé ✓ 🚀", "ctrl": "\x01\x1f\x7f", "quote": '"', "big": 10**20, "float": 1e-300},
    ["\\N", "\\", None, "", "\\t"],
]


def test_enqueue_many_stores_awkward_payloads_exactly(path: str, client: Client, conn: Connection) -> None:
    specs = [JobSpec("t", p, idempotency_key=key_for(path, n)) for n, p in enumerate(AWKWARD_PAYLOADS)]
    results = client.enqueue_many(specs)
    assert [row(conn, r.id)["payload"] for r in results] == AWKWARD_PAYLOADS


def test_enqueue_many_notifies_each_queue_given_a_due_job_once(path: str, client: Client, dsn: str) -> None:
    with connect(dsn, purpose="test-listen") as listener:
        client.store.listen(listener)
        specs = [JobSpec("t", queue="a", idempotency_key=key_for(path, n)) for n in range(3)]
        specs += [JobSpec("t", queue="b", delay=60, idempotency_key=key_for(path, 3))]
        specs += [
            JobSpec(
                "t", queue="c", run_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc), idempotency_key=key_for(path, 4)
            )
        ]
        client.enqueue_many(specs)
        client.enqueue("t", queue="d")  # a marker: notifications arrive in commit order
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=3)]
    assert sorted(heard[:2]) == ["a", "c"], "b's job is not due yet"
    assert heard[2] == "d"


def test_enqueue_many_without_notify_sends_none(dsn: str) -> None:
    with Client(dsn, notify=False) as quiet, connect(dsn, purpose="test-listen") as listener:
        quiet.store.listen(listener)
        quiet.enqueue_many([JobSpec("t", queue="a"), JobSpec("t", queue="b", idempotency_key="k")])
        quiet.enqueue_many([JobSpec("t", queue="c")])
        quiet.enqueue_many([JobSpec("t", queue="e")] * quiet.store.copy_threshold)
        quiet.enqueue("t", queue="d")
        with Client(dsn) as loud:
            loud.enqueue("t", queue="marker")
        assert [n.payload for n in listener.notifies(timeout=10, stop_after=1)] == ["marker"]


# --- options ------------------------------------------------------------------------------------


def test_a_misspelt_option_is_a_type_error_that_names_it_and_stores_nothing(client: Client, conn: Connection) -> None:
    with pytest.raises(TypeError, match=r"unknown enqueue options \['qeue'\]: use allow_failure, "):
        client.enqueue("t", qeue="q")  # type: ignore[call-arg]  # the misspelt keyword under test
    assert count(conn) == 0


def test_every_job_option_is_a_field_of_a_job_spec() -> None:
    # mypy sees that each option is a JobSpec field (enqueue unpacks them into one); not the converse.
    assert set(JobOptions.__annotations__) == set(JobSpec._fields) - {"task", "payload"}


# --- transactional enqueue ------------------------------------------------------------------------


def test_rolled_back_transactional_enqueue_stores_nothing(client: Client, conn: Connection, dsn: str) -> None:
    with psycopg.connect(dsn) as own:
        result = client.enqueue("t", {"order": 1}, conn=own)
        client.enqueue_many([JobSpec("t", {"n": n}) for n in range(3)], conn=own)
        assert count(own) == 4, "visible inside the caller's transaction"
        assert count(conn) == 0, "invisible outside it before commit"
        own.rollback()
    assert count(conn) == 0
    with pytest.raises(AssertionError):
        row(conn, result.id)


def test_committed_transactional_enqueue_is_stored(client: Client, conn: Connection, dsn: str, store: Store) -> None:
    with psycopg.connect(dsn) as own:
        own.execute("CREATE TEMP TABLE orders (id int)")
        own.execute("INSERT INTO orders VALUES (1)")
        result = client.enqueue("ship", {"order": 1}, conn=own)
        assert store.claim(conn, ["default"], W1, 30, 1) == [], "workers cannot claim it before commit"
        own.commit()
    assert row(conn, result.id)["state"] == "available"
    assert [lease.id for lease in store.claim(conn, ["default"], W1, 30, 1)] == [result.id]


# --- scheduling on the database clock ---------------------------------------------------------------


def test_run_at_is_stored_as_the_same_instant(client: Client, conn: Connection, store: Store) -> None:
    plus_five = dt.timezone(dt.timedelta(hours=5))
    run_at = (db_now(conn) + dt.timedelta(hours=2)).astimezone(plus_five)
    result = client.enqueue("t", run_at=run_at)
    assert row(conn, result.id)["scheduled_at"] == run_at
    assert store.claim(conn, ["default"], W1, 30, 1) == []
    past = client.enqueue("t", run_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    assert [lease.id for lease in store.claim(conn, ["default"], W1, 30, 5)] == [past.id]


def test_delay_counts_on_the_database_clock(client: Client, conn: Connection) -> None:
    seconds = client.enqueue("t", delay=90)
    as_timedelta = client.enqueue("t", delay=dt.timedelta(hours=1, milliseconds=500))
    for result, expected in ((seconds, dt.timedelta(seconds=90)), (as_timedelta, dt.timedelta(seconds=3600.5))):
        stored = row(conn, result.id)
        assert stored["scheduled_at"] - stored["created_at"] == expected


def test_delayed_job_is_invisible_to_claim_until_due(client: Client, conn: Connection, store: Store) -> None:
    result = client.enqueue("t", delay=0.5)
    assert store.claim(conn, ["default"], W1, 30, 1) == []
    leases = wait_until(lambda: store.claim(conn, ["default"], W1, 30, 1), timeout=10, what="the delayed job")
    assert [lease.id for lease in leases] == [result.id]
    assert db_now(conn) >= row(conn, result.id)["scheduled_at"]


# --- concurrency --------------------------------------------------------------------------------------


def test_concurrent_enqueue_of_one_key_from_two_threads_returns_one_id(
    client: Client, conn: Connection, dsn: str
) -> None:
    def enqueue_at_once(key: str, barrier: threading.Barrier) -> EnqueueResult:
        with connect(dsn, purpose="test-producer") as own:
            barrier.wait(timeout=10)
            return client.enqueue("t", {"key": key}, idempotency_key=key, conn=own)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for n in range(20):
            key, barrier = f"race-{n}", threading.Barrier(2)
            results = [f.result() for f in [pool.submit(enqueue_at_once, key, barrier) for _ in range(2)]]
            assert results[0].id == results[1].id
            assert sorted(r.duplicate for r in results) == [False, True]
    assert count(conn) == 20


def _enqueue_behind_an_open_insert(
    client: Client, conn: Connection, dsn: str, *, commit: bool, many: bool
) -> tuple[EnqueueResult, EnqueueResult]:
    """Hold key "k" in an open transaction, enqueue it again from another thread, then end the
    first transaction; return (the first insert, the second enqueue's result)."""
    name = "miniqueue:test-second-producer"
    with psycopg.connect(dsn) as first_tx, connect(dsn, purpose="test-second-producer") as second:
        first = client.enqueue("t", {"who": "first"}, idempotency_key="k", conn=first_tx)

        def enqueue_second() -> EnqueueResult:
            spec = JobSpec("t", {"who": "second"}, idempotency_key="k")
            if many:
                return client.enqueue_many([spec], conn=second)[0]
            return client.enqueue("t", {"who": "second"}, idempotency_key="k", conn=second)

        with ThreadPoolExecutor(max_workers=1) as pool:
            pending: Future[EnqueueResult] = pool.submit(enqueue_second)
            wait_until(lambda: waiting_on_a_lock(conn, name), timeout=10, what="the second insert to wait")
            assert not pending.done()
            first_tx.commit() if commit else first_tx.rollback()
            return first, pending.result(timeout=10)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_enqueue_waiting_on_a_committed_insert_of_its_key_returns_that_id(
    client: Client, conn: Connection, dsn: str, many: bool
) -> None:
    first, second = _enqueue_behind_an_open_insert(client, conn, dsn, commit=True, many=many)
    assert second == EnqueueResult(first.id, duplicate=True)
    assert count(conn) == 1
    assert row(conn, first.id)["payload"] == {"who": "first"}


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_enqueue_waiting_on_a_rolled_back_insert_of_its_key_inserts(
    client: Client, conn: Connection, dsn: str, many: bool
) -> None:
    first, second = _enqueue_behind_an_open_insert(client, conn, dsn, commit=False, many=many)
    assert not second.duplicate and second.id != first.id
    assert count(conn) == 1
    assert row(conn, second.id)["payload"] == {"who": "second"}


# --- the client's inspection and repair methods ---------------------------------------------------


def test_client_get_counts_cancel_and_requeue(client: Client, conn: Connection) -> None:
    first = client.enqueue("report", {"month": 5}, queue="reports")
    second = client.enqueue("report", {"month": 6}, queue="reports")
    record = client.get(first.id)
    assert (record.task, record.payload, record.state) == ("report", {"month": 5}, State.AVAILABLE)
    assert client.cancel([first.id]) == [first.id]
    assert client.counts() == [QueueCount("reports", State.AVAILABLE, 1), QueueCount("reports", State.CANCELLED, 1)]
    assert client.requeue([first.id]) == [first.id]
    assert client.get(first.id).state == State.AVAILABLE
    client.cancel([first.id, second.id])
    assert client.requeue_matching([State.CANCELLED], queue="reports") == 2
    assert count(conn, "state = 'available'") == 2
    with pytest.raises(JobNotFound):
        client.get(987_654)


def test_a_pooled_connection_keeps_one_cursor_past_a_failed_statement(client: Client, conn: Connection) -> None:
    with client.connection() as pooled:
        assert isinstance(pooled, PooledConnection)
        cursor = pooled.statement_cursor()
        with pytest.raises(psycopg.errors.DivisionByZero):
            cursor.execute("SELECT 1 / 0")
        job = client.enqueue("t", {"after": "error"}, conn=pooled)
        assert pooled.statement_cursor() is cursor
    assert row(conn, job.id)["payload"] == {"after": "error"}
