"""The unique-key rules (``--unique``): however often a key was enqueued, and whatever the faults
did, no two jobs of one key ever held it at once, no two executions of one key ever ran at once
(but a stale attempt still running past the lease it lost), every stored job completed exactly
once, and every duplicate named the job that held the key.

The holds, the runs and their overlaps come from SQL over the harness's tables (see
:mod:`chaos.keyed`). An overlap is allowed only where the evidence shows a lost lease: one of the
two runs' leases ended without completion, for a reason an injected fault explains (the same
rule that explains re-executions, :func:`chaos.verify.explain`: a kill, a SIGSTOP past the lease,
a database fault), and ended before the other run's lease was claimed, so the two leases never
overlapped and only the handler of the first ran on, unfenced, past its lease. Its outcome must
then have been discarded, which the checks of every run already show (one completion per job,
no duplicated effect).
"""

from __future__ import annotations

import collections
import datetime as dt
from typing import Any

from .evidence import Evidence
from .faults import Fault
from .keyed import KeyedEvidence, Run
from .options import ALL_SCENARIOS
from .rows import Row, info, rule
from .workload import KeyedEnqueue, Workload

#: Clock slack when comparing this host's times (an enqueue) with the server's (a hold), as the
#: attribution of faults does (:data:`chaos.verify.GRACE`).
CLOCK_GRACE = 1.0

#: A lease's cause: (job, attempt, pid) of every lease that ended without completion -> the fault
#: that explains it, or "UNEXPLAINED" (see chaos.verify).
Causes = dict[tuple[int, int, int | None], str]


def unique_rows(
    ev: Evidence, workload: Workload, causes: Causes, faults: list[Fault], data: dict[str, Any]
) -> list[Row]:
    """The rows of the unique-key rules, after lines saying what was enqueued."""
    keyed = ev.keyed
    jobs = sorted(keyed.unique)
    enqueues = [e for e in workload.enqueues if e.kind == "unique"]
    duplicates = [e for e in enqueues if e.duplicate]
    failed = [f"{e.key} #{e.n} ({e.method}, {e.retries} retries): {e.error}" for e in enqueues if e.error]
    not_once = [
        f"job {job} ({keyed.unique[job]}): {ev.states.get(job, ('missing', 0))[0]}, "
        f"completed {len(ev.completions.get(job, []))} times"
        for job in jobs
        if len(ev.completions.get(job, [])) != 1
    ]
    held = [
        f"{a.key}: job {a.job} held it {clock(a.since)}-{clock(a.until)}, job {b.job} {clock(b.since)}-{clock(b.until)}"
        for a, b in keyed.held_at_once
    ]
    overlaps, stale = judge_overlaps(ev, "unique", causes)
    wrong = wrong_duplicates(keyed, duplicates)
    cut, leases, frozen = leases_cut(ev, set(jobs), causes, faults)
    found = [j for j in workload.found if j in keyed.unique]
    per_key = collections.Counter(keyed.unique.values())
    methods = collections.Counter(e.method for e in enqueues)
    data["unique"] = {
        "keys": len({e.key for e in enqueues}),
        "enqueues": len(enqueues),
        "stored": len(jobs),
        "duplicates": len(duplicates),
        "by_method": dict(methods),
        "jobs_per_key": dict(sorted(per_key.items())),
        "found_in_database": found,
        "failed_enqueues": failed,
        "wrong_duplicates": wrong,
        "not_completed_once": not_once,
        "held_at_once": held,
        "overlaps": overlaps,
        "stale_overlaps": stale,
        "leases_cut": cut,
        "held_by_a_frozen_worker": frozen,
    }
    return [
        info(
            "unique: enqueues of a unique key",
            f"{len(enqueues)} over {len(per_key)} keys: {len(jobs)} jobs stored, {len(duplicates)} duplicates",
        ),
        info("  by way of", ", ".join(f"{m} {methods[m]}" for m in sorted(methods)) or "-"),
        info("  stored jobs found only in the database (enqueue reply lost)", len(found)),
        rule("  enqueues that failed", failed),
        rule("  duplicates that named a job not holding the key", wrong),
        rule("  stored jobs not completed exactly once", not_once),
        rule("  jobs of one key holding it at once (stored -> finished)", held),
        rule("  executions of one key overlapping (not a stale attempt)", overlaps),
        info("  overlaps of a stale attempt past its lost lease (allowed)", len(stale)),
        info(
            "  their leases ended without completion (fault or hand-back)",
            f"{cut} of {leases}; {frozen} held by a frozen worker",
        ),
    ]


def judge_overlaps(ev: Evidence, kind: str, causes: Causes) -> tuple[list[str], list[str]]:
    """The overlaps of ``kind`` ("unique" or "sequence") that no lost lease explains, and those it
    does (each described)."""
    bad: list[str] = []
    allowed: list[str] = []
    for overlap in ev.keyed.overlaps:
        if overlap.kind != kind:
            continue
        shown = f"{overlap.key}: {_run(overlap.first)} and {_run(overlap.second)}"
        why = stale(ev, overlap.first, overlap.second, causes) or stale(ev, overlap.second, overlap.first, causes)
        if why is None:
            bad.append(shown)
        else:
            allowed.append(f"{shown}: {why}")
    return bad, allowed


def stale(ev: Evidence, run: Run, other: Run, causes: Causes) -> str | None:
    """Why ``run`` could still be under way during ``other`` (its lease lost to a fault before
    ``other``'s lease was claimed), or None if the evidence does not show it."""
    lease = ev.lease(run.job, run.attempt, pid=run.pid)
    theirs = ev.lease(other.job, other.attempt, pid=other.pid)
    if lease is None or theirs is None or lease.ended is None or lease.end_state in (None, "completed"):
        return None
    cause = causes.get((lease.job, lease.attempt, lease.pid), "")
    if cause.split(" ")[0] not in ALL_SCENARIOS or lease.ended > theirs.claimed:
        return None
    return (
        f"job {run.job} attempt {run.attempt}'s lease was lost at {clock(lease.ended)} ({cause}), "
        f"before job {other.job} attempt {other.attempt} was claimed at {clock(theirs.claimed)}"
    )


def wrong_duplicates(keyed: KeyedEvidence, duplicates: list[KeyedEnqueue]) -> list[str]:
    """Duplicates whose holder is not a job of their key, or was not holding it during the enqueue
    (stored after it ended, or finished before it began, beyond the clocks' slack)."""
    wrong = []
    for enqueue in duplicates:
        holder = enqueue.id if enqueue.id is not None else -1
        key = keyed.unique.get(holder)
        since, until = keyed.stored.get(holder), keyed.finished.get(holder)
        if key != enqueue.key or since is None:
            what = f"of key {key}" if key else "without a unique key"
            wrong.append(f"{enqueue.key} #{enqueue.n} ({enqueue.method}): named job {holder}, {what}")
        elif since > enqueue.ended + CLOCK_GRACE or (until is not None and until < enqueue.started - CLOCK_GRACE):
            wrong.append(
                f"{enqueue.key} #{enqueue.n} ({enqueue.method}) at {clock(enqueue.started)}-{clock(enqueue.ended)}: "
                f"named job {holder}, which held the key {clock(since)}-{clock(until)}"
            )
    return wrong


def leases_cut(ev: Evidence, jobs: set[int], causes: Causes, faults: list[Fault]) -> tuple[int, int, int]:
    """Of the jobs' leases: how many ended without completion, how many there were, and how many
    of the jobs a frozen worker held."""
    leases = [lease for job in jobs for lease in ev.by_job.get(job, [])]
    cut = sum(1 for lease in leases if lease.ended is not None and lease.end_state != "completed")
    frozen = len({job for f in faults if f.kind == "stop-worker" for job, _ in f.leases if job in jobs})
    return cut, len(leases), frozen


def _run(run: Run) -> str:
    end = clock(run.ended) + ("" if run.recorded_end else " (lease end)")
    return f"job {run.job} attempt {run.attempt} (pid {run.pid}) {clock(run.started)}-{end}"


def clock(at: float | None) -> str:
    """A time of this host's clock, to the millisecond ('open' for none)."""
    return "open" if at is None else dt.datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
