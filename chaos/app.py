"""The app the chaos supervisor runs (``chaos.app:app``): one task that leaves evidence.

Every execution commits a row to ``chaos_executions`` before the handler returns, on a
connection of the worker's own (one per handler thread, opened lazily, so after fork). A
share of the jobs also write a ``chaos_effects`` row through ``job.transaction()``: the
effect and the job's completion commit together or not at all, so a second effect row for a
job would be a double completion. The handler ignores ``should_stop()`` on purpose: a late
outcome must be rejected by fencing, not by the handler's good manners.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from typing import Any

import psycopg

from miniqueue import App, Job

TASK = "chaos"
QUEUE = "chaos"
#: The harness's own connections are named ``chaos:*`` so ``terminate-backend`` (which
#: targets ``miniqueue:*``) leaves the evidence trail alone.
APP_NAME = "chaos:app"
#: How long recording an execution retries through a PostgreSQL restart before giving up.
RECORD_RETRY_SECONDS = 20.0

app = App()
_local = threading.local()

_RECORD = """
INSERT INTO chaos_executions (token, job_id, attempt, pid) VALUES (%s, %s, %s, %s)
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


def _connection() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, application_name=APP_NAME)
        _local.conn = conn
    return conn


def _drop_connection() -> None:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    _local.conn = None
    if conn is not None:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def _execute(query: str, params: tuple[object, ...]) -> None:
    """Run one autocommit statement, reconnecting through a restart. The caller makes the
    statement idempotent (a token, ON CONFLICT), since a retry may follow a lost reply to a
    statement that did commit."""
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    delay = 0.05
    while True:
        try:
            _connection().execute(query, params)
            return
        except psycopg.OperationalError:
            _drop_connection()
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


@app.task(TASK, queue=QUEUE, max_attempts=25)
def chaos(job: Job) -> None:
    """Record the execution, work a little, then (for effect jobs) complete transactionally."""
    _execute(_RECORD, (uuid.uuid4().hex, job.id, job.attempt, os.getpid()))
    time.sleep(float(job.payload.get("ms", 0)) / 1000)
    if not job.payload.get("effect"):
        return
    with job.transaction() as conn:
        if conn.execute(_EFFECT, (job.id, job.attempt, os.getpid())).rowcount == 0:
            # Another attempt's effect committed, and with it that attempt's completion: this
            # attempt is late. Note it outside the transaction (it happened), and inside it: that
            # row survives only if this transaction commits, i.e. if fencing let a second
            # completion through, which is exactly a duplicated effect.
            _execute(_CONFLICT, (uuid.uuid4().hex, job.id, job.attempt, os.getpid()))
            conn.execute(_DUPLICATE, (job.id, job.attempt, os.getpid()))
