"""Fair share by key through a real ``miniqueue-supervise`` with its defaults (see
docs/guides/fairness.md), timed on the database clock.

- ``fair-2``: tenant A's 100,000 no-op jobs are enqueued and committed, then, once 5% of them
  completed (the drain under way), tenants B-K's 100 each (one more transaction), all with a
  ``fair_key``. The row's rate is the whole drain's
  (from A's commit to the last completion), held against ``drain-2-default`` of the same run
  (target: >= 0.8x). ``fair_last_ms`` is when B-K's last job completed, from their commit;
  ``fair_share_ms`` is their fair share's time: their 1,000 jobs at 10/11 of the drain's rate
  (11 keys with work take turns). Target: the last within 2x of the fair share.
- ``fair-backlog-2``: 1,000,000 queued fair no-op jobs over 10,000 keys, against
  ``drain-backlog-2`` (the same backlog, not fair) of the same run. Target: >= 0.8x.
- ``fair-weights-2``: two keys, weights 1 and 3 (a rule), both backlogged with jobs of about
  1 ms; ``weight_ratio`` is the weight-3 key's completions over the weight-1 key's from 1 s to
  11 s after the commit. Target: 3 within 10%.
"""

from __future__ import annotations

import datetime as dt
import time

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection, connect

from .apps import SHORT_TASK
from .database import QUEUE, TASK, payload, settle
from .drain import NOOP_APP, check_outcomes, database_clock, enqueue_in_one_transaction, wait_drained
from .measure import Sample
from .registry import Benchmark, Context
from .scale import BACKLOG, TINY_BACKLOG
from .supervised import SuperviseOptions, supervised

BIG, SMALL, SMALL_KEYS = 100_000, 100, 10
#: B-K arrive once this share of A's jobs completed: into a drain under way, not one starting.
UNDER_WAY = 0.05
POLL_SECONDS = 0.01
BACKLOG_KEYS = 10_000
WEIGHTED_JOBS, WINDOW_START, WINDOW_SECONDS = 60_000, 1.0, 10.0
TINY_BIG, TINY_BACKLOG_KEYS, TINY_WEIGHTED_JOBS, TINY_WINDOW_START, TINY_WINDOW_SECONDS = 1000, 10, 1000, 0.1, 0.3
FAIRNESS_APP = "bench.apps:fairness_app"
#: Rows held against a baseline of the same run: (baseline, least share).
TARGETS: dict[str, tuple[str, float]] = {"fair-2": ("drain-2-default", 0.8), "fair-backlog-2": ("drain-backlog-2", 0.8)}
#: The last small tenant's job within this many times its fair share's time.
FAIR_SHARE_FACTOR = 2.0
#: The weight-3 key's completions per weight-1 key's, and how far from it they may be.
WEIGHTS, WEIGHT_TOLERANCE = 3.0, 0.1

_LAST_OF = """
SELECT extract(epoch FROM max(completed_at) - %(committed)s::timestamptz)::float8 * 1000
  FROM miniqueue_jobs WHERE state = 'completed' AND fair_key <> 'A'
"""
_IN_WINDOW = """
SELECT fair_key, count(*) FROM miniqueue_jobs
 WHERE state = 'completed'
   AND completed_at >= %(committed)s::timestamptz + make_interval(secs => %(start)s)
   AND completed_at < %(committed)s::timestamptz + make_interval(secs => %(start)s + %(seconds)s)
 GROUP BY fair_key
"""
_COMPLETED = "SELECT count(*) FROM miniqueue_jobs WHERE state = 'completed'"
_LEFT = "SELECT fair_key, count(*) FROM miniqueue_jobs WHERE state = 'available' GROUP BY fair_key"


def big_then_small(ctx: Context) -> Sample:
    """Tenant A's jobs, committed, then B-K's: the whole drain, and when B-K's last completed."""
    big, small = ctx.sized(BIG, TINY_BIG), ctx.sized(SMALL, SMALL // 10)
    first = [JobSpec(TASK, payload(n), queue=QUEUE, fair_key="A") for n in range(big)]
    then = [
        JobSpec(TASK, payload(n), queue=QUEUE, fair_key=chr(ord("B") + k))
        for k in range(SMALL_KEYS)
        for n in range(small)
    ]
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, first)
        _wait_completed(conn, int(big * UNDER_WAY))
        small_committed = enqueue_in_one_transaction(ctx.dsn, conn, then)
        wait_drained(conn)
        seconds = check_outcomes([(conn, 0)], committed, len(first) + len(then))
        row = conn.execute(_LAST_OF, {"committed": small_committed}).fetchone()
    assert row is not None and row[0] is not None
    jobs = len(first) + len(then)
    share_ms = len(then) / (jobs / seconds * SMALL_KEYS / (SMALL_KEYS + 1)) * 1000
    return Sample(jobs, seconds, None, None, None, fair_last_ms=float(row[0]), fair_share_ms=share_ms)


def fair_backlog(ctx: Context) -> Sample:
    """1,000,000 queued fair no-op jobs over 10,000 keys, with the supervisor's defaults."""
    count, keys = ctx.sized(BACKLOG, TINY_BACKLOG), ctx.sized(BACKLOG_KEYS, TINY_BACKLOG_KEYS)
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE, fair_key=f"k{n % keys}") for n in range(count)]
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        wait_drained(conn)
        seconds = check_outcomes([(conn, 0)], committed, count)
    return Sample(count, seconds, None, None, None)


def weighted(ctx: Context) -> Sample:
    """Two backlogged keys of weights 1 and 3: their completions in a window of WINDOW_SECONDS."""
    count = ctx.sized(WEIGHTED_JOBS, TINY_WEIGHTED_JOBS)
    start, seconds = ctx.sized(WINDOW_START, TINY_WINDOW_START), ctx.sized(WINDOW_SECONDS, TINY_WINDOW_SECONDS)
    with Client(ctx.dsn) as client:
        client.set_key_rule("heavy", weight=WEIGHTS)
    jobs = [
        JobSpec(SHORT_TASK, payload(n), queue=QUEUE, fair_key=key) for n in range(count) for key in ("light", "heavy")
    ]
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(FAIRNESS_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        committed = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        _wait_until(conn, committed + dt.timedelta(seconds=start + seconds))
        done = dict(conn.execute(_IN_WINDOW, {"committed": committed, "start": start, "seconds": seconds}).fetchall())
        left = dict(conn.execute(_LEFT).fetchall())
    if not ctx.tiny and (not left.get("light") or not left.get("heavy")):
        raise RuntimeError(f"a key ran out of jobs before the window ended ({left}): enqueue more")
    light, heavy = int(done.get("light", 0)), int(done.get("heavy", 0))
    return Sample(light + heavy, seconds, None, None, None, weight_ratio=heavy / light if light else None)


def _wait_completed(conn: Connection, jobs: int) -> None:
    """Poll until ``jobs`` jobs completed."""
    while (row := conn.execute(_COMPLETED).fetchone()) is not None and row[0] < jobs:
        time.sleep(POLL_SECONDS)


def _wait_until(conn: Connection, at: dt.datetime) -> None:
    """Sleep (on the database clock) until ``at``."""
    while (left := (at - database_clock(conn)).total_seconds()) > 0:
        conn.execute("SELECT pg_sleep(%s)", [min(left, 1.0)])


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "fair-2",
        f"supervise drain, {BIG:,} jobs of one key, then {SMALL} of each of {SMALL_KEYS} more, defaults",
        2,
        big_then_small,
        baselines=("drain-2-default",),
    ),
    Benchmark(
        "fair-backlog-2",
        f"supervise drain, 1,000,000 queued fair jobs over {BACKLOG_KEYS:,} keys, defaults",
        2,
        fair_backlog,
        baselines=("drain-backlog-2",),
    ),
    Benchmark(
        "fair-weights-2",
        f"two backlogged keys of weights 1 and {WEIGHTS:g}: completions in {WINDOW_SECONDS:g} s",
        2,
        weighted,
    ),
]
