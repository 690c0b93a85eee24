"""Fleet-wide limits: concurrency per key, caps per queue and rate limits, enforced by the claim."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from miniqueue import App, Client, InvalidInput, JobSpec
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.core.records import Lease, State
from miniqueue.store.store import Release, Store
from miniqueue.tasks.job import Job
from miniqueue.worker import claiming
from miniqueue.worker.claiming import goes_down
from miniqueue.worker.worker import Worker, WorkerConfig

from ..helpers import assert_refused_and_nothing_stored, count, expire_lease, row, wait_until
from ..running import StartWorker


def claim(
    store: Store, conn: Connection, worker: str = "w", limit: int = 100, queues: tuple[str, ...] = ("default",)
) -> list[Lease]:
    return store.claim(conn, list(queues), worker, 30.0, limit)


def ids(leases: list[Lease]) -> list[int]:
    return sorted(lease.id for lease in leases)


# -- concurrency per key ---------------------------------------------------------------------------


def test_a_key_runs_at_most_its_limit_and_other_keys_are_not_held_back(
    client: Client, store: Store, conn: Connection
) -> None:
    a = [client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(3)]
    b = client.enqueue("t", {}, concurrency_key="B").id
    plain = client.enqueue("t", {}).id
    first = claim(store, conn)
    assert ids(first) == sorted([a[0], b, plain])
    assert claim(store, conn) == [], "A's slot and B's are held"
    held = row(conn, a[1])
    assert (held["state"], held["attempt"]) == ("available", 0), "a job held back spends no attempt"
    assert store.complete_many(conn, "w", [(a[0], 1)]) == {a[0]}
    assert ids(claim(store, conn)) == [a[1]], "the completed job's slot is free"


def test_a_claim_takes_a_free_keys_jobs_together_and_they_hold_its_one_slot(
    client: Client, store: Store, conn: Connection
) -> None:
    a = [client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(5)]
    b = client.enqueue("t", {}, concurrency_key="B").id
    plain = client.enqueue("t", {}).id
    first = store.claim(conn, ["default"], "w", 30.0, 100, together=4)
    assert ids(first) == sorted([*a[:4], b, plain]), "up to 4 of a free key's jobs, the oldest"
    assert {lease.id for lease in first if lease.together} == {*a[:4], b}, "a job without limits is never together"
    assert [lease.id for lease in first if lease.limits == first[0].limits][:1] == [a[0]], "the key's oldest first"
    assert store.claim(conn, ["default"], "v", 30.0, 100, together=4) == [], "A's one slot is held"
    assert store.complete_many(conn, "w", [(job, 1) for job in a[:3]]) == set(a[:3])
    assert store.claim(conn, ["default"], "v", 30.0, 100, together=4) == [], "the last job taken together holds it"
    assert store.complete_many(conn, "w", [(a[3], 1)]) == {a[3]}
    assert ids(store.claim(conn, ["default"], "v", 30.0, 100, together=4)) == [a[4]]
    assert count(conn, "state = 'completed' AND attempt = 1") == 4


def test_a_spare_key_fills_a_claim_of_jobs_taken_together_only_where_the_keys_needed_fall_short(
    client: Client, store: Store, conn: Connection
) -> None:
    spare = client.enqueue("t", {}, concurrency_key="k2").id  # the oldest job, of the key swept second
    needed = [client.enqueue("t", {"i": i}, concurrency_key="k1").id for i in range(5)]
    # One key is needed for 5 jobs of 5 a key; k2 is looked at as a spare.
    taken = store.claim(conn, ["default"], "w", 30.0, 5, together=5, per_group=5)
    assert ids(taken) == needed, "k1's jobs come whole; k2's older job waits to be taken with its key's others"
    assert (row(conn, spare)["state"], row(conn, spare)["attempt"]) == ("available", 0)
    short = [client.enqueue("t", {"i": i}, concurrency_key="k3").id for i in range(3)]
    taken = store.claim(conn, ["default"], "w", 30.0, 5, together=5, per_group=5)
    assert ids(taken) == [spare, short[0]], "k1 held, k2 needed but one job short: the spare k3 fills in, one job"


def test_jobs_taken_together_show_as_one_slot_held_by_each_of_them(
    dsn: str, client: Client, store: Store, conn: Connection
) -> None:
    a = [client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(4)]
    taken = store.claim(conn, ["default"], "w", 30.0, 100, together=3)
    assert ids(taken) == a[:3]
    [wait] = client.limit_waits()
    assert (wait.held, wait.max_running, wait.holders, wait.waiting) == (1, 1, a[:3], 1)
    said = CliRunner().invoke(main, ["jobs", "why", str(a[3]), "--database-url", dsn], env={"DATABASE_URL": None})
    assert said.exit_code == 0, said.output
    assert f"is full: 1 of 1 slot, held by jobs {a[0]}, {a[1]}, {a[2]}." in said.output
    shown = CliRunner().invoke(main, ["limits", "--database-url", dsn], env={"DATABASE_URL": None})
    assert shown.exit_code == 0 and "1/1 slots held by jobs" in shown.output, shown.output


def test_jobs_are_taken_together_only_under_a_limit_of_1_and_never_past_a_rate(
    client: Client, store: Store, conn: Connection
) -> None:
    wide = [client.enqueue("t", {"i": i}, concurrency_key="W", max_concurrent=3).id for i in range(9)]
    taken = store.claim(conn, ["default"], "w", 30.0, 100, together=10)
    assert (ids(taken), [lease.together for lease in taken]) == (wide[:3], [False] * 3), "3 free slots: 3 jobs apart"
    assert store.complete_many(conn, "w", [(wide[0], 1)]) == {wide[0]}
    again = store.claim(conn, ["default"], "v", 30.0, 100, together=10)
    assert (ids(again), again[0].together) == (wide[3:4], False), "its last free slot: one job, the others' room kept"
    rated = [client.enqueue("r", {"i": i}, rate_limit="1/h").id for i in range(3)]
    taken = store.claim(conn, ["default"], "w", 30.0, 100, together=10)
    assert (ids(taken), taken[0].together) == (rated[:1], False), "a rate's one token starts one job"


def test_claims_go_round_the_keys_from_a_cursor_upwards_or_downwards(
    client: Client, store: Store, conn: Connection
) -> None:
    # A claim of 2 looks at 4 groups (2 spare, for groups taken meanwhile) and takes the oldest
    # jobs among them; the caller's cursor moves past the groups it took.
    jobs = [client.enqueue("t", {}, concurrency_key=f"k{i:02}").id for i in range(40)]

    def take(after: list[str], descending: bool) -> list[Lease]:
        return store.claim(conn, ["default"], "w", 30.0, 2, after=after, descending=descending)

    up = take([], False)
    assert ids(up) == jobs[0:2], "upwards from the first key"
    down = take([], True)
    assert ids(down) == jobs[36:38], "downwards from the last key"
    assert ids(take(max(lease.limits for lease in up if lease.limits), False)) == jobs[2:4]
    assert ids(take(min(lease.limits for lease in down if lease.limits), True)) == jobs[32:34]


def test_a_claim_that_completes_a_keys_job_takes_its_next_job_wherever_the_cursor_is(
    client: Client, store: Store, conn: Connection
) -> None:
    a1, a2, b1, a3, b2 = (client.enqueue("t", {}, concurrency_key=key).id for key in "AABAB")
    (first,) = store.claim(conn, ["default"], "w", 30.0, 1)
    assert first.id == a1 and first.limits is not None
    # From past the last key, a sweep finds nothing; the completed job's key is looked at anyway.
    past = ["concurrency zzz"]
    completed, leases = store.complete_and_claim(conn, "w", [(a1, 1)], ["default"], 30.0, 1, after=past)
    assert (completed, ids(leases)) == ({a1}, [a2])
    # The kept keys never take the whole claim: the sweep still gets its groups, and the oldest
    # jobs among all of them win (B's first job is older than A's next one).
    completed, leases = store.complete_and_claim(conn, "w", [(a2, 1)], ["default"], 30.0, 1)
    assert (completed, ids(leases)) == ({a2}, [b1])
    assert ids(store.complete_and_claim(conn, "w", [(b1, 1)], ["default"], 30.0, 2)[1]) == [a3, b2]


def test_a_completed_job_left_out_of_keep_does_not_send_the_claim_to_its_key_first(
    client: Client, store: Store, conn: Connection
) -> None:
    a1, a2 = (client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(2))
    (first,) = store.claim(conn, ["default"], "w", 30.0, 1)
    assert first.id == a1
    past = ["concurrency zzz"]  # where the sweep finds nothing
    completed, leases = store.complete_and_claim(conn, "w", [(a1, 1)], ["default"], 30.0, 1, after=past, keep=[])
    assert (completed, leases) == ({a1}, []), "A's next job waits for the sweep"
    assert row(conn, a2)["state"] == "available"
    assert ids(store.claim(conn, ["default"], "w", 30.0, 1)) == [a2], "which finds it"


def test_the_keys_a_claim_kept_do_not_move_the_workers_cursor(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    keys = [client.enqueue("t", {}, concurrency_key=f"k{i}").id for i in range(3)]
    k0, k1, k2 = leases = store.claim(conn, ["default"], "w", 30.0, 3)
    assert ids(leases) == keys
    policy = Worker(App(), dsn, WorkerConfig(queues=("default",)))._claims
    policy.claimed(leases, 3, set(), now=0.0)
    assert policy.cursor == ["concurrency t k2"]
    policy.claimed([k0, k1], 2, {("concurrency t k1",)}, now=0.0)
    assert policy.cursor == ["concurrency t k0"], "past the swept keys only"
    policy.claimed([k2], 1, {("concurrency t k2",)}, now=0.0)
    assert policy.cursor == ["concurrency t k0"], "a claim of kept keys alone leaves it where it was"


def test_neighbouring_workers_go_round_the_keys_opposite_ways() -> None:
    assert [goes_down(slot) for slot in ("worker-1", "worker-2", "worker-3", "worker-10", "reaper")] == [
        False,
        True,
        False,
        True,
        False,
    ]


def test_a_keys_jobs_in_two_queues_share_its_limit_within_one_claim(
    client: Client, store: Store, conn: Connection
) -> None:
    mail = client.enqueue("t", {}, queue="mail", concurrency_key="A").id
    sms = client.enqueue("t", {}, queue="sms", concurrency_key="A").id
    taken = ids(claim(store, conn, queues=("mail", "sms")))
    assert len(taken) == 1 and taken[0] in (mail, sms)
    assert claim(store, conn, queues=("mail", "sms")) == []


def test_a_completion_frees_its_slot_for_the_claim_in_the_same_statement(
    client: Client, store: Store, conn: Connection
) -> None:
    first, second, third = (client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(3))
    assert ids(claim(store, conn)) == [first]
    completed, leases = store.complete_and_claim(conn, "w", [(first, 1)], ["default"], 30.0, 10)
    assert (completed, ids(leases)) == ({first}, [second])
    # A lease lost meanwhile frees its slot too (the job is no longer running at that attempt).
    expire_lease(conn, second)
    store.recover_expired_leases(conn)
    completed, leases = store.complete_and_claim(conn, "w", [(second, 2)], ["default"], 30.0, 10)
    assert (completed, ids(leases)) == (set(), [third]), "the recovered job is due from now: behind the third"
    assert row(conn, second)["state"] == "available"


def test_a_finished_job_starts_its_keys_next_job_without_waiting_for_a_poll(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No notification announces a freed slot, and the polls here are a minute apart: only the
    # worker's own finished job can be the reason its key's next job is claimed.
    monkeypatch.setattr(claiming, "LIMITED_POLL_INTERVAL", 60.0)
    app = App()
    app.task("t", concurrency_key="A")(lambda job: None)
    client.enqueue_many([app.task_spec("t", {"i": i}) for i in range(5)])
    start_worker(app, poll_only=True, poll_interval=60.0, lease_duration=5.0, heartbeat_seconds=1.0)
    wait_until(lambda: count(conn, "state = 'completed'") == 5, timeout=20, what="5 jobs of one key completed")
    assert count(conn, "attempt <> 1") == 0


def test_a_claim_looks_past_the_groups_another_claim_has_locked(
    dsn: str, client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue_many([JobSpec("t", {"i": i}, concurrency_key=f"k{i:02}") for i in range(40)])
    with psycopg.connect(dsn) as other:  # a claim still running: its transaction is open
        assert len(store.claim(other, ["default"], "other", 30.0, 10)) == 10
        # It holds the scope rows of the first 20 keys (the 10 it took and the 10 more it looked
        # at): a claim of 2 skips them without waiting, and takes the next keys' jobs.
        mine = claim(store, conn, limit=2)
        assert sorted(lease.limits[0] for lease in mine if lease.limits) == ["concurrency t k20", "concurrency t k21"]
        other.rollback()


def test_ten_thousand_jobs_of_one_key_do_not_hold_back_another(client: Client, store: Store, conn: Connection) -> None:
    client.enqueue_many([JobSpec("t", {"i": i}, concurrency_key="A", priority=5) for i in range(10_000)])
    b = client.enqueue("t", {}, concurrency_key="B").id
    first = claim(store, conn, limit=10)
    assert b in ids(first) and len(first) == 2
    late = client.enqueue("t", {}, concurrency_key="C").id
    assert ids(claim(store, conn, limit=10)) == [late], "A is full: the next claim takes only C"


def test_max_concurrent_lets_that_many_run(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("t", {"i": i}, concurrency_key="k", max_concurrent=3).id for i in range(5)]
    assert ids(claim(store, conn, limit=2)) == jobs[:2]
    assert ids(claim(store, conn, limit=10)) == jobs[2:3]
    assert claim(store, conn) == []


def test_a_key_is_per_task(client: Client, store: Store, conn: Connection) -> None:
    one = client.enqueue("export", {}, concurrency_key="c1").id
    two = client.enqueue("import", {}, concurrency_key="c1").id
    assert ids(claim(store, conn)) == sorted([one, two])


def test_a_lost_lease_frees_its_slot_when_the_reaper_returns_it(client: Client, store: Store, conn: Connection) -> None:
    first, second = (client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(2))
    assert ids(claim(store, conn, worker="killed")) == [first]
    assert claim(store, conn) == [], "the killed worker's lease still holds the slot"
    expire_lease(conn, first)
    assert store.recover_expired_leases(conn) == {first: "available"}
    assert ids(claim(store, conn)) == [second], "the slot freed with the lease (the job returned is due from now)"
    assert row(conn, first)["state"] == "available"


def test_a_released_lease_frees_its_slot(client: Client, store: Store, conn: Connection) -> None:
    first, second = (client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(2))
    assert ids(claim(store, conn, worker="stopping")) == [first]
    assert store.release(conn, "stopping", [Release(first, 1, "handed back")]) == {first}
    assert ids(claim(store, conn)) == [first]
    store.fail(conn, first, "w", 2, "boom")
    assert row(conn, first)["state"] == "failed"
    assert ids(claim(store, conn)) == [second], "a failed job's slot is free"


def test_a_cancelled_running_job_frees_its_slot(client: Client, store: Store, conn: Connection) -> None:
    first, second = (client.enqueue("t", {"i": i}, concurrency_key="A").id for i in range(2))
    assert ids(claim(store, conn)) == [first]
    assert client.cancel([first]) == [first]
    assert ids(claim(store, conn)) == [second]


def test_a_holder_deleted_since_frees_its_slot(client: Client, store: Store, conn: Connection) -> None:
    # A finished job stays listed as its scope's holder until a claim rewrites the scope row;
    # pruned meanwhile, the claim sees no row for it at all, and takes the slot.
    first = client.enqueue("t", {}, concurrency_key="A").id
    assert ids(claim(store, conn)) == [first]
    assert store.complete_many(conn, "w", [(first, 1)]) == {first}
    assert conn.execute("SELECT holder_ids FROM miniqueue_limits WHERE scope = 'concurrency t A'").fetchone() == (
        [first],
    )
    assert store.prune(conn, [State.COMPLETED], 0) == 1
    second = client.enqueue("t", {}, concurrency_key="A").id
    assert ids(claim(store, conn)) == [second]


def test_the_latest_enqueue_sets_the_limit(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("t", {"i": i}, concurrency_key="k").id for i in range(3)]
    assert ids(claim(store, conn)) == jobs[:1]
    client.enqueue("t", {"i": 3}, concurrency_key="k", max_concurrent=3)
    assert ids(claim(store, conn)) == jobs[1:3]


def test_limits_hold_with_many_workers(dsn: str, client: Client, conn: Connection, start_worker: StartWorker) -> None:
    conn.execute("CREATE TABLE runs (job_id BIGINT, key TEXT, started TIMESTAMPTZ, ended TIMESTAMPTZ)")
    app = App()

    @app.task("work", concurrency_key=lambda payload: payload["key"], max_concurrent=1)
    def work(job: Job) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            [(started,)] = c.execute("SELECT clock_timestamp()").fetchall()
            job.wait(0.01)
            c.execute("INSERT INTO runs VALUES (%s, %s, %s, clock_timestamp())", [job.id, job.payload["key"], started])

    @app.task("wide", concurrency_key="wide", max_concurrent=3)
    def wide(job: Job) -> None:
        work(job)

    specs = [app.task_spec("work", {"key": f"k{i % 5}"}) for i in range(60)]
    specs += [app.task_spec("wide", {"key": "wide"}) for _ in range(24)]
    client.enqueue_many(specs)
    for _ in range(4):
        start_worker(app, concurrency=4, lease_duration=5.0, heartbeat_seconds=1.0, poll_interval=0.2)
    wait_until(lambda: count(conn, "state = 'completed'") == 84, timeout=60, what="84 jobs completed")
    overlap = dict(
        conn.execute("""
        SELECT a.key, max((SELECT count(*) FROM runs b
                            WHERE b.key = a.key AND b.started <= a.started AND b.ended > a.started))
          FROM runs a GROUP BY a.key""").fetchall()
    )
    assert overlap == {"k0": 1, "k1": 1, "k2": 1, "k3": 1, "k4": 1, "wide": overlap["wide"]}
    assert 1 <= overlap["wide"] <= 3
    assert count(conn, "attempt <> 1") == 0
    assert conn.execute("SELECT count(DISTINCT job_id) = count(*) FROM runs").fetchone() == (True,)


def test_a_worker_runs_a_keys_jobs_taken_together_one_after_another(
    dsn: str, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    conn.execute("CREATE TABLE lane_runs (job_id BIGINT, key TEXT, started TIMESTAMPTZ, ended TIMESTAMPTZ)")
    app = App()

    @app.task("work", concurrency_key=lambda payload: payload["key"])
    def work(job: Job) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            [(started,)] = c.execute("SELECT clock_timestamp()").fetchall()
            job.wait(0.01)
            c.execute("INSERT INTO lane_runs VALUES (%s, %s, %s, clock_timestamp())", [job.id, "A", started])

    client.enqueue_many([app.task_spec("work", {"key": "A"}) for _ in range(12)])
    start_worker(app, concurrency=4, prefetch=8, lease_duration=5.0, heartbeat_seconds=1.0)
    wait_until(lambda: count(conn, "state = 'completed'") == 12, timeout=30, what="12 jobs of one key completed")
    # Claims of 4 free handlers and 8 prefetched jobs take 3 of the key's jobs together (12 / 4).
    [(claims, most)] = conn.execute(
        "SELECT count(DISTINCT started_at), max(n) FROM (SELECT started_at, count(*) OVER (PARTITION BY started_at) n"
        " FROM miniqueue_jobs WHERE task = 'work') t"
    ).fetchall()
    assert claims < 12 and most > 1, "some claim took several of the key's jobs"
    [(overlap,)] = conn.execute("""
        SELECT max((SELECT count(*) FROM lane_runs b WHERE b.started <= a.started AND b.ended > a.started))
          FROM lane_runs a""")
    assert overlap == 1, "never two of them at once, on 4 handler threads"
    assert count(conn, "attempt <> 1") == 0


# -- caps per queue ---------------------------------------------------------------------------------


def test_a_queue_cap_limits_its_running_jobs(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("t", {"i": i}, queue="capped").id for i in range(5)]
    client.limit_queue("capped", 2)
    assert client.queue_limits() == {"capped": 2}
    first = claim(store, conn, queues=("capped",))
    assert ids(first) == jobs[:2]
    assert claim(store, conn, queues=("capped",)) == []
    store.complete_many(conn, "w", [(jobs[0], 1)])
    assert ids(claim(store, conn, queues=("capped", "default"))) == [jobs[2]]
    client.limit_queue("capped", None)
    assert client.queue_limits() == {}
    assert ids(claim(store, conn, queues=("capped",))) == jobs[3:]


def test_a_queue_cap_counts_limited_jobs_too(client: Client, store: Store, conn: Connection) -> None:
    keyed = [client.enqueue("t", {"i": i}, queue="q", concurrency_key=f"k{i}").id for i in range(3)]
    client.limit_queue("q", 1)
    assert len(claim(store, conn, queues=("q",))) == 1
    assert claim(store, conn, queues=("q",)) == []
    assert count(conn, "id = ANY(%s) AND state = 'available'", [keyed]) == 2


def test_keys_in_a_capped_queue_share_its_cap_within_one_claim(client: Client, store: Store, conn: Connection) -> None:
    # Every key's group names the queue's cap too: the claim locks that row for the first key
    # and must still count it as its own for the next ones.
    keyed = [client.enqueue("t", {"i": i}, queue="q", concurrency_key=f"k{i}").id for i in range(5)]
    client.limit_queue("q", 3)
    assert ids(claim(store, conn, queues=("q",))) == keyed[:3]
    assert claim(store, conn, queues=("q",)) == []


def test_a_cap_on_an_unknown_queue_is_refused(client: Client) -> None:
    with pytest.raises(InvalidInput, match="queue 'nope' is unknown"):
        client.limit_queue("nope", 3)
    assert client.queue_limits() == {}
    client.limit_queue("nope", 3, create=True)
    assert client.queue_limits() == {"nope": 3}


# -- rate limits ------------------------------------------------------------------------------------


def test_a_rate_limit_starts_no_more_than_its_tokens(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("api", {"i": i}, rate_limit="1/h").id for i in range(3)]
    other = client.enqueue("api", {}, rate_limit="1/h", rate_limit_key="tenant-2").id
    assert ids(claim(store, conn)) == sorted([jobs[0], other]), "a new bucket starts with one token"
    assert claim(store, conn) == []
    assert count(conn, "id = ANY(%s) AND state = 'available' AND attempt = 0", [jobs[1:]]) == 2


def test_a_rate_bucket_refills_on_the_database_clock(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("api", {"i": i}, rate_limit="3/s").id for i in range(6)]
    assert ids(claim(store, conn, limit=10)) == jobs[:1]
    conn.execute("UPDATE miniqueue_limits SET refilled_at = refilled_at - interval '1 minute'")
    assert ids(claim(store, conn, limit=10)) == jobs[1:4], "the bucket holds one second's worth at most"


# -- through the app --------------------------------------------------------------------------------


def test_a_task_computes_its_key_from_the_payload(client: Client, conn: Connection) -> None:
    app = App()
    app.task("export", concurrency_key=lambda p: f"customer-{p['customer']}", max_concurrent=2, rate_limit="10/s")(
        lambda job: None
    )
    job_id = app.enqueue(client, "export", {"customer": 42}).id
    assert row(conn, job_id)["limits"] == ["concurrency export customer-42", "rate export"]
    override = app.enqueue(client, "export", {"customer": 42}, concurrency_key="all", max_concurrent=1).id
    assert row(conn, override)["limits"] == ["concurrency export all", "rate export"]
    limits = dict(conn.execute("SELECT scope, max_running FROM miniqueue_limits").fetchall())
    assert limits == {"concurrency export customer-42": 2, "concurrency export all": 1, "rate export": None}


def test_a_task_refuses_bad_limits_at_registration() -> None:
    app = App()
    with pytest.raises(InvalidInput, match="max_concurrent 0 is invalid"):
        app.task("t", concurrency_key="k", max_concurrent=0)(lambda job: None)
    with pytest.raises(InvalidInput, match="rate limit '10 per second' is invalid"):
        app.task("t", rate_limit="10 per second")(lambda job: None)
    assert app.tasks == {}


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency_key": "k", "max_concurrent": 0}, "max_concurrent 0 is invalid"),
        ({"concurrency_key": "k", "max_concurrent": -1}, "max_concurrent -1 is invalid"),
        ({"concurrency_key": "k", "max_concurrent": True}, "max_concurrent True is invalid"),
        ({"max_concurrent": 2}, "max_concurrent needs a concurrency key"),
        ({"concurrency_key": "x" * 256}, "concurrency key 'xxx.*' is invalid: use 1-255 characters"),
        ({"concurrency_key": ""}, "concurrency key '' is invalid"),
        ({"concurrency_key": "a\nb"}, "concurrency key 'a\\\\nb' is invalid: .* without control characters"),
        ({"concurrency_key": 42}, "concurrency key 42 is invalid"),
        ({"rate_limit": "100"}, "rate limit '100' is invalid: use '<number>/s'"),
        ({"rate_limit": "0/s"}, "rate limit '0/s' is invalid: it must allow more than 0"),
        ({"rate_limit": "-5/s"}, "rate limit '-5/s' is invalid"),
        ({"rate_limit": "5/day"}, "rate limit '5/day' is invalid"),
        ({"rate_limit": 5}, "rate limit 5 is invalid"),
        ({"rate_limit_key": "t"}, "rate_limit_key needs a rate_limit"),
        ({"rate_limit": "5/s", "rate_limit_key": "y" * 300}, "rate limit key 'yyy.*' is invalid"),
    ],
)
def test_bad_limits_are_refused_and_nothing_is_stored(
    client: Client, conn: Connection, options: dict[str, Any], message: str
) -> None:
    assert_refused_and_nothing_stored(client, conn, options, message)


def test_rates_in_every_unit(client: Client, conn: Connection) -> None:
    for text, per_second in (("100/s", 100), ("6/min", 0.1), ("7200/h", 2), (" 2.5 / sec ", 2.5), ("1/hour", 1 / 3600)):
        client.enqueue("t", {}, rate_limit=text, rate_limit_key=text)
        [(rate,)] = conn.execute("SELECT rate FROM miniqueue_limits WHERE scope = %s", [f"rate t {text}"]).fetchall()
        assert rate == pytest.approx(per_second)


# -- operators --------------------------------------------------------------------------------------


def cli(dsn: str, *args: str) -> Any:
    return CliRunner().invoke(main, [*args, "--database-url", dsn])


def test_the_cli_caps_a_queue_and_shows_what_waits_on_limits(
    dsn: str, client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue_many([JobSpec("t", {"i": i}, queue="mail", concurrency_key="A") for i in range(4)])
    result = cli(dsn, "queues", "limit", "mail", "2")
    assert (result.exit_code, result.output) == (0, "queue mail: at most 2 running\n")
    listed = json.loads(cli(dsn, "queues", "list", "--json").output)
    assert listed == [{"queue": "mail", "paused": False, "max_running": 2, "age_after": None}]
    (running,) = claim(store, conn, queues=("mail",))
    waits = json.loads(cli(dsn, "limits", "--json").output)
    assert waits == [
        {
            "scope": "concurrency t A",
            "waiting": 3,
            "max_running": 1,
            "rate": None,
            "held": 1,
            "tokens": None,
            "holders": [running.id],
        },
        {
            "scope": "queue mail",
            "waiting": 3,
            "max_running": 2,
            "rate": None,
            "held": 1,
            "tokens": None,
            "holders": [running.id],
        },
    ]
    text = cli(dsn, "limits").output
    assert "concurrency t A" in text and f"1/1 slots held by job {running.id}" in text
    assert cli(dsn, "queues", "limit", "mail", "--remove").output == "queue mail: no cap\n"
    assert client.queue_limits() == {}


def test_the_cli_shows_the_slots_running_jobs_hold_with_no_job_waiting(
    dsn: str, client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue_many([JobSpec("t", {"i": i}, queue="mail", concurrency_key="A", max_concurrent=3) for i in range(2)])
    client.enqueue("t", {}, queue="mail", rate_limit="5/s")
    client.limit_queue("mail", 4)
    leases = claim(store, conn, queues=("mail",))
    holders = ids([lease for lease in leases if row(conn, lease.id)["limits"] != ["rate t"]])
    assert len(leases) == 3 and count(conn, "state = 'available'") == 0, "every job running, none waiting"

    waits = json.loads(cli(dsn, "limits", "--json").output)
    assert [(w["scope"], w["waiting"], w["max_running"], w["held"], w["holders"]) for w in waits] == [
        ("queue mail", 0, 4, 3, ids(leases)),
        ("concurrency t A", 0, 3, 2, holders),
    ], "a rate limit holds no slot: it is listed only while jobs wait on it"
    result = cli(dsn, "limits")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"{'LIMIT':<48} {'WAITING':>8}  STATE",
        f"{'queue mail':<48} {0:>8}  3/4 slots held by jobs {', '.join(map(str, ids(leases)))}",
        f"{'concurrency t A':<48} {0:>8}  2/3 slots held by jobs {', '.join(map(str, holders))}",
    ]

    for lease in leases:  # a finished job's slot is free at once, though the claim prunes its holder later
        store.complete(conn, lease.id, "w", lease.attempt)
    assert json.loads(cli(dsn, "limits", "--json").output) == []
    assert cli(dsn, "limits").output == "no job is waiting on a limit or holding a slot\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("queues", "limit", "mail", "0"), "0 is not in the range 1<=x<=1000000"),
        (("queues", "limit", "mail"), "give either MAX_RUNNING or --remove"),
        (("queues", "limit", "mail", "3", "--remove"), "give either MAX_RUNNING or --remove"),
        (("queues", "limit", "nope", "3"), "queue 'nope' is unknown"),
        (("queues", "limit", "Bad Name", "3"), "queue name 'Bad Name' is invalid"),
    ],
)
def test_the_cli_refuses_a_bad_cap(dsn: str, client: Client, args: tuple[str, ...], message: str) -> None:
    client.enqueue("t", {}, queue="mail")
    result = cli(dsn, *args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert client.queue_limits() == {}
