"""``--durable``: durable jobs under fire (docs/guides/durable.md).

Each durable job runs five steps, one of them a ``step_transaction`` that writes to a table of
the harness's own, with two durable sleeps and a wait for a signal between them. Every step's
function counts its run in ``chaos_step_runs`` (committed at once, on a connection of its own)
before it returns, so the checks can tell a step that ran again after it was recorded from one
that ran again because its run was cut short before the record (a kill between the two: allowed,
and what a step is for). A third of the jobs have their signal sent before they wait (kept in the
mailbox); the :class:`Signaller` sends the others' as they park, through the run and the drain.

The checks are chaos.check_durable's; this module is what the supervisors load (the task) and
what the harness runs beside them (the enqueue, the signaller), nothing of the harness's own.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from typing import Any

import psycopg

from miniqueue import Client, Job, JobSpec
from miniqueue.client.sharded import ShardedClient

from .app import BACKOFF, DURABLE_TASK, QUEUE, _execute, app, async_app

SLEEP_SECONDS = 0.3
#: Longer than any run: a wait ends by its signal, never by the timeout.
SIGNAL_TIMEOUT = 600.0
STEPS = ("reserve", "book", "ship", "notify", "close")
#: How often the signaller looks for parked jobs.
SIGNAL_EVERY = 0.3

_RUN = "INSERT INTO chaos_step_runs (token, job_id, step, attempt) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
_EFFECT = "INSERT INTO chaos_durable_effects (job_id, attempt, pid) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_DUPLICATE = "INSERT INTO chaos_durable_duplicates (job_id, attempt, pid) VALUES (%s, %s, %s)"
_PARKED = f"SELECT signal_key FROM miniqueue_jobs WHERE task = '{DURABLE_TASK}' AND state = 'waiting'"


def signal_key(job_id: int) -> str:
    return f"durable:{job_id}"


def _run(job: Job, step: str) -> dict[str, Any]:
    """A step's function: count the run, work a little, give a value."""
    _execute(_RUN, (uuid.uuid4().hex, job.id, step, job.run), job.id)
    time.sleep(float(job.payload.get("ms", 0)) / 1000)
    return {"step": step, "attempt": job.run}


def _book(conn: psycopg.Connection[Any], job: Job) -> dict[str, Any]:
    """The transactional step: its effect commits with the step's record, or not at all."""
    value = _run(job, "book")
    if conn.execute(_EFFECT, (job.id, job.run, os.getpid())).rowcount == 0:
        conn.execute(_DUPLICATE, (job.id, job.run, os.getpid()))  # survives only a double record
    return value


def durable(job: Job) -> dict[str, Any]:
    """Five steps, two sleeps and a signal, top to bottom."""
    job.step("reserve", _run, job, "reserve")
    job.sleep(SLEEP_SECONDS)
    job.step_transaction("book", _book, job)
    signalled = job.wait_for(signal_key(job.id), timeout=SIGNAL_TIMEOUT)
    job.step("ship", _run, job, "ship")
    job.sleep(SLEEP_SECONDS)
    job.step("notify", _run, job, "notify")
    job.step("close", _run, job, "close")
    return {"signal": signalled}


__all__ = ["Signaller", "app", "async_app", "durable", "enqueue_durable"]

for _app in (app, async_app):
    _app.task(DURABLE_TASK, queue=QUEUE, max_attempts=25, backoff=BACKOFF)(durable)


def enqueue_durable(client: Client | ShardedClient, count: int, sleep_ms: tuple[int, int]) -> tuple[list[int], int]:
    """Enqueue the durable jobs, and send a third of their signals before they wait (each on its
    job's own database, over several); their ids and how many signals were sent ahead."""
    specs = [
        JobSpec(DURABLE_TASK, {"n": n, "ms": sleep_ms[0] + n % (sleep_ms[1] - sleep_ms[0] + 1)}, queue=QUEUE)
        for n in range(count)
    ]
    ids = [result.id for result in client.enqueue_many(specs)]
    ahead = ids[::3]
    by_client: dict[int, tuple[Client, list[int]]] = {}
    for job_id in ahead:
        own = client.client(client.shards.database_of(job_id)) if isinstance(client, ShardedClient) else client
        by_client.setdefault(id(own), (own, []))[1].append(job_id)
    for own, jobs in by_client.values():
        own.signal_many([(signal_key(job_id), {"ahead": True}) for job_id in jobs])
    return ids, len(ahead)


class Signaller(threading.Thread):
    """Sends the signal of each durable job that parks, until stopped (through restarts): on each
    database of ``dsns`` (over several, a parked job's signal goes to its own database)."""

    def __init__(self, dsns: list[str]) -> None:
        super().__init__(name="chaos-signaller", daemon=True)
        self.dsns = dsns
        self.sent = 0
        self.errors = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        # One client and one connection per database for the run (a connection per look costs a
        # core's share), made again after a restart or a terminated backend; the next round tries again.
        clients: dict[str, Client] = {}
        conns: dict[str, psycopg.Connection[Any]] = {}
        while not self._stop_event.wait(SIGNAL_EVERY):
            for dsn in self.dsns:
                try:
                    client = clients.get(dsn) or clients.setdefault(dsn, Client(dsn))
                    conn = conns.get(dsn)
                    if conn is None or conn.closed:
                        conn = conns[dsn] = psycopg.connect(
                            dsn, autocommit=True, application_name="chaos:signaller", connect_timeout=5
                        )
                    keys = [row[0] for row in conn.execute(_PARKED)]
                    if keys:
                        client.signal_many([(key, {"ahead": False}) for key in keys])
                        self.sent += len(keys)
                except Exception:
                    self.errors += 1
                    _close(clients.pop(dsn, None), conns.pop(dsn, None))
        _close(*clients.values(), *conns.values())

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def _close(*closing: Client | psycopg.Connection[Any] | None) -> None:
    for each in closing:
        if each is not None:
            with contextlib.suppress(Exception):
                each.close()
