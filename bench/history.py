"""Finished jobs out of the hot table (docs/guides/retention.md).

Each row drains 5 x --jobs no-op jobs (50,000 by default) with ``miniqueue-supervise --workers
2`` and its defaults, as ``drain-2-default`` does (its baseline, measured in the same run), but
with a history of finished jobs beside the hot table:

- ``drain-history-2``: 10,000,000 completed jobs in the history first (in one hourly partition
  of yesterday's, as a busy hour leaves them). Target: at least 0.95 x the baseline's jobs/s.
- ``prune-day-2``: a day of 10,000,000 completed jobs, spread over its 24 hourly partitions, all
  past retention at once (as after retention was cut by a day) and pruned by one pass of the
  reaper's ``drop_partitions`` 0.2 s into the drain: the 24 partitions detached in one
  transaction and the oldest dropped (the others go one a pass, after the drain; a run fails
  unless the pass ends before the last completion, or leaves other than 23 to later passes).
  p50 is how long the pass took (ms), p99 the longest gap between two completions while it
  ran; the target is 0.97 x the baseline's jobs/s.
- ``prune-history-2``: harsher, the 10,000,000 jobs of one busy hour in one partition, dropped
  whole the same way (the pass detaches it and drops its 2.5 GB of files at once). Same
  figures, same target.
- ``history-cycles``: 10 cycles of 100 x --jobs jobs (1,000,000 by default) enqueued, drained and
  pruned (their partition made a day old, then dropped), then vacuumed until a pass no longer
  shrinks it; a run fails unless the hot table's
  size (table and indexes) after each cycle from the third on is within 10% of the second's
  (the first grew the table from empty), and none is more than 10% above the first's.
  p50 is that size after the last cycle (MB), p99 the largest after any (MB).
"""

from __future__ import annotations

import datetime as dt
import threading

from miniqueue import JobSpec
from miniqueue.core.db import Connection, connect
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, settle
from .drain import DRAIN_SCALE, NOOP_APP, drain_through_supervisor, enqueue_in_one_transaction, wait_drained
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

DRAIN_BASELINE = "drain-2-default"
#: Each row's target: its jobs/s at least this share of the baseline's, in the same run.
TARGETS: dict[str, tuple[str, float]] = {
    "drain-history-2": (DRAIN_BASELINE, 0.95),
    "prune-day-2": (DRAIN_BASELINE, 0.97),
    "prune-history-2": (DRAIN_BASELINE, 0.97),
}
HISTORY_ROWS = 10_000_000
CYCLES = 10
CYCLE_SCALE = 100
#: The hot table's size after each cycle may differ from the steady state's by this share at most.
FLAT = 0.10
#: Seconds into the drain when prune-history-2 drops the partition: the drain is under way (its
#: first claims made), and the drop (about half a second) ends well before the drain does.
DROP_AFTER = 0.2
#: Vacuum passes at most after a cycle (see _vacuumed_size).
VACUUM_PASSES = 5

# A finished history, written straight into the partitions from %(anchor)s on (a day before the
# hour the seed began: made first), one row every %(step)s seconds: in one hour's partition, the
# rows a busy hour leaves (BUSY_HOUR), or across the day's 24 (A_DAY), as the statement that
# completes a job leaves them.
_SEED = """
INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, max_attempts, attempt_budget, scheduled_at,
                            created_at, completed_at, finished_at)
SELECT %(queue)s, %(task)s, '{"n": 0}', 'completed', 1, 5, 5, t, t, t, t
  FROM (SELECT %(anchor)s + g * make_interval(secs => %(step)s) AS t
          FROM generate_series(0, %(rows)s - 1) AS g) s
"""
BUSY_HOUR, A_DAY = 0.0003, 0.00864
# The hour a day before this one, where a seed begins, and how many seconds ago it began.
_ANCHOR = """
SELECT a, extract(epoch FROM now() - a)::float8 FROM (SELECT date_trunc('hour', now(), 'UTC') - interval '1 day' AS a) s
"""
# The seeded partitions, and the retention (seconds) past which they alone are: the reaper's pass
# that drops them, an hour after the one before (the day's row: after retention was cut by a day).
_SEEDED_PARTITIONS = """
SELECT array_agg(name ORDER BY name), min(extract(epoch FROM now() - ends_at)::float8) - 1
  FROM miniqueue_history_partitions
 WHERE class = 'done' AND starts_at >= %(anchor)s
   AND starts_at < %(anchor)s + make_interval(secs => %(rows)s * %(step)s)
"""
# The history's partitions detached and not dropped yet.
_DETACHED = """
SELECT count(*) FROM pg_class WHERE relkind = 'r' AND relname ~ '^miniqueue_jobs_done_[0-9]' AND NOT relispartition
"""
# The longest gap between two completions inside a span, on the database clock.
_STALL = """
WITH done AS (
    SELECT completed_at, lag(completed_at) OVER (ORDER BY completed_at) AS before FROM miniqueue_jobs
     WHERE state = 'completed' AND completed_at > %(start)s - interval '5 s')
SELECT extract(epoch FROM max(completed_at - before) FILTER (WHERE completed_at BETWEEN %(start)s AND %(end)s))
  FROM done
"""
# A cycle's finished jobs made a day older: the UPDATE moves them to yesterday's partitions.
_AGE = "UPDATE miniqueue_jobs SET finished_at = finished_at - interval '1 day' WHERE state = 'completed'"
_HOT_BYTES = "SELECT pg_total_relation_size('miniqueue_jobs_live')"
_VACUUM_HOT = "VACUUM miniqueue_jobs_live"


def _vacuumed_size(conn: Connection) -> int:
    """The hot table's size (bytes) once vacuumed, as the reaper's upkeep does at its own pace.

    A VACUUM cuts the table's empty tail off only if no claim asks for the table's lock while
    it scans that tail backwards (it gives way to one), and an idle worker's claims come every
    few hundred ms: on one cycle in four or so the first pass left the tail (286 MB, not 81)
    for the next pass to cut. Passes run until one no longer shrinks the table (at most
    VACUUM_PASSES), as the upkeep's next passes would."""
    size = None
    for _ in range(VACUUM_PASSES):
        conn.execute(_VACUUM_HOT)
        now = int(conn.execute(_HOT_BYTES).fetchall()[0][0])
        if size is not None and now >= size:
            break
        size = now
    assert size is not None
    return size


def _seed_history(dsn: str, rows: int, step: float = BUSY_HOUR) -> dt.datetime:
    """Seed the history; return the hour it begins at (a seed may begin in one hour of the clock
    and end in the next: everything about it is reckoned from that one hour)."""
    with connect(dsn, purpose="bench-seed") as conn:
        [(anchor, ago)] = conn.execute(_ANCHOR).fetchall()
        # The partitions of the last day, as a retention of 24 hours keeps them.
        Store().ensure_partitions(conn, back_seconds={"done": ago})
        conn.execute(_SEED, {"queue": QUEUE, "task": TASK, "rows": rows, "step": step, "anchor": anchor})
        # As a partition past retention was long ago: vacuumed and analyzed (no autovacuum of the
        # fresh rows runs into the timed part), and out of the buffer pool. The INSERT filled the
        # pool with the seed's pages, which the drain would evict where the baseline's fresh
        # database finds free buffers (docs/figures.md). VACUUM FULL writes the tables anew
        # outside the pool and frees the old files' buffers, as the days since a real history's
        # hour was written have; the VACUUM after it sets the visibility map.
        conn.execute("VACUUM (FULL, ANALYZE) miniqueue_jobs_done")
        conn.execute("VACUUM miniqueue_jobs_done")
    assert isinstance(anchor, dt.datetime)
    return anchor


def _jobs(count: int) -> list[JobSpec]:
    return [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(count)]


def history_drain(ctx: Context) -> Sample:
    """The default drain, beside a history of 10,000,000 finished jobs."""
    _seed_history(ctx.dsn, ctx.sized(HISTORY_ROWS, 2_000))
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), _jobs(ctx.jobs * DRAIN_SCALE))


def day_prune(ctx: Context) -> Sample:
    """The default drain, while a day of 10,000,000 finished jobs in 24 partitions is pruned."""
    return _prune_during_drain(ctx, A_DAY, "prune-day-2")


def history_prune(ctx: Context) -> Sample:
    """The default drain, while the history's partition of 10,000,000 jobs is dropped."""
    return _prune_during_drain(ctx, BUSY_HOUR, "prune-history-2")


def _prune_during_drain(ctx: Context, step: float, name: str) -> Sample:
    rows = ctx.sized(HISTORY_ROWS, 2_000)
    anchor = _seed_history(ctx.dsn, rows, step)
    count = ctx.jobs * DRAIN_SCALE
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        seeded = {"rows": rows, "step": step, "anchor": anchor}
        [(partitions, retention)] = conn.execute(_SEEDED_PARTITIONS, seeded).fetchall()
        committed = enqueue_in_one_transaction(ctx.dsn, conn, _jobs(count))
        span: list[object] = []
        dropped: list[str] = []
        left: list[int] = []

        def prune() -> None:  # as the reaper does it, on its next pass if it could not have the lock
            with connect(ctx.dsn, purpose="bench-prune") as own:
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]
                while not dropped:
                    dropped.extend(Store().drop_partitions(own, "done", retention))
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]
                left.append(int(own.execute(_DETACHED).fetchone()[0]))  # type: ignore[index]

        pruner = threading.Timer(ctx.sized(DROP_AFTER, 0.0), prune)  # once the drain is under way
        pruner.start()
        wait_drained(conn)
        pruner.join()
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'completed'), extract(epoch FROM max(completed_at) - %(c)s),"
            "       max(completed_at)"
            "  FROM miniqueue_jobs WHERE id > %(seeded)s",
            {"c": committed, "seeded": rows},
        ).fetchone()
        stall = conn.execute(_STALL, {"start": span[0], "end": span[1]}).fetchone()
        while int(conn.execute(_DETACHED).fetchone()[0]):  # type: ignore[index]  # the reaper's later passes
            Store().drop_partitions(conn, "done", retention)
    assert row is not None and stall is not None
    if row[0] != count or dropped != partitions or left != [len(partitions) - 1]:
        raise RuntimeError(
            f"{name}: {row[0]} of {count} jobs completed; detached {dropped}, not {partitions}; "
            f"{left} detached left to later passes"
        )
    if not ctx.tiny and span[1] >= row[2]:
        raise RuntimeError(f"{name}: the pass ended after the last completion: drain more jobs (--jobs)")
    drop_ms = (span[1] - span[0]).total_seconds() * 1000  # type: ignore[operator]
    return Sample(jobs=count, seconds=float(row[1]), p50_ms=drop_ms, p99_ms=float(stall[0] or 0) * 1000, rss_mb=None)


def history_cycles(ctx: Context) -> Sample:
    """Ten cycles of fill, drain and prune; the hot table's size after each."""
    count = ctx.jobs * CYCLE_SCALE
    sizes: list[int] = []
    seconds = 0.0
    store = Store()
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        store.ensure_partitions(conn, back_seconds={"done": 2 * 86400})
        for _ in range(ctx.sized(CYCLES, 2)):
            committed = enqueue_in_one_transaction(ctx.dsn, conn, _jobs(count))
            wait_drained(conn)
            [(elapsed,)] = conn.execute(
                "SELECT extract(epoch FROM max(completed_at) - %s)::float8 FROM miniqueue_jobs", [committed]
            ).fetchall()
            seconds += float(elapsed)
            conn.execute(_AGE)
            store.drop_partitions(conn, "done", 3600)
            sizes.append(_vacuumed_size(conn))
    # The first cycle grew the table from empty, and its vacuum may not have had the lock to cut
    # the table's empty tail off (the workers' claims hold it): the sizes from the second on are
    # the steady state, and none may pass the first.
    steady = sizes[1]
    if not ctx.tiny and (
        any(abs(size - steady) > FLAT * steady for size in sizes[2:]) or max(sizes[1:]) > sizes[0] * (1 + FLAT)
    ):
        raise RuntimeError(f"history-cycles: the hot table's size after each cycle (bytes) is not flat: {sizes}")
    mb = 1024 * 1024
    return Sample(jobs=count * len(sizes), seconds=seconds, p50_ms=sizes[-1] / mb, p99_ms=max(sizes) / mb, rss_mb=None)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "drain-history-2",
        "supervise drain, no-op, defaults, beside 10,000,000 finished jobs",
        2,
        history_drain,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark(
        "prune-day-2",
        "supervise drain, no-op, defaults, a day of 10,000,000 finished jobs in 24 partitions pruned meanwhile: "
        "p50 = the reaper's pass, p99 = the longest stall (ms)",
        2,
        day_prune,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark(
        "prune-history-2",
        "supervise drain, no-op, defaults, a partition of 10,000,000 finished jobs dropped meanwhile: "
        "p50 = the drop, p99 = the longest stall (ms)",
        2,
        history_prune,
        baselines=(DRAIN_BASELINE,),
    ),
    Benchmark(
        "history-cycles",
        f"{CYCLES} cycles of {CYCLE_SCALE} x --jobs enqueued, drained, pruned: p50 = the hot table after the last, "
        "p99 = its largest (MB)",
        2,
        history_cycles,
    ),
]
