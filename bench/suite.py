"""The suite: every registered row, and the loop that runs them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from . import (
    aging,
    autoscale,
    batch,
    claim,
    cpu,
    drain,
    durable,
    enqueue,
    fair_share,
    fairness,
    history,
    horizon,
    iobound,
    keys,
    latency,
    limits,
    online,
    scale,
    shards,
    workflow,
)
from .database import scratch_database
from .measure import Sample, load_average
from .registry import Benchmark, Context
from .report import RowResult

# The table's rows, in order. A new row is a function (Context) -> Sample added to a module's
# BENCHMARKS list; a new module adds its list here.
BENCHMARKS: list[Benchmark] = [
    *enqueue.BENCHMARKS,
    *claim.BENCHMARKS,
    *drain.BENCHMARKS,
    *fairness.BENCHMARKS,
    *latency.BENCHMARKS,
    *cpu.BENCHMARKS,
    *autoscale.BENCHMARKS,
    *aging.BENCHMARKS,
    *iobound.BENCHMARKS,
    *scale.BENCHMARKS,
    *limits.BENCHMARKS,
    *fair_share.BENCHMARKS,
    *keys.BENCHMARKS,
    *online.BENCHMARKS,
    *history.BENCHMARKS,
    *durable.BENCHMARKS,
    *shards.BENCHMARKS,
    *horizon.BENCHMARKS,
    *workflow.BENCHMARKS,
    *batch.BENCHMARKS,
]

Progress = Callable[[int, Benchmark, Sample], None]

#: ``--jobs`` of a tiny run (``--tiny``): a few batches of the batch-claim rows.
TINY_JOBS = 50


def run_suite(
    server_dsn: str,
    benchmarks: Sequence[Benchmark],
    *,
    runs: int,
    jobs: int,
    progress: Progress,
    tiny: bool = False,
) -> list[RowResult]:
    """Run every benchmark ``runs`` times, each time in a fresh database; return the samples.
    ``tiny`` runs each at a tiny size (see :class:`Context`), only to see that it runs.

    The runs are interleaved (all rows once, then all rows again) so that a slow spell of the
    machine, a checkpoint or another tenant spreads over the rows instead of hitting one.
    """
    samples: dict[str, list[Sample]] = {b.name: [] for b in benchmarks}
    for run in range(1, runs + 1):
        for benchmark in benchmarks:
            sample = run_once(server_dsn, benchmark, jobs=jobs, tiny=tiny)
            sample = dataclasses.replace(sample, load_1m=load_average())
            samples[benchmark.name].append(sample)
            progress(run, benchmark, sample)
    return [RowResult(b, samples[b.name]) for b in benchmarks]


def run_once(server_dsn: str, benchmark: Benchmark, *, jobs: int, tiny: bool = False) -> Sample:
    """One run of one row, in a database created for it and dropped afterwards."""
    with scratch_database(server_dsn, benchmark.name) as dsn:
        return benchmark.run(Context(dsn=dsn, jobs=jobs, workers=benchmark.workers, tiny=tiny))
