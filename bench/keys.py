"""Unique keys and sequence keys (docs/guides/keys.md), each against the same work without keys,
measured in the same invocation: each row names its baseline (``Benchmark.baselines``), so
``--only`` of the row runs that too, and its target is the ratio of the two medians.

- ``drain-unique-2``: 5 x --jobs no-op jobs (50,000 by default), each with a unique key of its
  own, drained by ``miniqueue-supervise --workers 2`` with its defaults, exactly as
  ``drain-2-default`` drains the same jobs without keys (its baseline). The keyed jobs go in by
  ``_ENQUEUE_MANY_KEYED`` instead of COPY, but the enqueue is not timed: what the row adds to the
  drain is the unique index (idx_miniqueue_jobs_unique_key) each claim and completion keeps.
- ``drain-sequences-2``: the same count of jobs over --jobs / 2 sequence keys (5,000 by default,
  10 jobs each, interleaved: job n has key ``s<n mod keys>``), so that one job of each key is
  available at a time and each completion hands its key on to the next (miniqueue_settle ->
  miniqueue_sequence_advance, in the completing statement). Baseline ``drain-2-default``. A run
  fails unless every key's jobs completed in id order.
- ``enqueue-unique``: ``Client.enqueue_many`` of 10 x --jobs jobs (100,000 by default) in calls
  of 1,000, each job with a unique key of its own, so by COPY too (``Store.copy_keyed_steps``: no
  key is held, so no batch gives way to ``_ENQUEUE_MANY_KEYED``); its baseline ``enqueue-plain``
  enqueues the same count in the same calls without keys. One spawned process each, timed as the
  ``enqueue-many-*`` rows are. ``enqueue-idempotent`` is the same with an idempotency key per
  job: the other enqueue that is an ``INSERT ... ON CONFLICT``, for reference.
- ``debounce``: 100 enqueues of one unique key 50 ms apart with ``Debounce(wait=1, max_wait=3)``
  while one supervised worker runs with its defaults: how many runs the burst took (at most 2),
  when the first was due (max_wait: 3 s after the first enqueue) and when it completed (its
  worker's poll, 1 s by default, comes on top: a job due later is not announced), on the
  database clock.
"""

from __future__ import annotations

import time

from miniqueue import Client, Debounce, JobSpec
from miniqueue.core.db import connect

from .database import QUEUE, TASK, payload, settle
from .drain import DRAIN_SCALE, NOOP_APP, drain_through_supervisor, wait_drained
from .enqueue import EnqueueSpec, enqueue_many_worker
from .measure import Sample, combine
from .processes import run_workers
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

#: The plain drain with the supervisor's defaults: the drain rows' baseline.
DRAIN_BASELINE = "drain-2-default"
ENQUEUE_BASELINE = "enqueue-plain"
#: Jobs per sequence key in ``drain-sequences-2``, at any --jobs.
PER_SEQUENCE = 10
#: The enqueue rows move this many times --jobs (100,000 by default), in calls of ENQUEUE_BATCH
#: (as ``enqueue-many-1000``, and the drain rows' enqueue; at or above the client's COPY
#: threshold of 500, so the baseline goes by COPY even in a tiny run, of 500 jobs).
ENQUEUE_SCALE = 10
ENQUEUE_BATCH = 1000

#: Each keyed row's target: its jobs/s at least this share of its baseline's, in the same run.
TARGETS: dict[str, tuple[str, float]] = {
    "drain-unique-2": (DRAIN_BASELINE, 0.9),
    "drain-sequences-2": (DRAIN_BASELINE, 0.7),
    "enqueue-unique": (ENQUEUE_BASELINE, 0.8),
}

# Pairs of jobs of one sequence key that completed out of id order (must be none).
_OUT_OF_ORDER = """
SELECT count(*) FROM (
    SELECT completed_at < lag(completed_at) OVER (PARTITION BY sequence_key ORDER BY id) AS early
      FROM miniqueue_jobs WHERE sequence_key IS NOT NULL) o
 WHERE early
"""


def unique_drain(ctx: Context) -> Sample:
    """5 x --jobs no-op jobs, each with a unique key of its own, with the supervisor's defaults."""
    count = ctx.jobs * DRAIN_SCALE
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, unique_key=f"u{n}") for n in range(count)]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)


def sequence_drain(ctx: Context) -> Sample:
    """5 x --jobs no-op jobs over one sequence key per PER_SEQUENCE jobs, with the defaults."""
    count = ctx.jobs * DRAIN_SCALE
    keys = max(1, count // PER_SEQUENCE)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, sequence_key=f"s{n % keys}") for n in range(count)]
    sample = drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)
    with connect(ctx.dsn, purpose="bench") as conn:
        row = conn.execute(_OUT_OF_ORDER).fetchone()
    if row is None or row[0]:
        raise RuntimeError(f"{row[0] if row else '?'} jobs of a sequence completed before the job ahead of them")
    return sample


def enqueue_plain(ctx: Context) -> Sample:
    """``enqueue_many`` of 10 x --jobs jobs without keys, in calls of ENQUEUE_BATCH (COPY)."""
    return _enqueue(ctx)


def enqueue_unique(ctx: Context) -> Sample:
    """The same, each job with a unique key of its own (``_ENQUEUE_MANY_KEYED``)."""
    return _enqueue(ctx, unique_keys=True)


def enqueue_idempotent(ctx: Context) -> Sample:
    """The same, each job with an idempotency key of its own (``_MANY_JOBS``: an insert ON
    CONFLICT too, the keyed rows' other reference)."""
    return _enqueue(ctx, idempotency_keys=True)


def _enqueue(ctx: Context, *, unique_keys: bool = False, idempotency_keys: bool = False) -> Sample:
    settle(ctx.dsn)
    count = ctx.jobs * ENQUEUE_SCALE
    spec = EnqueueSpec(ctx.dsn, count, ENQUEUE_BATCH, unique_keys=unique_keys, idempotency_keys=idempotency_keys)
    return combine(run_workers(enqueue_many_worker, [spec]))


#: The debounce row: DEBOUNCE_ENQUEUES enqueues of one key DEBOUNCE_GAP seconds apart.
DEBOUNCE_ENQUEUES = 100
DEBOUNCE_GAP = 0.05
DEBOUNCE = Debounce(wait=1.0, max_wait=3.0)

# The debounced key's runs: how many, and the first one's run-at and completion, in seconds from
# its first enqueue (its created_at), on the database clock.
_DEBOUNCED = """
SELECT count(*) FILTER (WHERE state = 'completed'),
       extract(epoch FROM (array_agg(scheduled_at - created_at ORDER BY id))[1]),
       extract(epoch FROM (array_agg(completed_at - created_at ORDER BY id))[1])
  FROM miniqueue_jobs WHERE unique_key = 'debounced'
"""


def debounce(ctx: Context) -> Sample:
    """DEBOUNCE_ENQUEUES enqueues of one unique key DEBOUNCE_GAP s apart with DEBOUNCE, run by
    one supervised worker with its defaults: ``jobs`` is how many runs it took, p50 the first
    run's run-at and p99 its completion, in ms after the first enqueue (database clock)."""
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, 1)), Client(ctx.dsn) as client:
        started = time.monotonic()
        for n in range(DEBOUNCE_ENQUEUES):
            client.enqueue(TASK, payload(n), queue=QUEUE, unique_key="debounced", on_conflict=DEBOUNCE)
            time.sleep(DEBOUNCE_GAP)
        burst = time.monotonic() - started
        with connect(ctx.dsn, purpose="bench") as conn:
            wait_drained(conn)
            row = conn.execute(_DEBOUNCED).fetchone()
    assert row is not None
    runs, run_at, completed = row
    return Sample(
        jobs=int(runs), seconds=burst, p50_ms=float(run_at) * 1000, p99_ms=float(completed) * 1000, rss_mb=None
    )


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "drain-unique-2",
        "supervise drain, no-op, a unique key per job, defaults",
        2,
        unique_drain,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark(
        "drain-sequences-2",
        f"supervise drain, no-op, {PER_SEQUENCE} jobs per sequence key, defaults",
        2,
        sequence_drain,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark(
        ENQUEUE_BASELINE,
        f"enqueue_many x{ENQUEUE_BATCH:,}, {ENQUEUE_SCALE} x --jobs, no keys (NOTIFY)",
        1,
        enqueue_plain,
    ),
    Benchmark(
        "enqueue-unique",
        f"enqueue_many x{ENQUEUE_BATCH:,}, {ENQUEUE_SCALE} x --jobs, a unique key per job (NOTIFY)",
        1,
        enqueue_unique,
        baselines=(ENQUEUE_BASELINE, "enqueue-idempotent"),
    ),
    Benchmark(
        "enqueue-idempotent",
        f"enqueue_many x{ENQUEUE_BATCH:,}, {ENQUEUE_SCALE} x --jobs, an idempotency key per job (NOTIFY)",
        1,
        enqueue_idempotent,
    ),
    Benchmark(
        "debounce",
        f"{DEBOUNCE_ENQUEUES} enqueues of one key {DEBOUNCE_GAP * 1000:.0f} ms apart, Debounce(1 s, 3 s): "
        "jobs = runs, p50 = first run-at, p99 = first done (ms after first enqueue)",
        1,
        debounce,
        throughput=False,
    ),
]
