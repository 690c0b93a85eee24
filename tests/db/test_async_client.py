"""AsyncClient against a real PostgreSQL: the producer API on psycopg's AsyncConnection.

Each test runs its coroutine with ``asyncio.run`` (the suite has no asyncio plugin). Where the
two clients must agree (results, errors), the test asks both and compares.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

import miniqueue
from miniqueue import (
    App,
    AsyncClient,
    Client,
    ConfigError,
    DatabaseUnavailable,
    EnqueueResult,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    JobSpec,
    MiniqueueError,
    State,
)
from miniqueue.core.db import AsyncPooledConnection, Connection, connect
from miniqueue.store.store import Store

from ..helpers import count, row

T = TypeVar("T")
W1 = "host-a:101:aaaa"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def using(dsn: str, body: Callable[[AsyncClient], Awaitable[T]], **options: Any) -> T:
    """Run ``body`` with an AsyncClient of its own (opened and closed on the test's loop)."""

    async def main() -> T:
        async with AsyncClient(dsn, **options) as client:
            return await body(client)

    return run(main())


async def own_connection(dsn: str, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit)


# --- enqueue -------------------------------------------------------------------------------------


def test_enqueue_stores_the_job_with_every_option(dsn: str, conn: Connection) -> None:
    at = dt.datetime(2031, 5, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))

    async def body(client: AsyncClient) -> tuple[EnqueueResult, EnqueueResult]:
        now = await client.enqueue("resize", {"image": 1}, queue="images", priority=7, max_attempts=3)
        later = await client.enqueue("report", run_at=at)
        return now, later

    now, later = using(dsn, body)
    stored = row(conn, now.id)
    assert now.duplicate is False
    assert (stored["task"], stored["payload"], stored["queue"], stored["priority"], stored["max_attempts"]) == (
        "resize",
        {"image": 1},
        "images",
        7,
        3,
    )
    assert stored["state"] == "available"
    assert row(conn, later.id)["scheduled_at"] == at
    assert row(conn, later.id)["payload"] == {}


def test_delay_counts_on_the_database_clock(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> tuple[dt.datetime, EnqueueResult]:
        return await client.now(), await client.enqueue("t", delay=dt.timedelta(minutes=10))

    before, job = using(dsn, body)
    waits = (row(conn, job.id)["scheduled_at"] - before).total_seconds()
    assert 600 <= waits < 610


def test_a_repeated_idempotency_key_returns_the_first_job(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> list[EnqueueResult]:
        first = await client.enqueue("charge", {"amount": 10}, idempotency_key="order-1")
        again = await client.enqueue("charge", {"amount": 99}, queue="other", idempotency_key="order-1")
        batch = await client.enqueue_many(
            [
                JobSpec("charge", idempotency_key="order-1"),
                JobSpec("charge", idempotency_key="order-2"),
                JobSpec("charge", idempotency_key="order-2"),
            ]
        )
        return [first, again, *batch]

    first, again, *batch = using(dsn, body)
    assert again == EnqueueResult(first.id, duplicate=True)
    assert batch[0] == EnqueueResult(first.id, duplicate=True)
    assert batch[1].duplicate is False and batch[2] == EnqueueResult(batch[1].id, duplicate=True)
    assert count(conn) == 2
    assert row(conn, first.id)["payload"] == {"amount": 10}


@pytest.mark.parametrize("size", [3, 2000], ids=["statement", "copy"])
def test_enqueue_many_stores_the_batch_in_input_order(size: int, dsn: str, conn: Connection) -> None:
    specs = [JobSpec("t", {"n": n}, queue=f"q{n % 3}", delay=60 if n == 1 else None) for n in range(size)]

    results = using(dsn, lambda client: client.enqueue_many(specs))
    assert [r.duplicate for r in results] == [False] * size
    assert [row(conn, r.id)["payload"] for r in (results[0], results[-1])] == [{"n": 0}, {"n": size - 1}]
    assert results == sorted(results, key=lambda r: r.id)
    assert count(conn) == size
    assert count(conn, "scheduled_at > now() + interval '50 seconds'") == 1
    assert using(dsn, lambda client: client.enqueue_many([])) == []


def test_concurrent_enqueues_share_the_pool(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> list[EnqueueResult]:
        return await asyncio.gather(*(client.enqueue("t", {"n": n}) for n in range(60)))

    results = using(dsn, body)
    assert len({r.id for r in results}) == 60
    assert count(conn) == 60


def test_enqueue_notifies_workers(dsn: str) -> None:
    with connect(dsn, purpose="test-listen") as listener:
        Store().listen(listener)
        using(dsn, lambda client: client.enqueue_many([JobSpec("t", queue="a"), JobSpec("t", queue="b", delay=60)]))
        using(dsn, lambda client: client.enqueue("t", queue="c"))
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=2)]
    assert heard == ["a", "c"], "b's job is not due yet"


def test_app_aenqueue_uses_the_tasks_defaults(dsn: str, conn: Connection) -> None:
    app = App()

    @app.task("resize", queue="images", priority=5, max_attempts=2)
    async def resize(job: miniqueue.Job) -> None: ...

    async def body(client: AsyncClient) -> list[EnqueueResult]:
        return [
            await app.aenqueue(client, "resize", {"image": 1}),
            await app.aenqueue(client, "resize", priority=9, delay=30),
        ]

    plain, override = using(dsn, body)
    assert (row(conn, plain.id)["queue"], row(conn, plain.id)["priority"], row(conn, plain.id)["max_attempts"]) == (
        "images",
        5,
        2,
    )
    assert row(conn, override.id)["priority"] == 9
    with pytest.raises(ConfigError, match="unknown enqueue options"):
        using(dsn, lambda client: app.aenqueue(client, "resize", colour="red"))  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="not registered"):
        using(dsn, lambda client: app.aenqueue(client, "nope"))


# --- transactional enqueue ---------------------------------------------------------------------------


def test_a_job_enqueued_in_a_committed_transaction_exists(dsn: str, conn: Connection) -> None:
    store = Store()

    async def body(client: AsyncClient) -> list[int]:
        own = await own_connection(dsn)
        async with own:
            async with own.transaction():
                await own.execute("CREATE TEMP TABLE orders (id int)")
                await own.execute("INSERT INTO orders VALUES (1)")
                one = await client.enqueue("ship", {"order": 1}, conn=own)
                many = await client.enqueue_many([JobSpec("ship", {"n": n}) for n in range(600)], conn=own)
                assert count(conn) == 0, "invisible outside the transaction before it commits"
                assert store.claim(conn, ["default"], W1, 30, 1) == [], "workers cannot claim it before commit"
            return [one.id, *(r.id for r in many)]

    ids = using(dsn, body)
    assert count(conn) == 601
    assert row(conn, ids[0])["payload"] == {"order": 1}
    assert [lease.id for lease in store.claim(conn, ["default"], W1, 30, 1)] == [ids[0]]


def test_a_job_enqueued_in_a_rolled_back_transaction_leaves_no_row(dsn: str, conn: Connection) -> None:
    class Abort(Exception):
        pass

    async def body(client: AsyncClient) -> int:
        async with await own_connection(dsn) as own:
            try:
                async with own.transaction():
                    job = await client.enqueue("t", {"order": 1}, conn=own)
                    await client.enqueue_many([JobSpec("t", {"n": n}) for n in range(3)], conn=own)
                    await client.enqueue_many([JobSpec("t", {"n": n}) for n in range(600)], conn=own)
                    cur = await own.execute("SELECT count(*) FROM miniqueue_jobs")
                    assert await cur.fetchone() == (604,), "visible inside the caller's transaction"
                    raise Abort
            except Abort:
                pass
            return job.id

    job_id = using(dsn, body)
    assert count(conn) == 0
    with pytest.raises(AssertionError):
        row(conn, job_id)


def test_a_connection_without_autocommit_commits_with_the_caller(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> None:
        async with await own_connection(dsn, autocommit=False) as own:
            await client.enqueue("t", conn=own)
            await client.enqueue_many([JobSpec("t")] * 600, conn=own)  # the COPY's own savepoint
            await own.rollback()
            await client.enqueue("kept", conn=own)
            await own.commit()

    using(dsn, body)
    assert count(conn) == 1 and count(conn, "task = 'kept'") == 1


def test_a_bad_job_in_a_large_batch_inside_a_transaction_undoes_only_the_batch(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> None:
        async with await own_connection(dsn) as own, own.transaction():
            await client.enqueue("kept", conn=own)
            specs = [JobSpec("t", {"n": n}) for n in range(1000)]
            specs[700] = JobSpec("t", {"bad": float("nan")})
            with pytest.raises(InvalidInput, match=r"^job 700: payload contains a float nan"):
                await client.enqueue_many(specs, conn=own)

    using(dsn, body)
    assert count(conn) == 1 and count(conn, "task = 'kept'") == 1


# --- inspection and repair: the same answers as Client ---------------------------------------------


def test_list_jobs_on_your_connection_sees_your_open_transaction(dsn: str, client: Client) -> None:
    async def main(a: AsyncClient) -> None:
        own = await own_connection(dsn)
        try:
            own.adapters.register_loader("jsonb", TextLoader)  # a connection set up to load jsonb as text
            async with own.transaction() as block:
                job = await a.enqueue("welcome", {"user": "ada"}, conn=own)
                assert await a.list_jobs() == []  # the pool's connections see nothing yet
                [found] = await a.list_jobs(conn=own)
                assert (found.id, found.payload, found.errors) == (job.id, {"user": "ada"}, ())
                raise psycopg.Rollback(block)
        finally:
            await own.close()

    using(dsn, main)
    assert client.list_jobs() == []


def test_every_inspection_and_repair_call_round_trips(dsn: str, conn: Connection, client: Client) -> None:
    store = Store()
    app = App()
    app.periodic("0 * * * *", task="hourly", name="hourly-report")
    ids = [client.enqueue("report", {"n": n}, queue="reports").id for n in range(4)]
    client.enqueue("other", queue="misc")
    done = store.claim(conn, ["reports"], W1, 30, 2)
    store.complete(conn, done[0].id, W1, done[0].attempt)
    store.fail(conn, done[1].id, W1, done[1].attempt, "boom")
    conn.execute("UPDATE miniqueue_jobs SET finished_at = now() - interval '1 day' WHERE id = %s", [done[0].id])
    ids = [i for i in ids if i not in {done[0].id, done[1].id}]

    async def reads(a: AsyncClient) -> list[Any]:
        return [
            await a.get(ids[0]),
            await a.counts(),
            [s.queue for s in await a.queue_stats()],
            await a.list_jobs(queue="reports", limit=2),
            await a.list_jobs(state="failed"),
            await a.list_jobs(search='"n": 3'),
            await a.list_queues(),
            await a.periodic_state(),
        ]

    def sync_reads() -> list[Any]:
        return [
            client.get(ids[0]),
            client.counts(),
            [s.queue for s in client.queue_stats()],
            client.list_jobs(queue="reports", limit=2),
            client.list_jobs(state="failed"),
            client.list_jobs(search='"n": 3'),
            client.list_queues(),
            client.periodic_state(),
        ]

    assert using(dsn, reads) == sync_reads()
    assert using(dsn, reads)[1] == [
        miniqueue.QueueCount("misc", State.AVAILABLE, 1),
        miniqueue.QueueCount("reports", State.AVAILABLE, 2),
        miniqueue.QueueCount("reports", State.COMPLETED, 1),
        miniqueue.QueueCount("reports", State.FAILED, 1),
    ]

    async def repairs(a: AsyncClient) -> list[Any]:
        clock = await a.now()
        changed = [
            await a.cancel(ids),
            await a.requeue([ids[0]]),
            await a.requeue_matching([State.CANCELLED], queue="reports"),
            await a.pause_queues(["reports", "misc"]),
            await a.list_queues(),
            await a.resume_queues(["misc"]),
            await a.pause_queues(["later"], create=True),
        ]
        await a.disable_schedule("hourly-report", app=app)
        schedules = await a.periodic_state()
        await a.enable_schedule("hourly-report")
        await a.recount()
        return [
            clock,
            *changed,
            schedules,
            await a.counts(),
            await a.prune([State.COMPLETED, State.FAILED], 3600, batch_size=1),
        ]

    clock, cancelled, requeued, matching, paused, queues, resumed, created, schedules, counts, pruned = using(
        dsn, repairs
    )
    assert abs((clock - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 60
    assert cancelled == ids and requeued == [ids[0]] and matching == 1
    assert count(conn, "state = 'available' AND queue = 'reports'") == 2
    assert paused == ["reports", "misc"] and resumed == ["misc"] and created == ["later"]
    assert queues == {"misc": True, "reports": True}
    assert client.list_queues() == {"later": True, "misc": False, "reports": True}
    assert schedules["hourly-report"][1] is False and client.periodic_state()["hourly-report"][1] is True
    assert pruned == 1, "only the completed job finished more than an hour ago"
    assert counts == [
        miniqueue.QueueCount("misc", State.AVAILABLE, 1),
        miniqueue.QueueCount("reports", State.AVAILABLE, 2),
        miniqueue.QueueCount("reports", State.COMPLETED, 1),
        miniqueue.QueueCount("reports", State.FAILED, 1),
    ]
    assert client.counts() == [
        miniqueue.QueueCount("misc", State.AVAILABLE, 1),
        miniqueue.QueueCount("reports", State.AVAILABLE, 2),
        miniqueue.QueueCount("reports", State.FAILED, 1),
    ]


# --- bad input: the same errors as Client, and nothing stored --------------------------------------

NAN = float("nan")
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("enqueue", ("bad task!",), {}),
    ("enqueue", ("t",), {"queue": "Bad Queue"}),
    ("enqueue", ("t", {"x": NAN}), {}),
    ("enqueue", ("t", {"x": "\x00"}), {}),
    ("enqueue", ("t", "x" * 2000), {}),
    ("enqueue", ("t",), {"priority": 40_000}),
    ("enqueue", ("t",), {"max_attempts": 0}),
    ("enqueue", ("t",), {"run_at": dt.datetime(2030, 1, 1)}),
    ("enqueue", ("t",), {"delay": -1}),
    ("enqueue", ("t",), {"delay": 1, "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)}),
    ("enqueue", ("t",), {"idempotency_key": ""}),
    ("enqueue", ("t",), {"idempotency_key": "k\udcff"}),
    ("enqueue_many", ([JobSpec("t"), JobSpec("t", queue="NO")],), {}),
    ("enqueue_many", ([JobSpec("t")] * 700 + [JobSpec("t", {"x": NAN})],), {}),
    ("enqueue_many", ([JobSpec("t", idempotency_key=f"k{n}") for n in "abc"] + [JobSpec("t", priority=10**5)],), {}),
    ("get", (0,), {}),
    ("get", (987_654,), {}),
    ("cancel", ([-1],), {}),
    ("cancel", ([987_654],), {}),
    ("requeue", ([987_654],), {}),
    ("requeue", ([True],), {}),
    ("requeue_matching", ([State.AVAILABLE],), {}),
    ("requeue_matching", ([State.DEAD],), {"queue": "Bad Queue"}),
    ("list_jobs", (), {"task": "bad task!"}),
    ("list_jobs", (), {"before_id": 0}),
    ("list_jobs", (), {"search": "\ud800"}),
    ("prune", ([State.RUNNING], 60), {}),
    ("prune", ([State.COMPLETED], NAN), {}),
    ("pause_queues", ([],), {}),
    ("pause_queues", (["nowhere"],), {}),
    ("resume_queues", (["Bad Queue"],), {}),
    ("disable_schedule", ("nightly",), {}),
    ("enable_schedule", ("bad name!",), {}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)])
def test_bad_input_raises_what_client_raises_and_stores_nothing(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any], dsn: str, conn: Connection
) -> None:
    with Client(dsn, max_payload_bytes=1000) as client, pytest.raises(MiniqueueError) as sync_error:
        getattr(client, method)(*args, **kwargs)
    assert count(conn) == 0

    async def body(a: AsyncClient) -> None:
        await getattr(a, method)(*args, **kwargs)

    with pytest.raises(MiniqueueError) as async_error:
        using(dsn, body, max_payload_bytes=1000)
    assert type(async_error.value) is type(sync_error.value)
    assert str(async_error.value) == str(sync_error.value)
    assert isinstance(sync_error.value, (InvalidInput, JobNotFound))
    assert count(conn) == 0
    assert conn.execute("SELECT count(*) FROM miniqueue_queues").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM miniqueue_periodic").fetchone() == (0,)


def test_a_transition_that_does_not_apply_raises_what_client_raises(dsn: str, conn: Connection, client: Client) -> None:
    job = client.enqueue("t")
    with pytest.raises(InvalidTransition) as sync_error:
        client.requeue([job.id])

    async def body(a: AsyncClient) -> None:
        await a.requeue([job.id])

    with pytest.raises(InvalidTransition) as async_error:
        using(dsn, body)
    expected = (
        f"cannot requeue job {job.id}: it is available; only cancelled, dead, expired, failed jobs can be requeued"
    )
    assert str(async_error.value) == str(sync_error.value) == expected
    assert row(conn, job.id)["state"] == "available"


# --- the pool: whose it is, when it opens -----------------------------------------------------------


def test_a_client_made_from_a_dsn_owns_its_pool_and_closes_it(dsn: str) -> None:
    async def main() -> None:
        async with AsyncClient(dsn) as client:
            pool = client._pool
            assert not pool.closed
            async with client.connection() as c:
                assert isinstance(c, AsyncPooledConnection)
                assert (await (await c.execute("SHOW application_name")).fetchone()) == ("miniqueue:client",)
        assert pool.closed

        lazy = AsyncClient(dsn)  # opened by its first call, on the running loop
        assert lazy._pool.closed
        await asyncio.gather(lazy.enqueue("t"), lazy.enqueue("t"), lazy.enqueue("t"))
        assert not lazy._pool.closed
        await lazy.close()
        assert lazy._pool.closed

    run(main())


def test_a_client_given_a_pool_uses_it_and_leaves_it_open(dsn: str, conn: Connection) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False) as pool:
            async with AsyncClient(pool) as client:
                job = await client.enqueue("t", {"via": "your pool"})
                assert (await client.get(job.id)).payload == {"via": "your pool"}
            assert not pool.closed
            async with pool.connection() as c:
                assert (await (await c.execute("SELECT 1")).fetchone()) == (1,)
            client = AsyncClient(pool)
            await client.close()
            assert not pool.closed
            assert (await client.get(job.id)).id == job.id

    run(main())
    assert count(conn) == 1


def test_a_dsn_that_does_not_parse_fails_at_once_and_an_unreachable_server_on_open(dsn: str) -> None:
    with pytest.raises(ConfigError, match="database URL"):
        AsyncClient("postgresql://user:secret@host:99999/db")
    unreachable = "postgresql://user:secret@127.0.0.1:1/db"

    async def main() -> None:
        client = AsyncClient(unreachable)
        with pytest.raises(DatabaseUnavailable) as error:
            await client.enqueue("t")
        assert "secret" not in str(error.value)
        with pytest.raises(DatabaseUnavailable):
            await client.open()  # still closed: a later call tries again
        await client.close()

    run(main())
    with pytest.raises(DatabaseUnavailable):
        Client(unreachable)


def test_a_pooled_async_connection_keeps_one_cursor_past_a_failed_statement(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> int:
        async with client.connection() as pooled:
            assert isinstance(pooled, AsyncPooledConnection)
            cursor = pooled.statement_cursor()
            with pytest.raises(psycopg.errors.DivisionByZero):
                await cursor.execute("SELECT 1 / 0")
            job = await client.enqueue("t", {"after": "error"}, conn=pooled)
            assert pooled.statement_cursor() is cursor
            return job.id

    assert row(conn, using(dsn, body))["payload"] == {"after": "error"}


def test_an_unmigrated_schema_says_to_migrate(dsn: str) -> None:
    with pytest.raises(MiniqueueError, match="run `miniqueue migrate` first"):
        using(dsn, lambda client: client.enqueue("t"), schema="not_migrated")


# --- limits, dependencies and results ------------------------------------------------------------


def test_limits_dependencies_and_queue_caps_on_the_async_client(dsn: str, conn: Connection) -> None:
    async def body(client: AsyncClient) -> tuple[list[EnqueueResult], miniqueue.GroupResult, dict[str, int]]:
        limited = await client.enqueue("t", {}, concurrency_key="k", max_concurrent=2, rate_limit="5/s")
        chain = await client.chain([JobSpec("a"), JobSpec("b"), JobSpec("c", depends_on=[limited.id])])
        group = await client.group([JobSpec("m", {"i": i}) for i in range(3)], then=JobSpec("after"))
        await client.limit_queue("default", 4)
        with pytest.raises(InvalidInput, match="queue 'nope' is unknown"):
            await client.limit_queue("nope", 4)
        return chain, group, await client.queue_limits()

    chain, group, caps = using(dsn, body)
    assert row(conn, 1)["limits"] == ["concurrency t k", "rate t"]
    assert [row(conn, r.id)["state"] for r in chain] == ["available", "waiting", "waiting"]
    assert row(conn, chain[2].id)["parents"] == [chain[1].id, 1]
    assert row(conn, group.then.id)["parents"] == [m.id for m in group.members]
    assert caps == {"default": 4}


def test_result_and_wait_on_the_async_client(dsn: str, conn: Connection, client: Client) -> None:
    job_id = client.enqueue("t", {}).id
    store = Store()
    [lease] = store.claim(conn, ["default"], W1, 30.0, 1)

    async def body(aclient: AsyncClient) -> tuple[Any, Any]:
        with pytest.raises(miniqueue.JobNotFinished):
            await aclient.result(job_id)
        waiting = asyncio.create_task(aclient.wait(job_id, timeout=30))
        # The waiter listens and flags the job before its first read: once the flag is set, the
        # completion below notifies it.
        for _ in range(1000):  # poll until the flag is set (10 s at most)
            if row(conn, job_id)["awaited"]:
                break
            await asyncio.sleep(0.01)
        assert row(conn, job_id)["awaited"], "the waiter never flagged the job"
        store.complete(conn, job_id, W1, lease.attempt, result='{"answer": 42}')
        return await waiting, await aclient.result(job_id)

    assert using(dsn, body) == ({"answer": 42}, {"answer": 42})


def test_wait_times_out_cleanly_on_the_async_client(dsn: str, client: Client) -> None:
    job_id = client.enqueue("t", {}).id

    async def body(aclient: AsyncClient) -> None:
        with pytest.raises(miniqueue.WaitTimeout):
            await aclient.wait(job_id, timeout=0.2)

    using(dsn, body)
