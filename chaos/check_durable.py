"""The durable rules (``--durable``; the jobs and their task: chaos.durable_jobs): every durable job
completed, once; the transactional step's effect exactly once per job; no step ran again in an
attempt after the one that recorded it, and once in that one; and a job no fault touched spent one
attempt, however many times it slept and waited.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .app import DURABLE_TASK
from .durable_jobs import STEPS
from .faults import Stop
from .keyed import Rows
from .rows import Row, info, rule

_DURABLE_JOBS = (
    "SELECT id, state, steps, errors, attempt, max_attempts, attempt_budget FROM miniqueue_jobs WHERE task = %s"
)


def durable_rows(db: Rows, ids: list[int], sent_ahead: int, stops: list[Stop], data: dict[str, Any]) -> list[Row]:
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
        durable_not_completed=not_completed,
        durable_completed_twice=twice,
        durable_effect_problems=effect_problems + duplicates,
        durable_stale_steps=stale,
        durable_spent_attempts=spent,
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
