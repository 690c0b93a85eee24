"""Durable jobs (docs/guides/durable.md).

- ``drain-parked-2``: the default drain of 5 x --jobs no-op jobs (``drain-2-default``, its
  baseline in the same run) with 10,000 jobs parked on ``wait_for`` in the same queue. Target:
  at least 0.95 x the baseline's jobs/s (parked jobs are outside the claim index).
- ``signal-10k``: one ``client.signal_many`` of 10,000 signals, each for one of 10,000 parked
  jobs; every job must be available afterwards. p50 is the call (ms).
- ``steps-10-2``: --jobs jobs of ten steps that do nothing, drained by ``miniqueue-supervise
  --workers 2`` with its defaults, after as many jobs without steps by the same supervisor.
  p50 is the cost of a step in worker time (µs: the difference of the two drains' worker
  seconds, per step), p99 the steps' drain alone (jobs/s is of the step jobs).
- ``sleep-resume-2``: --jobs / 50 jobs that sleep 0.5 s, then record a step; p50 and p99 are
  the time from the sleep's end to that step's record (ms), both on the database clock. The
  worker that put a job to sleep looks for work when the sleep ends; the others at their poll.
"""

from __future__ import annotations

from miniqueue import Client, JobSpec
from miniqueue.core.db import connect

from .apps import PLAIN_TASK, SLEEP_TASK, STEPS_TASK
from .database import QUEUE, TASK, payload, settle
from .drain import DRAIN_SCALE, NOOP_APP, drain_through_supervisor, enqueue_in_one_transaction, wait_drained
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

DRAIN_BASELINE = "drain-2-default"
DURABLE_APP = "bench.apps:durable_app"
TARGETS: dict[str, tuple[str, float]] = {"drain-parked-2": (DRAIN_BASELINE, 0.95)}
PARKED = 10_000
STEPS = 10

# Jobs parked on a signal each, as job.wait_for leaves them (an attempt run, its lease given up).
_PARK = """
INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, max_attempts, attempt_budget, signal_key, steps)
SELECT %(queue)s, 'bench.parked', '{}', 'waiting', 1, 6, 5, 'parked:' || g,
       jsonb_build_array(jsonb_build_object('name', 'signal parked:' || g || ' #1', 'kind', 'signal',
                                            'key', 'parked:' || g, 'waiting', true, 'attempt', 1, 'at', now()))
  FROM generate_series(1, %(rows)s) AS g
"""
_RESUMED = "SELECT count(*) FROM miniqueue_jobs WHERE task = 'bench.parked' AND state = 'available'"
_DRAINED_SINCE = """
SELECT extract(epoch FROM max(completed_at) - %(committed)s)::float8, count(*) FROM miniqueue_jobs
 WHERE task = %(task)s AND state = 'completed'
"""
_WORKER_LATENCY = """
SELECT extract(epoch FROM (s -> 1 ->> 'at')::timestamptz - (s -> 0 ->> 'until')::timestamptz) * 1000
  FROM (SELECT steps AS s FROM miniqueue_jobs WHERE task = %(task)s AND state = 'completed') j
 ORDER BY 1
"""


def _jobs(task: str, count: int) -> list[JobSpec]:
    return [JobSpec(task, payload(n), queue=QUEUE) for n in range(count)]


def _park(dsn: str, rows: int) -> None:
    with connect(dsn, purpose="bench-seed") as conn:
        conn.execute(_PARK, {"queue": QUEUE, "rows": rows})


def parked_drain(ctx: Context) -> Sample:
    """The default drain, beside 10,000 jobs parked until a signal."""
    _park(ctx.dsn, ctx.sized(PARKED, 100))
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs * DRAIN_SCALE)]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)


def signal_parked(ctx: Context) -> Sample:
    """One signal_many call resuming 10,000 parked jobs."""
    rows = ctx.sized(PARKED, 100)
    _park(ctx.dsn, rows)
    settle(ctx.dsn)
    with Client(ctx.dsn) as client, connect(ctx.dsn, purpose="bench") as conn:
        signals = [(f"parked:{n}", {"n": n}) for n in range(1, rows + 1)]
        start = conn.execute("SELECT clock_timestamp()").fetchone()
        resumed = client.signal_many(signals)
        end = conn.execute("SELECT clock_timestamp()").fetchone()
        available = conn.execute(
            "SELECT count(*) FROM miniqueue_jobs WHERE task = 'bench.parked' AND state = 'available'"
        )
        count = available.fetchone()
    assert start is not None and end is not None and count is not None
    if None in resumed or count[0] != rows:
        raise RuntimeError(f"signal-10k: {count[0]} of {rows} parked jobs resumed")
    seconds = (end[0] - start[0]).total_seconds()
    return Sample(jobs=rows, seconds=seconds, p50_ms=seconds * 1000, p99_ms=None, rss_mb=None)


def step_overhead(ctx: Context) -> Sample:
    """Jobs of ten no-op steps against as many jobs without steps, in one supervisor's life."""
    count = ctx.jobs
    settle(ctx.dsn)
    with (
        supervised(ctx.dsn, SuperviseOptions(DURABLE_APP, ctx.workers)) as supervisor,
        connect(ctx.dsn, purpose="bench") as conn,
    ):
        costs = []
        for task in (PLAIN_TASK, STEPS_TASK):
            cpu = supervisor.worker_cpu_seconds()
            committed = enqueue_in_one_transaction(
                ctx.dsn, conn, [JobSpec(task, payload(n), queue=QUEUE) for n in range(count)]
            )
            wait_drained(conn)
            [(seconds, done)] = conn.execute(
                "SELECT extract(epoch FROM max(completed_at) - %s)::float8, count(*) FROM miniqueue_jobs"
                " WHERE task = %s AND state = 'completed'",
                [committed, task],
            ).fetchall()
            if done != count:
                raise RuntimeError(f"steps-10-2: {done} of {count} {task} jobs completed")
            costs.append((supervisor.worker_cpu_seconds() - cpu, float(seconds)))
    (plain_cpu, _), (steps_cpu, steps_seconds) = costs
    per_step_us = (steps_cpu - plain_cpu) / (count * STEPS) * 1e6
    return Sample(jobs=count, seconds=steps_seconds, p50_ms=per_step_us, p99_ms=None, rss_mb=supervisor.worker_rss_mb())


def sleep_resume(ctx: Context) -> Sample:
    """Jobs that sleep half a second: how long after the sleep's end each ran again."""
    count = max(ctx.jobs // 50, 10)
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(DURABLE_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(
            ctx.dsn, conn, [JobSpec(SLEEP_TASK, payload(n), queue=QUEUE) for n in range(count)]
        )
        while True:
            wait_drained(conn)
            left = conn.execute(
                "SELECT count(*) FROM miniqueue_jobs WHERE task = %s AND state <> 'completed'", [SLEEP_TASK]
            )
            if left.fetchone() == (0,):
                break
        latencies = [float(r[0]) for r in conn.execute(_WORKER_LATENCY, {"task": SLEEP_TASK}).fetchall()]
        [(seconds,)] = conn.execute(
            "SELECT extract(epoch FROM max(completed_at) - %s)::float8 FROM miniqueue_jobs WHERE task = %s",
            [committed, SLEEP_TASK],
        ).fetchall()
    if len(latencies) != count:
        raise RuntimeError(f"sleep-resume-2: {len(latencies)} of {count} jobs completed")
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return Sample(jobs=count, seconds=float(seconds), p50_ms=p50, p99_ms=p99, rss_mb=None)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "drain-parked-2",
        "supervise drain, no-op, defaults, beside 10,000 jobs parked on wait_for",
        2,
        parked_drain,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark("signal-10k", "one signal_many resuming 10,000 parked jobs: p50 = the call (ms)", 0, signal_parked),
    Benchmark(
        "steps-10-2",
        "supervise drain of jobs of 10 no-op steps, defaults: p50 = a step's worker time (us)",
        2,
        step_overhead,
    ),
    Benchmark(
        "sleep-resume-2",
        "supervise, defaults: a 0.5 s durable sleep's end to the job's next step (ms, database clock)",
        2,
        sleep_resume,
        throughput=False,
    ),
]
