"""The apps the chaos supervisor runs: one task that leaves evidence, as ``def`` (``chaos.app:app``)
or as ``async def`` (``chaos.app:async_app``, with ``--async``).

Every execution commits a row to ``chaos_executions`` before the handler returns, on a
connection of the worker's own (one per handler thread, opened lazily, so after fork). A
share of the jobs also write a ``chaos_effects`` row through ``job.transaction()``: the
effect and the job's completion commit together or not at all, so a second effect row for a
job would be a double completion. The handler ignores ``should_stop()`` on purpose: a late
outcome must be rejected by fencing, not by the handler's good manners. The async handler does
the same on an ``AsyncConnection`` of its worker's event loop and ``job.atransaction()``; it
cannot ignore a stop (its coroutine is cancelled), so it also shows that a cancellation at any
await leaves no half-done effect.

Every handler's result is ``{"attempt": n}``, the attempt that completed it. A dependent (a
group's callback, a chain's step, with ``--workflow``) records the ``job.parent_results`` it
read with its execution, so the checks can tell that it ran with its parents' completed results.

The same handler also serves two tasks with keys (``--unique``, ``--sequences``): ``chaos-unique``
declares ``unique_key`` and ``chaos-sequence`` ``sequence_key`` (with ``on_failure="block"``), each
computed from the payload, so ``app.enqueue`` computes it and a client without the app passes it.
A keyed job's execution also records when its work was done (``ended``, before its completion
commits: inside the effect transaction for an effect job), so the checks can tell whether two
executions of one key overlapped. A sequence job with ``"fail"`` in its payload raises every time
(:data:`PLANNED_FAILURE`) until it is dead.

Over several databases (``--databases``) the supervisors get the shard map's file in
:data:`SHARDS_ENV`, and each job's evidence goes to its own database, the one its id names: the
checks read each database's records, and a database that is down holds up only its own jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from miniqueue import App, Job, exponential_backoff
from miniqueue.core.shard_map import ShardMap

TASK = "chaos"
UNIQUE_TASK = "chaos-unique"
SEQUENCE_TASK = "chaos-sequence"
#: The durable task (``--durable``: see chaos.durable_jobs), whose jobs the durable checks judge alone.
DURABLE_TASK = "chaos-durable"
#: The batch task (``--batches``: see chaos.batches), whose handler takes a list of jobs.
BATCH_TASK = "chaos-batch"
QUEUE = "chaos"
#: What the handler of a sequence job planned to die raises (its attempts are not a fault's).
PLANNED_FAILURE = "chaos: planned failure"
#: The harness's own connections are named ``chaos:*`` so ``terminate-backend`` (which
#: targets ``miniqueue:*``) leaves the evidence trail alone.
APP_NAME = "chaos:app"
#: How long recording an execution retries through a PostgreSQL restart before giving up.
RECORD_RETRY_SECONDS = 20.0
#: With ``--databases``: the shard map's file, which says where each job's evidence goes.
SHARDS_ENV = "CHAOS_SHARDS"
#: Every chaos task's retry backoff: miniqueue's default (0-2 s after a first charged attempt,
#: doubling) but capped at this many seconds instead of 30 minutes. A short form lasts a minute
#: and its drain two at most: a job the faults charge again and again (a kill, a SIGSTOP past its
#: lease, a lost backend, each charged) would wait 8, 16, 32 s ... after its third, fourth, fifth
#: charged attempt, and the long form's busiest jobs minutes, past the drain's deadline. The
#: retry rule (chaos.check_leases) judges every charged retry against this backoff.
RETRY_CAP_SECONDS = 4.0
BACKOFF = exponential_backoff(base=1.0, cap=RETRY_CAP_SECONDS)

app = App()
async_app = App()
_local = threading.local()

_RECORD = """
INSERT INTO chaos_executions (token, job_id, attempt, pid, parents, batch) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (token) DO NOTHING
"""
_EFFECT = """
INSERT INTO chaos_effects (job_id, attempt, pid) VALUES (%s, %s, %s)
ON CONFLICT (job_id) DO NOTHING
"""
_CONFLICT = (
    "INSERT INTO chaos_effect_conflicts (token, job_id, attempt, pid) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_DUPLICATE = "INSERT INTO chaos_duplicate_effects (job_id, attempt, pid) VALUES (%s, %s, %s)"
#: A keyed job's work is done: the first stamp stands (a retried update changes nothing).
_ENDED = "UPDATE chaos_executions SET ended = clock_timestamp() WHERE token = %s AND ended IS NULL"


class PlannedFailure(RuntimeError):
    """Raised by a job whose payload says ``fail``: its sequence key must block once it is dead."""


def _keyed(job: Job) -> bool:
    """Whether the job carries a unique or sequence key (its executions record their end)."""
    return bool(job.payload.get("unique") or job.payload.get("sequence"))


def _unique_key_of(payload: Any) -> str:
    return str(payload["unique"])


def _sequence_key_of(payload: Any) -> str:
    return str(payload["sequence"])


def _execution(job: Job, batch: str | None = None) -> tuple[object, ...]:
    """The parameters of this execution's ``chaos_executions`` row (a fresh token each call);
    ``batch`` names the batch handler's call it ran in (``--batches``)."""
    parents = Jsonb({str(k): v for k, v in job.parent_results.items()}) if job.parents else None
    return (uuid.uuid4().hex, job.id, job.run, os.getpid(), parents, batch)


def _result(job: Job) -> dict[str, int]:
    """The job's result: the attempt that completes it, for a dependent to read back."""
    return {"attempt": job.run}


@functools.cache
def _shard_map() -> ShardMap | None:
    source = os.environ.get(SHARDS_ENV)
    return ShardMap.load(source) if source else None


def _evidence_url(job_id: int | None = None) -> str:
    """Where a job's evidence goes: its own database over several, else the run's one."""
    shards = _shard_map()
    if shards is None or job_id is None:
        return os.environ["DATABASE_URL"]
    return shards.database_of(job_id).url


def _thread_connections() -> dict[str, psycopg.Connection[Any]]:
    """This handler thread's connections, by URL (one per database it recorded on)."""
    conns: dict[str, psycopg.Connection[Any]] | None = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    return conns


def _connection(url: str) -> psycopg.Connection[Any]:
    conns = _thread_connections()
    conn = conns.get(url)
    if conn is None or conn.closed:
        conn = psycopg.connect(url, autocommit=True, application_name=APP_NAME)
        conns[url] = conn
    return conn


def _drop_connection(url: str) -> None:
    conn = _thread_connections().pop(url, None)
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def _execute(query: str, params: tuple[object, ...], job_id: int | None = None) -> None:
    """Run one autocommit statement on ``job_id``'s database, reconnecting through a restart.
    The caller makes the statement idempotent (a token, ON CONFLICT), since a retry may follow a
    lost reply to a statement that did commit."""
    url = _evidence_url(job_id)
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            _connection(url).execute(query, params)
            return
        except psycopg.OperationalError:
            _drop_connection(url)
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@app.task(TASK, queue=QUEUE, max_attempts=25, backoff=BACKOFF)
def chaos(job: Job) -> dict[str, int] | None:
    """Record the execution, work a little, then (for effect jobs) complete transactionally."""
    execution = _execution(job)
    _execute(_RECORD, execution, job.id)
    time.sleep(float(job.payload.get("ms", 0)) / 1000)
    keyed = _keyed(job)
    if not job.payload.get("effect"):
        if keyed:
            _execute(_ENDED, execution[:1], job.id)
        if job.payload.get("fail"):
            raise PlannedFailure(PLANNED_FAILURE)
        return _result(job)
    complete_with_effect(job, execution if keyed else None)
    return None  # the result was stored with the completion, in the transaction


def complete_with_effect(job: Job, keyed_execution: tuple[object, ...] | None = None) -> None:
    """Complete ``job`` through ``job.transaction()``, writing its effect in the same transaction;
    for a keyed job, stamp its execution's end (``keyed_execution``) before that commits."""
    with job.transaction() as conn:
        job.set_result(_result(job))
        if conn.execute(_EFFECT, (job.id, job.run, os.getpid())).rowcount == 0:
            # Another attempt's effect committed, and with it that attempt's completion: this
            # attempt is late. Note it outside the transaction (it happened), and inside it: that
            # row survives only if this transaction commits, i.e. if fencing let a second
            # completion through, which is exactly a duplicated effect.
            _execute(_CONFLICT, (uuid.uuid4().hex, job.id, job.run, os.getpid()), job.id)
            conn.execute(_DUPLICATE, (job.id, job.run, os.getpid()))
        if keyed_execution is not None:
            _execute(_ENDED, keyed_execution[:1], job.id)  # on its own connection, before this transaction commits


# One per worker process and database: every coroutine of a worker runs on its one event loop.
_async_conns: dict[str, psycopg.AsyncConnection[Any]] = {}


async def execute_async(query: str, params: tuple[object, ...], job_id: int | None = None) -> None:
    """:func:`_execute` on the event loop, on ``job_id``'s database. Any failure, a cancellation
    included (the connection may be mid-statement), drops the connection: the next statement
    opens another."""
    url = _evidence_url(job_id)
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            conn = _async_conns.get(url)
            if conn is None or conn.closed:
                conn = _async_conns[url] = await psycopg.AsyncConnection.connect(
                    url, autocommit=True, application_name=APP_NAME
                )
            await conn.execute(query, params)
            return
        except BaseException as exc:
            dropped = _async_conns.pop(url, None)
            if dropped is not None:
                with contextlib.suppress(psycopg.Error):
                    await dropped.close()
            if not isinstance(exc, psycopg.OperationalError) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


@async_app.task(TASK, queue=QUEUE, max_attempts=25, backoff=BACKOFF)
async def chaos_async(job: Job) -> dict[str, int] | None:
    """:func:`chaos` as a coroutine: record, wait, then (for effect jobs) complete transactionally."""
    execution = _execution(job)
    await execute_async(_RECORD, execution, job.id)
    await asyncio.sleep(float(job.payload.get("ms", 0)) / 1000)
    keyed = _keyed(job)
    if not job.payload.get("effect"):
        if keyed:
            await execute_async(_ENDED, execution[:1], job.id)
        if job.payload.get("fail"):
            raise PlannedFailure(PLANNED_FAILURE)
        return _result(job)
    await complete_with_effect_async(job, execution if keyed else None)
    return None  # the result was stored with the completion, in the transaction


async def complete_with_effect_async(job: Job, keyed_execution: tuple[object, ...] | None = None) -> None:
    """:func:`complete_with_effect` through ``job.atransaction()``."""
    async with job.atransaction() as conn:
        job.set_result(_result(job))
        if (await conn.execute(_EFFECT, (job.id, job.run, os.getpid()))).rowcount == 0:
            await execute_async(_CONFLICT, (uuid.uuid4().hex, job.id, job.run, os.getpid()), job.id)
            await conn.execute(_DUPLICATE, (job.id, job.run, os.getpid()))
        if keyed_execution is not None:
            await execute_async(_ENDED, keyed_execution[:1], job.id)


# The keyed tasks: the same handlers, with keys computed from the payload (see the module's docstring).
for _app, _handler in ((app, chaos), (async_app, chaos_async)):
    _app.task(UNIQUE_TASK, queue=QUEUE, max_attempts=25, backoff=BACKOFF, unique_key=_unique_key_of)(_handler)
    _app.task(
        SEQUENCE_TASK,
        queue=QUEUE,
        max_attempts=25,
        backoff=BACKOFF,
        sequence_key=_sequence_key_of,
        on_failure="block",
    )(_handler)
