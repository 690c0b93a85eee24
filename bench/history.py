"""Finished jobs out of the hot table (README, "Finished jobs and retention").

Each row drains 5 x --jobs no-op jobs (50,000 by default) with ``miniqueue-supervise --workers
2`` and its defaults, as ``drain-2-default`` does (its baseline, measured in the same run), but
with a history of finished jobs beside the hot table:

- ``drain-history-2``: 10,000,000 completed jobs in the history first (in one hourly partition
  of yesterday's, as a busy hour leaves them). Target: at least 0.95 x the baseline's jobs/s.
- ``prune-history-2``: the same history, among the partitions of a day, and its partition dropped
  whole as retention does it (the reaper's ``drop_partitions``, with the retention past which
  that partition alone is) 0.2 s into the drain (a run fails unless the drop ends before the
  last completion). p50 is how long the drop took (ms), p99 the longest gap between two
  completions while it ran; the target is 0.97 x the baseline's jobs/s.
- ``history-cycles``: 10 cycles of 100 x --jobs jobs (1,000,000 by default) enqueued, drained and
  pruned (their partition made a day old, then dropped), then vacuumed until a pass no longer
  shrinks it; a run fails unless the hot table's
  size (table and indexes) after each cycle from the third on is within 10% of the second's
  (the first grew the table from empty), and none is more than 10% above the first's.
  p50 is that size after the last cycle (MB), p99 the largest after any (MB).
"""

from __future__ import annotations

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

# A finished history, written straight into yesterday's partition of one hour (made first): the
# rows a busy hour leaves, as the statement that completes a job leaves them.
_SEED = """
INSERT INTO miniqueue_jobs (queue, task, payload, state, attempt, max_attempts, attempt_budget, scheduled_at,
                            created_at, completed_at, finished_at)
SELECT %(queue)s, %(task)s, '{"n": 0}', 'completed', 1, 5, 5, t, t, t, t
  FROM (SELECT date_trunc('hour', now(), 'UTC') - interval '1 day' + g * interval '0.3 ms' AS t
          FROM generate_series(1, %(rows)s) AS g) s
"""
# The seeded partition, and the retention (seconds) past which it alone is: the reaper's pass
# that drops it, an hour after it dropped the one before.
_SEEDED_PARTITION = """
SELECT name, extract(epoch FROM now() - ends_at)::float8 - 1 FROM miniqueue_history_partitions
 WHERE class = 'done' AND starts_at = date_trunc('hour', now(), 'UTC') - interval '1 day'
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


def _seed_history(dsn: str, rows: int) -> None:
    with connect(dsn, purpose="bench-seed") as conn:
        # The partitions of the last day, as a retention of 24 hours keeps them.
        Store().ensure_partitions(conn, back_seconds={"done": 86400})
        conn.execute(_SEED, {"queue": QUEUE, "task": TASK, "rows": rows})
        # As a partition past retention was long ago: vacuumed and analyzed (no autovacuum of the
        # fresh rows runs into the timed part).
        conn.execute("VACUUM (ANALYZE) miniqueue_jobs_done")


def _jobs(count: int) -> list[JobSpec]:
    return [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(count)]


def history_drain(ctx: Context) -> Sample:
    """The default drain, beside a history of 10,000,000 finished jobs."""
    _seed_history(ctx.dsn, ctx.sized(HISTORY_ROWS, 2_000))
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), _jobs(ctx.jobs * DRAIN_SCALE))


def history_prune(ctx: Context) -> Sample:
    """The default drain, while the history's partition of 10,000,000 jobs is dropped."""
    _seed_history(ctx.dsn, ctx.sized(HISTORY_ROWS, 2_000))
    count = ctx.jobs * DRAIN_SCALE
    settle(ctx.dsn)
    with supervised(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers)), connect(ctx.dsn, purpose="bench") as conn:
        [(partition, retention)] = conn.execute(_SEEDED_PARTITION).fetchall()
        committed = enqueue_in_one_transaction(ctx.dsn, conn, _jobs(count))
        span: list[object] = []
        dropped: list[str] = []

        def drop() -> None:  # as the reaper does it, on its next pass if it could not have the lock
            with connect(ctx.dsn, purpose="bench-prune") as own:
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]
                while partition not in dropped:
                    dropped.extend(Store().drop_partitions(own, "done", retention))
                span.append(own.execute("SELECT clock_timestamp()").fetchone()[0])  # type: ignore[index]

        pruner = threading.Timer(ctx.sized(DROP_AFTER, 0.0), drop)  # once the drain is under way
        pruner.start()
        wait_drained(conn)
        pruner.join()
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'completed'), extract(epoch FROM max(completed_at) - %(c)s),"
            "       max(completed_at)"
            "  FROM miniqueue_jobs WHERE id > %(seeded)s",
            {"c": committed, "seeded": ctx.sized(HISTORY_ROWS, 2_000)},
        ).fetchone()
        stall = conn.execute(_STALL, {"start": span[0], "end": span[1]}).fetchone()
    assert row is not None and stall is not None
    if row[0] != count or dropped != [partition]:
        raise RuntimeError(f"prune-history-2: {row[0]} of {count} jobs completed; dropped {dropped}, not {partition}")
    if not ctx.tiny and span[1] >= row[2]:
        raise RuntimeError("prune-history-2: the drop ended after the last completion: drain more jobs (--jobs)")
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
