"""Fair share by key: fair jobs take turns by key (ranked as they are enqueued, claimed by rank),
weighted by rule; rules set a key's limit and weight at run time; a fair job's declaration holds
however it is enqueued; ``jobs why`` names a key's turn; and bad rules store nothing."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner

from miniqueue import App, AsyncClient, Client, InvalidInput, JobSpec
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.core.diagnosis import CauseKind
from miniqueue.core.records import ProcessInfo
from miniqueue.store.store import Store

from ..helpers import count


def keys_of(conn: Connection, ids: list[int]) -> list[str]:
    """The fair key of each job, in the order given."""
    rows = dict(conn.execute("SELECT id, fair_key FROM miniqueue_jobs WHERE id = ANY(%s)", [ids]).fetchall())
    return [rows[i] for i in ids]


def claimed_keys(conn: Connection, store: Store, queue: str, n: int) -> list[str]:
    """The fair keys of the next ``n`` jobs a claim takes, in the claim's order."""
    return keys_of(conn, [lease.id for lease in store.claim(conn, [queue], "w", 30, n)])


def test_fair_jobs_take_turns_by_key_each_key_in_its_order(client: Client, conn: Connection, store: Store) -> None:
    client.enqueue_many([JobSpec("t", {"n": n}, queue="f", fair_key="big") for n in range(60)])
    for key in ("b", "c"):
        client.enqueue_many([JobSpec("t", {"n": n}, queue="f", fair_key=key) for n in range(5)])
    leases = store.claim(conn, ["f"], "w", 30, 15)
    assert Counter(keys_of(conn, [lease.id for lease in leases])) == {"big": 5, "b": 5, "c": 5}
    for key in ("big", "b", "c"):  # each key's jobs in the order they were enqueued
        ids = [lease.id for lease in leases if keys_of(conn, [lease.id]) == [key]]
        assert ids == sorted(ids)
    assert Counter(claimed_keys(conn, store, "f", 100)) == {"big": 55}


def test_a_key_that_arrives_late_takes_turns_from_the_queue_s_current_turn(
    client: Client, conn: Connection, store: Store
) -> None:
    client.enqueue_many([JobSpec("t", {"n": n}, queue="f", fair_key="a") for n in range(40)])
    assert claimed_keys(conn, store, "f", 20) == ["a"] * 20
    client.enqueue_many([JobSpec("t", {"n": n}, queue="f", fair_key="late") for n in range(3)])
    assert Counter(claimed_keys(conn, store, "f", 6)) == {"a": 3, "late": 3}


def test_priority_comes_before_turns(client: Client, conn: Connection, store: Store) -> None:
    client.enqueue_many([JobSpec("t", {}, queue="f", fair_key="a") for _ in range(5)])
    urgent = client.enqueue("t", {}, queue="f", fair_key="a", priority=5).id
    assert store.claim(conn, ["f"], "w", 30, 1)[0].id == urgent


def test_weights_set_by_rule_give_turns_in_proportion_and_rerank_waiting_jobs(
    client: Client, conn: Connection, store: Store
) -> None:
    for key in ("x", "y"):
        client.enqueue_many([JobSpec("t", {}, queue="f", fair_key=key) for _ in range(40)])
    client.set_key_rule("x", weight=3)  # after the jobs were enqueued: they take their new turns
    assert Counter(claimed_keys(conn, store, "f", 20)) == {"x": 15, "y": 5}
    client.enqueue_many([JobSpec("t", {}, queue="f", fair_key=key) for key in ("x", "y") for _ in range(8)])
    assert Counter(claimed_keys(conn, store, "f", 20)) == {"x": 15, "y": 5}


def test_a_rule_limits_a_key_s_running_jobs_and_removing_it_lifts_the_limit(
    client: Client, conn: Connection, store: Store
) -> None:
    client.set_key_rule("tenant:p*", limit=2)
    client.enqueue_many([JobSpec("t", {}, queue="f", fair_key="tenant:p1") for _ in range(5)])
    client.enqueue_many([JobSpec("t", {}, queue="f", fair_key="tenant:other") for _ in range(5)])
    assert Counter(claimed_keys(conn, store, "f", 10)) == {"tenant:p1": 2, "tenant:other": 5}
    assert client.remove_key_rule("tenant:p*") is True
    assert Counter(claimed_keys(conn, store, "f", 10)) == {"tenant:p1": 3}
    assert client.remove_key_rule("tenant:p*") is False


def test_the_most_specific_rule_wins(client: Client, conn: Connection, store: Store) -> None:
    client.set_key_rule("*", limit=1, every_key=True)
    client.set_key_rule("tenant:premium-*", limit=3)
    client.set_key_rule("tenant:premium-gold", limit=4)
    for key in ("tenant:free", "tenant:premium-a", "tenant:premium-gold"):
        client.enqueue_many([JobSpec("t", {}, queue="f", fair_key=key) for _ in range(6)])
    assert Counter(claimed_keys(conn, store, "f", 50)) == {
        "tenant:free": 1,
        "tenant:premium-a": 3,
        "tenant:premium-gold": 4,
    }
    shares = {s.key: s for s in client.key_shares("f")}
    assert (shares["tenant:free"].running, shares["tenant:free"].available, shares["tenant:free"].max_running) == (
        1,
        5,
        1,
    )
    assert [r.pattern for r in client.key_rules()] == ["tenant:premium-gold", "tenant:premium-*", "*"]


@pytest.mark.parametrize(
    ("pattern", "options", "message"),
    [
        ("", {"weight": 2}, "key pattern '' is invalid"),
        ("*", {"limit": 1}, "matches every key"),
        ("**", {"weight": 2}, "matches every key"),
        ("k", {"limit": 0}, "a limit of 0 would never run a job of the key"),
        ("k", {"limit": -1}, "limit -1 is invalid"),
        ("k", {"weight": -1.0}, "weight -1.0 is invalid"),
        ("k", {"weight": 0}, "weight 0 is invalid"),
        ("k", {"weight": float("nan")}, "weight nan is invalid"),
        ("k", {"weight": 5000}, "weight 5000 is invalid"),
        ("k", {}, "sets nothing"),
        ("a\nb", {"weight": 1}, "is invalid"),
    ],
)
def test_a_bad_rule_is_refused_and_stores_nothing(
    client: Client, conn: Connection, pattern: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        client.set_key_rule(pattern, **options)
    assert client.key_rules() == []
    assert conn.execute("SELECT count(*) FROM miniqueue_limits").fetchone() == (0,)


def test_a_bad_fair_key_is_refused_and_stores_nothing(client: Client, conn: Connection) -> None:
    with pytest.raises(InvalidInput, match="fair_key"):
        client.enqueue("t", {}, fair_key="x" * 300)
    with pytest.raises(InvalidInput, match="job 1: fair_key"):
        client.enqueue_many([JobSpec("t", {}), JobSpec("t", {}, fair_key=7)])  # type: ignore[arg-type]
    assert count(conn) == 0


fair_app = App()


@fair_app.task(
    "tenant_report", queue="reports", fair_by="key", concurrency_key=lambda p: p["tenant"], max_concurrent=50
)
def tenant_report(job: Any) -> None:
    """A task whose jobs take turns by tenant."""


@fair_app.task("shared_report", queue="reports", fair_by="key")
def shared_report(job: Any) -> None:
    """A fair task without a concurrency key: its jobs' fair key is given, or none."""


def test_a_fair_task_s_jobs_are_fair_however_they_are_enqueued(dsn: str, client: Client, conn: Connection) -> None:
    ids = [fair_app.enqueue(client, "tenant_report", {"tenant": "app"}).id]
    client.declare(fair_app)
    with Client(dsn) as producer:  # without the app: the published declaration
        ids.append(producer.enqueue("tenant_report", {"tenant": "client"}, concurrency_key="client").id)
        ids += [r.id for r in producer.enqueue_many([JobSpec("tenant_report", {}, concurrency_key="batch")])]
        ids += [r.id for r in producer.chain([JobSpec("tenant_report", {}, concurrency_key="chain")])]
        group = producer.group(
            [JobSpec("tenant_report", {}, concurrency_key="member")],
            then=JobSpec("tenant_report", {}, concurrency_key="callback"),
        )
        ids += [group.members[0].id, group.then.id]

    async def enqueue_async() -> int:
        async with AsyncClient(dsn) as producer:
            return (await producer.enqueue("tenant_report", {}, concurrency_key="async")).id

    ids.append(asyncio.run(enqueue_async()))
    for extra in (["--fair-key", "cli"], []):
        cli = CliRunner().invoke(
            main, ["enqueue", "shared_report", *extra, "--json", "--database-url", dsn], env={"DATABASE_URL": None}
        )
        assert cli.exit_code == 0, cli.output
        ids.append(json.loads(cli.output)["id"])
    expected = ["app", "client", "batch", "chain", "member", "callback", "async", "cli", ""]
    assert keys_of(conn, ids) == expected
    ranked = conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE id = ANY(%s) AND rank_at IS NOT NULL", [ids])
    assert ranked.fetchone() == (len(ids),)


def test_a_fair_queue_makes_every_job_fair_and_ranks_those_it_holds(
    client: Client, conn: Connection, store: Store
) -> None:
    before = [r.id for r in client.enqueue_many([JobSpec("t", {}, queue="q") for _ in range(3)])]
    with pytest.raises(InvalidInput, match="unknown"):
        client.fair_queue("nosuch")
    assert client.fair_queue("q") == 3
    assert client.fair_queues() == ["q"]
    after = client.enqueue("t", {}, queue="q").id
    keyed = client.enqueue("t", {}, queue="q", fair_key="k").id
    assert keys_of(conn, [*before, after, keyed]) == ["", "", "", "", "k"]
    assert Counter(claimed_keys(conn, store, "q", 2)) == {"": 1, "k": 1}
    client.fair_queue("q", False)
    assert client.fair_queues() == []
    assert keys_of(conn, [client.enqueue("t", {}, queue="q").id]) == [None]


def test_jobs_why_names_a_fair_job_s_turn(client: Client, conn: Connection, store: Store) -> None:
    store.publish_tasks(conn, [], ["f"])  # a live worker serves the queue
    now = store.now(conn)
    worker = ProcessInfo(id="host:1/w", kind="worker", pid=1, title="miniqueue 0 idle", started_at=now)
    supervisor = ProcessInfo(id="host:1", kind="supervisor", pid=1, title="miniqueue supervisor", started_at=now)
    store.register_processes(conn, "host:1", "host", [supervisor, worker])
    a = [r.id for r in client.enqueue_many([JobSpec("t", {}, queue="f", fair_key="a") for _ in range(10)])]
    client.enqueue_many([JobSpec("t", {}, queue="f", fair_key=key) for key in ("b", "c") for _ in range(10)])
    cause = client.why(a[4]).causes[0]
    assert cause.kind is CauseKind.FAIR_SHARE, cause
    assert cause.details["keys_ahead"] == 2 and cause.details["ahead"] == 12, cause.details
    assert "key 'a'" in cause.message and "2 other keys" in cause.message
    assert client.why(a[0]).causes[0].kind is CauseKind.DUE


def test_the_keys_commands(dsn: str, client: Client) -> None:
    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--database-url", dsn], env={"DATABASE_URL": None})

    assert cli("keys", "set", "*", "--limit", "1").exit_code == 2
    assert cli("keys", "set", "k", "--limit", "0").exit_code == 2
    assert client.key_rules() == []
    done = cli("keys", "set", "tenant:premium-*", "--limit", "10", "--weight", "5")
    assert done.exit_code == 0 and "at most 10 running, weight 5" in done.output, done.output
    client.enqueue("t", {}, queue="f", fair_key="tenant:premium-a")
    listed = cli("keys", "list")
    assert "rule 'tenant:premium-*'" in listed.output and "tenant:premium-a" in listed.output, listed.output
    assert "1 waiting, 0 running" in listed.output
    assert cli("keys", "unset", "tenant:premium-*").exit_code == 0
    assert cli("keys", "unset", "tenant:premium-*").exit_code == 1
    assert cli("queues", "fair", "f").exit_code == 0
    assert client.fair_queues() == ["f"]


def test_the_fair_claim_reads_the_claim_index_without_sorting(client: Client, conn: Connection) -> None:
    for start in range(0, 20_000, 5_000):
        client.enqueue_many([JobSpec("t", {}, queue="f", fair_key=f"k{n % 1000}") for n in range(start, start + 5_000)])
    conn.execute("ANALYZE miniqueue_jobs_live")
    plan = conn.execute(
        "EXPLAIN (FORMAT JSON) SELECT id FROM miniqueue_jobs"
        " WHERE state = 'available' AND queue = 'f' AND limits IS NULL AND scheduled_at <= now()"
        " ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT 100 FOR UPDATE SKIP LOCKED"
    ).fetchone()
    assert plan is not None
    text = str(plan[0])
    assert "idx_miniqueue_jobs_claim" in text and "Sort" not in text and "Seq Scan" not in text, text
