"""Limits through a real ``miniqueue-supervise`` with its defaults, timed on the database clock.

- ``limits-keys-N``: 5 x --jobs no-op jobs spread over 5,000 concurrency keys (limit 1 each),
  drained as ``drain-N-default`` drains the same number without limits: run both in one
  invocation (``--only 'drain-2-default,limits-keys-2'``) for the ratio (N = 2 or 4).
- ``limits-others-N`` / ``limits-hot-N``: 10,000 jobs over 1,000 keys, timed from the commit to
  the last of them completed; in the ``hot`` row, 10,000 jobs of one more key (limit 1) were
  enqueued first, in the same transaction. Equal figures mean the hot key's backlog costs the
  other keys nothing.
- ``limits-backlog-2``: 1,000,000 queued no-op jobs over 10,000 keys of limit 1, drained by 2
  workers with the defaults, beside ``drain-backlog-2`` (the same backlog without limits) in
  the same run: a claim that scanned the backlog to find a free key would show here. Target:
  >= 0.8 x of it.
- ``rate-limit-N``: jobs of a task limited to 200/s, more than the workers could run in the
  time; the figure is the jobs that completed in the 10 s window from 2 s after the commit
  (the first seconds include the bucket's initial token). The rate limit's accuracy is this
  row's jobs/s against 200.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from miniqueue import JobSpec
from miniqueue.core.db import Connection, connect

from .database import QUEUE, TASK, payload, settle
from .drain import DRAIN_SCALE, NOOP_APP, RAN_ONCE, drain_through_supervisor, enqueue_in_one_transaction
from .measure import Sample
from .registry import Benchmark, Context
from .scale import BACKLOG, TINY_BACKLOG
from .supervised import SuperviseOptions, supervised

KEYS = 5000
BACKLOG_KEYS = 10_000
#: Rows held against a baseline of the same run: (baseline, least share).
TARGETS: dict[str, tuple[str, float]] = {"limits-backlog-2": ("drain-backlog-2", 0.8)}
OTHERS, OTHER_KEYS, HOT_JOBS = 10_000, 1000, 10_000
RATE, RATE_JOBS, WINDOW_START, WINDOW_SECONDS = 200.0, 4000, 2.0, 10.0
# A tiny run (see Context.sized): a few keys, a short backlog and a short window.
TINY_KEYS = 10
TINY_OTHERS, TINY_OTHER_KEYS, TINY_HOT_JOBS = 100, 10, 100
TINY_RATE_JOBS, TINY_WINDOW_START, TINY_WINDOW_SECONDS = 200, 0.2, 0.5
POLL_SECONDS = 0.01
TIMEOUT_SECONDS = 600.0

_OTHERS_DONE = f"""
SELECT count(*), extract(epoch FROM max(completed_at) - %(committed)s::timestamptz)::float8
  FROM miniqueue_jobs
 WHERE {RAN_ONCE} AND limits[1] LIKE 'concurrency bench.noop other-%%'
"""
_IN_WINDOW = """
SELECT count(*) FROM miniqueue_jobs
 WHERE state = 'completed'
   AND completed_at >= %(committed)s::timestamptz + make_interval(secs => %(start)s)
   AND completed_at < %(committed)s::timestamptz + make_interval(secs => %(start)s + %(seconds)s)
"""
_SINCE = "SELECT extract(epoch FROM clock_timestamp() - %s::timestamptz)::float8"


def keyed_drain(ctx: Context) -> Sample:
    """5 x --jobs no-op jobs over 5,000 keys of limit 1, with the supervisor's defaults."""
    count, keys = ctx.jobs * DRAIN_SCALE, ctx.sized(KEYS, TINY_KEYS)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, concurrency_key=f"k{n % keys}") for n in range(count)]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)


def keyed_backlog(ctx: Context) -> Sample:
    """1,000,000 queued no-op jobs over 10,000 keys of limit 1, with the supervisor's defaults."""
    count, keys = ctx.sized(BACKLOG, TINY_BACKLOG), ctx.sized(BACKLOG_KEYS, TINY_KEYS)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, concurrency_key=f"k{n % keys}") for n in range(count)]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), jobs)


def others(ctx: Context) -> Sample:
    """The other keys' jobs alone."""
    return _time_others(ctx, hot=0)


def others_behind_a_hot_key(ctx: Context) -> Sample:
    """The other keys' jobs, enqueued after 10,000 jobs of one hot key."""
    return _time_others(ctx, hot=ctx.sized(HOT_JOBS, TINY_HOT_JOBS))


def _time_others(ctx: Context, hot: int) -> Sample:
    others, keys = ctx.sized(OTHERS, TINY_OTHERS), ctx.sized(OTHER_KEYS, TINY_OTHER_KEYS)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, concurrency_key="hot") for n in range(hot)]
    jobs += [JobSpec(TASK, payload(n), queue=QUEUE, concurrency_key=f"other-{n % keys}") for n in range(others)]
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        seconds = _poll(lambda: _others_done(conn, committed, others))
    return Sample(jobs=others, seconds=seconds, p50_ms=None, p99_ms=None, rss_mb=None)


def _others_done(conn: Connection, committed: object, others: int) -> float | None:
    row = conn.execute(_OTHERS_DONE, {"committed": committed}).fetchone()
    assert row is not None
    return float(row[1]) if row[0] == others else None


def rate_limited(ctx: Context) -> Sample:
    """Jobs limited to 200/s: how many complete in a 10 s window."""
    count = ctx.sized(RATE_JOBS, TINY_RATE_JOBS)
    start, seconds = ctx.sized(WINDOW_START, TINY_WINDOW_START), ctx.sized(WINDOW_SECONDS, TINY_WINDOW_SECONDS)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, rate_limit=f"{RATE:g}/s") for n in range(count)]
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        window_end = start + seconds

        def window_over() -> float | None:
            row = conn.execute(_SINCE, [committed]).fetchone()
            return 1.0 if row is not None and float(row[0]) > window_end + 0.5 else None

        _poll(window_over)
        params = {"committed": committed, "start": start, "seconds": seconds}
        row = conn.execute(_IN_WINDOW, params).fetchone()
    assert row is not None
    return Sample(jobs=int(row[0]), seconds=seconds, p50_ms=None, p99_ms=None, rss_mb=None)


def _poll(done: Callable[[], float | None]) -> float:
    """Call ``done`` every POLL_SECONDS until it returns a number; return it."""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while True:
        result = done()
        if result is not None:
            return float(result)
        if time.monotonic() > deadline:
            raise RuntimeError(f"not done within {TIMEOUT_SECONDS:.0f} s")
        time.sleep(POLL_SECONDS)


BENCHMARKS: list[Benchmark] = [
    *(
        Benchmark(f"limits-keys-{n}", f"supervise drain, no-op, {KEYS:,} keys of limit 1, defaults", n, keyed_drain)
        for n in (2, 4)
    ),
    Benchmark(
        "limits-backlog-2",
        f"supervise drain, no-op, 1,000,000 queued over {BACKLOG_KEYS:,} keys of limit 1, defaults",
        2,
        keyed_backlog,
        baselines=("drain-backlog-2",),
    ),
    Benchmark("limits-others-2", f"{OTHERS:,} jobs over {OTHER_KEYS:,} keys, alone, defaults", 2, others),
    Benchmark(
        "limits-hot-2", f"the same behind {HOT_JOBS:,} jobs of one hot key, defaults", 2, others_behind_a_hot_key
    ),
    Benchmark(
        "rate-limit-2", f"jobs limited to {RATE:g}/s: completed per s in a {WINDOW_SECONDS:g} s window", 2, rate_limited
    ),
]
