"""Measurements: what a worker process reports, and how reports become one sample.

Latencies are timed with ``time.perf_counter()`` inside one process. A run's duration spans
processes, so it uses ``time.monotonic()``, which on Linux and macOS reads one system-wide
clock (CLOCK_MONOTONIC / mach_absolute_time): instants from different processes compare.
"""

from __future__ import annotations

import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WorkerReport:
    """What one worker process did between the start gate and the end of its work."""

    started: float
    finished: float
    jobs: int
    latencies_ms: list[float]
    rss_mb: float


@dataclass(frozen=True)
class Sample:
    """One run of one benchmark: jobs processed, wall time, per-call latency, peak worker RSS."""

    jobs: int
    seconds: float
    p50_ms: float | None
    p99_ms: float | None
    rss_mb: float | None
    load_1m: float | None = None  # the machine's load average when the run ended: how noisy it was
    # Supervised rows: CPU seconds the worker processes used per second of the run, i.e. how
    # many cores they actually got (on a busy machine, fewer than there are workers).
    worker_cores: float | None = None
    # The fairness row: when the first long job completed, in ms from the commit.
    long_first_ms: float | None = None
    # The scale-reads row: a /metrics scrape and a dashboard overview, in ms (medians of 5).
    scrape_ms: float | None = None
    overview_ms: float | None = None
    # The autoscaling rows: when a second worker ran (ms from the commit), the most workers seen,
    # and when the supervisor was back at its minimum (ms from the drain's end).
    scale_up_ms: float | None = None
    peak_workers: int | None = None
    scale_down_ms: float | None = None
    # The fair-share rows: when the small tenants' last job completed and their fair share's time
    # (ms from their commit), and the weight-3 key's completions over the weight-1 key's.
    fair_last_ms: float | None = None
    fair_share_ms: float | None = None
    weight_ratio: float | None = None

    @property
    def jobs_per_s(self) -> float:
        """Throughput of this run."""
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Laps:
    """A worker's stopwatch: the time its gate opened, then one latency per call."""

    started: float
    latencies_ms: list[float] = field(default_factory=list)
    jobs: int = 0

    def record(self, began: float, jobs: int) -> None:
        """Record a call that began at ``began`` (``perf_counter``) and handled ``jobs`` jobs."""
        self.latencies_ms.append((time.perf_counter() - began) * 1000.0)
        self.jobs += jobs

    def report(self) -> WorkerReport:
        """Stop the clock and report, with this process's peak RSS."""
        return WorkerReport(self.started, time.monotonic(), self.jobs, self.latencies_ms, peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; None if there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def combine(reports: Sequence[WorkerReport]) -> Sample:
    """One sample from all workers of a run: from the first start to the last finish."""
    latencies = [ms for r in reports for ms in r.latencies_ms]
    return Sample(
        jobs=sum(r.jobs for r in reports),
        seconds=max(r.finished for r in reports) - min(r.started for r in reports),
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        rss_mb=max(r.rss_mb for r in reports),
    )


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None; None if all are."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
