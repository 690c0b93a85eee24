"""Several databases behind one client (docs/guides/shards.md): the shard map, ids that
route themselves, routing by queue and by key, and what cannot span databases refused.

Three databases of the test server stand for three servers here: routing, ids and refusals do
not depend on where a database runs.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from click.testing import CliRunner

from miniqueue import JobSpec, State
from miniqueue.cli.main import main
from miniqueue.client.sharded import ShardedClient, migrate_shards
from miniqueue.core.errors import ConfigError, InvalidInput
from miniqueue.core.shard_map import ID_BASE, MODULUS, Database, ShardMap
from miniqueue.supervise.shard_supervisor import split_workers
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.testing import database as testing_db
from miniqueue.testing import run_jobs

from ..helpers import row, wait_until
from ..servers import emptied_client
from ..supervised import FAST, Supervised, create_executions


def three_databases(server_dsn: str) -> Iterator[dict[str, str]]:
    """Three migrated databases: a (the origin), b and c."""
    dsns = {name: testing_db.create_database(server_dsn, prefix=f"miniqueue_shard_{name}") for name in "abc"}
    yield dsns
    for dsn in dsns.values():
        testing_db.drop_database(server_dsn, dsn)


@pytest.fixture
def three(server_dsn: str) -> Iterator[dict[str, str]]:
    """Three databases of the test's own, not in any map yet."""
    yield from three_databases(server_dsn)


@pytest.fixture(scope="module")
def joined(server_dsn: str) -> Iterator[dict[str, str]]:
    """Three databases that joined the map (for the module: joining is a migration apiece)."""
    for dsns in three_databases(server_dsn):
        shards = shard_map(dsns)
        assert migrate_shards(shards) == {"a": True, "b": True, "c": True}
        assert migrate_shards(shards) == {"a": False, "b": False, "c": False}, "joining again changes nothing"
        yield dsns


def shard_map(dsns: dict[str, str]) -> ShardMap:
    return ShardMap.parse(
        {
            "databases": {name: {"url": dsn, "index": i} for i, (name, dsn) in enumerate(dsns.items())},
            "queues": {"mail": ["b"], "hot": ["b", "c"]},
        }
    )


@pytest.fixture
def sharded(joined: dict[str, str]) -> Iterator[ShardedClient]:
    """A client over the joined databases, emptied for the test."""
    yield from emptied_client(shard_map(joined))


def test_each_job_goes_to_its_queues_database_and_its_id_names_it(sharded: ShardedClient) -> None:
    plain = sharded.enqueue("t", {"n": 1})
    mail = sharded.enqueue("t", {"n": 2}, queue="mail")
    assert plain.id >= ID_BASE and plain.id % MODULUS == 0, "a queue the map does not name lives on the origin"
    assert mail.id % MODULUS == 1
    for job_id, name in ((plain.id, "a"), (mail.id, "b")):
        assert sharded.shards.database_of(job_id).name == name
        assert sharded.get(job_id).id == job_id  # found without naming its database
        with psycopg.connect(sharded.shards.databases[name].url) as conn:
            assert row(conn, job_id)["queue"] in ("default", "mail")


def test_a_spread_queue_keeps_a_keys_jobs_together_and_spreads_the_rest(sharded: ShardedClient) -> None:
    keyed = [sharded.enqueue("t", {"n": n}, queue="hot", sequence_key="account-7").id for n in range(6)]
    assert len({job_id % MODULUS for job_id in keyed}) == 1, "every job of a key on one database"
    spread = [sharded.enqueue("t", {"n": n}, queue="hot").id for n in range(6)]
    assert sorted({job_id % MODULUS for job_id in spread}) == [1, 2], "round-robin over the queue's databases"
    batch = sharded.enqueue_many([JobSpec("t", {"n": n}, queue=q) for n, q in enumerate(["mail", "default", "hot"])])
    assert [r.id % MODULUS for r in batch][:2] == [1, 0], "a batch lands per database, results in input order"


def test_results_waits_cancels_and_requeues_route_by_id(sharded: ShardedClient) -> None:
    app = App()

    @app.task("double", queue="mail")
    def double(job: Job) -> int:
        return int(job.payload["n"]) * 2

    job_id = app.enqueue(sharded.client("b"), "double", {"n": 21}).id
    run_jobs(app, sharded.client("b"))
    assert sharded.result(job_id) == 42
    first, second = sharded.enqueue("t", queue="mail").id, sharded.enqueue("t").id
    assert sorted(sharded.cancel([first, second])) == sorted([first, second]), "each on its own database"
    assert sorted(sharded.requeue([first, second])) == sorted([first, second])
    assert {sharded.get(i).state for i in (first, second)} == {State.AVAILABLE}


def test_what_cannot_span_databases_is_refused_before_anything_is_stored(
    sharded: ShardedClient, joined: dict[str, str]
) -> None:
    parent = sharded.enqueue("t").id  # on a
    with pytest.raises(InvalidInput, match="would span databases a, b"):
        sharded.enqueue("t", queue="mail", depends_on=[parent])
    with pytest.raises(InvalidInput, match="the chain would span databases a, b"):
        sharded.chain([JobSpec("t"), JobSpec("t", queue="mail")])
    with pytest.raises(InvalidInput, match="the group would span databases a, b"):
        sharded.group([JobSpec("t")], then=JobSpec("t", queue="mail"))
    with psycopg.connect(joined["a"]) as on_a, pytest.raises(InvalidInput, match="conn is on database 'a'"):
        sharded.enqueue("t", queue="mail", conn=on_a)
    counts = {}
    for name, stats in sharded.queue_stats_by_database().items():
        assert isinstance(stats, list), stats
        counts[name] = sum(s.counts[State.AVAILABLE] for s in stats)
    assert counts == {"a": 1, "b": 0, "c": 0}, "only the first enqueue stored a job"
    with psycopg.connect(joined["b"]) as on_b, on_b.transaction():
        assert sharded.enqueue("t", queue="mail", conn=on_b).id % MODULUS == 1, "its own database's connection"


def test_operators_see_one_queue_over_every_database(sharded: ShardedClient) -> None:
    for queue in ("default", "mail", "mail", "hot", "hot"):
        sharded.enqueue("t", queue=queue)
    merged = {s.queue: s.counts[State.AVAILABLE] for s in sharded.queue_stats()}
    assert merged == {"default": 1, "hot": 2, "mail": 2}
    assert len(sharded.list_jobs(limit=10)) == 5


def test_joining_a_map_keeps_every_guarantee_of_the_ids(server_dsn: str, three: dict[str, str]) -> None:
    with ShardedClient(ShardMap.parse({"databases": {"a": {"url": three["a"], "index": 0}}})) as before:
        old = before.client("a").enqueue("t").id  # drawn before any map
    assert old < ID_BASE
    shards = shard_map(three)
    with ShardedClient(shards) as client:
        client.client("c").enqueue("t")  # c holds an old id too: it cannot join but as the origin
    with pytest.raises(ConfigError, match="database 'c' holds jobs with ids drawn before it joined"):
        migrate_shards(shards)
    with psycopg.connect(three["c"], autocommit=True) as conn:
        conn.execute("DELETE FROM miniqueue_jobs")
    migrate_shards(shards)
    with ShardedClient(shards) as client:
        assert client.get(old).id == old, "an id from before the map routes to the origin"
    renamed = ShardMap.parse(
        {"databases": {"a": {"url": three["a"], "index": 0}, "z": {"url": three["b"], "index": 9}}}
    )
    with pytest.raises(ConfigError, match="is 'b' \\(index 1\\) of a shard map, not 'z'"):
        migrate_shards(renamed)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "a shard map is a JSON object"),
        ({"databases": {"a": {"index": 0}}}, "database 'a' needs a \"url\""),
        ({"databases": {"a": {"url": "x", "index": 1024}}}, 'needs an "index" from 0 to 1023'),
        ({"databases": {"a": {"url": "x", "index": 0}, "b": {"url": "y", "index": 0}}}, "have index 0"),
        ({"databases": {"a": {"url": "x", "index": 0}}, "queues": {"q": ["b"]}}, "names database\\(s\\) the map"),
    ],
)
def test_a_bad_map_is_refused_naming_the_problem(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShardMap.parse(data)
    with pytest.raises(ConfigError, match=message):
        ShardMap.load(json.dumps(data))


def test_migrate_joins_every_database_and_shards_check_says_when_a_moved_queue_has_drained(
    three: dict[str, str],
) -> None:
    before = json.dumps(
        {"databases": {n: {"url": three[n], "index": i} for i, n in enumerate("abc")}, "queues": {"mail": ["b"]}}
    )
    migrated = CliRunner().invoke(main, ["migrate", "--shards", before])
    assert migrated.exit_code == 0, migrated.output
    assert migrated.output.splitlines() == [
        "a: migrated, joined the shard map",
        "b: migrated, joined the shard map",
        "c: migrated, joined the shard map",
    ]
    app = App()

    @app.task("send", queue="mail")
    def send(job: Job) -> None:
        pass

    with ShardedClient(before) as client:
        ids = [client.enqueue("send", {"n": n}, queue="mail").id for n in range(3)]
    assert {i % MODULUS for i in ids} == {1}
    # The queue moves to c: producers switch to the new map; b's workers drain what it holds.
    after = json.dumps(
        {"databases": {n: {"url": three[n], "index": i} for i, n in enumerate("abc")}, "queues": {"mail": ["c"]}}
    )
    with ShardedClient(after) as client:
        assert client.enqueue("send", queue="mail").id % MODULUS == 2
        checked = CliRunner().invoke(main, ["shards", "check", "--shards", after])
        assert checked.exit_code == 1 and "queue 'mail': 3 unfinished job(s) here" in checked.output, checked.output
        run_jobs(app, client.client("b"))
        assert {client.get(i).state for i in ids} == {State.COMPLETED}, "ids from b still route to b"
    drained = CliRunner().invoke(main, ["shards", "check", "--shards", after])
    assert drained.exit_code == 0 and drained.output.count(": ok") == 3, drained.output


def test_a_task_declared_by_the_workers_of_another_database_goes_to_its_queue(sharded: ShardedClient) -> None:
    app = App()

    @app.task("send", queue="mail", priority=3)
    def send(job: Job) -> None:
        pass

    sharded.client("b").declare(app)  # as the workers serving queue "mail" on b publish it
    job = sharded.get(sharded.enqueue("send").id)
    assert (job.queue, job.priority, job.id % MODULUS) == ("mail", 3, 1)


def test_stats_over_a_map_shows_each_database_a_total_and_an_unreachable_one_by_name(
    sharded: ShardedClient, joined: dict[str, str]
) -> None:
    for queue in ("mail", "hot", "hot", "default"):
        sharded.enqueue("t", queue=queue)
    databases = {n: {"url": joined[n], "index": i} for i, n in enumerate("abc")}
    shards = json.dumps({"databases": databases, "queues": {"mail": ["b"], "hot": ["b", "c"]}})
    shown = CliRunner().invoke(main, ["stats", "--json", "--shards", shards])
    assert shown.exit_code == 0, shown.output
    rows = {(r["database"], r["queue"]): r["available"] for r in json.loads(shown.output)}
    assert rows[("total", "hot")] == 2 and rows[("total", "mail")] == 1 and rows[("a", "default")] == 1
    assert rows[("b", "hot")] + rows[("c", "hot")] == 2
    gone = {**databases, "c": {"url": joined["c"].replace("miniqueue_shard_c", "no_such_database"), "index": 2}}
    down = CliRunner().invoke(
        main, ["stats", "--shards", json.dumps({"databases": gone, "queues": {"hot": ["b", "c"]}})]
    )
    assert down.exit_code == 1
    assert "database c: unreachable" in down.output and "its queues are not counted above" in down.output


def test_supervise_with_a_map_runs_a_supervisor_per_database_sharing_the_workers_by_weight(
    sharded: ShardedClient, joined: dict[str, str], tmp_path: Path, repo_root: Path
) -> None:
    assert split_workers(5, [Database("a", "", 0, 2), Database("b", "", 1, 1), Database("c", "", 2, 0)]) == {
        "a": 3,
        "b": 2,
    }
    with pytest.raises(ConfigError, match="need one worker each"):
        split_workers(1, [Database("a", "", 0), Database("b", "", 1)])
    with psycopg.connect(joined["a"], autocommit=True) as conn:  # where tests.apps.supervised records runs
        create_executions(conn)
    databases = {
        n: {"url": joined[n], "index": i, "weight": w} for i, (n, w) in enumerate(zip("abc", (1, 1, 0), strict=True))
    }
    shards = json.dumps({"databases": databases, "queues": {"mail": ["b"], "idle": ["c"]}})
    args = ["--app", "tests.apps.supervised:app", "--workers", "2", "--queues", "default,mail,idle", *FAST]
    args += ["--shards", shards]
    supervised = Supervised(joined["a"], args, tmp_path / "supervisor", repo_root)
    try:
        with ShardedClient(shards) as client:
            on_a, on_b = client.enqueue("work").id, client.enqueue("work", queue="mail").id
            on_c = client.enqueue("work", queue="idle").id
            assert [job_id % MODULUS for job_id in (on_a, on_b, on_c)] == [0, 1, 2]
            for job_id in (on_a, on_b):
                wait_until(lambda: client.get(job_id).state is State.COMPLETED, timeout=30, what=f"job {job_id}")  # noqa: B023
            assert client.get(on_c).state is State.AVAILABLE, "no worker for a database of weight 0"
        # By role (a worker's title says what it runs: "worker-1 idle", "worker-1 job 7 work").
        roles = sorted(" ".join(p.cmdline()).split()[1] for p in supervised.process.children(recursive=True))
        assert roles == ["reaper", "reaper", "supervisor", "supervisor", "worker-1", "worker-1"], (
            "a supervisor per database of weight above 0, each with its worker and its reaper"
        )
        supervised.proc.send_signal(signal.SIGTERM)
        assert supervised.proc.wait(timeout=30) == 0, supervised.output()
    finally:
        supervised.stop()


def test_a_map_supervisor_killed_outright_takes_every_database_supervisor_down(
    joined: dict[str, str], tmp_path: Path, repo_root: Path
) -> None:
    """SIGKILL of ``miniqueue-supervise --shards`` (it forwards nothing): each database's
    supervisor stops as on TERM, and with it its workers and reaper; no process is left."""
    databases = {n: {"url": joined[n], "index": i} for i, n in enumerate("ab")}
    args = [
        "--app",
        "tests.apps.supervised:app",
        "--workers",
        "2",
        *FAST,
        "--shards",
        json.dumps({"databases": databases}),
    ]
    supervised = Supervised(joined["a"], args, tmp_path / "supervisor", repo_root)
    try:
        wait_until(lambda: len(supervised.process.children(recursive=True)) == 6, timeout=60, what="2 supervisors")
        tree = supervised.process.children(recursive=True)
        supervised.proc.kill()
        supervised.proc.wait(timeout=10)
        wait_until(
            lambda: not [p for p in tree if _alive(p)],
            timeout=30,
            what="every process of the tree gone",
        )
    finally:
        supervised.stop()


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a process gone meanwhile is not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
