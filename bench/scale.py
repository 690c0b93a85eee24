"""Flat as the table grows: reads and drains with millions of finished rows.

- ``scale-reads``: 10,000,000 finished jobs and 100,000 available ones. ``miniqueue stats``
  end to end (a subprocess, as an operator runs it; p50/p99 of 5), a ``/metrics`` scrape of a
  supervised run, and the dashboard's overview page (medians of 5).
- ``drain-backlog-2``: 1,000,000 queued no-op jobs drained by 2 workers with the defaults, to
  set beside ``drain-2-default`` (50,000) in the same run.
- ``drain-pruning-2``: the 50,000-job default drain while the reaper prunes 10,000,000 finished
  rows (finished two days ago, past the 24 h retention) in batches.

The finished rows are written server-side (``INSERT ... SELECT generate_series``): the producer
API would take minutes, and these rows stand for history, not for the enqueue path.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from miniqueue import Client, JobSpec
from miniqueue.core.db import connect
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, seed_jobs, settle
from .drain import NOOP_APP, drain_through_supervisor
from .measure import Sample, percentile
from .registry import Benchmark, Context
from .supervised import REPO_ROOT, SuperviseOptions, supervised

FINISHED = 10_000_000
AVAILABLE = 100_000
BACKLOG = 1_000_000
REPEATS = 5
# A tiny run (see Context.sized): enough rows for every statement to find some.
TINY_FINISHED, TINY_AVAILABLE, TINY_BACKLOG, TINY_REPEATS = 2_000, 200, 500, 1

_SEED_FINISHED = """
INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, max_attempts, attempt_budget, scheduled_at,
                            created_at, completed_at, finished_at)
SELECT %(queue)s, %(task)s, '{"n": 0}', 'completed', 1, 5, 5, now() - interval '2 days', now() - interval '2 days',
       now() - interval '2 days', now() - interval '2 days'
  FROM generate_series(1, %(count)s)
"""


def seed_finished(dsn: str, count: int) -> None:
    with connect(dsn, purpose="bench-seed") as conn:
        for start in range(0, count, 1_000_000):
            conn.execute(_SEED_FINISHED, {"queue": QUEUE, "task": TASK, "count": min(1_000_000, count - start)})
        Store().recount(conn)  # the finished-job counts of rows written behind the store's back


def scale_reads(ctx: Context) -> Sample:
    finished, available = ctx.sized(FINISHED, TINY_FINISHED), ctx.sized(AVAILABLE, TINY_AVAILABLE)
    repeats = ctx.sized(REPEATS, TINY_REPEATS)
    seed_finished(ctx.dsn, finished)
    seed_jobs(ctx.dsn, available)
    settle(ctx.dsn)
    stats_ms = [_timed_stats(ctx.dsn) for _ in range(repeats)]
    port = _free_port()
    options = SuperviseOptions(
        NOOP_APP, 1, extra=("--queues", "idle", "--metrics-port", str(port), "--metrics-interval", "1")
    )
    with supervised(ctx.dsn, options):
        _wait_for_gauges(port)
        scrape_ms = [_timed_get(f"http://127.0.0.1:{port}/metrics") for _ in range(repeats)]
    overview_ms = _timed_overview(ctx.dsn, repeats)
    return Sample(
        jobs=finished + available,
        seconds=statistics.median(stats_ms) / 1000,
        p50_ms=percentile(stats_ms, 50),
        p99_ms=percentile(stats_ms, 99),
        rss_mb=None,
        scrape_ms=statistics.median(scrape_ms),
        overview_ms=statistics.median(overview_ms),
    )


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for the supervisor's /metrics)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _timed_stats(dsn: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", "stats"],
        env={**os.environ, "DATABASE_URL": dsn},
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    return (time.perf_counter() - started) * 1000


def _timed_get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


def _wait_for_gauges(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            if f'miniqueue_jobs{{queue="{QUEUE}",state="completed"}}'.encode() in response.read():
                return  # the reaper's first reading has arrived
        time.sleep(0.2)
    raise RuntimeError("the supervisor never served the queue gauges")


def _timed_overview(dsn: str, repeats: int) -> list[float]:
    from starlette.testclient import TestClient

    from miniqueue.web.server import create_app

    with Client(dsn) as client, TestClient(create_app(client), base_url="http://localhost") as browser:
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            assert browser.get("/").status_code == 200
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def drain_backlog(ctx: Context) -> Sample:
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.sized(BACKLOG, TINY_BACKLOG))]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)


def drain_pruning(ctx: Context) -> Sample:
    seed_finished(ctx.dsn, ctx.sized(FINISHED, TINY_FINISHED))
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs * 5)]
    # The reaper prunes at start and every second: it is deleting old rows throughout the drain.
    options = SuperviseOptions(NOOP_APP, ctx.workers, extra=("--reaper-interval", "1"))
    return drain_through_supervisor(ctx.dsn, options, jobs)


BENCHMARKS = [
    Benchmark(
        "scale-reads",
        "stats / scrape / overview at 10M finished + 100k available (ms)",
        1,
        scale_reads,
        throughput=False,
    ),
    Benchmark("drain-backlog-2", "supervise drain, defaults, 1,000,000 queued", 2, drain_backlog),
    Benchmark("drain-pruning-2", "supervise drain, defaults, 50,000 while pruning 10M finished", 2, drain_pruning),
]
