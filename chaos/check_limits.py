"""The limits rule (``--limits``): no concurrency key ever had more leases at once than its
``max_concurrent``.

A slot is a lease: the claim takes it, and it is free once the job leaves ``running`` at that
attempt (completed, failed, released by the supervisor after a SIGKILL, expired and returned by
the reaper, handed back). So the rule is judged on leases, from ``chaos_transitions``: from the
claim to the transition that ended it, not from the handler's run. A SIGKILLed worker's handler
is gone at once, but its slot stays held until its lease is released, and a frozen worker's
handler may still run after its lease expired and the slot went to another job.

A limit is scoped to its task (``--batches``: the batch task's jobs of a key hold the key's slots
of their own task), and over several databases each database enforces its own (a key's jobs on a
spread queue go to the database of its hash, but a group or a chain is enqueued on one database
whatever its members' keys): the rule holds per task and per database.

Claims and ends are stamped with ``clock_timestamp()`` in the transaction that made them. A claim
admitted on a freed slot read that release committed, so its stamp comes after the release's;
two leases shown at once were at once. At equal stamps the end counts first.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from miniqueue.core.shard_map import MODULUS

from .app import BATCH_TASK, TASK
from .evidence import Attempt, Evidence
from .options import LIMIT_KEYS
from .rows import Row, info
from .workload import Workload


@dataclass(frozen=True)
class Peak:
    """The most leases of one key held at once, which ones (the first time that many were), and
    how long, in all, the key had at least ``limit`` leases."""

    count: int
    holders: tuple[Attempt, ...]
    seconds_at_limit: float


def peak(leases: list[Attempt], limit: int) -> Peak:
    """Sweep the leases' claims and ends in time order (an end before a claim at the same time).
    A lease that never ended counts as held to the end (its time at the limit up to the last
    claim or end recorded)."""
    events = sorted(
        [(lease.claimed, 1, index) for index, lease in enumerate(leases)]
        + [(math.inf if lease.ended is None else lease.ended, 0, index) for index, lease in enumerate(leases)]
    )
    held: set[int] = set()
    best, holders = 0, tuple[Attempt, ...]()
    at_limit, since = 0.0, None
    last = 0.0
    for at, claim, index in events:
        if claim:
            held.add(index)
        else:
            held.discard(index)
        last = at if math.isfinite(at) else last
        if len(held) > best:
            best, holders = len(held), tuple(leases[i] for i in sorted(held))
        if len(held) >= limit and since is None:
            since = at
        elif len(held) < limit and since is not None:
            at_limit += last - since
            since = None
    if since is not None:  # held to the end by a lease that never ended: counted to the last record
        at_limit += last - since
    return Peak(best, holders, at_limit)


def limit_rows(ev: Evidence, workload: Workload, data: dict[str, Any], per_database: bool = False) -> list[Row]:
    """A row per key: the most leases at once (on any one database, ``per_database``), which must
    not exceed the key's limit."""
    keyed = [lease for job in workload.keys for lease in ev.by_job.get(job, [])]
    cut = sum(1 for lease in keyed if lease.end_state != "completed")
    rows = [
        info("limits: jobs with a concurrency key", f"{len(workload.keys)} over {len(LIMIT_KEYS)} keys"),
        info("  their leases ended without completion (by a fault or hand-back)", f"{cut} of {len(keyed)}"),
    ]
    report: dict[str, dict[str, Any]] = {}
    exceeded: list[str] = []
    for key, limit in LIMIT_KEYS.items():
        jobs = sorted(job for job, named in workload.keys.items() if named == key)
        scopes: dict[str, list[Attempt]] = {}
        for job in jobs:
            task = BATCH_TASK if job in workload.batch_jobs else TASK
            scope = f"db{job % MODULUS} {task}" if per_database else task
            scopes.setdefault(scope, []).extend(ev.by_job.get(job, []))
        peaks = {scope: peak(leases, limit) for scope, leases in sorted(scopes.items())}
        found = max(peaks.values(), key=lambda p: p.count, default=peak([], limit))
        leases = sum(len(x) for x in scopes.values())
        at_limit = sum(p.seconds_at_limit for p in peaks.values())
        offenders = [f"{scope}: {_describe(key, limit, p)}" for scope, p in peaks.items() if p.count > limit]
        exceeded += offenders
        report[key] = {
            "max_concurrent": limit,
            "max_overlap": found.count,
            "jobs": len(jobs),
            "leases": leases,
            "seconds_at_limit": round(at_limit, 3),
        }
        if len(peaks) > 1:
            report[key]["by_scope"] = {scope: p.count for scope, p in peaks.items()}
        where = f", {len(peaks)} scopes (task, database)" if len(peaks) > 1 else ""
        rows.append(
            Row(
                f"  {key} (max_concurrent {limit}): most leases at once",
                f"{found.count} ({len(jobs)} jobs, {leases} leases, {at_limit:.1f}s at the limit{where})",
                f"must be <= {limit}",
                not offenders,
                offenders,
            )
        )
    data.update(limits=report, limit_exceeded=exceeded)
    return rows


def _describe(key: str, limit: int, found: Peak) -> str:
    """The key, and the leases it held at once when it first went over its limit."""
    leases = "; ".join(
        f"job {x.job} attempt {x.attempt} by {x.worker} from {_clock(x.claimed)} to {_clock(x.ended)}"
        for x in found.holders
    )
    return f"{key}: {found.count} leases at once (max_concurrent {limit}): {leases}"


def _clock(at: float | None) -> str:
    """A time of this host's clock, to the millisecond ('open' for a lease that never ended)."""
    return "open" if at is None else dt.datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
