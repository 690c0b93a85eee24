"""The batch rules (``--batches``): no call of the batch handler was given more jobs than the
task's size, and a batch's jobs interrupted by a crash each ran alone next.

Each job's execution row names the handler's call it ran in (chaos.batches), so the calls and
their sizes come from ``chaos_executions``. When a worker dies while several of its handlers'
jobs run (a batch), which job killed it is not known: each goes back uncharged, its history
saying ``interrupted after ...: worker process died: ... while N jobs ran in the process; attempt
not charged: it runs alone next ...``, and its next run must be a batch of one (docs/guarantees.md, "A crash is
charged to its cause").
"""

from __future__ import annotations

import collections
import re
import statistics
from typing import Any

from .evidence import Evidence, Execution
from .options import BATCH_SIZE
from .rows import Row, info, rule
from .workload import Workload

#: How the history says a job was interrupted beside others, uncharged, to run alone next.
_ALONE_NEXT = re.compile(r"^(?:handed back: )?interrupted after [0-9.]+s: .* while \d+ jobs ran\b.*runs alone next")


def batch_rows(ev: Evidence, workload: Workload, data: dict[str, Any]) -> list[Row]:
    """The rows of the batch rules, after lines saying what ran."""
    runs = [e for e in ev.executions if e.job in workload.batch_jobs]
    calls: dict[str, list[Execution]] = collections.defaultdict(list)
    for execution in runs:
        if execution.batch is not None:
            calls[execution.batch].append(execution)
    sizes = sorted(len(jobs) for jobs in calls.values())
    oversize = [
        f"call {token[:8]} (pid {jobs[0].pid}): {len(jobs)} jobs, {', '.join(str(e.job) for e in jobs[:20])}"
        for token, jobs in sorted(calls.items())
        if len(jobs) > BATCH_SIZE
    ]
    interrupted, not_alone = _alone_next(ev, workload, calls)
    data["batches"] = {
        "jobs": len(workload.batch_jobs),
        "calls": len(calls),
        "sizes": dict(collections.Counter(sizes)),
        "oversize": oversize,
        "interrupted_beside_others": interrupted,
        "not_alone_next": not_alone,
    }
    spread = f"median {statistics.median(sizes):g}, max {sizes[-1]}" if sizes else "-"
    return [
        info(f"batches: jobs of the batch task (size {BATCH_SIZE})", f"{len(workload.batch_jobs)}, {len(runs)} runs"),
        info("  handler calls, jobs per call", f"{len(calls)}: {spread}; {sizes.count(1)} of one job"),
        rule(f"  calls given more than {BATCH_SIZE} jobs", oversize),
        info("  jobs interrupted beside others by a crash (not charged)", interrupted),
        rule("  of those, next run not alone (a batch of one)", not_alone),
    ]


def _alone_next(ev: Evidence, workload: Workload, calls: dict[str, list[Execution]]) -> tuple[int, list[str]]:
    """How many leases of batch jobs ended interrupted beside others, and those whose job's next
    run was not a batch of one."""
    count, wrong = 0, []
    for job in sorted(workload.batch_jobs):
        for lease in ev.by_job.get(job, []):
            if lease.end_state != "available" or not _ALONE_NEXT.search(lease.error or ""):
                continue
            count += 1
            after = [e for e in ev.executions if e.job == job and e.attempt > lease.attempt]
            if not after:
                continue  # not run again (the job's own rows say whether it completed)
            following = min(after, key=lambda e: (e.attempt, e.at))
            size = len(calls.get(following.batch or "", [])) or 1
            if size != 1:
                wrong.append(
                    f"job {job}: interrupted at attempt {lease.attempt}, ran next (attempt {following.attempt}, "
                    f"pid {following.pid}) in a batch of {size}"
                )
    return count, wrong
