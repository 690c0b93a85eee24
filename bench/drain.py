"""End-to-end drain through a real ``miniqueue-supervise``, timed on the database clock.

The supervisor is started first and waited for until every worker is idle and waiting. Then
all the jobs are enqueued in ONE transaction (``Client.enqueue_many`` in calls of 1,000, with
NOTIFY), and the clock starts at its commit: ``clock_timestamp()`` read right after COMMIT.
It stops at the last completion, ``max(completed_at)``, so the figure is commit-to-last-
completion on one clock, independent of how quickly this process notices the end (it polls
two index-only lookups every 10 ms). A run fails loudly unless every job completed on its
first charged attempt (see :data:`RAN_ONCE`). The worker processes' RSS is sampled with psutil
before the supervisor stops. Over several databases of one server (:func:`drain_databases`)
the clock starts once the last database's transaction committed and stops at the last
completion on any of them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable, Sequence

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection, connect

from .database import QUEUE, TASK, payload, settle
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

NOOP_APP = "bench.apps:noop_app"
# Claims of about half of this (a worker refills its buffer when half is free): on a 2-core
# machine where a commit costs a millisecond or more, 200 left the drain at 20-24k jobs/s,
# 1,000 reaches the floor (each claim-and-complete statement, with its commit, serves 500 jobs).
PREFETCH = 1000
CONCURRENCY = 1
# Drain rows move this many times --jobs (50,000 by default), like the batch-claim rows.
DRAIN_SCALE = 5
ENQUEUE_BATCH = 1000
POLL_SECONDS = 0.01
DRAIN_TIMEOUT_SECONDS = 900.0

# True once no job is available or leased. Each lookup reads the first entry of a partial index
# (the claim index, the limited jobs' index, the reaper's lease index), so polling costs the
# server next to nothing.
_DRAINED = """
SELECT (SELECT id FROM miniqueue_jobs
         WHERE state = 'available' AND limits IS NULL AND queue = %(queue)s
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT 1) IS NULL
   AND (SELECT id FROM miniqueue_jobs
         WHERE state = 'available' AND limits IS NOT NULL AND queue = %(queue)s
         ORDER BY limits LIMIT 1) IS NULL
   AND (SELECT id FROM miniqueue_jobs
         WHERE state = 'running' AND lease_expires_at IS NOT NULL
         ORDER BY lease_expires_at LIMIT 1) IS NULL
"""

#: A job that ran once: completed on its first charged attempt. A prefetched job that a worker
#: hands back unstarted (every handler thread busy past the prefetch budget, which a loaded
#: machine causes even with short jobs, or the worker stopping) had its attempt counted by the
#: claim and is given it back as one more ``max_attempts`` (see the store's release): it never
#: ran there, and it is no failure. A failed, retried or recovered attempt is charged.
RAN_ONCE = "state = 'completed' AND attempt - (max_attempts - attempt_budget) = 1"
#: Jobs a worker handed back unstarted at least once (for the message of a failed run).
HANDED_BACK = "max_attempts > attempt_budget"

_OUTCOME = f"""
SELECT count(*),
       count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE {RAN_ONCE}),
       extract(epoch FROM max(completed_at) - %(committed)s::timestamptz)::float8,
       count(*) FILTER (WHERE {HANDED_BACK})
  FROM miniqueue_jobs
 WHERE id > %(before)s
"""

# The jobs already in the table (a row may seed history first): only later ones are checked.
_LAST_ID = "SELECT coalesce(max(id), 0) FROM miniqueue_jobs"


def drain(ctx: Context) -> Sample:
    """``ctx.workers`` supervised workers drain 5 x --jobs no-op jobs enqueued in one transaction."""
    options = SuperviseOptions(NOOP_APP, ctx.workers, concurrency=CONCURRENCY, prefetch=PREFETCH)
    return drain_through_supervisor(ctx.dsn, options, noop_jobs(ctx))


def drain_default(ctx: Context) -> Sample:
    """The same drain with no tuning flag: ``miniqueue-supervise --app ... --workers N``."""
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), noop_jobs(ctx))


def noop_jobs(ctx: Context) -> list[JobSpec]:
    """The plain drains' jobs: 5 x --jobs no-op jobs of one queue."""
    return [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs * DRAIN_SCALE)]


#: Enqueues a drain's jobs and returns the database clock read right after its last commit, on
#: the connection it is given (to the first database of the drain).
Enqueue = Callable[[Connection], dt.datetime]


def drain_through_supervisor(dsn: str, options: SuperviseOptions, jobs: Sequence[JobSpec]) -> Sample:
    """Start the supervisor, enqueue ``jobs`` in one transaction, time commit to last completion."""
    return drain_databases([dsn], options, len(jobs), lambda conn: enqueue_in_one_transaction(dsn, conn, jobs))


def drain_databases(dsns: Sequence[str], options: SuperviseOptions, jobs: int, enqueue: Enqueue) -> Sample:
    """Start the supervisor (``options.shards`` names the databases of a map, ``dsns[0]`` is the
    database otherwise), ``enqueue`` ``jobs`` jobs, time its commit to the last completion on any
    of ``dsns`` (every job must run once on one of them)."""
    for dsn in dsns:
        settle(dsn)
    with supervised(dsns[0], options) as supervisor, contextlib.ExitStack() as stack:
        conns = [stack.enter_context(connect(dsn, purpose="bench-drain")) for dsn in dsns]
        cpu_before = supervisor.worker_cpu_seconds()  # idle workers: the enqueue costs them nothing
        befores = [_last_id(conn) for conn in conns]
        committed_at = enqueue(conns[0])
        for conn in conns:  # no job moves between databases: one found drained stays drained
            wait_drained(conn)
        cpu = supervisor.worker_cpu_seconds() - cpu_before
        rss_mb = supervisor.worker_rss_mb()
        seconds = check_outcomes(list(zip(conns, befores, strict=True)), committed_at, jobs)
    return Sample(jobs=jobs, seconds=seconds, p50_ms=None, p99_ms=None, rss_mb=rss_mb, worker_cores=cpu / seconds)


def _last_id(conn: Connection) -> int:
    row = conn.execute(_LAST_ID).fetchone()
    return int(row[0]) if row else 0


def enqueue_in_one_transaction(dsn: str, conn: Connection, jobs: Sequence[JobSpec]) -> dt.datetime:
    """Enqueue every job in one transaction on ``conn``; return the database clock right after COMMIT."""
    with Client(dsn) as client:
        with conn.transaction():
            for start in range(0, len(jobs), ENQUEUE_BATCH):
                client.enqueue_many(jobs[start : start + ENQUEUE_BATCH], conn=conn)
        return database_clock(conn)


def database_clock(conn: Connection) -> dt.datetime:
    """The server's ``clock_timestamp()`` now (not the transaction's start, as ``now()`` is)."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    now: dt.datetime = row[0]
    return now


def drained(conn: Connection) -> bool:
    """Whether no job of the bench's queue is available or running."""
    row = conn.execute(_DRAINED, {"queue": QUEUE}).fetchone()
    return bool(row and row[0])


def wait_drained(conn: Connection) -> None:
    """Poll until no job is available or running; raise after DRAIN_TIMEOUT_SECONDS."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    while True:
        if drained(conn):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the supervisor did not drain the queue within {DRAIN_TIMEOUT_SECONDS:.0f} s")
        time.sleep(POLL_SECONDS)


def _check_outcome(conn: Connection, committed_at: dt.datetime, jobs: int, before: int) -> float:
    """Seconds from the commit to the last completion; raises unless every job ran once (RAN_ONCE)."""
    return check_outcomes([(conn, before)], committed_at, jobs)


def check_outcomes(databases: Sequence[tuple[Connection, int]], committed_at: dt.datetime, jobs: int) -> float:
    """Seconds from the commit to the last completion on any of ``databases`` (each a connection
    and the last id it held before the enqueue); raises unless, over all of them, every job
    ran once (RAN_ONCE)."""
    rows = [
        conn.execute(_OUTCOME, {"committed": committed_at, "before": before}).fetchone() for conn, before in databases
    ]
    found = [row for row in rows if row is not None]
    total, completed, ran_once, handed_back = (sum(int(row[i]) for row in found) for i in (0, 1, 2, 4))
    ends = [float(row[3]) for row in found if row[3] is not None]
    if not total == completed == ran_once == jobs or not ends:
        raise RuntimeError(
            f"{jobs} jobs enqueued, {total} stored, {completed} completed, {ran_once} on their first charged "
            f"attempt ({handed_back} handed back unstarted at least once)"
        )
    return max(ends)


BENCHMARKS: list[Benchmark] = [
    *(
        Benchmark(f"drain-{n}-default", "supervise drain, no-op, defaults (no tuning flag)", n, drain_default)
        for n in (1, 2, 4, 8)
    ),
    *(
        Benchmark(
            f"drain-{n}",
            f"supervise drain, no-op (--prefetch {PREFETCH} --concurrency {CONCURRENCY})",
            n,
            drain,
        )
        for n in (1, 2, 4, 8)
    ),
]
