"""``--batches``: a batch task among the jobs (docs/guides/tasks.md, "Batch handlers").

The task's handler receives up to :data:`~chaos.options.BATCH_SIZE` jobs at once. It records an
execution per job, as the chaos task does, each naming the call it ran in (a token shared by the
call's jobs), works once for the whole batch (its longest job's sleep, and a quarter of the
others': a bulk call costs more than one job, less than all of them), then completes
each effect job through its own ``job.transaction()`` (the effect and that job's completion
commit together) and returns the others' results by job id. So every rule of the run holds its
jobs as any other's (none lost or completed twice, no duplicated effect, each re-execution
explained), and the batch rules (chaos.check_batches) read the calls: none larger than the task's
size, and a batch's jobs interrupted by a crash (uncharged) each ran alone next.

The supervisors load this module's ``app`` (or ``async_app``) with ``--batches``: chaos.durable_jobs's,
the chaos tasks and the durable one, with the batch task added. Only then: a worker holds whole
batches of a batch task (two at least), which changes how many jobs it holds of every task.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from miniqueue import Batch, Job

from .app import (
    _RECORD,
    BACKOFF,
    BATCH_TASK,
    QUEUE,
    _execute,
    _execution,
    _result,
    complete_with_effect,
    complete_with_effect_async,
    execute_async,
)
from .durable_jobs import app, async_app
from .options import BATCH_SIZE, BATCH_WAIT

__all__ = ["app", "async_app"]


def _work(jobs: list[Job]) -> float:
    """Seconds the batch works: its longest job's sleep and a quarter of the others'."""
    sleeps = sorted(float(job.payload.get("ms", 0)) for job in jobs)
    return (sleeps[-1] + sum(sleeps[:-1]) / 4) / 1000


def chaos_batch(jobs: list[Job]) -> dict[int, Any]:
    """Record each job's execution, work once for the batch, complete the effect jobs
    transactionally (each on its own), return the others' results."""
    batch = uuid.uuid4().hex
    for job in jobs:
        _execute(_RECORD, _execution(job, batch), job.id)
    time.sleep(_work(jobs))
    outcomes: dict[int, Any] = {}
    for job in jobs:
        if job.payload.get("effect"):
            complete_with_effect(job)  # completed with its effect: left out of the outcomes
        else:
            outcomes[job.id] = _result(job)
    return outcomes


async def chaos_batch_async(jobs: list[Job]) -> dict[int, Any]:
    """:func:`chaos_batch` as a coroutine."""
    batch = uuid.uuid4().hex
    for job in jobs:
        await execute_async(_RECORD, _execution(job, batch), job.id)
    await asyncio.sleep(_work(jobs))
    outcomes: dict[int, Any] = {}
    for job in jobs:
        if job.payload.get("effect"):
            await complete_with_effect_async(job)
        else:
            outcomes[job.id] = _result(job)
    return outcomes


for _app, _handler in ((app, chaos_batch), (async_app, chaos_batch_async)):
    _app.task(BATCH_TASK, queue=QUEUE, max_attempts=25, backoff=BACKOFF, batch=Batch(size=BATCH_SIZE, wait=BATCH_WAIT))(
        _handler
    )
