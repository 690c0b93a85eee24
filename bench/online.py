"""A migration while the queue drains (docs/operations/schema.md, "Online migrations").

- ``online-index``: 100 x --jobs no-op jobs (1,000,000 by default) queued, then drained by
  ``miniqueue-supervise --workers 2`` with its defaults; once the drain is under way, a
  migration outside a transaction builds an index ``CONCURRENTLY`` on the hot table (and drops
  it first, as such a file does). ``jobs`` and jobs/s are the drain's; p50 is how long the build
  took and p99 the longest gap between two completions while it ran (the stall it caused), in
  ms on the database clock. A run fails unless every job completed once and the index is valid.
"""

from __future__ import annotations

import threading

from miniqueue import JobSpec
from miniqueue.core.db import connect
from miniqueue.store.migrate import latest_version
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, settle
from .drain import NOOP_APP, RAN_ONCE, enqueue_in_one_transaction, wait_drained
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

#: The drained jobs: this many times --jobs.
ONLINE_SCALE = 100

_INDEX = """-- miniqueue: no transaction
DROP INDEX CONCURRENTLY IF EXISTS idx_bench_online;
CREATE INDEX CONCURRENTLY idx_bench_online ON miniqueue_jobs_live (task, created_at);
"""

# The build's span, and the longest gap between two completions inside it, on the database clock.
_STALL = """
WITH done AS (
    SELECT completed_at, lag(completed_at) OVER (ORDER BY completed_at) AS before FROM miniqueue_jobs
     WHERE completed_at IS NOT NULL)
SELECT extract(epoch FROM max(completed_at - before) FILTER (WHERE completed_at BETWEEN %(start)s AND %(end)s))
  FROM done
"""
# Every job completed on its first charged attempt (a prefetched job handed back unstarted runs
# again uncharged: see bench.drain.RAN_ONCE), and the index valid.
_OUTCOME = f"""
SELECT count(*), count(*) FILTER (WHERE {RAN_ONCE}),
       extract(epoch FROM max(completed_at) - %(committed)s::timestamptz),
       (SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE c.relname = 'idx_bench_online')
  FROM miniqueue_jobs
"""


def online_index(ctx: Context) -> Sample:
    """The drain, with an index built concurrently in the middle of it."""
    count = ctx.jobs * ONLINE_SCALE
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(count)]
    migration = (latest_version() + 1, "bench_online", _INDEX)
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        span: list[object] = []

        def build() -> None:
            with connect(ctx.dsn, purpose="bench-migrate") as own:
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]
                Store().apply_migrations(own, [migration])
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]

        builder = threading.Timer(1.0, build)  # once the drain is under way
        builder.start()
        wait_drained(conn)
        builder.join()
        row = conn.execute(_OUTCOME, {"committed": committed}).fetchone()
        stall = conn.execute(_STALL, {"start": span[0], "end": span[1]}).fetchone()
        conn.execute("DROP INDEX IF EXISTS idx_bench_online")
        conn.execute("DELETE FROM miniqueue_migrations WHERE version > %s", [latest_version()])
    assert row is not None and stall is not None
    total, once, seconds, valid = row
    if total != count or once != count or valid is not True:
        raise RuntimeError(f"online-index: {once} of {total} jobs completed once, index valid: {valid}")
    build_ms = (span[1] - span[0]).total_seconds() * 1000  # type: ignore[operator]
    return Sample(jobs=count, seconds=float(seconds), p50_ms=build_ms, p99_ms=float(stall[0] or 0) * 1000, rss_mb=None)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "online-index",
        f"supervise drain, {ONLINE_SCALE} x --jobs, defaults, an index built CONCURRENTLY meanwhile: "
        "p50 = the build, p99 = the longest stall (ms)",
        2,
        online_index,
    ),
]
