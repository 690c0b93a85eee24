"""Producer rows: enqueue one by one, enqueue_many, and the SQL floor under them."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from miniqueue import Client, JobSpec
from miniqueue.core.db import connect
from miniqueue.core.validation import validate
from miniqueue.store.store import Store

from .database import QUEUE, TASK, payload, settle
from .measure import Laps, Sample, WorkerReport, combine
from .processes import Gate, run_workers
from .registry import Benchmark, Context

# For reference: the same columns Client.enqueue fills, with nothing else: no ON CONFLICT, no
# NOTIFY. What the plainest autocommit INSERT per job costs on this server.
PLAIN_INSERT = """
INSERT INTO public.miniqueue_jobs
       (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at, idempotency_key)
VALUES (%(queue)s, %(task)s, %(payload)s, 0, 5, 5, now(), NULL)
RETURNING id
"""


@dataclass(frozen=True)
class EnqueueSpec:
    """What an enqueueing worker does: ``jobs`` jobs in calls of ``batch``, each job with a
    unique key of its own (``u<n>``) if ``unique_keys``, an idempotency key of its own if
    ``idempotency_keys``."""

    dsn: str
    jobs: int
    batch: int = 1
    notify: bool = True
    unique_keys: bool = False
    idempotency_keys: bool = False


def enqueue_one_by_one(ctx: Context, *, notify: bool) -> Sample:
    """``Client.enqueue`` called once per job, each its own transaction."""
    settle(ctx.dsn)
    return combine(run_workers(enqueue_worker, [EnqueueSpec(ctx.dsn, ctx.jobs, notify=notify)]))


def enqueue_in_batches(ctx: Context, *, batch: int, notify: bool) -> Sample:
    """``Client.enqueue_many`` with ``batch`` jobs per call (the JobSpec lists are built untimed)."""
    settle(ctx.dsn)
    return combine(run_workers(enqueue_many_worker, [EnqueueSpec(ctx.dsn, ctx.jobs, batch, notify)]))


def enqueue_floor(ctx: Context) -> Sample:
    """The SQL floor: the store's own enqueue statement (with NOTIFY), issued by a bare psycopg loop."""
    settle(ctx.dsn)
    return combine(run_workers(floor_worker, [EnqueueSpec(ctx.dsn, ctx.jobs)]))


def plain_insert(ctx: Context) -> Sample:
    """A bare psycopg loop: one plain INSERT per job, autocommit."""
    settle(ctx.dsn)
    return combine(run_workers(insert_worker, [EnqueueSpec(ctx.dsn, ctx.jobs)]))


def enqueue_worker(spec: EnqueueSpec, gate: Gate) -> WorkerReport:
    """Worker: enqueue ``spec.jobs`` jobs one at a time."""
    with Client(spec.dsn, notify=spec.notify) as client:
        client.counts()  # the pool opens its connection before the clock starts
        laps = Laps(gate.wait())
        for n in range(spec.jobs):
            began = time.perf_counter()
            client.enqueue(TASK, payload(n), queue=QUEUE)
            laps.record(began, 1)
        return laps.report()


def enqueue_many_worker(spec: EnqueueSpec, gate: Gate) -> WorkerReport:
    """Worker: enqueue ``spec.jobs`` jobs in ``enqueue_many`` calls of ``spec.batch``."""
    batches = [
        [
            JobSpec(
                TASK,
                payload(n),
                queue=QUEUE,
                unique_key=f"u{n}" if spec.unique_keys else None,
                idempotency_key=f"i{n}" if spec.idempotency_keys else None,
            )
            for n in range(start, min(start + spec.batch, spec.jobs))
        ]
        for start in range(0, spec.jobs, spec.batch)
    ]
    with Client(spec.dsn, notify=spec.notify) as client:
        client.counts()
        laps = Laps(gate.wait())
        for batch in batches:
            began = time.perf_counter()
            client.enqueue_many(batch)
            laps.record(began, len(batch))
        return laps.report()


def floor_statement(store: Store) -> tuple[str, dict[str, Any]]:
    """The statement ``Client.enqueue`` sends for a job of ours (no limits, no parents) and its
    parameters, as the store builds them (``Store._job_params``) from the validated job, with
    NOTIFY and tracing off (no trace context); only the payload changes from job to job."""
    job = validate(JobSpec(TASK, payload(0), queue=QUEUE))
    statement = store._enqueue_limited if job.scopes else store._enqueue  # only the rendered SQL text
    return statement, store._job_params(job, notify=True, trace_context=None)


def floor_worker(spec: EnqueueSpec, gate: Gate) -> WorkerReport:
    """Worker: the SQL floor, the store's enqueue statement with the parameters it sends
    (:func:`floor_statement`), one ``conn.execute`` per job on a connection with the client's
    session settings (``miniqueue.db.connect``): no validation, no pool, no API."""
    statement, params = floor_statement(Store())
    with connect(spec.dsn, purpose="bench-floor") as conn:
        laps = Laps(gate.wait())
        for n in range(spec.jobs):
            began = time.perf_counter()
            params["payload"] = json.dumps(payload(n), separators=(",", ":"))
            conn.execute(statement, params).fetchall()
            laps.record(began, 1)
        return laps.report()


def insert_worker(spec: EnqueueSpec, gate: Gate) -> WorkerReport:
    """Worker: one plain INSERT per job."""
    with psycopg.connect(spec.dsn, autocommit=True) as conn:
        laps = Laps(gate.wait())
        for n in range(spec.jobs):
            began = time.perf_counter()
            conn.execute(PLAIN_INSERT, {"queue": QUEUE, "task": TASK, "payload": Jsonb(payload(n))}).fetchone()
            laps.record(began, 1)
        return laps.report()


def _notify_label(notify: bool) -> str:
    return "NOTIFY" if notify else "no NOTIFY"


BENCHMARKS: list[Benchmark] = [
    Benchmark("enqueue", "enqueue (NOTIFY)", 1, functools.partial(enqueue_one_by_one, notify=True)),
    Benchmark("enqueue-no-notify", "enqueue (no NOTIFY)", 1, functools.partial(enqueue_one_by_one, notify=False)),
    Benchmark("floor-enqueue", "SQL floor: enqueue statement per job", 1, enqueue_floor),
    Benchmark("plain-insert", "plain INSERT per job (reference)", 1, plain_insert),
    *[
        Benchmark(
            f"enqueue-many-{batch}{'' if notify else '-no-notify'}",
            f"enqueue_many x{batch:,} ({_notify_label(notify)})",
            1,
            functools.partial(enqueue_in_batches, batch=batch, notify=notify),
        )
        for batch in (1000, 10_000)
        for notify in (True, False)
    ],
]
