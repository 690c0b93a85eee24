"""Finished jobs leave the hot table (migration 022): the statement that finishes a job moves it
to the history, partitioned by finish time; everything that reads finished jobs still finds them;
retention drops whole partitions, with the idempotency keys and counts of their jobs; an upgrade
moves the rows of an existing table while the queue runs."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from miniqueue import Client, JobSpec, Reaper, ReaperConfig, State
from miniqueue.core.db import Connection, connect
from miniqueue.core.records import Lease
from miniqueue.core.validation import validate
from miniqueue.store import history
from miniqueue.store.history import partition_name
from miniqueue.store.migrate import load_migrations
from miniqueue.store.store import Failure, Store

from ..helpers import count, wait_until

T = TypeVar("T")

W = "worker-1"
DAY = 86400.0


def where(conn: Connection, job_id: int) -> str:
    """The partition that holds the job."""
    found = conn.execute("SELECT tableoid::regclass::text FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
    assert found is not None, f"job {job_id} does not exist"
    return str(found[0])


def live_rows(conn: Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM miniqueue_jobs_live").fetchone()[0])  # type: ignore[index]


def run_one(store: Store, conn: Connection) -> tuple[int, int]:
    [lease] = store.claim(conn, ["default"], W, 30, 1)
    return lease.id, lease.attempt


def finished_yesterday(conn: Connection, *ids: int) -> None:
    """Move finished jobs' finish time a day back, as if they had finished then: the UPDATE moves
    each to the partition of that time, and the recount counts it in that hour."""
    conn.execute(
        "UPDATE miniqueue_jobs SET finished_at = finished_at - interval '1 day' WHERE id = ANY(%s)", [list(ids)]
    )
    Store().recount(conn)


def detached(conn: Connection) -> list[str]:
    """The history's partitions detached and not dropped yet, oldest first."""
    rows = conn.execute(
        "SELECT relname::text FROM pg_class WHERE relkind = 'r' AND NOT relispartition"
        "   AND relname ~ '^miniqueue_jobs_(done|failed)_[0-9]{8}' ORDER BY relname"
    ).fetchall()
    return [name for (name,) in rows]


def drop_detached_pass_by_pass(store: Store, conn: Connection) -> None:
    """Call the drop as the reaper's passes do until no detached partition is left: each call
    drops one table, the oldest, so that a drain meets one table's files at a time."""
    left = detached(conn)
    while left:
        store.drop_partitions(conn, "done", 3600)
        assert detached(conn) == left[1:], "one table a call, the oldest"
        left = left[1:]


def finished_count(client: Client, state: State = State.COMPLETED) -> int:
    return sum(c.count for c in client.counts() if c.state == state)


def test_a_finished_job_leaves_the_hot_table_and_is_read_and_requeued_from_the_history(
    client: Client, store: Store, conn: Connection
) -> None:
    job_id = client.enqueue("t", {"n": 1}).id
    assert where(conn, job_id) == "miniqueue_jobs_live"
    claimed, attempt = run_one(store, conn)
    store.complete(conn, claimed, W, attempt, result='{"ok": true}')
    assert live_rows(conn) == 0, "the hot table holds only live jobs"
    assert where(conn, job_id).startswith("miniqueue_jobs_done_2")
    assert client.result(job_id) == {"ok": True}
    assert client.get(job_id).state is State.COMPLETED
    assert [j.id for j in client.list_jobs(state=State.COMPLETED)] == [job_id]
    assert finished_count(client) == 1
    failed = client.enqueue("t").id
    claimed, attempt = run_one(store, conn)
    store.fail(conn, claimed, W, attempt, "never again")
    assert where(conn, failed).startswith("miniqueue_jobs_failed_2")
    assert client.requeue([failed]) == [failed]
    assert where(conn, failed) == "miniqueue_jobs_live" and finished_count(client, State.FAILED) == 0


@pytest.mark.parametrize(
    ("finish", "state", "table"),
    [
        ("cancel", State.CANCELLED, "done"),
        ("fail", State.FAILED, "failed"),
        ("dead", State.DEAD, "failed"),
        ("expire", State.EXPIRED, "failed"),
    ],
)
def test_each_final_state_lands_in_its_history_table(
    client: Client, store: Store, conn: Connection, dsn: str, finish: str, state: State, table: str
) -> None:
    job_id = client.enqueue("t", max_attempts=1, expires_in=60).id
    if finish == "cancel":
        client.cancel([job_id])
    elif finish == "expire":
        conn.execute(
            "UPDATE miniqueue_jobs SET created_at = now() - interval '2 s', expires_at = now() - interval '1 s'"
        )
        Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    else:
        claimed, attempt = run_one(store, conn)
        if finish == "fail":
            store.fail(conn, claimed, W, attempt, "never again")
        else:
            store.record_failures(conn, W, [Failure(claimed, attempt, "boom")])
    assert client.get(job_id).state is state
    assert where(conn, job_id).startswith(f"miniqueue_jobs_{table}_2")
    assert live_rows(conn) == 0


def test_an_idempotency_key_holds_after_its_job_finished_until_the_job_is_deleted(
    client: Client, store: Store, conn: Connection
) -> None:
    first = client.enqueue("t", idempotency_key="k").id
    claimed, attempt = run_one(store, conn)
    store.complete(conn, claimed, W, attempt)
    again = client.enqueue("t", idempotency_key="k")
    assert again.duplicate and again.id == first
    batch = client.enqueue_many([JobSpec("t", idempotency_key="k"), JobSpec("t", idempotency_key="j")])
    assert (batch[0].id, batch[0].duplicate) == (first, True) and not batch[1].duplicate
    client.delete([first])
    fresh = client.enqueue("t", idempotency_key="k")
    assert not fresh.duplicate and fresh.id != first


def test_a_job_kept_out_by_its_unique_key_gives_its_idempotency_key_back(client: Client) -> None:
    holder = client.enqueue("t", unique_key="u").id
    kept_out = client.enqueue("t", unique_key="u", idempotency_key="i")
    assert kept_out.duplicate and kept_out.id == holder
    client.cancel([holder])
    stored = client.enqueue("t", idempotency_key="i")
    assert not stored.duplicate, "the idempotency key was not left to a job that was never stored"
    [a, b] = client.enqueue_many([JobSpec("t", unique_key="v"), JobSpec("t", unique_key="v", idempotency_key="w")])
    assert not a.duplicate and b.duplicate and b.id == a.id
    assert not client.enqueue("t", idempotency_key="w").duplicate


def test_retention_drops_a_partition_whole_with_its_keys_and_counts(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    old = [client.enqueue("t", idempotency_key=f"old{n}").id for n in range(3)]
    recent = client.enqueue("t").id
    for _ in range(4):
        claimed, attempt = run_one(store, conn)
        store.complete(conn, claimed, W, attempt)
    finished_yesterday(conn, *old)
    yesterday = where(conn, old[0])
    assert yesterday != where(conn, recent) and yesterday.startswith("miniqueue_jobs_done_2")
    assert finished_count(client) == 4

    result = Reaper(dsn, ReaperConfig(vacuum=False, completed_retention=3600)).run_once()
    assert result.pruned == 0, "no row was deleted one by one"
    assert yesterday in detached(conn), "out of the history at once; its files go at a later pass"
    assert [j.id for j in client.list_jobs(state=State.COMPLETED)] == [recent]
    assert finished_count(client) == 1, "the dropped jobs left the counts"
    assert not client.enqueue("t", idempotency_key="old0").duplicate, "their keys went with them"
    assert count(conn, "state = 'completed'") == 1
    drop_detached_pass_by_pass(store, conn)
    assert conn.execute("SELECT to_regclass(%s)", [yesterday]).fetchone() == (None,)


def test_partitions_expired_together_go_in_one_pass_with_their_keys_and_counts_only(
    client: Client, store: Store, conn: Connection
) -> None:
    """A day of hours past retention, one of whose partitions was dropped by hand (its register
    row stayed), so that its hour's job landed in the default partition. One call detaches the
    others, forgets the gone one, and lets go of the keys and counts of the detached ones' jobs
    alone."""
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    ids = [client.enqueue("t", idempotency_key=f"k{n}").id for n in range(3)]
    for _ in ids:
        claimed, attempt = run_one(store, conn)
        store.complete(conn, claimed, W, attempt)
    [(now,)] = conn.execute("SELECT date_trunc('hour', now(), 'UTC')").fetchall()
    gone = partition_name("done", now - dt.timedelta(hours=25))
    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(gone)))
    conn.execute(
        "UPDATE miniqueue_jobs j SET finished_at = finished_at - make_interval(hours => h)"
        "  FROM unnest(%s::int8[], %s::int[]) AS m(id, h) WHERE j.id = m.id",
        [ids, [24, 25, 26]],
    )
    store.recount(conn)
    assert [where(conn, i) for i in ids] == [
        partition_name("done", now - dt.timedelta(hours=24)),
        "miniqueue_jobs_done_default",
        partition_name("done", now - dt.timedelta(hours=26)),
    ]

    dropped = store.drop_partitions(conn, "done", 3600)

    hours = [partition_name("done", now - dt.timedelta(hours=h)) for h in (24, 25, 26)]
    assert hours[0] in dropped and hours[2] in dropped and hours[1] not in dropped
    assert len(detached(conn)) == len(dropped) - 1, "the oldest table dropped in the same call, the others left"
    left = conn.execute("SELECT count(*) FROM miniqueue_history_partitions WHERE name = ANY(%s)", [hours]).fetchone()
    assert left == (0,), "all three out of the register, the gone one too"
    assert [j.id for j in client.list_jobs(state=State.COMPLETED)] == [ids[1]]
    assert finished_count(client) == 1, "the default partition's job still counted"
    assert not client.enqueue("t", idempotency_key="k0").duplicate
    assert not client.enqueue("t", idempotency_key="k2").duplicate
    assert client.enqueue("t", idempotency_key="k1").id == ids[1], "the default partition's job keeps its key"
    drop_detached_pass_by_pass(store, conn)


def test_two_reapers_dropping_one_partition_at_once_drop_it_once_and_neither_fails(
    client: Client, store: Store, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "LOCK_TIMEOUT", "30s")  # both wait out the reader below
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    ids = [client.enqueue("t").id for _ in range(2)]
    for _ in ids:
        claimed, attempt = run_one(store, conn)
        store.complete(conn, claimed, W, attempt)
    finished_yesterday(conn, *ids)
    yesterday = where(conn, ids[0])
    with connect(dsn, purpose="test-hold") as holder, holder.transaction():
        holder.execute(f'LOCK TABLE "{yesterday}" IN ACCESS SHARE MODE')  # a reader of its old jobs
        # Each lists the partition, then waits for the history table's lock.
        reapers = [in_background(dsn, "test-drop", retention_pass) for _ in "ab"]
        wait_until(lambda: waiting(conn, "test-drop") == 2, what="both reapers waiting for the lock")
    dropped = [reaper.result(30) for reaper in reapers]
    assert not set(dropped[0]) & set(dropped[1]), "no partition dropped twice"
    assert yesterday in dropped[0] + dropped[1]
    drop_detached_pass_by_pass(store, conn)
    assert conn.execute("SELECT to_regclass(%s)", [yesterday]).fetchone() == (None,)


def test_a_drop_waiting_for_a_reader_holds_up_no_claim_and_a_completion_only_until_it_is_done(
    client: Client, store: Store, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion locks the history table and then the partition it lands in; a drop waiting
    for a reader of the partition it drops queues such a completion behind it. Once the reader
    is done, the drop and then the completion go on, and neither is taken for a deadlock (as
    they would be if the drop held the partition and waited for the history table). A claim
    locks no partition of the history, and runs meanwhile."""
    monkeypatch.setattr(history, "LOCK_TIMEOUT", "30s")  # the drop waits out the reader below
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    old = client.enqueue("t").id
    claimed, attempt = run_one(store, conn)
    store.complete(conn, claimed, W, attempt)
    finished_yesterday(conn, old)
    yesterday = where(conn, old)
    running = client.enqueue("t").id
    running_attempt = run_one(store, conn)[1]
    available = client.enqueue("t").id
    with connect(dsn, purpose="test-hold") as reader, reader.transaction():
        reader.execute("SELECT count(*) FROM miniqueue_jobs WHERE state = 'completed'")  # jobs list, say
        dropping = in_background(dsn, "test-drop", retention_pass)
        wait_until(lambda: waiting(conn, "test-drop") == 1, what="the drop waiting for the reader")
        with connect(dsn, purpose="test-claim") as claimer:
            claimer.execute("SET statement_timeout = '10s'")  # a claim held up fails, not hangs
            assert [lease.id for lease in store.claim(claimer, ["default"], "w2", 30, 1)] == [available]
        completing = in_background(dsn, "test-complete", lambda own: Store().complete(own, running, W, running_attempt))
        wait_until(lambda: waiting(conn, "test-complete") == 1, what="the completion waiting behind the drop")
    assert yesterday in dropping.result(30)
    assert completing.result(30) is None
    assert where(conn, running).startswith("miniqueue_jobs_done_2")
    drop_detached_pass_by_pass(store, conn)
    assert conn.execute("SELECT to_regclass(%s)", [yesterday]).fetchone() == (None,)


def test_a_requeue_of_a_job_past_retention_during_its_drop_goes_on_and_the_drop_undoes_all_it_did(
    client: Client, store: Store, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drop locks the partitions it detaches against writers before it locks the history
    table. A requeue that locked the history table first, and then waits for its job's partition,
    holds the drop up in turn: the drop gives up (here at the server's deadlock check, its lock
    timeout being long), undoing all it did, and the requeue goes on with the job's key held."""
    monkeypatch.setattr(history, "LOCK_TIMEOUT", "30s")
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    old = client.enqueue("t", idempotency_key="k").id
    assert client.cancel([old]) == [old]
    finished_yesterday(conn, old)
    yesterday = where(conn, old)
    assert yesterday.startswith("miniqueue_jobs_done_2")
    with connect(dsn, purpose="test-requeue") as requeuer, requeuer.transaction():
        requeuer.execute("LOCK TABLE ONLY miniqueue_jobs_done IN ROW EXCLUSIVE MODE")  # a write's first lock
        dropping = in_background(dsn, "test-drop", retention_pass)
        wait_until(lambda: waiting(conn, "test-drop") == 1, what="the drop waiting for the history table")
        assert store.requeue(requeuer, [old]) == [old]
    assert dropping.result(30) == [], "the drop gave up, to try again at a later pass"
    assert where(conn, old) == "miniqueue_jobs_live"
    assert client.enqueue("t", idempotency_key="k").id == old, "the requeued job holds its key"
    assert yesterday in {p.name for p in store.partitions(conn)}, "the partition still registered"
    assert yesterday in store.drop_partitions(conn, "done", 3600)
    drop_detached_pass_by_pass(store, conn)


def test_a_claim_locks_no_partition_of_the_history_and_a_completion_only_the_one_it_lands_in(
    client: Client, store: Store, conn: Connection
) -> None:
    """A day of hourly partitions: a claim (with limits, whose holders it looks up) and a
    completion, each in the generic plan a worker runs after its first few statements."""
    store.ensure_partitions(conn, back_seconds={"done": DAY, "failed": 3 * DAY})
    client.enqueue_many([JobSpec("t", {"n": n}, concurrency_key=f"k{n % 2}") for n in range(20)])
    client.enqueue_many([JobSpec("t", {"n": n}) for n in range(20)])
    history_locks = """
        SELECT array_agg(DISTINCT coalesce(i.indrelid, c.oid)::regclass::text) FROM pg_locks l
          JOIN pg_class c ON c.oid = l.relation LEFT JOIN pg_index i ON i.indexrelid = c.oid
         WHERE l.pid = pg_backend_pid() AND c.relname ~ '^miniqueue_jobs_(done|failed)_'"""
    leases: list[Lease] = []
    for _ in range(8):  # psycopg prepares a statement on its fifth run
        with conn.transaction():
            leases.extend(store.claim(conn, ["default"], W, 30, 2))
            assert conn.execute(history_locks).fetchone() == (None,), "a claim locked the history"
        lease = leases.pop()
        with conn.transaction():
            done, more = store.complete_and_claim(conn, W, [(lease.id, lease.attempt)], ["default"], 30, 1)
            assert done == {lease.id}
            [locked] = conn.execute(history_locks).fetchone()  # type: ignore[misc]
        leases.extend(more)
        assert locked == [where(conn, lease.id)], "a completion locked more than its job's partition"


def retention_pass(own: Connection) -> list[str]:
    """The reaper's retention of finished jobs: drop the partitions of those done over an hour ago."""
    return Store().drop_partitions(own, "done", 3600)


def in_background(dsn: str, purpose: str, call: Callable[[Connection], T]) -> Future[T]:
    """``call`` on a thread and an autocommit connection of its own, named ``purpose`` (so that
    :func:`waiting` sees it wait for a lock); its future: what it returned, or raises."""

    def target() -> T:
        with connect(dsn, purpose=purpose) as own:
            own.autocommit = True
            return call(own)

    executor = ThreadPoolExecutor(max_workers=1)
    try:
        return executor.submit(target)
    finally:
        executor.shutdown(wait=False)  # the thread ends once the call does


def waiting(conn: Connection, application: str) -> int:
    """How many sessions of ``application`` wait for a lock."""
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name LIKE %s",
        [f"%{application}%"],
    ).fetchone()
    assert found is not None
    return int(found[0])


def test_the_count_of_a_deleted_job_leaves_the_hour_it_finished_in(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    store.ensure_partitions(conn, back_seconds={"done": 2 * DAY})
    ids = [client.enqueue("t").id for _ in range(3)]
    for _ in ids:
        claimed, attempt = run_one(store, conn)
        store.complete(conn, claimed, W, attempt)
    finished_yesterday(conn, *ids[1:])
    client.delete([ids[1]])
    assert finished_count(client) == 2
    Reaper(dsn, ReaperConfig(vacuum=False, completed_retention=3600)).run_once()
    assert finished_count(client) == 1, "no count left behind by the drop, none taken twice"


def test_a_job_finished_where_no_partition_was_made_lands_in_the_default_and_is_pruned(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    job_id = client.enqueue("t").id
    claimed, attempt = run_one(store, conn)
    store.complete(conn, claimed, W, attempt)
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '30 days' WHERE id = %s", [job_id])
    store.recount(conn)
    assert where(conn, job_id) == "miniqueue_jobs_done_default"
    result = Reaper(dsn, ReaperConfig(vacuum=False)).run_once()
    assert result.pruned == 1 and count(conn) == 0 and finished_count(client) == 0


def test_the_reaper_makes_the_partitions_ahead(store: Store, conn: Connection, dsn: str) -> None:
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    names = {p.name for p in store.partitions(conn)}
    [(now,)] = conn.execute("SELECT now()").fetchall()
    assert partition_name("done", now.replace(minute=0, second=0, microsecond=0)) in names
    assert sum(1 for p in store.partitions(conn) if p.kind == "done" and p.ends_at > now) >= 3
    assert sum(1 for p in store.partitions(conn) if p.kind == "failed" and p.ends_at > now) >= 3


def test_an_upgrade_moves_the_old_tables_rows_while_the_queue_runs(fresh_database: str) -> None:
    """A deployment at migration 021, with live and finished jobs (one with a key), migrates:
    the live jobs are claimable at once; the finished ones, and their counts, move as the reaper
    passes, the old table goes, and nothing is lost or counted twice."""
    migrations = [(m.version, m.name, m.sql) for m in load_migrations()]
    store = Store()
    with connect(fresh_database, purpose="test") as conn:
        store.apply_migrations(conn, migrations[:21])
        conn.execute(
            "INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, attempt_budget, finished_at,"
            " completed_at, idempotency_key)"
            " SELECT 'default', 't', '{}', 'completed', 1, 5, now() - g * interval '1 minute', now(),"
            "        CASE WHEN g = 1 THEN 'kept' END FROM generate_series(1, 2500) g"
        )
        conn.execute(
            "INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, attempt_budget, finished_at)"
            " VALUES ('default', 't', '{}', 'dead', 5, 5, now())"
        )
        conn.execute(
            "INSERT INTO miniqueue_jobs (queue, task, payload, attempt_budget) VALUES ('default', 't', '{}', 5)"
        )
        conn.execute(
            "INSERT INTO miniqueue_counts (queue, state, shard, count)"
            " VALUES ('default', 'completed', 0, 2500), ('default', 'dead', 0, 1)"
        )
        store.apply_migrations(conn, migrations)
        store.ensure_partitions(conn)

        [lease] = store.claim(conn, ["default"], W, 30, 10)
        assert lease.id == 2502, "the live job moved with the migration"
        assert store.enqueue(conn, validate(JobSpec("t", idempotency_key="kept"))).duplicate
        assert store.has_legacy(conn)

    with Client(fresh_database) as client:
        assert finished_count(client) == 2500 and finished_count(client, State.DEAD) == 1
        # (Retention kept out of it: how many of the moved jobs are past it, and so pruned by the
        # passes that follow, would depend on how many passes the move took.)
        kept = ReaperConfig(vacuum=False, batch_size=100, completed_retention=None, failed_retention=None)
        reaper = Reaper(fresh_database, kept)
        while store.has_legacy(conn := connect(fresh_database, purpose="test")):
            conn.close()
            reaper.run_once()
        conn.close()
        assert client.get(1).state is State.COMPLETED and client.get(2501).state is State.DEAD
        assert finished_count(client) == 2500 and finished_count(client, State.DEAD) == 1
        with connect(fresh_database, purpose="test") as conn:
            assert live_rows(conn) == 1
            assert count(conn) == 2502
            [(infinite,)] = conn.execute(
                "SELECT coalesce(sum(count), 0) FROM miniqueue_counts WHERE bucket = '-infinity'"
            ).fetchall()
            assert infinite == 0, "the counts moved with the rows"


def test_a_statement_that_waited_for_a_job_that_moved_meanwhile_runs_again(client: Client, dsn: str) -> None:
    """A DELETE waiting for a job's row lock while another transaction moves the row (cancels the
    job) would fail with a serialization failure: outside a transaction it runs again, and finds
    the row where it went."""
    job_id = client.enqueue("t").id
    deleted: list[list[int]] = []
    with connect(dsn, purpose="test", autocommit=False) as other, connect(dsn, purpose="test") as watcher:
        other.execute("UPDATE miniqueue_jobs SET state = 'cancelled', finished_at = now() WHERE id = %s", [job_id])
        deleter = threading.Thread(target=lambda: deleted.append(client.delete([job_id])))
        deleter.start()
        wait_until(
            lambda: watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%DELETE FROM%%'"
            ).fetchone(),
            what="the delete waiting for the row",
        )
        other.commit()
        deleter.join(timeout=10)
    assert deleted == [[job_id]]


def test_a_reaper_whose_role_may_not_make_partitions_says_so_once_and_still_recovers_leases(
    client: Client, store: Store, conn: Connection, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the tables' owner may make a partition: a reaper run as a role granted the queue's
    tables alone logs why, once, and the rest of its pass goes on."""
    role = f"miniqueue_rw_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    for grant in (
        "GRANT USAGE ON SCHEMA public TO {}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}",
        "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}",
    ):
        conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
    try:
        [(newest,)] = conn.execute(
            "SELECT name FROM miniqueue_history_partitions WHERE class = 'done' ORDER BY starts_at DESC LIMIT 1"
        ).fetchall()
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(newest)))  # the reaper must make it again
        conn.execute("DELETE FROM miniqueue_history_partitions WHERE name = %s", [newest])
        job_id = client.enqueue("t").id
        store.claim(conn, ["default"], W, 0.01, 1)
        wait_until(lambda: count(conn, "lease_expires_at < now()") == 1, what="the lease expired")

        reaper = Reaper(make_conninfo(dsn, user=role, password=""), ReaperConfig(vacuum=False))
        with caplog.at_level(logging.ERROR, logger="miniqueue.reaper"):
            assert reaper.run_once().recovered == 1
            assert reaper.run_once().recovered == 0
        refusals = [r.getMessage() for r in caplog.records if "cannot keep the history's partitions" in r.getMessage()]
        assert len(refusals) == 1 and "lacks a privilege miniqueue needs" in refusals[0]
        assert client.get(job_id).state == State.AVAILABLE
        assert conn.execute("SELECT to_regclass(%s)", [newest]).fetchone() == (None,)
        reaper.close()
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
