"""Priority aging: in a queue with ``age_after``, the reaper raises each due job's priority one step
per interval it has been due, up to the queue's top, so that the claim takes a job that waited
long enough before the newer ones. Each pass is the reaper's ``run_once()``, called here; a job
"due long ago" is one whose due time the test moved back, never a wait."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from typing import Any

import pytest
from click.testing import CliRunner, Result

from miniqueue import AsyncClient, Client, InvalidInput, JobSpec, Reaper, ReaperConfig
from miniqueue.cli.main import main
from miniqueue.core.db import Connection, connect
from miniqueue.maintenance import reaper as reaper_module
from miniqueue.store.store import Store

from ..helpers import db_now, make_running, row

W = "test-host:1:aging"
MINUTE = 60.0


def due_for(conn: Connection, seconds: float, *ids: int) -> None:
    """Move the jobs' due time ``seconds`` into the past (as if they had waited that long)."""
    conn.execute(
        "UPDATE miniqueue_jobs SET scheduled_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)",
        [seconds, list(ids)],
    )


def reap(dsn: str, batch_size: int = 1000) -> int:
    """One reaper pass; how many jobs it raised."""
    reaper = Reaper(dsn, ReaperConfig(prune=False, vacuum=False, batch_size=batch_size))
    try:
        return reaper.run_once().aged
    finally:
        reaper.close()


def priorities(conn: Connection, *ids: int) -> list[tuple[int, int | None]]:
    """Each job's (priority, aged_from), in the order given."""
    return [(row(conn, i)["priority"], row(conn, i)["aged_from"]) for i in ids]


def cli(dsn: str, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--database-url", dsn], env={"DATABASE_URL": None})


def aging_rows(conn: Connection) -> dict[str, float | None]:
    return dict(conn.execute("SELECT name, age_after FROM miniqueue_queues").fetchall())


# --- what the reaper raises ----------------------------------------------------------------------


def test_a_job_due_three_intervals_ago_rises_three_steps(client: Client, conn: Connection, dsn: str) -> None:
    client.enqueue("t", queue="q", priority=10)
    old = client.enqueue("t", queue="q", run_at=db_now(conn) - dt.timedelta(seconds=3 * MINUTE + 5)).id
    client.age_queue("q", MINUTE)
    assert reap(dsn) == 1
    assert priorities(conn, old) == [(3, 0)]
    assert client.get(old).describe_priority() == "3 (enqueued at 0, aged)"
    assert reap(dsn) == 0, "the next step is an interval away"
    due_for(conn, 4 * MINUTE + 5, old)
    assert reap(dsn) == 1
    assert priorities(conn, old) == [(4, 0)], "each step counts from the priority it was enqueued with"


def test_a_job_never_rises_above_the_queues_top(client: Client, conn: Connection, dsn: str) -> None:
    client.enqueue("t", queue="q", priority=5)
    old = client.enqueue("t", queue="q", priority=-3).id
    alone = client.enqueue("t", queue="solo").id
    due_for(conn, 100 * MINUTE, old, alone)
    client.age_queue("q", MINUTE)
    client.age_queue("solo", MINUTE)
    assert reap(dsn) == 1
    assert priorities(conn, old) == [(5, -3)]
    assert priorities(conn, alone) == [(0, None)], "alone in its queue, a job is its top already"


def test_the_top_counts_the_jobs_with_limits_and_the_limited_jobs_age_too(
    client: Client, conn: Connection, dsn: str
) -> None:
    client.enqueue("t", queue="q", priority=7, concurrency_key="k", max_concurrent=1)
    plain = client.enqueue("t", queue="q").id
    limited = client.enqueue("t", queue="q", concurrency_key="other", max_concurrent=1).id
    due_for(conn, 2 * MINUTE + 1, plain, limited)
    client.age_queue("q", MINUTE)
    assert reap(dsn) == 2
    assert priorities(conn, plain, limited) == [(2, 0), (2, 0)]
    due_for(conn, 50 * MINUTE, plain, limited)
    reap(dsn)
    assert priorities(conn, plain, limited) == [(7, 0), (7, 0)]


def test_the_top_among_jobs_with_limits_is_read_again_after_a_while(
    client: Client, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It takes a probe per group of limits, so a reaper reads it every LIMITED_TOP_SECONDS; the
    top among the jobs without limits is read at every pass."""
    monkeypatch.setattr(reaper_module, "LIMITED_TOP_SECONDS", 3600.0)
    client.enqueue("t", queue="q", priority=5, concurrency_key="a", max_concurrent=1)
    old = client.enqueue("t", queue="q").id
    due_for(conn, 20 * MINUTE, old)
    client.age_queue("q", MINUTE)
    reaper = Reaper(dsn, ReaperConfig(prune=False, vacuum=False))
    try:
        reaper.run_once()
        assert priorities(conn, old) == [(5, 0)]
        client.enqueue("t", queue="q", priority=8, concurrency_key="b", max_concurrent=1)
        reaper.run_once()
        assert priorities(conn, old) == [(5, 0)], "the top among jobs with limits as last read"
        client.enqueue("t", queue="q", priority=7)
        reaper.run_once()
        assert priorities(conn, old) == [(7, 0)], "the top among jobs without limits, read at every pass"
        monkeypatch.setattr(reaper_module, "LIMITED_TOP_SECONDS", 0.0)
        reaper.run_once()
        assert priorities(conn, old) == [(8, 0)]
    finally:
        reaper.close()


def test_queues_without_aging_and_jobs_not_waiting_are_left_alone(
    client: Client, conn: Connection, dsn: str, store: Store
) -> None:
    client.enqueue("t", queue="q", priority=10)
    client.enqueue("t", queue="plain", priority=10)
    running = client.enqueue("t", queue="q").id
    later = client.enqueue("t", queue="q", delay=3600).id
    plain = client.enqueue("t", queue="plain").id
    fresh = client.enqueue("t", queue="q").id
    make_running(conn, running, W, 30)
    due_for(conn, 10 * MINUTE, running, plain)
    due_for(conn, MINUTE - 1, fresh)
    client.age_queue("q", MINUTE)
    assert reap(dsn) == 0
    assert priorities(conn, running, later, plain, fresh) == [(0, None)] * 4


def test_a_job_a_claim_holds_is_passed_over_and_raised_at_the_next_pass(
    client: Client, conn: Connection, dsn: str
) -> None:
    """The reaper never waits on a row a claim has locked (SKIP LOCKED): it goes on, and raises
    the job at a later pass if it is still waiting."""
    client.enqueue("t", queue="q", priority=10)
    held = client.enqueue("t", queue="q").id
    free = client.enqueue("t", queue="q").id
    due_for(conn, 2 * MINUTE + 1, held, free)
    client.age_queue("q", MINUTE)
    with connect(dsn, purpose="test") as claimer, claimer.transaction():
        claimer.execute("SELECT id FROM miniqueue_jobs WHERE id = %s FOR UPDATE", [held])
        assert reap(dsn) == 1
        assert priorities(conn, held, free) == [(0, None), (2, 0)]
    assert reap(dsn) == 1
    assert priorities(conn, held) == [(2, 0)]


def test_the_claim_takes_the_aged_job_before_a_newer_one_once_it_outranks_it(
    client: Client, conn: Connection, dsn: str, store: Store
) -> None:
    """Claim order: priority (as aging left it), then due time, then id."""
    old = client.enqueue("t", queue="q").id
    newer = [client.enqueue("t", queue="q", priority=10).id for _ in range(2)]
    client.age_queue("q", MINUTE)
    due_for(conn, 9 * MINUTE + 1, old)
    reap(dsn)
    assert priorities(conn, old) == [(9, 0)]
    assert [lease.id for lease in store.claim(conn, ["q"], W, 30, 1)] == [newer[0]], "9 is still below 10"
    due_for(conn, 10 * MINUTE + 1, old)
    reap(dsn)
    assert priorities(conn, old) == [(10, 0)]
    assert [lease.id for lease in store.claim(conn, ["q"], W, 30, 1)] == [old], "due first, at the same priority"


def test_a_job_aged_and_retried_keeps_its_raised_priority(
    client: Client, conn: Connection, dsn: str, store: Store
) -> None:
    client.enqueue("t", queue="q", priority=10)
    old = client.enqueue("t", queue="q").id
    due_for(conn, 20 * MINUTE, old)
    client.age_queue("q", MINUTE)
    reap(dsn)
    [lease] = store.claim(conn, ["q"], W, 30, 1)
    assert lease.id == old
    store.record_failure(conn, old, W, lease.attempt, "boom", backoff_seconds=0)
    assert row(conn, old)["state"] == "available"
    assert priorities(conn, old) == [(10, 0)], "the retry keeps the priority aging gave it"
    reap(dsn)
    assert priorities(conn, old) == [(10, 0)], "aging never lowers a priority"


def test_a_pass_sweeps_every_job_in_batches_each_raised_once(client: Client, conn: Connection, dsn: str) -> None:
    """Batches of 2 over levels of the claim index and groups of the limited jobs' index: every
    job that rises is raised, to its level, whatever batch reads it."""
    client.enqueue("t", queue="q", priority=20)
    specs = [JobSpec("t", queue="q", priority=p) for p in (0, 0, 3, 3, 5)]
    specs += [JobSpec("t", queue="q", priority=p, concurrency_key=k, max_concurrent=1) for p, k in ((0, "a"), (4, "b"))]
    ids = [r.id for r in client.enqueue_many(specs)]
    for steps, job_id in enumerate(ids, 2):
        due_for(conn, steps * MINUTE + 1, job_id)
    client.age_queue("q", MINUTE)
    assert reap(dsn, batch_size=2) == len(ids)
    expected = [(min(20, p + steps), p) for steps, p in enumerate((0, 0, 3, 3, 5, 0, 4), 2)]
    assert priorities(conn, *ids) == expected


def test_a_sweep_cut_short_goes_on_at_the_next_pass_and_then_to_the_next_queue(
    client: Client, conn: Connection, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reaper_module, "AGING_SLICE", 0.0)  # one batch a pass
    for queue in ("a", "b"):
        client.enqueue("t", queue=queue, priority=10)
    ids = {queue: [client.enqueue("t", queue=queue).id for _ in range(3)] for queue in ("a", "b")}
    due_for(conn, 2 * MINUTE + 1, *ids["a"], *ids["b"])
    for queue in ids:
        client.age_queue(queue, MINUTE)
    reaper = Reaper(dsn, ReaperConfig(prune=False, vacuum=False, batch_size=2))
    try:
        assert [reaper.run_once().aged for _ in range(4)] == [2, 3, 1, 0]
    finally:
        reaper.close()
    assert {p for q in ids for p in priorities(conn, *ids[q])} == {(2, 0)}


# --- setting it ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1.5, math.nan, math.inf, True, "60", 1e12])
def test_a_bad_interval_is_refused_and_nothing_is_stored(client: Client, conn: Connection, bad: Any) -> None:
    client.enqueue("t", queue="q")
    with pytest.raises(InvalidInput, match=r"age_after .* is invalid: use a positive number of seconds"):
        client.age_queue("q", bad)
    assert aging_rows(conn) == {}


def test_the_client_sets_shows_and_turns_aging_off(client: Client, conn: Connection) -> None:
    with pytest.raises(InvalidInput, match=r"queue 'nope' is unknown.*pass create=True"):
        client.age_queue("nope", MINUTE)
    assert aging_rows(conn) == {}
    client.age_queue("nope", 90, create=True)
    assert client.queue_aging() == {"nope": 90.0}
    client.age_queue("nope", None)
    assert client.queue_aging() == {}
    assert aging_rows(conn) == {"nope": None}


def test_the_async_client_sets_and_shows_aging(dsn: str, conn: Connection, client: Client) -> None:
    client.enqueue("t", queue="q")

    async def body() -> dict[str, float]:
        async with AsyncClient(dsn) as aclient:
            with pytest.raises(InvalidInput, match="age_after 0 is invalid"):
                await aclient.age_queue("q", 0)
            with pytest.raises(InvalidInput, match="queue 'nope' is unknown"):
                await aclient.age_queue("nope", MINUTE)
            await aclient.age_queue("q", 2.5)
            return await aclient.queue_aging()

    assert asyncio.run(body()) == {"q": 2.5}
    assert aging_rows(conn) == {"q": 2.5}


def test_the_command_line_sets_lists_and_turns_aging_off(client: Client, conn: Connection, dsn: str) -> None:
    client.enqueue("t", queue="q", priority=10)
    old = client.enqueue("t", queue="q").id
    result = cli(dsn, "queues", "age", "q", "60")
    assert result.exit_code == 0, result.output
    assert result.stdout == "queue q: priority rises a step per 60s due\n"
    listed = cli(dsn, "queues", "list")
    assert "priority rises a step per 60s due" in listed.stdout
    assert '"age_after": 60.0' in cli(dsn, "queues", "list", "--json").stdout
    due_for(conn, 5 * MINUTE + 1, old)
    reap(dsn)
    assert "priority: 5 (enqueued at 0, aged)" in cli(dsn, "jobs", "show", str(old)).stdout
    assert '"aged_from": 0' in cli(dsn, "jobs", "show", str(old), "--json").stdout
    off = cli(dsn, "queues", "age", "q", "--off")
    assert off.exit_code == 0 and off.stdout == "queue q: no aging\n"
    assert aging_rows(conn) == {"q": None}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["q", "0"], "0 is not in the range 0<x<="),
        (["q", "--", "-5"], "-5.0 is not in the range 0<x<="),
        (["q", "nan"], "'nan' is not a number of seconds"),
        (["q", "inf"], "inf is not in the range 0<x<="),
        (["q"], "give either SECONDS or --off"),
        (["q", "60", "--off"], "give either SECONDS or --off"),
    ],
)
def test_the_command_line_refuses_a_bad_interval_and_stores_nothing(
    client: Client, conn: Connection, dsn: str, args: list[str], fragment: str
) -> None:
    client.enqueue("t", queue="q")
    result = cli(dsn, "queues", "age", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert aging_rows(conn) == {}


def test_the_command_line_names_an_unknown_queue_and_stores_nothing_without_create(
    client: Client, conn: Connection, dsn: str
) -> None:
    client.enqueue("t", queue="emails")
    result = cli(dsn, "queues", "age", "emials", "60")
    assert result.exit_code == 2
    assert "queue 'emials' is unknown" in result.output and result.output.rstrip().endswith("pass --create")
    assert aging_rows(conn) == {}
    assert cli(dsn, "queues", "age", "emials", "60", "--create").exit_code == 0
    assert aging_rows(conn) == {"emials": 60.0}
