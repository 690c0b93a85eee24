"""Worker processes that start together.

Workers are *spawned* (a fresh interpreter, nothing inherited), so no connection, pool or
lock can cross into them; each opens its own connection, then waits at a barrier so that the
clock starts when every worker is ready, not while the last one is still importing psycopg.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any, TypeVar

from .measure import WorkerReport

SpecT = TypeVar("SpecT")

# Generous: a spawned interpreter imports psycopg and miniqueue in well under this even when
# eight of them start at once on two cores.
GATE_TIMEOUT_SECONDS = 120.0
RUN_TIMEOUT_SECONDS = 1800.0


class WorkerFailed(RuntimeError):
    """A worker process raised or died; the message carries its traceback or exit code."""


@dataclass(frozen=True)
class Gate:
    """The start line every worker of a run waits at."""

    barrier: Barrier

    def wait(self) -> float:
        """Block until every worker is ready; return the start time (``time.monotonic()``)."""
        self.barrier.wait(GATE_TIMEOUT_SECONDS)
        return time.monotonic()


WorkerFn = Callable[[SpecT, Gate], WorkerReport]


def run_workers(work: WorkerFn[SpecT], specs: Sequence[SpecT]) -> list[WorkerReport]:
    """Run ``work(spec, gate)`` in one spawned process per spec; return their reports.

    ``work`` must be a module-level function (it is pickled by name). Raises WorkerFailed if
    any worker raises or exits without reporting.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(specs))
    results: Queue[tuple[str, Any]] = context.Queue()
    processes = [
        context.Process(target=_worker_main, args=(work, spec, barrier, results), name=f"bench-worker-{i}")
        for i, spec in enumerate(specs)
    ]
    for process in processes:
        process.start()
    try:
        return _collect(results, processes)
    finally:
        barrier.abort()  # releases any worker still waiting when another one failed
        _stop(processes)


def _worker_main(work: WorkerFn[SpecT], spec: SpecT, barrier: Barrier, results: Queue[tuple[str, Any]]) -> None:
    try:
        results.put(("ok", work(spec, Gate(barrier))))
    except BaseException:
        barrier.abort()  # so the other workers stop waiting for this one
        results.put(("error", traceback.format_exc()))


def _collect(results: Queue[tuple[str, Any]], processes: Sequence[BaseProcess]) -> list[WorkerReport]:
    reports: list[WorkerReport] = []
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    quiet_polls = 0
    while len(reports) < len(processes):
        if time.monotonic() > deadline:
            raise WorkerFailed(f"workers did not finish within {RUN_TIMEOUT_SECONDS:.0f} s")
        try:
            status, payload = results.get(timeout=1.0)
        except queue.Empty:
            quiet_polls = quiet_polls + 1 if _exited(processes) > len(reports) else 0
            # A worker's report can still be in the pipe just after it exits: only a second
            # quiet poll with more exits than reports means one died without a word.
            if quiet_polls >= 2:
                codes = ", ".join(f"{p.name}: {p.exitcode}" for p in processes if p.exitcode is not None)
                raise WorkerFailed(f"a worker process exited without reporting ({codes})") from None
            continue
        if status != "ok":
            raise WorkerFailed(f"a worker process failed:\n{payload}")
        reports.append(payload)
    return reports


def _exited(processes: Sequence[BaseProcess]) -> int:
    return sum(1 for p in processes if p.exitcode is not None)


def _stop(processes: Sequence[BaseProcess]) -> None:
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
