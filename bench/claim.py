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
from miniqueue.core.db import connect
from miniqueue.store.store import Store, _columns

from .database import QUEUE, TASK, count_in_state, seed_jobs, settle
from .measure import Laps, Sample, WorkerReport, combine
from .processes import Gate, run_workers
from .registry import Benchmark, Context

LEASE_SECONDS = 300.0
BATCH = 100
#: The jobs a claim of the default drain's worker completes and claims at once, about: with
#: ``--prefetch auto`` on a no-op drain it holds about 1,000 and claims when half are free.
DRAIN_CLAIM = 500
#: The SQL floor under ``drain-2-default``, and so the ceiling of any drain on the worker's claim
#: statement, whatever its handlers cost (``batch-drain-2`` runs on it too).
FLOOR_DRAIN = "floor-drain-2"
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
            leases = store.claim(conn, [QUEUE], worker_id, LEASE_SECONDS, spec.batch, tasks=[TASK])
            if not leases:
                break
            if spec.batch == 1:
                store.complete(conn, leases[0].id, worker_id, leases[0].attempt)
            else:
                store.complete_many(conn, worker_id, [(lease.id, lease.attempt) for lease in leases])
            laps.record(began, len(leases))
        return laps.report()


def floor_statement(store: Store, worker_id: str, batch: int) -> tuple[str, dict[str, Any]]:
    """The statement a worker's claim loop sends (``Store.complete_and_claim``) and the claim's
    parameters, as the store builds them (``Store._claim_query``, which ``complete_and_claim``
    calls) for a worker of one queue whose jobs have no limits: its cursor over the limited
    jobs stays empty and it goes upwards (``after=[]``, not ``descending``: the defaults), it
    claims the one task its app declares, and, with one handler, may take a whole claim of one
    key's jobs together."""
    return store._claim_query(
        [QUEUE], worker_id, LEASE_SECONDS, batch, after=(), descending=False, tasks=[TASK], together=batch
    )


def floor_params(claim_params: dict[str, Any], held: list[tuple[int, int]]) -> dict[str, Any]:
    """The claim's parameters with the completions of the ``(id, attempt)`` leases ``held``, as
    ``complete_and_claim`` sends them: ids and attempts in id order, no results, and no job of a
    group of limited jobs to look at first."""
    ids, attempts = _columns(held)
    return {**claim_params, "ids": ids, "attempts": attempts, "results": [], "keep": _columns([])[0]}


def floor_worker(spec: ClaimSpec, gate: Gate) -> WorkerReport:
    """Worker: the SQL floor under the worker's claim loop, a bare psycopg loop sending the very
    statement a worker sends, with the parameters it sends (:func:`floor_statement`): the
    completions of the batch it holds ride with the claim of the next one, one round trip and one
    commit per batch. The connection has the worker's session settings (``miniqueue.db.connect``:
    search_path, ``jit=off``, the JSON decoder). Left out is the API around the statement: no
    ``Lease`` objects, no handler dispatch, no error translation.
    """
    store, worker_id = Store(), f"bench-floor-{os.getpid()}"
    statement, claim_params = floor_statement(store, worker_id, spec.batch)
    with connect(spec.dsn, purpose="bench-floor") as conn:
        held: list[tuple[int, int]] = []
        attempt: int | None = None
        laps = Laps(gate.wait())
        while True:
            began = time.perf_counter()
            try:
                cur = conn.execute(statement, floor_params(claim_params, held))
            except psycopg.errors.SerializationFailure:
                continue  # a row it locked moved to the history meanwhile: run again, as the store does
            rows = cur.fetchall()
            if attempt is None:  # the leases' columns follow the ids completed and taken together
                attempt = [column.name for column in cur.description or ()].index("attempt")
            completed = len(rows[0][0] or ()) if rows else 0
            if completed != len(held):
                raise RuntimeError(f"completed {completed} of the {len(held)} jobs this worker held")
            held = [(row[2], row[attempt]) for row in rows if row[2] is not None]
            laps.record(began, len(held))
            if not held:
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
            f"SQL floor: the worker's complete + claim {BATCH}, one statement",
            n,
            functools.partial(claim_and_complete, batch=BATCH, floor=True),
        )
        for n in (1, 2)
    ],
    Benchmark(
        FLOOR_DRAIN,
        f"SQL floor under the default drain: the worker's complete + claim {DRAIN_CLAIM}, one statement",
        2,
        functools.partial(claim_and_complete, batch=DRAIN_CLAIM, floor=True),
    ),
]
