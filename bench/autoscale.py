"""Autoscaling: a burst of CPU-bound jobs on ``--workers 1:4`` beside a fixed ``--workers 2``.

- ``autoscale-burst``: 4,000 jobs of about 20 ms of pure Python each (the CPU rows' calibrated
  loop), enqueued in one transaction to an idle ``miniqueue-supervise --workers 1:4`` with every
  other option at its default (``--scale-target 30``, ``--scale-cooldown 30``): the drain, from
  the commit to the last completion; when a second worker process ran, from the commit; the
  most worker processes seen; and when the supervisor was back at one, from the drain's end.
- ``autoscale-fixed-2``: the same burst on a fixed ``--workers 2``, its baseline (same run).

Targets (``bench.targets``): the burst drains at >= 0.9x of the fixed two; a second worker within
5 s of the commit and never a third (two cores: the CPU is saturated at two); back at one within
the cool-down and a reading (32 s). Worker processes are counted by their titles every 0.2 s.
"""

from __future__ import annotations

import time

from miniqueue import JobSpec
from miniqueue.core.db import connect
from miniqueue.core.scaling import DEFAULT_SCALE_COOLDOWN

from .apps import CPU_TASK
from .cpu import CPU_APP, calibration
from .database import QUEUE, settle
from .drain import check_outcomes, drained, enqueue_in_one_transaction
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

JOBS = 4_000
TINY_JOBS = 20
#: The autoscaling rows' range, and the fixed count they are held against.
RANGE = "1:4"
BASELINE = "autoscale-fixed-2"
#: How often the worker processes are counted.
LOOK_SECONDS = 0.2
TARGETS = {
    "share": 0.9,
    "scale_up_ms": 5_000.0,
    "peak_workers": 2,
    "scale_down_ms": (DEFAULT_SCALE_COOLDOWN + 2) * 1000,
}


def burst(ctx: Context, *, scaling: bool) -> Sample:
    """The burst through a supervisor that scales (``--workers 1:4``) or not (``--workers 2``)."""
    loop = calibration().loop
    jobs = [JobSpec(CPU_TASK, {"n": loop, "i": i}, queue=QUEUE) for i in range(ctx.sized(JOBS, TINY_JOBS))]
    cooldown = ctx.sized(DEFAULT_SCALE_COOLDOWN, 1.0)
    extra = ("--workers", RANGE, *(("--scale-cooldown", "1") if ctx.tiny else ())) if scaling else ()
    options = SuperviseOptions(CPU_APP, 1 if scaling else 2, extra=extra)
    settle(ctx.dsn)
    with supervised(ctx.dsn, options) as supervisor, connect(ctx.dsn, purpose="bench-drain") as conn:
        before = int((conn.execute("SELECT coalesce(max(id), 0) FROM miniqueue_jobs").fetchone() or (0,))[0])
        committed_at = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        started, seen = time.monotonic(), [(0.0, 1 if scaling else 2)]
        while not drained(conn):
            seen.append((time.monotonic() - started, len(supervisor.worker_pids())))
            time.sleep(LOOK_SECONDS)
        drained_at = time.monotonic() - started
        seconds = check_outcomes([(conn, before)], committed_at, len(jobs))
        back = None
        while scaling and time.monotonic() - started < drained_at + cooldown + 30:
            if len(supervisor.worker_pids()) == 1:
                back = time.monotonic() - started - drained_at
                break
            time.sleep(LOOK_SECONDS)
    up = next((at for at, workers in seen if workers >= 2), None)
    return Sample(
        jobs=len(jobs),
        seconds=seconds,
        p50_ms=None,
        p99_ms=None,
        rss_mb=None,
        scale_up_ms=None if up is None else up * 1000,
        peak_workers=max(workers for _, workers in seen),
        scale_down_ms=None if back is None else back * 1000,
    )


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        BASELINE,
        f"a burst of {JOBS:,} CPU-bound jobs (~20 ms), fixed --workers 2",
        2,
        lambda ctx: burst(ctx, scaling=False),
    ),
    Benchmark(
        "autoscale-burst",
        f"the same burst, --workers {RANGE} (autoscaling, its defaults)",
        1,
        lambda ctx: burst(ctx, scaling=True),
        baselines=(BASELINE,),
    ),
]
