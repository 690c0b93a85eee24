"""Several databases on three real PostgreSQL servers (docs/guides/shards.md): the suite's
server (the embedded one, or ``TEST_DATABASE_URL``'s) and two embedded servers of this module's
own, each started on a socket of its own. Routing by queue and by key, ids that route themselves
to their server, what could not hold over several databases refused before anything is stored,
a spread queue's limits declared per database, and a queue moved under load with nothing lost
or run twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg.conninfo import conninfo_to_dict

from miniqueue import Client, JobRecord, JobSpec, Reaper, State
from miniqueue.cli.main import main
from miniqueue.client.asyncsharded import AsyncShardedClient
from miniqueue.client.sharded import ShardedClient, migrate_shards
from miniqueue.core.errors import ConfigError, DatabaseUnavailable, InvalidInput
from miniqueue.core.shard_map import MODULUS, ShardMap
from miniqueue.supervise.config import SupervisorConfig
from miniqueue.supervise.shard_supervisor import ShardedSupervisor
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.testing import database as testing_db
from miniqueue.testing import run_jobs

from ..helpers import wait_until
from ..running import worker_starter
from ..servers import pg_ctl
from ..supervised import FAST, Supervised, create_executions, free_port, free_ports_after
from .test_probes import get, status

NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def on_servers(servers: list[str]) -> Iterator[dict[str, str]]:
    """A migrated database on each server: a (the origin) on the suite's, b and c on their own."""
    dsns = {
        name: testing_db.create_database(server, prefix="miniqueue_servers")
        for name, server in zip(NAMES, servers, strict=True)
    }
    yield dsns
    for name, server in zip(NAMES, servers, strict=True):
        testing_db.drop_database(server, dsns[name])


def map_json(dsns: dict[str, str], queues: dict[str, Any]) -> str:
    return json.dumps({"databases": {n: {"url": dsns[n], "index": i} for i, n in enumerate(NAMES)}, "queues": queues})


@pytest.fixture
def dsns(on_servers: dict[str, str]) -> dict[str, str]:
    """The three databases, joined to a map and emptied for the test."""
    migrate_shards(ShardMap.parse(json.loads(map_json(on_servers, {}))))
    for dsn in on_servers.values():
        testing_db.clean_database(dsn)
    return on_servers


def stored(dsn: str) -> list[tuple[int, str, str]]:
    """``(id, task, queue)`` of every job a database holds, read on a connection of its own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute("SELECT id, task, queue FROM miniqueue_jobs ORDER BY id")]


def test_jobs_go_to_their_queues_server_and_their_ids_route_back(dsns: dict[str, str]) -> None:
    shards = map_json(dsns, {"mail": ["b"], "hot": ["b", "c"]})
    with ShardedClient(shards) as client:
        plain, mail = client.enqueue("t").id, client.enqueue("t", queue="mail").id
        hot = [
            r.id for r in client.enqueue_many([JobSpec("t", queue="hot", unique_key=f"k{n % 3}") for n in range(30)])
        ]
        keyed = [r.id for r in client.enqueue_many([JobSpec("t", queue="hot", concurrency_key="acct-7")] * 5)]
        assert [i for i, _, _ in stored(dsns["a"])] == [plain]
        assert mail in [i for i, _, _ in stored(dsns["b"])]
        on = {name: {i for i, _, q in stored(dsns[name]) if q == "hot"} for name in ("b", "c")}
        assert on["b"] | on["c"] == set(hot) | set(keyed) and on["b"] and on["c"], "a hot queue uses both servers"
        assert len({i % MODULUS for i in keyed}) == 1, "every job of a key on one server"
        for job_id in (plain, mail, *hot):
            assert client.get(job_id).id == job_id
        assert client.cancel([plain, mail]) == [plain, mail]
        assert {client.get(i).state for i in (plain, mail)} == {State.CANCELLED}


def test_a_keyed_rate_limit_routes_by_its_key_and_a_task_wide_one_is_refused(dsns: dict[str, str]) -> None:
    shards = map_json(dsns, {"hot": ["b", "c"]})
    with ShardedClient(shards) as client:
        ids = [client.enqueue("t", queue="hot", rate_limit="5/s", rate_limit_key="tenant-9").id for _ in range(6)]
        assert len({i % MODULUS for i in ids}) == 1, "a keyed rate limit's jobs on one server"
        with pytest.raises(InvalidInput, match=r"its rate limit '5/s' is task-wide.*\"limits\": \"per-database\""):
            client.enqueue("t", queue="hot", rate_limit="5/s")
    assert sum(len(stored(dsn)) for dsn in dsns.values()) == 6, "nothing stored by the refusal"


def test_what_a_task_declares_is_checked_on_a_spread_queue(dsns: dict[str, str]) -> None:
    app = App()
    app.task("throttled", queue="hot", rate_limit="10/s")(lambda job: None)
    app.task("accounts", queue="hot", concurrency_key="acct", max_concurrent=1)(lambda job: None)
    shards = map_json(dsns, {"hot": ["b", "c"]})
    with ShardedClient(shards) as client:
        client.client("c").declare(app)  # as the queue's workers on c publish it
        with pytest.raises(InvalidInput, match="task 'throttled' cannot go to queue 'hot'"):
            client.enqueue("throttled")
        with pytest.raises(InvalidInput, match="its concurrency key 'acct' differs from the key it is routed by, 'u1'"):
            client.enqueue_many([JobSpec("accounts"), JobSpec("accounts", unique_key="u1")])
        assert sum(len(stored(dsn)) for dsn in dsns.values()) == 0, "a refused batch stores nothing anywhere"
        assert client.enqueue("accounts").id % MODULUS in (1, 2), "its concurrency key routes it"
        with pytest.raises(InvalidInput, match="its sequence key 's' differs from its unique key 'u'"):
            client.enqueue("t", queue="hot", unique_key="u", sequence_key="s")


def test_a_spread_queue_declared_per_database_takes_limits_and_caps_each_database(dsns: dict[str, str]) -> None:
    per_database = map_json(dsns, {"hot": {"databases": ["b", "c"], "limits": "per-database"}, "mail": ["b"]})
    with ShardedClient(per_database) as client:
        ids = [client.enqueue("t", queue="hot", rate_limit="5/s").id for _ in range(4)]
        assert {i % MODULUS for i in ids} == {1, 2}, "round-robin: each database grants the rate alone"
        client.limit_queue("hot", 3)
        assert [client.client(n).queue_limits() for n in ("b", "c")] == [{"hot": 3}, {"hot": 3}]
        client.limit_queue("mail", 2, create=True)
        assert client.client("b").queue_limits() == {"hot": 3, "mail": 2}
    with ShardedClient(map_json(dsns, {"hot": ["b", "c"]})) as client:
        with pytest.raises(InvalidInput, match=r"queue 'hot' is spread over databases b, c: a cap of 4"):
            client.limit_queue("hot", 4)
        client.limit_queue("hot", None)  # lifting a cap is always allowed
        assert [client.client(n).queue_limits() for n in ("b", "c")] == [{"mail": 2}, {}]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"databases": ["b"], "limits": "fleet"}, '"limits" is \'fleet\': the only value is "per-database"'),
        ({"databases": ["b"], "cap": 3}, "has unknown key(s) ['cap']"),
        ({"limits": "per-database"}, "queue 'q' needs a list of distinct databases"),
    ],
)
def test_a_bad_queue_entry_in_the_map_is_refused_naming_the_problem(entry: object, message: str) -> None:
    data = {"databases": {"b": {"url": "postgresql:///x", "index": 1}}, "queues": {"q": entry}}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ShardMap.parse(data)


def test_a_queue_moved_to_another_server_under_load_loses_nothing_and_runs_nothing_twice(
    dsns: dict[str, str],
) -> None:
    runs: Counter[int] = Counter()
    lock = threading.Lock()
    app = App()

    @app.task("move", queue="moving")
    def move(job: Job) -> None:
        with lock:
            runs[job.id] += 1

    before, after = map_json(dsns, {"moving": ["b"]}), map_json(dsns, {"moving": ["c"]})
    enqueued: list[int] = []
    switched, stop = threading.Event(), threading.Event()

    def produce() -> None:  # a producer that picks up the new map mid-stream, as a deploy does
        with ShardedClient(before) as old, ShardedClient(after) as new:
            # As a deploy step does: the task's queue known on every database before the first
            # enqueue, not only once a worker has published it (the producer may start first).
            old.declare(app)
            while not stop.is_set():
                client = new if switched.is_set() else old
                enqueued.extend(r.id for r in client.enqueue_many([JobSpec("move", {"n": n}) for n in range(20)]))
                time.sleep(0.01)  # a steady stream, not a flood

    starters = [worker_starter(dsns[name]) for name in ("b", "c")]
    producer = threading.Thread(target=produce)
    try:
        for starter in starters:  # the queue's workers on both servers: the old drains while the new fills
            next(starter)(app, queues=["moving"])
        producer.start()
        wait_until(lambda: len(enqueued) >= 200, timeout=60, what="jobs on the old server")
        switched.set()
        wait_until(lambda: len(enqueued) >= 400, timeout=60, what="jobs on the new server")
        stop.set()
        producer.join(10)

        def check() -> Result | None:
            result = CliRunner().invoke(main, ["shards", "check", "--shards", after])
            return result if result.exit_code == 0 else None

        checked = wait_until(check, timeout=60, what="the old server drained of the moved queue")
        assert checked.output.count(": ok") == 3, checked.output
        wait_until(lambda: len(runs) == len(enqueued), timeout=60, what="every job ran")
    finally:
        stop.set()
        for starter in starters:
            next(starter, None)
    assert {i % MODULUS for i in enqueued} == {1, 2}, "jobs on both servers"
    assert sorted(runs) == sorted(enqueued) and set(runs.values()) == {1}, "nothing lost, nothing run twice"
    with ShardedClient(after) as client:
        assert {client.get(i).state for i in enqueued} == {State.COMPLETED}


def test_the_async_client_routes_refuses_and_finds_jobs_as_the_sync_one_does(dsns: dict[str, str]) -> None:
    shards = map_json(dsns, {"mail": ["b"], "hot": ["b", "c"]})

    async def scenario() -> tuple[list[int], list[int], list[JobRecord]]:
        async with AsyncShardedClient(shards) as client:
            single = [(await client.enqueue("t")).id, (await client.enqueue("t", queue="mail")).id]
            batch = [r.id for r in await client.enqueue_many([JobSpec("t", queue="hot", unique_key="k")] * 3)]
            with pytest.raises(InvalidInput, match="its rate limit '1/s' is task-wide"):
                await client.enqueue_many([JobSpec("t"), JobSpec("t", queue="hot", rate_limit="1/s")])
            parent = single[1]
            with pytest.raises(InvalidInput, match="the chain would span databases a, b"):
                await client.chain([JobSpec("t", queue="mail"), JobSpec("t")])
            with pytest.raises(InvalidInput, match="the job and its parents would span databases a, b"):
                await client.enqueue("t", depends_on=[parent])
            async with await psycopg.AsyncConnection.connect(dsns["c"]) as conn:
                with pytest.raises(InvalidInput, match="conn is on database 'c', but the job goes to database 'b'"):
                    await client.enqueue("t", queue="mail", conn=conn)
            assert await client.cancel(single) == single
            return single, batch, [await client.get(i) for i in single]

    single, batch, records = asyncio.run(scenario())
    assert [i % MODULUS for i in single] == [0, 1] and len(set(batch)) == 1, "a unique key holds: one job"
    assert {r.state for r in records} == {State.CANCELLED}
    assert sum(len(stored(dsn)) for dsn in dsns.values()) == 3, "the refusals stored nothing"


def test_the_testing_kit_runs_every_database_of_a_map_until_none_has_work(dsns: dict[str, str]) -> None:
    shards = map_json(dsns, {"mail": ["b"], "hot": ["b", "c"]})
    app = App()
    with ShardedClient(shards) as client:

        @app.task("signup")
        def signup(job: Job) -> None:  # on the origin; its mail goes to b, found in the next round
            client.enqueue("welcome", {"user": job.payload["user"]}, queue="mail")

        app.task("welcome", queue="mail")(lambda job: None)
        app.task("event", queue="hot")(lambda job: None)
        client.declare(app)  # as a deploy step does: jobs enqueued by name take their tasks' queues
        client.enqueue_many([JobSpec("signup", {"user": 1}), *[JobSpec("event", {"n": n}) for n in range(4)]])
        result = run_jobs(app, client)
    assert result.stopped_by == "idle"
    assert sorted(run.task for run in result.runs) == ["event"] * 4 + ["signup", "welcome"]
    assert len(result.completed) == 6 and {job.id % MODULUS for job in result.jobs} == {0, 1, 2}


def test_a_database_that_is_down_costs_only_its_own_workers_and_the_probes_name_it(
    servers: list[str], dsns: dict[str, str], tmp_path: Path, repo_root: Path
) -> None:
    with psycopg.connect(dsns["a"], autocommit=True) as conn:  # where tests.apps.supervised records runs
        create_executions(conn)
    weights = {"a": 0, "b": 1, "c": 1}
    shards = json.dumps(
        {
            "databases": {n: {"url": dsns[n], "index": i, "weight": weights[n]} for i, n in enumerate(NAMES)},
            "queues": {"on_b": ["b"], "on_c": ["c"]},
        }
    )
    port = free_ports_after(2)  # b serves on port + 1, c on port + 2
    args = ["--app", "tests.apps.supervised:app", "--workers", "2", "--queues", "on_b,on_c", *FAST]
    supervised = Supervised(dsns["a"], [*args, "--shards", shards, "--metrics-port", str(port)], tmp_path, repo_root)
    try:
        for number in (1, 2):
            try:
                wait_until(lambda: status(port + number, "/readyz") == 200, timeout=60)  # noqa: B023
            except AssertionError:
                raise AssertionError(f"database {number} not ready:\n{supervised.output()[-4000:]}") from None
        pg_ctl(servers[2], "stop")
        try:
            wait_until(
                lambda: (answer := get(port + 2, "/readyz"))[0] == 503 and "database c unreachable" in answer[1],
                timeout=30,
                what="c's supervisor saying its database is down",
            )
            down = 'miniqueue_database_up{database="c"} 0.0'
            wait_until(lambda: down in get(port + 2, "/metrics")[1], timeout=30, what="c's gauge saying it is down")
            with ShardedClient(shards) as client:
                on_b = [r.id for r in client.enqueue_many([JobSpec("work", queue="on_b")] * 5)]
                wait_until(
                    lambda: {client.get(i).state for i in on_b} == {State.COMPLETED}, timeout=30, what="b's jobs"
                )
            assert get(port + 1, "/readyz")[0] == 200, "b's workers ran on"
            # c's supervisor killed while its database is down: started again (and again, with a
            # back-off) until it is back, none of which makes the drained stop below fail.
            [c_pid] = re.findall(r"started the supervisor of database c \(pid (\d+)", supervised.output())
            os.kill(int(c_pid), signal.SIGKILL)
            wait_until(lambda: "the supervisor of database c (pid" in supervised.output(), what="c's restart")
        finally:
            pg_ctl(servers[2], "start")
        with ShardedClient(shards) as client:
            on_c = client.enqueue("work", queue="on_c").id
            wait_until(lambda: client.get(on_c).state is State.COMPLETED, timeout=60, what="c's job, once c is back")
        wait_until(lambda: get(port + 2, "/readyz")[0] == 200, timeout=30, what="c's supervisor ready again")
        supervised.proc.send_signal(signal.SIGTERM)
        assert supervised.proc.wait(timeout=30) == 0, supervised.output()
    finally:
        supervised.stop()


def test_each_periodic_slot_is_enqueued_once_over_the_map(dsns: dict[str, str]) -> None:
    weights = {"a": 1, "b": 0, "c": 1}
    databases = {n: {"url": dsns[n], "index": i, "weight": weights[n]} for i, n in enumerate(NAMES)}
    shards = ShardMap.parse({"databases": databases, "queues": {"reports": ["b", "c"], "digests": ["c"]}})
    app = App()
    app.task("report", queue="reports")(lambda job: None)
    app.task("digest", queue="digests")(lambda job: None)
    app.task("tidy")(lambda job: None)
    for task in ("report", "digest", "tidy"):
        app.periodic("* * * * *", task=task, catch_up="latest")
    plans = ShardedSupervisor(SupervisorConfig(dsn="", app_ref="x", workers=2), shards).plans
    # Each database's reaper, as its supervisor configures it, schedules the periodic jobs of the
    # queues it is the first database of; b runs no worker (weight 0), so the spread queue's is c.
    owned = {
        name: sorted(s.task for s in Reaper(dsns[name], plan.reaper, app=app).schedules) for name, plan in plans.items()
    }
    assert owned == {"a": ["tidy"], "c": ["digest", "report"]}
    assert shards.scheduler_of("reports") == shards.databases["c"], "where the dashboard lists its schedules too"


def test_a_stopping_worker_waits_between_retries_while_its_database_is_down(
    servers: list[str], dsns: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app = App()
    started = threading.Event()

    @app.task("slow", queue="slow")
    def slow(job: Job) -> None:
        started.set()
        job.wait(2)  # its outcome cannot be recorded while the database is down

    with ShardedClient(map_json(dsns, {"slow": ["c"]})) as client:
        client.enqueue("slow", queue="slow")
    starter = worker_starter(dsns["c"])
    running = next(starter)(app, shutdown_timeout=3.0)
    try:
        assert started.wait(30)
        pg_ctl(servers[2], "stop")
        try:
            running.stop(timeout=15)  # drains until the shutdown deadline, then abandons the job
        finally:
            pg_ctl(servers[2], "start")
    finally:
        next(starter, None)
    retries = [r for r in caplog.records if r.name == "miniqueue.worker" and "retrying in" in r.getMessage()]
    assert 0 < len(retries) < 20, f"{len(retries)} retries in 3 s: the back-off must hold while stopping"


def test_an_apps_enqueue_through_either_client_over_a_map_takes_the_tasks_options(dsns: dict[str, str]) -> None:
    app = App()
    app.task("send", queue="mail", priority=4)(lambda job: None)
    app.task("track", queue="hot", concurrency_key=lambda payload: f"user-{payload['user']}")(lambda job: None)
    shards = map_json(dsns, {"mail": ["b"], "hot": ["b", "c"]})
    with ShardedClient(shards) as client:
        sent = client.get(app.enqueue(client, "send").id)
        tracked = [app.enqueue(client, "track", {"user": 7}).id for _ in range(3)]

    async def enqueue_async() -> list[int]:
        async with AsyncShardedClient(shards) as aclient:
            return [(await app.aenqueue(aclient, "track", {"user": 7})).id for _ in range(2)]

    tracked += asyncio.run(enqueue_async())
    assert (sent.queue, sent.priority, sent.id % MODULUS) == ("mail", 4, 1)
    assert len({i % MODULUS for i in tracked}) == 1, "the key the app computed routes every job of it together"


def test_with_the_origin_down_a_job_bound_for_another_database_is_stored_there_at_once(
    servers: list[str], dsns: dict[str, str]
) -> None:
    app = App()
    app.task("task_on_second", queue="second")(lambda job: None)
    with Client(dsns["b"]) as on_b:
        on_b.declare(app)  # as b's workers publish it
    shards = map_json(dsns, {"second": ["b"]})
    origin = conninfo_to_dict(dsns["a"])["dbname"]
    with ShardedClient(shards, connect_timeout=5) as client, psycopg.connect(servers[0], autocommit=True) as admin:
        client.enqueue("task_on_second")  # routed while the origin is up: its client and pool are open
        admin.execute(f'ALTER DATABASE "{origin}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [origin])
        try:
            started = time.monotonic()
            job = client.enqueue("task_on_second")
            took = time.monotonic() - started
            assert job.id in [i for i, _, _ in stored(dsns["b"])]
            assert took < 5, f"took {took:.2f}s: it waited on the origin, which it does not go to"
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="database 'a' is unavailable"):
                client.enqueue("bound_for_the_origin")  # the default queue lives on the origin
            assert time.monotonic() - started < 5 + 2, "it failed within the client's connect timeout"
        finally:
            admin.execute(f'ALTER DATABASE "{origin}" ALLOW_CONNECTIONS true')


def test_a_new_client_routes_past_an_origin_that_refuses_connections(dsns: dict[str, str]) -> None:
    app = App()
    app.task("task_on_second", queue="second")(lambda job: None)
    with Client(dsns["b"]) as on_b:
        on_b.declare(app)
    refusing = {**dsns, "a": f"postgresql://127.0.0.1:{free_port()}/nothing"}
    for client in (ShardedClient(map_json(refusing, {"second": ["b"]}), connect_timeout=2),):
        with client:
            job = client.enqueue("task_on_second")
            assert job.id in [i for i, _, _ in stored(dsns["b"])]
            with pytest.raises(DatabaseUnavailable, match="database 'a' is unavailable"):
                client.enqueue("bound_for_the_origin")
            with pytest.raises(DatabaseUnavailable, match=r"cannot route task\(s\) 'declared_nowhere'"):
                client.enqueue("declared_nowhere")  # where it goes is not known while the origin is down

    async def through_the_async_client() -> int:
        async with AsyncShardedClient(map_json(refusing, {"second": ["b"]}), connect_timeout=2) as aclient:
            return (await aclient.enqueue("task_on_second")).id

    assert asyncio.run(through_the_async_client()) in [i for i, _, _ in stored(dsns["b"])]
