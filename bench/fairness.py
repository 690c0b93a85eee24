"""Fairness under the defaults: short jobs must not wait behind long ones.

Four supervised workers with no tuning flag get 2,000 jobs of about 1 ms with 2 jobs of 5 s
among them (at a third and two thirds of the queue, where workers that have learnt to prefetch
short jobs will pick them up), all enqueued in one transaction. The row reports, for the short
jobs, the median and 99th percentile of the time from the commit to their completion (an upper
bound of their wait), and as its duration when the last one completed; ``long_first_ms`` is when
the first long job completed, which every short job should beat.

Two rows, the same jobs, two apps:

- ``fairness``: an app of ``def`` handlers only (``bench.apps:fairness_app``);
- ``fairness-mixed``: the same app with one ``async def`` task more, on the same queue
  (``bench.apps:fairness_mixed_app``), so each worker runs a thread pool and an event loop. No
  job of that task is enqueued: only the kind of app differs, and the target is the same.
"""

from __future__ import annotations

import functools

from miniqueue import JobSpec
from miniqueue.core.db import connect

from .apps import LONG_SECONDS, LONG_TASK, SHORT_TASK
from .database import QUEUE, payload, settle
from .drain import enqueue_in_one_transaction, wait_drained
from .measure import Sample, percentile
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

FAIRNESS_APP = "bench.apps:fairness_app"
FAIRNESS_MIXED_APP = "bench.apps:fairness_mixed_app"
SHORT_JOBS = 2000
LONG_JOBS = 2
WORKERS = 4
# A tiny run (see Context.sized): a long job still outlives the default 0.1 s prefetch budget,
# so the worker still has prefetched jobs to hand back.
TINY_SHORT_JOBS, TINY_LONG_SECONDS = 40, 0.5

_FINISHED_MS = """
SELECT task, extract(epoch FROM completed_at - %(committed)s::timestamptz) * 1000
  FROM miniqueue_jobs WHERE state = 'completed'
"""


def fairness(ctx: Context, *, app: str) -> Sample:
    short_jobs, long_seconds = ctx.sized(SHORT_JOBS, TINY_SHORT_JOBS), ctx.sized(LONG_SECONDS, TINY_LONG_SECONDS)
    jobs = [JobSpec(SHORT_TASK, payload(n), queue=QUEUE) for n in range(short_jobs)]
    for at in (2 * short_jobs // 3, short_jobs // 3):
        jobs.insert(at, JobSpec(LONG_TASK, {**payload(at), "seconds": long_seconds}, queue=QUEUE))
    settle(ctx.dsn)
    with (
        supervised(ctx.dsn, SuperviseOptions(app, ctx.workers)) as supervisor,
        connect(ctx.dsn, purpose="bench-fairness") as conn,
    ):
        committed_at = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        wait_drained(conn)
        rss_mb = supervisor.worker_rss_mb()
        finished = conn.execute(_FINISHED_MS, {"committed": committed_at}).fetchall()
    shorts = sorted(float(ms) for task, ms in finished if task == SHORT_TASK)
    longs = sorted(float(ms) for task, ms in finished if task == LONG_TASK)
    if len(shorts) != short_jobs or len(longs) != LONG_JOBS:
        raise RuntimeError(f"{len(shorts)} short and {len(longs)} long jobs completed, of {short_jobs} and {LONG_JOBS}")
    return Sample(
        jobs=short_jobs,
        seconds=shorts[-1] / 1000,
        p50_ms=percentile(shorts, 50),
        p99_ms=percentile(shorts, 99),
        rss_mb=rss_mb,
        long_first_ms=longs[0],
    )


_JOBS = f"{SHORT_JOBS:,} x 1 ms jobs and {LONG_JOBS} x {LONG_SECONDS:g} s jobs, defaults"

BENCHMARKS = [
    Benchmark(
        "fairness",
        f"{_JOBS}: short jobs' completion (ms)",
        WORKERS,
        functools.partial(fairness, app=FAIRNESS_APP),
        throughput=False,
    ),
    Benchmark(
        "fairness-mixed",
        f"{_JOBS}, app with an async def task too: short jobs' completion (ms)",
        WORKERS,
        functools.partial(fairness, app=FAIRNESS_MIXED_APP),
        throughput=False,
    ),
]

#: The rows the fairness targets are set against (bench/targets.py).
ROWS = tuple(b.name for b in BENCHMARKS)
