"""Priority aging: a priority-0 job behind a constant stream of priority-10 jobs.

- ``aging-2``: ``miniqueue-supervise --workers 2 --reaper-interval 1`` (its defaults otherwise)
  runs jobs of 10 ms (``bench.apps:fairness_app``'s long task, told to sleep 10 ms) from a
  queue with ``age_after`` 1 s, while a producer keeps at least 200 priority-10 jobs waiting,
  newly enqueued, so that the workers are never idle. Two seconds into the stream one
  priority-0 job is enqueued: without aging it would wait for as long as the stream lasts. Its
  wait is the time from its due time to its start, both on the database clock (``p50``), against
  its bound (``p99``): ten intervals to rise from 0 to the stream's 10, plus one reaper interval
  for the pass that raises it to fall due (jobs/s: the stream's jobs completed meanwhile).

Target (``bench.targets``): the priority-0 job starts within its bound. One that has not started
at three times its bound ends the run, its wait reported as that long. A tiny run ages every
0.1 s.
"""

from __future__ import annotations

import threading
import time

from miniqueue import Client, JobSpec
from miniqueue.core.db import connect

from .apps import LONG_TASK
from .database import QUEUE, settle
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import SuperviseOptions, supervised

AGE_AFTER, TINY_AGE_AFTER = 1.0, 0.1
REAPER_INTERVAL = 1.0
#: The stream's priority: the priority-0 job rises to it in this many steps of AGE_AFTER.
STREAM_PRIORITY = 10
JOB_SECONDS = 0.01
#: The stream: at least this many priority-10 jobs wait, topped up this often.
WAITING, TOP_UP_SECONDS = 200, 0.05
#: How long the stream runs before the priority-0 job is enqueued.
LEAD_SECONDS, TINY_LEAD_SECONDS = 2.0, 0.2
POLL_SECONDS = 0.01

_WAITING = """
SELECT count(*) FROM (SELECT 1 FROM miniqueue_jobs
                       WHERE state = 'available' AND limits IS NULL AND queue = %(queue)s LIMIT %(enough)s) w
"""
# The priority-0 job's wait from its due time to its start (NULL until it started), in seconds.
_WAITED = "SELECT extract(epoch FROM started_at - scheduled_at)::float8 FROM miniqueue_jobs WHERE id = %s"
_COMPLETED = "SELECT count(*) FROM miniqueue_jobs WHERE state = 'completed' AND priority = %s AND aged_from IS NULL"


class Stream(threading.Thread):
    """Keeps at least WAITING priority-10 jobs waiting, each enqueued anew, until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="aging-stream", daemon=True)
        self.dsn, self.stopping = dsn, threading.Event()
        self.failed: BaseException | None = None

    def run(self) -> None:
        jobs = [JobSpec(LONG_TASK, {"seconds": JOB_SECONDS}, queue=QUEUE, priority=STREAM_PRIORITY)] * WAITING
        try:
            with Client(self.dsn) as client, connect(self.dsn, purpose="bench-stream") as conn:
                while not self.stopping.is_set():
                    row = conn.execute(_WAITING, {"queue": QUEUE, "enough": WAITING}).fetchone()
                    if row is not None and row[0] < WAITING:
                        client.enqueue_many(jobs)
                    self.stopping.wait(TOP_UP_SECONDS)
        except BaseException as exc:  # reported by the run, which would otherwise wait for nothing
            self.failed = exc


def starved_job(ctx: Context) -> Sample:
    """One run of ``aging-2`` (see the module's docstring)."""
    age_after = ctx.sized(AGE_AFTER, TINY_AGE_AFTER)
    bound = STREAM_PRIORITY * age_after + REAPER_INTERVAL
    settle(ctx.dsn)
    options = SuperviseOptions("bench.apps:fairness_app", 2, extra=("--reaper-interval", f"{REAPER_INTERVAL:g}"))
    with Client(ctx.dsn) as client:
        client.age_queue(QUEUE, age_after, create=True)
    stream = Stream(ctx.dsn)
    with supervised(ctx.dsn, options), connect(ctx.dsn, purpose="bench-aging") as conn:
        stream.start()
        began = time.monotonic()
        try:
            time.sleep(ctx.sized(LEAD_SECONDS, TINY_LEAD_SECONDS))
            with Client(ctx.dsn) as client:
                job_id = client.enqueue(LONG_TASK, {"seconds": JOB_SECONDS}, queue=QUEUE, priority=0).id
            enqueued, waited = time.monotonic(), None
            while waited is None and time.monotonic() - enqueued < 3 * bound and stream.failed is None:
                time.sleep(POLL_SECONDS)
                waited = (conn.execute(_WAITED, [job_id]).fetchone() or (None,))[0]
            seconds = time.monotonic() - began
        finally:
            stream.stopping.set()
            stream.join()
        if stream.failed is not None:
            raise RuntimeError(f"the stream of priority-{STREAM_PRIORITY} jobs failed: {stream.failed!r}")
        completed = int((conn.execute(_COMPLETED, [STREAM_PRIORITY]).fetchone() or (0,))[0])
    return Sample(
        jobs=completed,
        seconds=seconds,
        p50_ms=(3 * bound if waited is None else waited) * 1000,
        p99_ms=bound * 1000,
        rss_mb=None,
    )


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "aging-2",
        f"a priority-0 job behind a stream of priority-{STREAM_PRIORITY} jobs, age_after {AGE_AFTER:g} s",
        2,
        starved_job,
    ),
]
