"""Workflows end to end through a real ``miniqueue-supervise``: a chain and a group of no-op jobs.

``chain-N``: a chain of --jobs/10 no-op steps (1,000 by default), each released by the
completion of the one before it. ``group-N``: --jobs no-op members (10,000 by default) and one
callback released by the last member's completion. Both are enqueued in one transaction while
the supervisor's workers (its defaults: no tuning flag) wait idle; the clock runs from that
commit (``clock_timestamp()``) to the last job's ``completed_at``, on the database clock. A run
fails loudly unless every job completed exactly once, on its first charged attempt (a job
handed back unstarted is not charged: see ``bench.drain.RAN_ONCE``).

``wait-wake``: how soon ``Client.wait`` returns after the job's completion commits. A thread
waits on a job; this process claims and completes it (with a result) on its own connection; the
waiter reads ``clock_timestamp()`` as soon as ``wait`` returns, on a connection it reuses. The
latency is that instant minus the job's ``completed_at`` (one clock), per job, for 50 jobs.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection, connect
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, settle
from .drain import NOOP_APP, RAN_ONCE
from .measure import Sample, percentile
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

#: A chain has this fraction of --jobs steps: one at a time, each a round trip of the queue.
CHAIN_FRACTION = 10
WAIT_SECONDS = 900.0

#: Enqueues a workflow on the connection (inside its transaction); returns the id of its last job.
_Enqueue = Callable[[Client, Connection], int]

_OUTCOME = f"""
SELECT count(*), count(*) FILTER (WHERE {RAN_ONCE}),
       extract(epoch FROM max(completed_at) - %(committed)s::timestamptz)::float8
  FROM miniqueue_jobs
"""


def chain(ctx: Context) -> Sample:
    """A chain of ``ctx.jobs / 10`` no-op steps, one after another."""
    steps = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(max(2, ctx.jobs // CHAIN_FRACTION))]
    return _run(ctx, lambda client, conn: [r.id for r in client.chain(steps, conn=conn)][-1], len(steps))


def group(ctx: Context) -> Sample:
    """``ctx.jobs`` no-op members in parallel, then one callback."""
    members = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs)]
    then = JobSpec(TASK, payload(-1), queue=QUEUE)
    return _run(ctx, lambda client, conn: client.group(members, then=then, conn=conn).then.id, len(members) + 1)


def _run(ctx: Context, enqueue: _Enqueue, jobs: int) -> Sample:
    settle(ctx.dsn)
    options = SuperviseOptions(NOOP_APP, ctx.workers)
    with (
        supervised(ctx.dsn, options) as supervisor,
        Client(ctx.dsn) as client,
        connect(ctx.dsn, purpose="bench-workflow") as conn,
    ):
        with conn.transaction():
            last = enqueue(client, conn)
        committed_at = _clock(conn)
        client.wait(last, timeout=WAIT_SECONDS)
        rss_mb = supervisor.worker_rss_mb()
        seconds = _check(conn, committed_at, jobs)
    return Sample(jobs=jobs, seconds=seconds, p50_ms=None, p99_ms=None, rss_mb=rss_mb)


def _clock(conn: Connection) -> dt.datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def _check(conn: Connection, committed_at: dt.datetime, jobs: int) -> float:
    row = conn.execute(_OUTCOME, {"committed": committed_at}).fetchone()
    assert row is not None
    total, first_attempt, seconds = int(row[0]), int(row[1]), row[2]
    if not total == first_attempt == jobs or seconds is None:
        raise RuntimeError(
            f"{jobs} jobs enqueued, {total} stored, {first_attempt} completed on their first charged attempt"
        )
    return float(seconds)


WAKES = 50
TINY_WAKES = 3
_COMPLETED_AT = "SELECT completed_at FROM miniqueue_jobs WHERE id = %s"


def wait_wake(ctx: Context) -> Sample:
    """Completion commit to ``wait`` returning, for WAKES jobs one at a time."""
    store = Store()
    latencies: list[float] = []
    wakes = ctx.sized(WAKES, TINY_WAKES)
    with (
        Client(ctx.dsn) as client,
        connect(ctx.dsn, purpose="bench-wait") as conn,
        connect(ctx.dsn, purpose="bench-waiter") as clock,
    ):
        for n in range(wakes):
            job_id = client.enqueue(TASK, payload(n), queue=QUEUE).id
            woke: list[dt.datetime] = []
            waiter = threading.Thread(target=_wait_then_read_clock, args=(client, job_id, clock, woke))
            waiter.start()
            _wait_flagged(conn, job_id)
            [lease] = store.claim(conn, [QUEUE], "bench-waker", 30.0, 1)
            store.complete(conn, lease.id, "bench-waker", lease.attempt, result='{"n": 1}')
            waiter.join(30)
            row = conn.execute(_COMPLETED_AT, [job_id]).fetchone()
            assert row is not None and woke, "the waiter did not return"
            latencies.append((woke[0] - row[0]).total_seconds() * 1000)
    return Sample(
        jobs=wakes,
        seconds=sum(latencies) / 1000,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        rss_mb=None,
    )


def _wait_then_read_clock(client: Client, job_id: int, clock: Connection, woke: list[dt.datetime]) -> None:
    client.wait(job_id, timeout=30)
    woke.append(_clock(clock))


def _wait_flagged(conn: Connection, job_id: int) -> None:
    """Poll (every ms, up to 10 s) until the waiter has flagged the job as awaited."""
    for _ in range(10_000):
        row = conn.execute("SELECT awaited FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
        if row and row[0]:
            return
        time.sleep(0.001)
    raise RuntimeError(f"job {job_id} was never flagged as awaited")


BENCHMARKS: list[Benchmark] = [
    *(Benchmark(f"chain-{n}", "chain of --jobs/10 no-op steps, end to end", n, chain) for n in (1, 2)),
    *(Benchmark(f"group-{n}", "group of --jobs no-op members + 1 callback, end to end", n, group) for n in (1, 2)),
    Benchmark("wait-wake", "Client.wait: completion commit -> wait returns (ms)", 1, wait_wake, throughput=False),
]
