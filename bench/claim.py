"""Worker-side rows: claim + complete with 1-8 processes, per job and in batches, and the SQL floor.

Each row drains a queue that was filled before the clock started; every worker claims until
the queue is empty. A run then checks that every job was completed exactly once.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from miniqueue import State
from miniqueue.db import connect
from miniqueue.store import Store

from .database import QUEUE, count_in_state, seed_jobs, settle
from .measure import Laps, Sample, WorkerReport, combine
from .processes import Gate, run_workers
from .registry import Benchmark, Context

LEASE_SECONDS = 300.0
BATCH = 100
# Batch rows drain this many times --jobs, so that a run lasts long enough to measure.
BATCH_SCALE = 5


@dataclass(frozen=True)
class ClaimSpec:
    """What a claiming worker does: claim ``batch`` jobs at a time until the queue is empty."""

    dsn: str
    batch: int


def claim_and_complete(ctx: Context, *, batch: int, floor: bool = False) -> Sample:
    """Drain a filled queue with ``ctx.workers`` processes; ``floor`` uses the bare-SQL worker."""
    jobs = ctx.jobs if batch == 1 else ctx.jobs * BATCH_SCALE
    seed_jobs(ctx.dsn, jobs)
    settle(ctx.dsn)
    work = floor_worker if floor else claim_worker
    sample = combine(run_workers(work, [ClaimSpec(ctx.dsn, batch)] * ctx.workers))
    _check_drained(ctx.dsn, jobs, sample)
    return sample


def _check_drained(dsn: str, jobs: int, sample: Sample) -> None:
    """A benchmark that double-claimed or lost jobs measured something else: stop loudly."""
    completed = count_in_state(dsn, State.COMPLETED)
    if sample.jobs != jobs or completed != jobs:
        raise RuntimeError(f"drained {sample.jobs} claims and {completed} completions for {jobs} jobs")


def claim_worker(spec: ClaimSpec, gate: Gate) -> WorkerReport:
    """Worker: ``Store.claim`` then ``complete`` (per job) or ``complete_many`` (batches)."""
    store, worker_id = Store(), f"bench-{os.getpid()}"
    with connect(spec.dsn, purpose="bench-claim") as conn:
        laps = Laps(gate.wait())
        while True:
            began = time.perf_counter()
            leases = store.claim(conn, [QUEUE], worker_id, LEASE_SECONDS, spec.batch)
            if not leases:
                break
            if spec.batch == 1:
                store.complete(conn, leases[0].id, worker_id, leases[0].attempt)
            else:
                store.complete_many(conn, worker_id, [(lease.id, lease.attempt) for lease in leases])
            laps.record(began, len(leases))
        return laps.report()


def floor_worker(spec: ClaimSpec, gate: Gate) -> WorkerReport:
    """Worker: the store's own claim and batch-complete SQL text, issued by a bare psycopg loop."""
    store, worker_id = Store(), f"bench-floor-{os.getpid()}"
    claim_sql, complete_sql = store._claim_one, store._complete  # only the rendered SQL text
    claim_params: dict[str, Any] = {"worker": worker_id, "lease": LEASE_SECONDS, "limit": spec.batch, "queue": QUEUE}
    with psycopg.connect(spec.dsn, autocommit=True) as conn:
        laps = Laps(gate.wait())
        while True:
            began = time.perf_counter()
            cur = conn.execute(claim_sql, claim_params)
            rows = cur.fetchall()
            if not rows:
                break
            attempt = [column.name for column in cur.description or ()].index("attempt")
            leases = {"ids": [r[0] for r in rows], "attempts": [r[attempt] for r in rows], "worker": worker_id}
            conn.execute(complete_sql, leases)
            laps.record(began, len(rows))
        return laps.report()


BENCHMARKS: list[Benchmark] = [
    *[
        Benchmark(f"claim-{n}", "claim 1 + complete", n, functools.partial(claim_and_complete, batch=1))
        for n in (1, 2, 4, 8)
    ],
    *[
        Benchmark(
            f"claim-batch-{n}", f"claim {BATCH} + complete_many", n, functools.partial(claim_and_complete, batch=BATCH)
        )
        for n in (1, 2, 4, 8)
    ],
    *[
        Benchmark(
            f"floor-claim-{n}",
            f"SQL floor: claim {BATCH} + complete",
            n,
            functools.partial(claim_and_complete, batch=BATCH, floor=True),
        )
        for n in (1, 2)
    ],
]
