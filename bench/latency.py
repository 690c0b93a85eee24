"""Enqueue-to-handler-start latency through a real supervisor, with NOTIFY and with ``--poll-only``.

One idle worker (``--workers 1``, ``--concurrency 1``, no prefetch, the default 1 s poll
interval). Jobs are enqueued one at a time with ``Client.enqueue`` (autocommit, NOTIFY), spaced
20 ms apart so each finds the worker idle. The handler's first act records
``clock_timestamp()``; a job's latency is that minus its ``created_at``, both on the database
clock. One warm-up job runs first, so the handler's connection is open before the timed jobs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from miniqueue import Client
from miniqueue.core.db import Connection, connect

from .apps import LATENCY_TABLE_DDL, LATENCY_TASK
from .database import QUEUE, settle
from .measure import Sample, percentile
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

LATENCY_APP = "bench.apps:latency_app"
JOBS = 300
TINY_JOBS = 10
SPACING_SECONDS = 0.02
POLL_INTERVAL = 1.0
WAIT_TIMEOUT_SECONDS = 60.0

_STARTED = "SELECT count(*) FROM bench_latency WHERE job_id = ANY(%(ids)s)"
_LATENCIES_MS = """
SELECT extract(epoch FROM l.started_at - j.created_at)::float8 * 1000
  FROM bench_latency l JOIN miniqueue_jobs j ON j.id = l.job_id
 WHERE l.job_id = ANY(%(ids)s)
"""
_STATES = "SELECT state, count(*) FROM miniqueue_jobs WHERE id = ANY(%(ids)s) GROUP BY state"


def enqueue_to_start(ctx: Context, *, poll_only: bool) -> Sample:
    """JOBS jobs enqueued 20 ms apart; p50/p99 of enqueue (created_at) to handler start."""
    count = ctx.sized(JOBS, TINY_JOBS)
    with connect(ctx.dsn, purpose="bench-latency") as conn:
        conn.execute(LATENCY_TABLE_DDL)
    settle(ctx.dsn)
    options = SuperviseOptions(LATENCY_APP, ctx.workers, poll_only=poll_only, poll_interval=POLL_INTERVAL)
    with (
        supervised(ctx.dsn, options) as supervisor,
        Client(ctx.dsn) as client,
        connect(ctx.dsn, purpose="bench-latency") as conn,
    ):
        _wait_started(conn, [client.enqueue(LATENCY_TASK, {"n": -1}, queue=QUEUE).id])  # warm-up
        ids: list[int] = []
        began = time.monotonic()
        for n in range(count):
            time.sleep(max(0.0, began + n * SPACING_SECONDS - time.monotonic()))
            ids.append(client.enqueue(LATENCY_TASK, {"n": n}, queue=QUEUE).id)
        seconds = time.monotonic() - began
        _wait_started(conn, ids)
        rss_mb = supervisor.worker_rss_mb()
        latencies = [float(row[0]) for row in conn.execute(_LATENCIES_MS, {"ids": ids}).fetchall()]
    return Sample(
        jobs=len(latencies),
        seconds=seconds,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        rss_mb=rss_mb,
    )


def _wait_started(conn: Connection, ids: Sequence[int]) -> None:
    """Poll until every job in ``ids`` has recorded its start; raise with their states if not."""
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    while True:
        row = conn.execute(_STARTED, {"ids": list(ids)}).fetchone()
        if row and int(row[0]) == len(ids):
            return
        if time.monotonic() > deadline:
            states = dict(conn.execute(_STATES, {"ids": list(ids)}).fetchall())
            raise RuntimeError(f"{len(ids)} jobs did not all start within {WAIT_TIMEOUT_SECONDS:.0f} s: {states}")
        time.sleep(0.02)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "latency-notify",
        "enqueue -> handler start (NOTIFY)",
        1,
        functools.partial(enqueue_to_start, poll_only=False),
        throughput=False,
    ),
    Benchmark(
        "latency-poll-only",
        f"enqueue -> handler start (--poll-only, --poll-interval {POLL_INTERVAL:g})",
        1,
        functools.partial(enqueue_to_start, poll_only=True),
        throughput=False,
    ),
]
