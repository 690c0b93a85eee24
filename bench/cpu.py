"""CPU-bound rows: about 20 ms of pure-Python work per job, in processes and in threads.

The loop size is calibrated once per bench invocation, in this process, so that one job takes
about 20 ms of CPU time on this machine; every job of every row then runs the same loop. The rows drain
200 such jobs through a real supervisor exactly like the drain rows (one enqueue transaction,
timed from its commit to the last completion on the database clock): with ``--workers 1``,
``--workers 2`` (and up to the core count), and ``--workers 1 --concurrency 2`` (two handler
threads sharing one GIL).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import dataclass

from miniqueue import JobSpec

from .apps import CPU_TASK, burn
from .database import QUEUE
from .drain import drain_through_supervisor
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions

CPU_APP = "bench.apps:cpu_app"
JOBS = 200
TINY_JOBS = 10
TARGET_MS = 20.0
_MIN_TIMING_SECONDS = 0.05  # time at least this much work when calibrating
_REPEATS = 7
_REFINEMENTS = 2


@dataclass(frozen=True)
class Calibration:
    """The loop size each job runs, and the CPU time one loop took here (median of several)."""

    loop: int
    ms_per_job: float


@functools.cache
def calibration() -> Calibration:
    """Size the loop to about TARGET_MS of CPU time on this machine, once. Each timing is the
    median of several: on a shared VM the same loop sometimes runs 40% faster for a while, and
    sizing on such a burst (a minimum) would make every job far longer than 20 ms."""
    n = 10_000
    while (took := _median_seconds(n)) < _MIN_TIMING_SECONDS:
        n *= 2
    for _ in range(_REFINEMENTS):  # rescale on the loop's own timing, closer to the target size
        n = max(1, round(n * TARGET_MS / 1000 / took))
        took = _median_seconds(n)
    return Calibration(n, took * 1000)


def calibrated() -> Calibration | None:
    """The calibration, if a CPU row already ran in this process (for the report)."""
    return calibration() if calibration.cache_info().currsize else None


def _median_seconds(n: int) -> float:
    """The median CPU time of ``burn(n)`` on this thread: CPU time, not wall time, so that
    other processes taking turns on the cores do not inflate it."""
    timings = []
    for _ in range(_REPEATS):
        began = time.thread_time()
        burn(n)
        timings.append(time.thread_time() - began)
    return statistics.median(timings)


def cpu_bound(ctx: Context, *, concurrency: int) -> Sample:
    """``ctx.workers`` processes of ``concurrency`` handler threads run JOBS calibrated loops."""
    loop = calibration().loop
    jobs = [JobSpec(CPU_TASK, {"n": loop, "i": i}, queue=QUEUE) for i in range(ctx.sized(JOBS, TINY_JOBS))]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(CPU_APP, ctx.workers, concurrency=concurrency), jobs)


def _worker_counts() -> list[int]:
    """1, 2 and every count up to the cores (at least 2, to show the process/thread contrast)."""
    return list(range(1, max(2, os.cpu_count() or 1) + 1))


BENCHMARKS: list[Benchmark] = [
    *[
        Benchmark(
            f"cpu-{n}",
            f"CPU-bound ~{TARGET_MS:g} ms/job (--concurrency 1)",
            n,
            functools.partial(cpu_bound, concurrency=1),
        )
        for n in _worker_counts()
    ],
    Benchmark(
        "cpu-1-concurrency-2",
        f"CPU-bound ~{TARGET_MS:g} ms/job (--concurrency 2: threads)",
        1,
        functools.partial(cpu_bound, concurrency=2),
    ),
]

#: The row the CPU table's ratios are against.
BASELINE = "cpu-1"
