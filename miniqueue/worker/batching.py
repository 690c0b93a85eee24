"""Batch tasks on a worker: when a batch task's ready jobs start together, and how many of
them the worker holds so that its batches fill.

A batch task's ready leases wait in the worker's slots like any other (renewed by the heartbeat,
handed back unstarted past their start-by time) until ``size`` of them are ready or the oldest
has waited ``wait`` seconds; then up to ``size`` of them start as one handler's jobs (see
:meth:`~miniqueue.worker.slots.Slots.start_batch`), and each job's outcome is queued and
recorded on its own (see :meth:`~miniqueue.worker.execute.Executor.run_batch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..core.records import Lease
from ..tasks.batch import Batch

#: Batches of a task a worker holds jobs for at once: one running, one filling, so a handler
#: that finishes a batch finds the next one full.
BATCHES_HELD = 2


def due_batch(leases: list[Lease], options: Batch, ready_since: Mapping[int, float], now: float) -> list[Lease]:
    """The first ``options.size`` of one task's ready ``leases`` (claim order) if that many are
    ready or the oldest has waited ``options.wait`` seconds; else []."""
    if not leases:
        return []
    oldest = min(ready_since.get(lease.id, now) for lease in leases)
    if len(leases) >= options.size or now - oldest >= options.wait:
        return leases[: options.size]
    return []


def due_in(ready: Iterable[Lease], batches: Mapping[str, Batch], ready_since: Mapping[int, float], now: float) -> float:
    """Seconds until the first batch waiting to fill is due (0: one is due now; inf: none)."""
    oldest: dict[str, float] = {}
    count: dict[str, int] = {}
    for lease in ready:
        if lease.task in batches:
            since = ready_since.get(lease.id, now)
            oldest[lease.task] = min(since, oldest.get(lease.task, since))
            count[lease.task] = count.get(lease.task, 0) + 1
    due = float("inf")
    for task, since in oldest.items():
        options = batches[task]
        due = min(due, 0.0 if count[task] >= options.size else max(0.0, since + options.wait - now))
    return due


def batch_capacity(capacity: int, batches: Mapping[str, Batch]) -> int:
    """The jobs a worker with these batch tasks holds (running and ready), given the
    ``capacity`` its prefetch policy asks for: at least :data:`BATCHES_HELD` full batches of the
    largest, and whole batches of it. A capacity one job over whole batches left a batch of one
    job waiting to fill after each claim, and the drain of a no-op batch task ran at half speed."""
    size = max((options.size for options in batches.values()), default=0)
    if not size:
        return capacity
    return max(BATCHES_HELD * size, -(-capacity // size) * size)
