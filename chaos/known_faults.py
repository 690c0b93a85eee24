"""Faults of miniqueue the harness has diagnosed, and reports without failing the run (see
chaos/README.md, "What it has found"): each is recognised by the exact story its records tell,
counted on a row of its own and in the report's "Known faults of miniqueue", so that a run
passes or fails on everything else, and the count shows when a fix lands.
"""

from __future__ import annotations

import bisect
from typing import Any

from miniqueue.core.backoff import backoff_ceiling

from .app import RETRY_CAP_SECONDS
from .evidence import Attempt, Evidence
from .rows import Row, info

#: A known fault of the worker (see chaos/README.md, "What it has found"): the heartbeat renews the
#: leases of a snapshot and reports those it could not renew as lost by job id; a job the worker
#: handed back and claimed again meanwhile is then dropped from the worker's new lease too, which
#: nobody runs, renews or hands back: it expires under a live worker and the reaper charges it.
FORGOTTEN = "a re-claimed lease its live worker forgot (product fault)"


def forgotten(ev: Evidence, lease: Attempt, interval: float, activity: dict[str | None, list[float]]) -> bool:
    """Whether ``lease`` fits that fault: it expired (``worker lost``) under the worker that had
    handed the job's lease before it back, unstarted and uncharged, less than a heartbeat
    ``interval`` before claiming it again, and that went on claiming and finishing other jobs more
    than an interval after that claim and before the lease expired (so it was neither dead nor
    frozen: ``activity``, each worker's claim and end times, sorted)."""
    if not (lease.error or "").startswith("worker lost") or lease.ended is None:
        return False
    leases = ev.by_job.get(lease.job, [])
    index = next((i for i, x in enumerate(leases) if x is lease), 0)
    if index == 0:
        return False
    before = leases[index - 1]
    if before.worker != lease.worker or before.ended is None or not (before.error or "").startswith("handed back"):
        return False
    if not 0 <= lease.claimed - before.ended < interval:
        return False
    times = activity.get(lease.worker, [])
    first = bisect.bisect_right(times, lease.claimed + interval)
    return first < len(times) and times[first] < lease.ended


#: Clock slack when comparing a retry's delay with its backoff's ceiling.
RETRY_SLACK = 0.25


def retry_rows(ev: Evidence, data: dict[str, Any]) -> list[Row]:
    """Charged retries put off longer than the backoff of the attempts charged allows (every
    chaos task's: base 1 s, cap RETRY_CAP_SECONDS). Reported, not judged: the delay follows the
    job's run number, which uncharged hand-backs move on, rather than its charged attempts."""
    late = []
    retries = 0
    for lease in ev.leases:
        error = lease.error or ""
        if lease.due is None or lease.charged is None or lease.ended is None or "not charged" in error:
            continue
        if error.startswith("handed back"):
            continue
        retries += 1
        ceiling = backoff_ceiling(max(1, lease.charged), base=1.0, cap=RETRY_CAP_SECONDS)
        delay = lease.due - lease.ended
        if delay > ceiling + RETRY_SLACK:
            late.append(
                f"job {lease.job} run {lease.attempt}, {lease.charged} attempt(s) charged: due again after "
                f"{delay:.1f}s, its backoff allows {ceiling:g}s ({_first_line(error)[:60]})"
            )
    data["late_retries"] = late
    return [
        info("charged retries (back to available after a charged attempt)", retries),
        Row(
            "  put off past the backoff of their charged attempts (by run number)",
            str(len(late)),
            "reported",
            None,
            late,
        ),
    ]


def _first_line(error: str) -> str:
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "")
