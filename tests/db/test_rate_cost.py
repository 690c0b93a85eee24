"""Weighted rate limits: a job takes its ``rate_cost`` in tokens from its rate limit's bucket when
it is claimed, waits while the bucket cannot cover it (never claimed on credit), and a cost the
bucket could never hold is refused at enqueue."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from miniqueue import App, Client, InvalidInput, JobSpec
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.core.records import Lease
from miniqueue.store.store import Store
from miniqueue.tasks.job import Job
from miniqueue.testing import run_jobs

from ..helpers import assert_refused_and_nothing_stored, count, row, wait_until
from ..running import StartWorker


def claim(store: Store, conn: Connection, limit: int = 10) -> list[int]:
    leases: list[Lease] = store.claim(conn, ["default"], "w", 30.0, limit)
    return sorted(lease.id for lease in leases)


def fill_buckets(conn: Connection) -> None:
    """Move every bucket's last refill a minute back: each holds its full size at the next claim."""
    conn.execute("UPDATE miniqueue_limits SET refilled_at = refilled_at - interval '1 minute'")


def tokens(conn: Connection, scope: str) -> float:
    [(left,)] = conn.execute("SELECT tokens FROM miniqueue_limits WHERE scope = %s", [scope]).fetchall()
    return float(left)


# -- the claim ----------------------------------------------------------------------------------------


def test_a_job_takes_its_cost_from_the_bucket(client: Client, store: Store, conn: Connection) -> None:
    jobs = [client.enqueue("api", {"i": i}, rate_limit="3/s", rate_cost=3).id for i in range(3)]
    assert [row(conn, job_id)["rate_cost"] for job_id in jobs] == [3, 3, 3]
    assert claim(store, conn) == [], "a new bucket holds one token: not enough for a cost of 3"
    fill_buckets(conn)
    assert claim(store, conn) == jobs[:1], "a full bucket of 3 pays for one job of cost 3"
    assert tokens(conn, "rate api") == pytest.approx(0, abs=0.5)
    assert claim(store, conn) == []
    assert count(conn, "id = ANY(%s) AND state = 'available' AND attempt = 0", [jobs[1:]]) == 2


def test_a_job_the_tokens_cannot_cover_waits_and_holds_back_the_cheaper_jobs_behind_it(
    client: Client, store: Store, conn: Connection
) -> None:
    cheap = client.enqueue("api", {}, rate_limit="3/s", priority=2).id
    dear = client.enqueue("api", {}, rate_limit="3/s", rate_cost=3, priority=1).id
    behind = client.enqueue("api", {}, rate_limit="3/s").id
    fill_buckets(conn)
    assert claim(store, conn) == [cheap], "3 tokens: 1 for the first, then 3 more do not fit"
    assert tokens(conn, "rate api") >= 0, "never claimed on credit"
    fill_buckets(conn)
    assert claim(store, conn) == [dear], "the dear job goes first once the bucket covers it"
    fill_buckets(conn)
    assert claim(store, conn) == [behind]


def test_costs_add_up_in_a_scope_that_groups_share(client: Client, store: Store, conn: Connection) -> None:
    a = client.enqueue("api", {}, rate_limit="4/s", rate_cost=3, concurrency_key="a").id
    client.enqueue("api", {}, rate_limit="4/s", rate_cost=2, concurrency_key="b")
    fill_buckets(conn)
    assert claim(store, conn) == [a], "two groups share 'rate api': 3 + 2 tokens do not fit in 4"
    assert tokens(conn, "rate api") == pytest.approx(1, abs=0.5)


def test_jobs_without_a_cost_cost_one(client: Client, store: Store, conn: Connection) -> None:
    plain = client.enqueue("t", {}).id
    limited = client.enqueue("api", {}, rate_limit="3/s").id
    assert (row(conn, plain)["rate_cost"], row(conn, limited)["rate_cost"]) == (1, 1)
    fill_buckets(conn)
    client.enqueue_many([JobSpec("api", {"i": i}, rate_limit="3/s") for i in range(2)])
    assert len(claim(store, conn)) == 4, "the bucket's 3 tokens pay for three jobs, and the plain one is free"


def test_every_enqueue_path_stores_the_cost(client: Client, conn: Connection) -> None:
    batch = client.enqueue_many(
        [JobSpec("api", {}, rate_limit="5/s", rate_cost=c) for c in (1, 4, 2)]
        + [JobSpec("api", {}, rate_limit="5/s", rate_cost=5, unique_key="u")]
    )
    assert [row(conn, r.id)["rate_cost"] for r in batch] == [1, 4, 2, 5]
    keyed = client.enqueue("api", {}, rate_limit="5/s", rate_cost=3, unique_key="k").id
    replacing = client.enqueue("api", {}, rate_limit="5/s", rate_cost=2, unique_key="r", on_conflict="replace").id
    child = client.enqueue("api", {}, rate_limit="5/s", rate_cost=4, depends_on=[keyed]).id
    [first, second] = client.chain([JobSpec("api", {}, rate_limit="5/s", rate_cost=c) for c in (2, 3)])
    costs = [row(conn, job_id)["rate_cost"] for job_id in (keyed, replacing, child, first.id, second.id)]
    assert costs == [3, 2, 4, 2, 3]


# -- through workers, on the database clock -----------------------------------------------------------


def recorded_starts(dsn: str, conn: Connection, start_worker: StartWorker, cost: int, jobs: int) -> list[dt.datetime]:
    """Run ``jobs`` jobs of cost ``cost`` under a 3/s bucket on a worker; their starts, as the
    database's clock recorded them, in order."""
    conn.execute("DROP TABLE IF EXISTS rate_cost_starts")
    conn.execute("CREATE TABLE rate_cost_starts (job_id BIGINT, at TIMESTAMPTZ)")
    app = App()

    @app.task("api", rate_limit="3/s", rate_cost=cost)
    def api(job: Job) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO rate_cost_starts VALUES (%s, clock_timestamp())", [job.id])

    with Client(dsn) as client:
        client.enqueue_many([app.task_spec("api", {"i": i}) for i in range(jobs)])
    start_worker(app, concurrency=4)
    wait_until(lambda: count(conn, "state = 'completed'") == jobs, timeout=30, what=f"{jobs} jobs completed")
    starts = [at for (at,) in conn.execute("SELECT at FROM rate_cost_starts ORDER BY at").fetchall()]
    conn.execute("DROP TABLE rate_cost_starts")  # the database outlives the test
    return starts


def test_jobs_of_cost_3_under_3_a_second_start_a_second_apart(
    dsn: str, conn: Connection, start_worker: StartWorker
) -> None:
    starts = recorded_starts(dsn, conn, start_worker, cost=3, jobs=4)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(starts)]
    assert all(0.9 <= gap <= 5 for gap in gaps), gaps


def test_jobs_of_cost_1_of_the_same_bucket_go_three_a_second(
    dsn: str, conn: Connection, start_worker: StartWorker
) -> None:
    starts = recorded_starts(dsn, conn, start_worker, cost=1, jobs=7)
    # The first starts on the new bucket's token; the six after it need two seconds' refill.
    span = (starts[-1] - starts[0]).total_seconds()
    assert 1.5 <= span <= 5, span
    for i, at in enumerate(starts):
        within = [s for s in starts[i:] if (s - at).total_seconds() < 1 - 0.05]
        assert len(within) <= 3 + 1, "at most the bucket's size plus one second's refill"


# -- declared by the task ---------------------------------------------------------------------------


def test_a_tasks_declared_cost_applies_to_a_bare_client(dsn: str, client: Client, conn: Connection) -> None:
    app = App()
    app.task("report", rate_limit="10/s", rate_cost=4)(lambda job: None)
    run_jobs(app, client)  # a worker of the app publishes its declarations
    declared = conn.execute("SELECT rate_limit, rate_cost FROM miniqueue_tasks WHERE task = 'report'").fetchone()
    assert declared == ("10/s", 4)
    with Client(dsn) as bare:
        by_name = bare.enqueue("report", {}).id
        overridden = bare.enqueue("report", {}, rate_cost=1).id
    assert (row(conn, by_name)["rate_cost"], row(conn, overridden)["rate_cost"]) == (4, 1)
    assert row(conn, by_name)["limits"] == ["rate report"]
    assert row(conn, app.enqueue(client, "report", {}, rate_cost=2).id)["rate_cost"] == 2


def test_a_task_refuses_a_bad_cost_at_registration() -> None:
    app = App()
    with pytest.raises(InvalidInput, match="rate_cost 2 needs a rate_limit"):
        app.task("t", rate_cost=2)(lambda job: None)
    with pytest.raises(InvalidInput, match="rate_cost 11 is invalid: the rate limit's bucket never holds more than 10"):
        app.task("t", rate_limit="10/s", rate_cost=11)(lambda job: None)
    with pytest.raises(InvalidInput, match="rate_cost 0 is invalid"):
        app.task("t", rate_limit="10/s", rate_cost=0)(lambda job: None)
    assert app.tasks == {}


# -- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": "3/s", "rate_cost": 0}, "rate_cost 0 is invalid: use a whole number of tokens, at least 1"),
        ({"rate_limit": "3/s", "rate_cost": -2}, "rate_cost -2 is invalid"),
        ({"rate_limit": "3/s", "rate_cost": 1.5}, "rate_cost 1.5 is invalid"),
        ({"rate_limit": "3/s", "rate_cost": 2.0}, "rate_cost 2.0 is invalid"),
        ({"rate_limit": "3/s", "rate_cost": True}, "rate_cost True is invalid"),
        ({"rate_limit": "3/s", "rate_cost": "2"}, "rate_cost '2' is invalid"),
        ({"rate_cost": 2}, "rate_cost 2 needs a rate_limit"),
        ({"rate_cost": 1}, "rate_cost 1 needs a rate_limit"),
        ({"rate_limit": "3/s", "rate_cost": 4}, "rate_cost 4 is invalid: .* bucket never holds more than 3 tokens"),
        ({"rate_limit": "30/min", "rate_cost": 2}, "rate_cost 2 is invalid: .* bucket never holds more than 1 tokens"),
    ],
)
def test_a_bad_cost_is_refused_and_nothing_is_stored(
    client: Client, conn: Connection, options: dict[str, Any], message: str
) -> None:
    assert_refused_and_nothing_stored(client, conn, options, message)


# -- the command line ---------------------------------------------------------------------------------


def test_the_cli_enqueues_with_a_cost(dsn: str, client: Client, conn: Connection) -> None:
    app = App()
    app.task("report", rate_limit="10/s")(lambda job: None)
    run_jobs(app, client)
    result = CliRunner().invoke(main, ["enqueue", "report", "--rate-cost", "5", "--json", "--database-url", dsn])
    assert result.exit_code == 0, result.output
    [(cost,)] = conn.execute("SELECT rate_cost FROM miniqueue_jobs WHERE state = 'available'").fetchall()
    assert cost == 5
    refused = CliRunner().invoke(main, ["enqueue", "plain", "--rate-cost", "2", "--database-url", dsn])
    assert refused.exit_code != 0
    assert "rate_cost 2 needs a rate_limit" in refused.output
    assert count(conn, "task = 'plain'") == 0
