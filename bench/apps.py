"""The apps the supervised rows run, loaded by ``miniqueue-supervise --app bench.apps:<name>``.

Each worker process imports this module after fork (the supervisor runs from the repository
root, so ``bench`` is importable). Nothing here opens a connection at import: the latency
handler opens its own, lazily, in the worker process that runs it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg

from miniqueue import App, Job

from .database import QUEUE, TASK

LATENCY_TASK = "bench.latency"
CPU_TASK = "bench.cpu"
#: The handlers' database: the supervisor's own DATABASE_URL, which its children inherit.
DSN_ENV = "DATABASE_URL"

#: Where the latency handler records when it started, on the database clock.
LATENCY_TABLE_DDL = "CREATE TABLE bench_latency (job_id BIGINT PRIMARY KEY, started_at TIMESTAMPTZ NOT NULL)"
_RECORD_START = "INSERT INTO bench_latency (job_id, started_at) VALUES (%s, clock_timestamp())"

noop_app = App()
latency_app = App()
cpu_app = App()


@noop_app.task(TASK, queue=QUEUE)
def noop(job: Job) -> None:
    """Nothing at all: what remains is what the queue costs per job."""


_local = threading.local()


def _connection() -> psycopg.Connection[Any]:
    """This handler thread's connection, opened on first use (after fork, in the worker)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ[DSN_ENV], autocommit=True, application_name="bench-handler")
        _local.conn = conn
    return conn


@latency_app.task(LATENCY_TASK, queue=QUEUE)
def record_start(job: Job) -> None:
    """Record ``clock_timestamp()`` as the handler's first act."""
    _connection().execute(_RECORD_START, [job.id])


@cpu_app.task(CPU_TASK, queue=QUEUE)
def burn_job(job: Job) -> None:
    """Pure-Python work: a loop of ``payload["n"]`` iterations (calibrated to about 20 ms)."""
    burn(int(job.payload["n"]))


def burn(n: int) -> int:
    """Interpreted bytecode, holding the GIL the way Python code does (switching every 5 ms),
    unlike ``sum(range(n))``, which runs in C without ever offering the GIL to another thread."""
    total = 0
    for i in range(n):
        total += i
    return total


fairness_app = App()
#: The same app with one ``async def`` task more, on the same queue: its workers run a thread
#: pool and an event loop. The fairness rows enqueue no job of it; only the app differs.
fairness_mixed_app = App()
SHORT_TASK, LONG_TASK, ASYNC_TASK = "bench.short", "bench.long", "bench.async"
#: How long a long job runs unless its payload says otherwise (``seconds``).
LONG_SECONDS = 5.0


@fairness_mixed_app.task(SHORT_TASK, queue=QUEUE)
@fairness_app.task(SHORT_TASK, queue=QUEUE)
def short(job: Job) -> None:
    """About a millisecond of waiting, as a quick call to another service would take."""
    time.sleep(0.001)


@fairness_mixed_app.task(LONG_TASK, queue=QUEUE)
@fairness_app.task(LONG_TASK, queue=QUEUE)
def long(job: Job) -> None:
    """Five seconds (``payload["seconds"]`` if given): long enough that a short job stuck behind
    it is plainly unfair."""
    time.sleep(float(job.payload.get("seconds", LONG_SECONDS)))


@fairness_mixed_app.task(ASYNC_TASK, queue=QUEUE)
async def short_async(job: Job) -> None:
    """The mixed app's coroutine task: the same millisecond, awaited."""
    await asyncio.sleep(0.001)


durable_app = App()
STEPS_TASK = "bench.steps10"
PLAIN_TASK = "bench.plain"
SLEEP_TASK = "bench.sleep"
#: How long each job of the sleep row sleeps.
SLEEP_SECONDS = 0.5


def _nothing() -> None:
    """A step that does nothing: what remains is what recording a step costs."""


@durable_app.task(PLAIN_TASK, queue=QUEUE)
def plain(job: Job) -> None:
    """The steps row's baseline, in the same app: no step at all."""


@durable_app.task(STEPS_TASK, queue=QUEUE)
def ten_steps(job: Job) -> None:
    """Ten steps that do nothing, each recorded (one fenced UPDATE apiece)."""
    for n in range(10):
        job.step(f"s{n}", _nothing)


@durable_app.task(SLEEP_TASK, queue=QUEUE)
def sleep_then_step(job: Job) -> None:
    """A durable sleep, then a step: its record's time, less the sleep's end, is the resume latency."""
    job.sleep(SLEEP_SECONDS)
    job.step("woke", _nothing)
