"""An app of ``async def`` tasks for the supervised async tests: each records its execution."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import psycopg

from miniqueue import App
from miniqueue.tasks.job import Job

app = App()
_conn: psycopg.AsyncConnection[Any] | None = None


async def record(job: Job) -> None:
    """Commit a row per execution (on a connection opened after fork, on the worker's loop)."""
    global _conn
    if _conn is None:
        _conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
    await _conn.execute(
        "INSERT INTO executions (job_id, attempt, pid) VALUES (%s, %s, %s)", [job.id, job.run, os.getpid()]
    )


@app.task("nap", max_attempts=3)
async def nap(job: Job) -> None:
    """Record, then sleep ``seconds`` on the attempts listed in ``sleep_on`` (default: none)."""
    await record(job)
    if job.run in job.payload.get("sleep_on", []):
        await asyncio.sleep(job.payload.get("seconds", 30))


@app.task("effect", max_attempts=3)
async def effect(job: Job) -> None:
    """Record, then write an effect row in the transaction that completes the job."""
    await record(job)
    async with job.atransaction() as conn:
        await conn.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])


@app.task("deaf", max_attempts=3, timeout=0.5)
async def deaf(job: Job) -> None:
    """Record, then on its first attempt swallow every cancellation: only a kill ends it."""
    await record(job)
    while job.run == 1:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
