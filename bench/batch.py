"""Batch handlers (docs/guides/tasks.md, "Batch handlers").

- ``batch-drain-2``: 20 x --jobs no-op jobs of a batch task (``Batch()``: up to 100 jobs a call,
  waiting at most 1 s), drained by ``miniqueue-supervise --workers 2`` with its defaults.
  Target: at least 0.9 x ``floor-drain-2``, the SQL floor it runs on (its baseline in the same
  run; ``drain-2-default``, the same no-op task handled one by one, is shown beside it). The
  app lives here: ``--app bench.batch:batch_app``.

A batch task's jobs are claimed and completed by the worker's one statement, as every job is:
``floor-drain-2``, that statement sent from a bare loop with no handler at all, is the ceiling
of this row, and of any drain on that statement. ``drain-2-default`` already reaches most of it,
so no batch handler can drain several times faster than the one-by-one drain; what a batch
handler saves is the handler's own per-call cost (a database round trip per call, say), which a
no-op does not have (docs/figures.md).
"""

from __future__ import annotations

from miniqueue import App, Batch, JobSpec
from miniqueue.tasks.job import Job

from .claim import FLOOR_DRAIN
from .database import QUEUE, TASK, payload
from .drain import drain_through_supervisor
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions

DRAIN_BASELINE = "drain-2-default"
BATCH_APP = "bench.batch:batch_app"
#: Jobs of the row, in --jobs: a drain long enough that the supervisor's start is noise.
BATCH_SCALE = 20
TARGETS: dict[str, tuple[str, float]] = {"batch-drain-2": (FLOOR_DRAIN, 0.9)}

batch_app = App()


@batch_app.task(TASK, queue=QUEUE, batch=Batch())
def noop_batch(jobs: list[Job]) -> None:
    """The no-op drain's handler, given its jobs a batch at a time."""


def batch_drain(ctx: Context) -> Sample:
    """The default drain of a no-op batch task."""
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs * BATCH_SCALE)]
    return drain_through_supervisor(ctx.dsn, SuperviseOptions(BATCH_APP, ctx.workers), jobs)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "batch-drain-2",
        "supervise drain, no-op batch task (Batch() defaults: 100 a call), defaults",
        2,
        batch_drain,
        baselines=(DRAIN_BASELINE, FLOOR_DRAIN),
    ),
]
