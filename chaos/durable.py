"""``--durable``: durable jobs under fire (docs/guides/durable.md).

Each durable job runs five steps, one of them a ``step_transaction`` that writes to a table of
the harness's own, with two durable sleeps and a wait for a signal between them. Every step's
function counts its run in ``chaos_step_runs`` (committed at once, on a connection of its own)
before it returns, so the checks can tell a step that ran again after it was recorded from one
that ran again because its run was cut short before the record (a kill between the two: allowed,
and what a step is for). A third of the jobs have their signal sent before they wait (kept in the
mailbox); the :class:`Signaller` sends the others' as they park, through the run and the drain.

The checks: every durable job completed, once; the transactional step's effect exactly once per
job; no step ran again in an attempt after the one that recorded it, and once in that one; and a
job no fault touched spent one attempt, however many times it slept and waited.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import psycopg

from miniqueue import Client, Job, JobSpec

from .app import DURABLE_TASK, QUEUE, _execute, app, async_app
from .rows import Row, info, rule

if TYPE_CHECKING:  # chaos.faults imports the fleet, which imports this module's DDL
    from .faults import Stop

SLEEP_SECONDS = 0.3
#: Longer than any run: a wait ends by its signal, never by the timeout.
SIGNAL_TIMEOUT = 600.0
STEPS = ("reserve", "book", "ship", "notify", "close")
#: How often the signaller looks for parked jobs.
SIGNAL_EVERY = 0.3

DDL = """
CREATE TABLE chaos_step_runs (
    token   TEXT PRIMARY KEY,                 -- one per run of a step's function
    job_id  BIGINT NOT NULL,
    step    TEXT NOT NULL,
    attempt INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_durable_effects (
    job_id  BIGINT PRIMARY KEY,               -- the transactional step's effect: one per job, ever
    attempt INT NOT NULL,
    pid     INT NOT NULL
);
-- Written inside the step's transaction when its effect was there already: a row survives only
-- if that transaction committed, i.e. if a second record of the step (and effect) stood.
CREATE TABLE chaos_durable_duplicates (
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    pid     INT NOT NULL
);
"""
_RUN = "INSERT INTO chaos_step_runs (token, job_id, step, attempt) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING"
_EFFECT = "INSERT INTO chaos_durable_effects (job_id, attempt, pid) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_DUPLICATE = "INSERT INTO chaos_durable_duplicates (job_id, attempt, pid) VALUES (%s, %s, %s)"
_DURABLE_JOBS = (
    "SELECT id, state, steps, errors, attempt, max_attempts, attempt_budget FROM miniqueue_jobs WHERE task = %s"
)
_PARKED = f"SELECT signal_key FROM miniqueue_jobs WHERE task = '{DURABLE_TASK}' AND state = 'waiting'"


def signal_key(job_id: int) -> str:
    return f"durable:{job_id}"


def _run(job: Job, step: str) -> dict[str, Any]:
    """A step's function: count the run, work a little, give a value."""
    _execute(_RUN, (uuid.uuid4().hex, job.id, step, job.run))
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


for _app in (app, async_app):
    _app.task(DURABLE_TASK, queue=QUEUE, max_attempts=25)(durable)


def enqueue_durable(dsn: str, count: int, sleep_ms: tuple[int, int]) -> tuple[list[int], int]:
    """Enqueue the durable jobs, and send a third of their signals before they wait; their ids
    and how many signals were sent ahead."""
    with Client(dsn) as client:
        specs = [
            JobSpec(DURABLE_TASK, {"n": n, "ms": sleep_ms[0] + n % (sleep_ms[1] - sleep_ms[0] + 1)}, queue=QUEUE)
            for n in range(count)
        ]
        ids = [result.id for result in client.enqueue_many(specs)]
        ahead = ids[::3]
        client.signal_many([(signal_key(job_id), {"ahead": True}) for job_id in ahead])
    return ids, len(ahead)


class Signaller(threading.Thread):
    """Sends the signal of each durable job that parks, until stopped (through restarts)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="chaos-signaller", daemon=True)
        self.dsn = dsn
        self.sent = 0
        self.errors = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        # One client and one connection for the run (a connection per look costs a core's share),
        # made again after a restart or a terminated backend; the next round tries again.
        client: Client | None = None
        conn: psycopg.Connection[Any] | None = None
        while not self._stop_event.wait(SIGNAL_EVERY):
            try:
                client = client or Client(self.dsn)
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, application_name="chaos:signaller")
                keys = [row[0] for row in conn.execute(_PARKED)]
                if keys:
                    client.signal_many([(key, {"ahead": False}) for key in keys])
                    self.sent += len(keys)
            except Exception:
                self.errors += 1
                for closing in (client, conn):
                    if closing is not None:
                        with contextlib.suppress(Exception):
                            closing.close()
                client, conn = None, None
        for closing in (client, conn):
            if closing is not None:
                closing.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def durable_rows(db: Any, ids: list[int], sent_ahead: int, stops: list[Stop], data: dict[str, Any]) -> list[Row]:
    """The durable checks, from the rows: see the module's docstring. A frozen worker's durable
    job (SIGSTOP past its lease) is the stale attempt: the steps' attempts never go down along
    the record, so no attempt recorded a step after a later one had."""
    wanted = set(ids)
    jobs = {int(r[0]): r[1:] for r in db.rows(_DURABLE_JOBS, [DURABLE_TASK])}
    states = {j: str(jobs[j][0]) if j in jobs else "missing" for j in ids}
    not_completed = [f"{j} ({state})" for j, state in states.items() if state != "completed"]
    completions = Counter(
        int(r[0])
        for r in db.rows(
            "SELECT job_id FROM chaos_transitions WHERE to_state = 'completed' AND job_id = ANY(%s)", [ids]
        )
    )
    twice = [str(j) for j, n in sorted(completions.items()) if n > 1]
    effects = Counter(int(r[0]) for r in db.rows("SELECT job_id FROM chaos_durable_effects"))
    effect_problems = [f"{j}: {effects.get(j, 0)} effects" for j in ids if effects.get(j, 0) != 1]
    duplicates = [f"job {r[0]} attempt {r[1]} pid {r[2]}" for r in db.rows("SELECT * FROM chaos_durable_duplicates")]
    runs: dict[tuple[int, str], list[int]] = {}
    for job_id, step, attempt in db.rows("SELECT job_id, step, attempt FROM chaos_step_runs ORDER BY at"):
        runs.setdefault((int(job_id), str(step)), []).append(int(attempt))
    replayed, stale, retried_before_record = [], [], 0
    for job_id in sorted(wanted & jobs.keys()):
        order = [int(s["attempt"]) for s in jobs[job_id][1] or []]
        if order != sorted(order):
            stale.append(f"job {job_id}: steps recorded by attempts {order}")
        recorded = {s["name"]: int(s["attempt"]) for s in jobs[job_id][1] or [] if s.get("kind") == "step"}
        for step in STEPS:
            attempts = runs.get((job_id, step), [])
            at = recorded.get(step)
            if at is None:
                continue  # not recorded: the job did not complete (reported above)
            if any(a > at for a in attempts) or attempts.count(at) != 1:
                replayed.append(f"job {job_id} step {step}: recorded by attempt {at}, ran in attempts {attempts}")
            retried_before_record += sum(1 for a in attempts if a < at)
    spent = []
    runs_per_job = []
    for job_id in sorted(wanted & jobs.keys()):
        _, _, errors, attempt, max_attempts, budget = jobs[job_id]
        charged = max(0, budget - (max_attempts - attempt))
        runs_per_job.append(attempt)
        if not errors and charged != 1:
            spent.append(f"job {job_id}: {charged} attempts charged in {attempt} runs, no fault in its history")
    frozen = [(job, attempt) for stop in stops for job, attempt in stop.fault.leases if job in wanted]
    taken_over = sum(
        1 for job, attempt in frozen if any(int(s["attempt"]) > attempt for s in jobs.get(job, ("", []))[1] or [])
    )
    data.update(
        durable_frozen=len(frozen),
        durable_frozen_taken_over=taken_over,
        durable_jobs=len(ids),
        durable_completed=len(ids) - len(not_completed),
        durable_signals_sent_ahead=sent_ahead,
        durable_step_reruns_before_record=retried_before_record,
        durable_replayed_steps=replayed,
        durable_runs_median=sorted(runs_per_job)[len(runs_per_job) // 2] if runs_per_job else None,
    )
    return [
        info("durable jobs (5 steps, 2 sleeps, 1 signal each)", len(ids)),
        rule("durable: not completed", not_completed),
        rule("durable: completed more than once", twice),
        rule("durable: the transactional step's effect not exactly once", effect_problems + duplicates),
        rule("durable: a recorded step ran again", replayed),
        info(
            "durable: jobs held by a SIGSTOPped worker past its lease (taken over meanwhile)",
            f"{len(frozen)} ({taken_over})",
        ),
        rule("durable: a step recorded by an attempt older than one recorded before it", stale),
        info("durable: steps run again because a fault cut them short before their record", retried_before_record),
        rule("durable: an attempt spent by a sleep or a wait (no fault in the job's history)", spent),
    ]
