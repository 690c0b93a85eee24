"""Two rules on what becomes of a lease once it has ended, each for a fault the run once found in
miniqueue (see chaos/README.md, "What it has found"), now fixed, so that it must not come back:

- a worker must not forget a lease it claimed again: a lease that expired under a live worker
  right after it handed the job's lease before it back is counted (it is also unexplained);
- a charged retry must be due within the backoff of the attempts charged, not of the job's runs
  (which uncharged hand-backs move on).
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

from miniqueue.core.backoff import backoff_ceiling

from .app import RETRY_CAP_SECONDS
from .check_unique import Causes
from .evidence import Attempt, Evidence
from .rows import Row, first_line, info, rule

#: Clock slack when comparing a retry's delay with its backoff's ceiling.
RETRY_SLACK = 0.25


def forgotten_rows(ev: Evidence, causes: Causes, interval: float, data: dict[str, Any]) -> list[Row]:
    """The unexplained lost leases that tell the story of a re-claimed lease its live worker
    forgot (:func:`forgotten`, ``interval`` the heartbeat's): each must be 0."""
    activity: dict[str | None, list[float]] = collections.defaultdict(list)
    for x in ev.leases:
        activity[x.worker] += [x.claimed] if x.ended is None else [x.claimed, x.ended]
    for times in activity.values():
        times.sort()
    forgot = sorted(
        f"job {lease.job} attempt {lease.attempt} (pid {lease.pid})"
        for lease in ev.leases
        if causes.get((lease.job, lease.attempt, lease.pid)) == "UNEXPLAINED"
        and forgotten(ev, lease, interval, activity)
    )
    data["forgotten_leases"] = forgot
    return [rule("    of those, re-claimed leases their live worker forgot", forgot)]


def forgotten(ev: Evidence, lease: Attempt, interval: float, activity: dict[str | None, list[float]]) -> bool:
    """Whether ``lease`` expired (``worker lost``) under the worker that had handed the job's lease
    before it back, unstarted and uncharged, less than a heartbeat ``interval`` before claiming it
    again, and that went on claiming and finishing other jobs more than an interval after that
    claim and before the lease expired (so it was neither dead nor frozen: ``activity``, each
    worker's claim and end times, sorted). The worker once did this: its heartbeat reported the
    leases it could not renew by job id, and it forgot the new lease of such a job with the old."""
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


def retry_rows(ev: Evidence, data: dict[str, Any]) -> list[Row]:
    """Charged retries due later than the backoff of the attempts charged allows (every chaos
    task's: base 1 s, cap RETRY_CAP_SECONDS), with RETRY_SLACK of clock slack: each must be 0.
    ``charged`` is the job's charged attempts as the failure left them (the trigger's), which is
    what the worker's backoff call, the supervisor's and the reaper's ``miniqueue_retry_delay``
    are given; the job's run number (``attempt``) is not."""
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
                f"{delay:.1f}s, its backoff allows {ceiling:g}s ({first_line(error)[:60]})"
            )
    data["late_retries"] = late
    return [
        info("charged retries (back to available after a charged attempt)", retries),
        rule("  put off past the backoff of their charged attempts", late),
    ]
