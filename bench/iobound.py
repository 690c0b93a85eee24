"""I/O-bound rows: jobs that wait 50 ms, as a call to another service does, async and threaded.

- ``io-async-1``: ``async def`` handlers that ``await asyncio.sleep(0.05)``, one worker with
  ``--concurrency 200``: 200 coroutines on the worker's one event loop.
- ``io-threads-1``: the same wait in ``def`` handlers (``time.sleep(0.05)``), one worker with
  ``--concurrency 200``: 200 handler threads.

At most 200 / 0.05 s = 4,000 jobs/s either way; what the rows show is how close each gets, and
at what CPU cost. Both drain --jobs jobs enqueued in one transaction, timed like the drain
rows (commit to last completion on the database clock; every job must complete on its first charged
attempt, see ``bench.drain.RAN_ONCE``).

The worker runs as ``python -m bench.iobound async|sync`` (a :class:`~miniqueue.Worker` in a
process of its own, what a supervised worker runs minus its reports), not under
``miniqueue-supervise``: the supervisor's start-up check counts a connection per handler for
``job.transaction()`` (203 for one worker at ``--concurrency 200``), beyond a default server's
100, although these handlers open none and an async worker's pool holds at most 10.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Literal

import psutil

from miniqueue import App, Job, JobSpec, Worker, WorkerConfig
from miniqueue.core.db import Connection, connect

from .database import QUEUE, settle
from .drain import _LAST_ID, _check_outcome, enqueue_in_one_transaction, wait_drained
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import REPO_ROOT

IO_TASK = "bench.io"
WAIT_SECONDS = 0.05
CONCURRENCY = 200
READY_TIMEOUT_SECONDS = 60.0
Kind = Literal["async", "sync"]

async_app = App()
sync_app = App()


@async_app.task(IO_TASK, queue=QUEUE)
async def wait_async(job: Job) -> None:
    await asyncio.sleep(WAIT_SECONDS)


@sync_app.task(IO_TASK, queue=QUEUE)
def wait_sync(job: Job) -> None:
    time.sleep(WAIT_SECONDS)


# The worker's claim connection exists once its first poll ran; its listener once LISTEN ran.
_READY = """
SELECT count(*) FILTER (WHERE application_name = 'miniqueue:worker') > 0
   AND count(*) FILTER (WHERE application_name = 'miniqueue:listen' AND query ILIKE 'LISTEN %%') > 0
  FROM pg_stat_activity
 WHERE datname = current_database()
"""


def io_bound(ctx: Context, *, kind: Kind) -> Sample:
    """One worker of CONCURRENCY handlers drains --jobs jobs that each wait WAIT_SECONDS."""
    jobs = [JobSpec(IO_TASK, {"i": i}, queue=QUEUE) for i in range(ctx.jobs)]
    settle(ctx.dsn)
    with worker_process(ctx.dsn, kind) as worker, connect(ctx.dsn, purpose="bench-drain") as conn:
        _wait_ready(conn, worker)
        cpu_before = _cpu_seconds(worker)
        before = conn.execute(_LAST_ID).fetchone()
        committed_at = enqueue_in_one_transaction(ctx.dsn, conn, jobs)
        wait_drained(conn)
        cpu = _cpu_seconds(worker) - cpu_before
        rss_mb = worker.memory_info().rss / 2**20
        seconds = _check_outcome(conn, committed_at, len(jobs), before[0] if before else 0)
    return Sample(jobs=len(jobs), seconds=seconds, p50_ms=None, p99_ms=None, rss_mb=rss_mb, worker_cores=cpu / seconds)


@contextlib.contextmanager
def worker_process(dsn: str, kind: Kind) -> Iterator[psutil.Process]:
    """``python -m bench.iobound <kind>`` in a session of its own; TERM, then KILL, at the end."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MINIQUEUE_")}, "DATABASE_URL": dsn}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.iobound", kind], cwd=REPO_ROOT, env=env, start_new_session=True
    )
    try:
        yield psutil.Process(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_ready(conn: Connection, worker: psutil.Process) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not (row := conn.execute(_READY).fetchone()) or not row[0]:
        if not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE:
            raise RuntimeError("the I/O-bound bench worker exited before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the I/O-bound bench worker was not ready within {READY_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.05)


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def run_worker(kind: Kind) -> None:
    """The worker process: run until TERM (its handler only asks the worker to stop)."""
    worker = Worker(
        async_app if kind == "async" else sync_app, os.environ["DATABASE_URL"], WorkerConfig(concurrency=CONCURRENCY)
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.stop())
    worker.run()


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "io-async-1",
        f"I/O-bound {WAIT_SECONDS * 1000:g} ms/job, async def (--concurrency {CONCURRENCY}: coroutines)",
        1,
        functools.partial(io_bound, kind="async"),
    ),
    Benchmark(
        "io-threads-1",
        f"I/O-bound {WAIT_SECONDS * 1000:g} ms/job, def (--concurrency {CONCURRENCY}: threads)",
        1,
        functools.partial(io_bound, kind="sync"),
    ),
]

if __name__ == "__main__":
    run_worker("async" if sys.argv[1:] == ["async"] else "sync")
