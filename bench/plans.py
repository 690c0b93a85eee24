"""Plan checks: EXPLAIN (ANALYZE, BUFFERS) of the store's hot statements at 50,000 queued jobs.

The plans are of exactly the SQL and parameters the store sends: :class:`ExplainingStore`
runs each statement a store method issues under EXPLAIN, inside a transaction that is rolled
back, so nothing is claimed, completed or inserted.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection, connect
from miniqueue.core.steps import Query, Steps
from miniqueue.core.validation import validate
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, scratch_database, seed_jobs

QUEUED_JOBS = 50_000
CLAIM_BATCH = 100
COMPLETE_BATCH = 100
ENQUEUE_MANY_BATCH = 10_000
# A tiny run (--tiny): the same checks on a few hundred jobs, only to see that they run.
TINY_QUEUED_JOBS, TINY_ENQUEUE_MANY_BATCH = 500, 100
# The fair claim's check: a backlog of fair jobs over many keys (see docs/guides/fairness.md).
FAIR_JOBS, FAIR_KEYS, FAIR_BATCH = 1_000_000, 10_000, 10_000
TINY_FAIR_JOBS, TINY_FAIR_KEYS = 500, 10
CLAIM_INDEX = "idx_miniqueue_jobs_claim"
_SORT_NODE = re.compile(r"(^|->\s+)(Incremental )?Sort\s+\(")
_JOIN_FILTER_REMOVED = re.compile(r"Rows Removed by Join Filter: (\d+)")
_EXECUTION = re.compile(r"Execution Time: ([\d.]+) ms")
_JIT_TOTAL = re.compile(r"Timing: .*Total ([\d.]+) ms")


@dataclass(frozen=True)
class PlanCheck:
    """One statement's plan: its top line, execution time, and whether it looks right."""

    label: str
    top_line: str
    execution_ms: float | None
    ok: bool
    verdict: str
    plan: list[str]


class ExplainingStore(Store):
    """A Store whose statements are EXPLAINed instead of answered (every Store method reads
    its rows through ``_rows``); the plans are kept in ``plans`` and no rows are returned."""

    def __init__(self, schema: str = "public") -> None:
        super().__init__(schema)
        self.plans: list[list[str]] = []

    def _rows(self, conn: Connection, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:  # type: ignore[override]
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, params).fetchall()
        self.plans.append([str(row[0]) for row in rows])
        return []

    def explain_first(self, conn: Connection, steps: Steps[Any]) -> None:
        """EXPLAIN the first statement of an operation written as steps (see
        :mod:`miniqueue.steps`), which reads its rows through an executor, not ``_rows``."""
        request = next(steps)
        assert isinstance(request, Query), request
        self._rows(conn, request.sql, dict(request.params or {}))


def check_plans(server_dsn: str, *, tiny: bool = False) -> list[PlanCheck]:
    """Fill a scratch queue with 50,000 jobs (500 if ``tiny``) and check the claim, batch-complete
    and enqueue_many plans."""
    with scratch_database(server_dsn, "plans") as dsn, connect(dsn, purpose="bench-plans") as conn:
        # Keep the statistics the migration left until we ANALYZE on purpose.
        conn.execute("ALTER TABLE miniqueue_jobs_live SET (autovacuum_enabled = false)")
        seed_jobs(dsn, TINY_QUEUED_JOBS if tiny else QUEUED_JOBS)
        checks = [check_claim(conn, "statistics from the migration only")]
        conn.execute("ANALYZE miniqueue_jobs_live")
        return [
            *checks,
            check_claim(conn, "after ANALYZE"),
            check_complete_many(conn, COMPLETE_BATCH),
            check_enqueue_many(conn, TINY_ENQUEUE_MANY_BATCH if tiny else ENQUEUE_MANY_BATCH),
            check_fair_claim(server_dsn, TINY_FAIR_JOBS if tiny else FAIR_JOBS, TINY_FAIR_KEYS if tiny else FAIR_KEYS),
        ]


def check_fair_claim(server_dsn: str, jobs: int, keys: int) -> PlanCheck:
    """At ``jobs`` fair jobs over ``keys`` keys, the claim reads the first entries of the claim
    index (each job's turn is in it) in order, as it does for jobs that are not fair: no Sort."""
    with scratch_database(server_dsn, "fair plans") as dsn, connect(dsn, purpose="bench-plans") as conn:
        with Client(dsn, notify=False) as client:
            for start in range(0, jobs, FAIR_BATCH):
                stop = min(start + FAIR_BATCH, jobs)
                client.enqueue_many(
                    [JobSpec(TASK, payload(n), queue=QUEUE, fair_key=f"k{n % keys}") for n in range(start, stop)]
                )
        conn.execute("ANALYZE miniqueue_jobs_live")
        return check_claim(conn, f"{jobs:,} fair jobs over {keys:,} keys")


def check_claim(conn: Connection, when: str) -> PlanCheck:
    """The claim must read the claim index in order: the index named, no Sort node in the part
    that picks jobs without limits (the `fast` CTE; what follows sorts only the candidates)."""
    plan = _explain(conn, lambda store: store.claim(conn, [QUEUE], "bench-plans", 300, CLAIM_BATCH))
    pick = _subtree(plan, "CTE fast")
    uses_index = any(CLAIM_INDEX in line for line in pick)
    sorts = any(_SORT_NODE.search(line) for line in pick)
    ok = uses_index and not sorts
    verdict = f"{CLAIM_INDEX} {'used' if uses_index else 'NOT used'}, {'a Sort node' if sorts else 'no Sort'}"
    return _check(f"claim x{CLAIM_BATCH}, {when}", plan, ok, verdict)


def check_complete_many(conn: Connection, batch: int) -> PlanCheck:
    """A batch completion should touch each leased row once, not compare every pair of ids."""
    with _rolled_back(conn):
        leases = [(lease.id, lease.attempt) for lease in Store().claim(conn, [QUEUE], "bench-plans", 300, batch)]
        plan = _explain(conn, lambda store: store.explain_first(conn, store.complete_many_steps("bench-plans", leases)))
    removed = max((int(m[1]) for line in plan if (m := _JOIN_FILTER_REMOVED.search(line))), default=0)
    ok = removed <= batch
    verdict = f"{removed:,} rows removed by a join filter for {batch} leases" + (
        "" if ok else " (a nested loop over unnest: quadratic in the batch size)"
    )
    return _check(f"complete_many x{batch}", plan, ok, verdict)


def check_enqueue_many(conn: Connection, count: int) -> PlanCheck:
    """A bulk insert should not pay for JIT compilation (a sign of a badly overestimated plan).

    The batch carries idempotency keys: one without them goes by COPY, which has no plan."""
    jobs = [validate(JobSpec(TASK, payload(n), queue=QUEUE, idempotency_key=f"plans-{n}")) for n in range(count)]
    plan = _explain(conn, lambda store: store.explain_first(conn, store.enqueue_many_steps(jobs, notify=True)))
    jit = next((float(m[1]) for line in plan if (m := _JIT_TOTAL.search(line))), None)
    verdict = "no JIT" if jit is None else f"JIT compilation took {jit:,.0f} ms of it"
    return _check(f"enqueue_many x{count:,} with keys", plan, jit is None, verdict)


def _subtree(plan: list[str], heading: str) -> list[str]:
    """The lines of the plan node (or CTE) whose line starts with ``heading``, children included."""

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    start = next((i for i, line in enumerate(plan) if line.strip().startswith(heading)), None)
    if start is None:
        return []
    children = itertools.takewhile(lambda line: indent(line) > indent(plan[start]), plan[start + 1 :])
    return [plan[start], *children]


def _explain(conn: Connection, call: Callable[[ExplainingStore], object]) -> list[str]:
    """The plan of the single statement ``call`` makes the store run, rolled back."""
    store = ExplainingStore()
    with _rolled_back(conn):
        call(store)
    if len(store.plans) != 1:
        raise RuntimeError(f"expected the store to run one statement, it ran {len(store.plans)}")
    return store.plans[0]


@contextmanager
def _rolled_back(conn: Connection) -> Iterator[None]:
    """A transaction (or savepoint) that is always rolled back."""
    with conn.transaction():
        yield
        raise psycopg.Rollback()


def _check(label: str, plan: list[str], ok: bool, verdict: str) -> PlanCheck:
    executed = next((float(m[1]) for line in plan if (m := _EXECUTION.search(line))), None)
    return PlanCheck(label, plan[0] if plan else "", executed, ok, verdict, plan)
