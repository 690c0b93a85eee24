"""Fairness under the defaults: short jobs must not wait behind long ones.

Four supervised workers with no tuning flag get 2,000 jobs of about 1 ms with 2 jobs of 5 s
among them (at a third and two thirds of the queue, where workers that have learnt to prefetch
short jobs will pick them up), all enqueued in one transaction. The row reports, for the short
jobs, the median and 99th percentile of the time from the commit to their completion (an upper
bound of their wait), and as its duration when the last one completed; ``long_first_ms`` is when
the first long job completed, which every short job should beat.
"""

from __future__ import annotations

from miniqueue import JobSpec
from miniqueue.db import connect

from .apps import LONG_TASK, SHORT_TASK
from .database import QUEUE, payload, settle
from .drain import enqueue_in_one_transaction, wait_drained
from .measure import Sample, percentile
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

FAIRNESS_APP = "bench.apps:fairness_app"
SHORT_JOBS = 2000
WORKERS = 4

_FINISHED_MS = """
SELECT task, extract(epoch FROM completed_at - %(committed)s::timestamptz) * 1000
  FROM miniqueue_jobs WHERE state = 'completed'
"""


def fairness(ctx: Context) -> Sample:
    jobs = [JobSpec(SHORT_TASK, payload(n), queue=QUEUE) for n in range(SHORT_JOBS)]
    for at in (2 * SHORT_JOBS // 3, SHORT_JOBS // 3):
        jobs.insert(at, JobSpec(LONG_TASK, payload(at), queue=QUEUE))
    settle(ctx.dsn)
    with (
        supervised(ctx.dsn, SuperviseOptions(FAIRNESS_APP, ctx.workers)) as supervisor,
        connect(ctx.dsn, purpose="bench-fairness") as conn,
    ):
        committed_at = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        wait_drained(conn)
        rss_mb = supervisor.worker_rss_mb()
        finished = conn.execute(_FINISHED_MS, {"committed": committed_at}).fetchall()
    shorts = sorted(float(ms) for task, ms in finished if task == SHORT_TASK)
    longs = sorted(float(ms) for task, ms in finished if task == LONG_TASK)
    if len(shorts) != SHORT_JOBS or len(longs) != 2:
        raise RuntimeError(f"{len(shorts)} short and {len(longs)} long jobs completed, of {SHORT_JOBS} and 2")
    return Sample(
        jobs=SHORT_JOBS, seconds=shorts[-1] / 1000, p50_ms=percentile(shorts, 50), p99_ms=percentile(shorts, 99),
        rss_mb=rss_mb, long_first_ms=longs[0],
    )  # fmt: skip


BENCHMARKS = [
    Benchmark("fairness", "2,000 x 1 ms jobs and 2 x 5 s jobs, defaults: short jobs' completion (ms)", WORKERS,
              fairness, throughput=False),
]
