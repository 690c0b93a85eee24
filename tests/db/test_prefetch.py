"""Prefetch sizing: the policy by itself, then a real worker on a real database holding back and
handing back jobs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.core.errors import ConfigError
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.worker.prefetch import AUTO_CAP, PrefetchPolicy, parse_prefetch

from ..helpers import count, row, wait_until
from ..running import StartWorker


@pytest.mark.parametrize(("given", "parsed"), [("auto", "auto"), ("0", 0), ("250", 250), (7, 7)])
def test_parse_prefetch(given: str | int, parsed: int | str) -> None:
    assert parse_prefetch(given) == parsed


@pytest.mark.parametrize("given", ["-1", "1.5", "lots", "", " auto"])
def test_parse_prefetch_names_the_bad_value(given: str) -> None:
    with pytest.raises(ConfigError, match="use 'auto' or a number of jobs"):
        parse_prefetch(given)


def test_auto_holds_nothing_extra_before_it_has_seen_a_job() -> None:
    assert PrefetchPolicy("auto", concurrency=4, budget=0.1).size() == 0


def test_auto_holds_what_the_threads_finish_within_the_budget() -> None:
    policy = PrefetchPolicy("auto", concurrency=2, budget=0.1)
    for _ in range(10):
        policy.record(0.01)
    assert policy.size() in (19, 20)  # 2 threads x 0.1 s / 10 ms (floored, in floating point)
    for _ in range(300):  # the window forgets: now 1 ms jobs
        policy.record(0.001)
    assert policy.size() in (199, 200)
    for _ in range(300):
        policy.record(0.0)
    assert policy.size() == AUTO_CAP
    assert policy.size(stuck=True) == 0


def test_auto_is_stuck_only_when_every_thread_outlived_the_budget() -> None:
    policy = PrefetchPolicy("auto", concurrency=2, budget=0.1)
    assert not policy.stuck([5.0])  # a thread is free
    assert not policy.stuck([5.0, 0.05])
    assert policy.stuck([5.0, 0.2])
    fixed = PrefetchPolicy(10, concurrency=1, budget=0.1)
    assert fixed.size(stuck=True) == 10 and not fixed.stuck([60.0])


def test_a_new_worker_claims_only_its_free_threads(
    client: Client,
    conn: Connection,
    start_worker: StartWorker,
) -> None:
    app = App()
    release = threading.Event()
    app.task("block")(lambda job: release.wait(10))
    for _ in range(20):
        app.enqueue(client, "block")
    try:
        start_worker(app, concurrency=2)
        wait_until(lambda: count(conn, "state = 'running'") == 2, what="two jobs running")
        assert count(conn, "state = 'running'") == 2, "nothing is prefetched before a job was seen"
    finally:
        release.set()
    wait_until(lambda: count(conn, "state = 'completed'") == 20, what="every job completed")


def test_jobs_waiting_behind_a_long_job_are_handed_back_for_another_worker(
    client: Client,
    conn: Connection,
    start_worker: StartWorker,
) -> None:
    app = App()
    long_started, release = threading.Event(), threading.Event()
    ran_by: dict[int, str] = {}

    @app.task("long")
    def long(job: Job) -> None:
        long_started.set()
        release.wait(20)

    @app.task("short")
    def short(job: Job) -> None:
        ran_by[job.id] = job.worker_id

    warmup = [app.enqueue(client, "short").id for _ in range(20)]
    first = start_worker(app, concurrency=1, prefetch_budget=0.1)
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in warmup), what="warm-up jobs completed")
    try:
        with conn.transaction():  # one commit: the first worker's next claim takes the long job and shorts
            long_id = app.enqueue(client, "long", priority=1, conn=conn).id
            shorts = [app.enqueue(client, "short", conn=conn).id for _ in range(50)]
        assert long_started.wait(10)
        second = start_worker(app, concurrency=1)
        wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in shorts), what="short jobs completed")
        assert row(conn, long_id)["state"] == "running", "the short jobs did not wait for the long one"
        handed_back = [i for i in shorts if row(conn, i)["errors"]]
        assert handed_back, "the first worker had prefetched short jobs behind the long one"
        for job_id in handed_back:
            assert ran_by[job_id] == second.worker.worker_id
            [note] = [e["error"] for e in row(conn, job_id)["errors"]]
            assert note.startswith("handed back unstarted: every handler thread of its worker was busy past")
            assert row(conn, job_id)["max_attempts"] - row(conn, job_id)["attempt"] == 4, "no attempt spent"
    finally:
        release.set()
    wait_until(lambda: row(conn, long_id)["state"] == "completed", what="the long job completed")
    assert first.worker.worker_id != second.worker.worker_id


def test_a_prefetched_job_whose_lease_may_have_ended_is_handed_back_at_once_and_runs(
    client: Client,
    conn: Connection,
    start_worker: StartWorker,
) -> None:
    app = App()
    app.task("slow")(lambda job: time.sleep(1.5))  # the handler's work, outlasting the next job's start-by time
    app.task("next")(lambda job: None)
    with conn.transaction():  # one commit: the worker's first claim takes both
        slow = app.enqueue(client, "slow", priority=1, conn=conn).id
        waiting = app.enqueue(client, "next", conn=conn).id
    # A lease of 2 s renewed every 1.9 s: the prefetched job may start for 1 s after its claim or
    # renewal, so it is overdue when the slow job ends, as after a stall of the whole process.
    start_worker(app, concurrency=1, prefetch=1, lease_duration=2.0, heartbeat_seconds=1.9)
    wait_until(lambda: row(conn, waiting)["state"] == "completed", what="the handed-back job completed")
    [note] = [e["error"] for e in row(conn, waiting)["errors"]]
    assert note.startswith("handed back unstarted: its lease may have ended before it could start")
    assert row(conn, waiting)["max_attempts"] - row(conn, waiting)["attempt"] == 4, "no attempt spent"
    wait_until(lambda: row(conn, slow)["state"] == "completed", what="the slow job completed")


@pytest.mark.parametrize("slow_kind", ["def", "async def"])
def test_in_an_app_of_both_kinds_a_job_waiting_behind_its_own_kind_goes_to_an_idle_worker(
    client: Client,
    conn: Connection,
    start_worker: StartWorker,
    slow_kind: str,
) -> None:
    """Each kind of handler is judged alone: a worker whose one handler thread is busy holds no
    thread job back while its event loop idles (and the reverse), so an idle worker takes it."""
    app = App()
    release = threading.Event()
    if slow_kind == "def":

        @app.task("slow")
        def slow(job: Job) -> None:
            release.wait(20)

        @app.task("other")
        async def other(job: Job) -> None:
            pass

    else:

        @app.task("slow")
        async def slow_async(job: Job) -> None:
            while not release.is_set():
                await asyncio.sleep(0.02)

        @app.task("other")
        def other_def(job: Job) -> None:
            pass

    first = start_worker(app, concurrency=1)
    try:
        with conn.transaction():  # one commit: the first worker's claim takes both
            ids = [app.enqueue(client, "slow", conn=conn).id for _ in range(2)]
        wait_until(lambda: count(conn, "state = 'running'") == 2, what="both slow jobs leased")
        second = start_worker(app, concurrency=1)
        wait_until(
            lambda: {row(conn, i)["leased_by"] for i in ids} == {first.worker.worker_id, second.worker.worker_id},
            what="each worker running one slow job",
        )
        [handed_back] = [i for i in ids if row(conn, i)["errors"]]
        note = row(conn, handed_back)["errors"][0]["error"]
        kind = "handler thread" if slow_kind == "def" else "async handler"
        assert note.startswith(f"handed back unstarted: every {kind} of its worker was busy past")
    finally:
        release.set()
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in ids), what="both completed")
