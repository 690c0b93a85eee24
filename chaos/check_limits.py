"""The limits rule (``--limits``): no concurrency key ever had more lanes at once than its
``max_concurrent``.

A slot is a lease: the claim takes it, and it is free once the job leaves ``running`` at that
attempt (completed, failed, released by the supervisor after a SIGKILL, expired and returned by
the reaper, handed back). So the rule is judged on leases, from ``chaos_transitions``: from the
claim to the transition that ended it, not from the handler's run. A SIGKILLed worker's handler
is gone at once, but its slot stays held until its lease is released, and a frozen worker's
handler may still run after its lease expired and the slot went to another job.

Lanes, not leases. When a key of limit 1 is free, one claim may lease several
of its available jobs together to one worker, which runs them one after another, never two at
once: they are one lane, held from that claim until the last of them ends. The database admits a
new lane only while the key's leases are below its limit, so a key's leases may exceed the limit
but its lanes never do, and the rule counts lanes (the most leases at once is reported beside).
Leases taken together share the key, the worker and the claiming transaction
(``chaos_transitions.xact``). A claim within its room takes each job on a lane of its own, as
every claim of several jobs of one key did before lanes, so leases that share all three are one
lane only when there are more of them than the room the claim found (the limit less the key's
leases held just before its first claim); else each is a lane. The room seen here is never less
than the claim's own (a release stamped before the claim but committed after its snapshot is
free here and held there), so a claim read as separate lanes adds no more lanes than it had room
for: the reading never invents an overrun. A lease without a claiming transaction (records made
by hand) is a lane of its own.

A limit is scoped to its task (``--batches``: the batch task's jobs of a key hold the key's slots
of their own task), and over several databases each database enforces its own (a key's jobs on a
spread queue go to the database of its hash, but a group or a chain is enqueued on one database
whatever its members' keys): the rule holds per task and per database, and so do the lanes.

Claims and ends are stamped with ``clock_timestamp()`` in the transaction that made them. A claim
admitted on a freed slot read that release committed, so its stamp comes after the release's;
two leases shown at once were at once. At equal stamps the end counts first.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from miniqueue.core.shard_map import MODULUS

from .app import BATCH_TASK, TASK
from .evidence import Attempt, Evidence
from .options import LIMIT_KEYS
from .rows import Row, info
from .workload import Workload


class Held(Protocol):
    """Something held from a claim to an end (None: never ended): a lease, or a lane."""

    @property
    def claimed(self) -> float: ...

    @property
    def ended(self) -> float | None: ...


H = TypeVar("H", bound=Held)


@dataclass(frozen=True)
class Lane:
    """The leases of one key that one claim took together (one lease, for most), run one after
    another by their worker: held from the first claim to the last end (None: one never ended)."""

    leases: tuple[Attempt, ...]

    @property
    def claimed(self) -> float:
        return min(lease.claimed for lease in self.leases)

    @property
    def ended(self) -> float | None:
        ends = [lease.ended for lease in self.leases]
        return None if any(end is None for end in ends) else max(end for end in ends if end is not None)


@dataclass(frozen=True)
class Peak(Generic[H]):
    """The most leases or lanes of one key held at once, which ones (the first time that many
    were), and how long, in all, the key had at least ``limit`` of them."""

    count: int
    holders: tuple[H, ...]
    seconds_at_limit: float


def _events(held: Sequence[Held]) -> list[tuple[float, int, int]]:
    """Each one's claim and end, in time order (an end before a claim at the same time); an end
    that never came is at infinity."""
    return sorted(
        [(x.claimed, 1, index) for index, x in enumerate(held)]
        + [(math.inf if x.ended is None else x.ended, 0, index) for index, x in enumerate(held)]
    )


def peak(held: Sequence[H], limit: int) -> Peak[H]:
    """Sweep the claims and ends in time order (an end before a claim at the same time). One
    that never ended counts as held to the end (its time at the limit up to the last claim or end
    recorded)."""
    holding: set[int] = set()
    best, holders = 0, tuple[H, ...]()
    at_limit, since = 0.0, None
    last = 0.0
    for at, claim, index in _events(held):
        if claim:
            holding.add(index)
        else:
            holding.discard(index)
        last = at if math.isfinite(at) else last
        if len(holding) > best:
            best, holders = len(holding), tuple(held[i] for i in sorted(holding))
        if len(holding) >= limit and since is None:
            since = at
        elif len(holding) < limit and since is not None:
            at_limit += last - since
            since = None
    if since is not None:  # held to the end by one that never ended: counted to the last record
        at_limit += last - since
    return Peak(best, holders, at_limit)


def lanes(leases: Sequence[Attempt], limit: int) -> list[Lane]:
    """The lanes of one key's leases in one scope, in claim order: the leases of one worker's
    claiming transaction are one lane when there are more of them than the room that claim found
    (``limit`` less the leases held just before its first claim), else a lane each; a lease with no
    claiming transaction is a lane of its own. Only a limit of 1 takes jobs together: under a
    larger one every lease is a lane, so a claim past such a limit's room shows as an overrun."""
    claims: dict[tuple[str | None, int], list[int]] = {}
    for index, lease in enumerate(leases):
        if lease.claim_xact is not None and limit == 1:
            claims.setdefault((lease.worker, lease.claim_xact), []).append(index)
    claim_of = {index: claim for claim, members in claims.items() if len(members) > 1 for index in members}
    room: dict[tuple[str | None, int], int] = {}
    holding: set[int] = set()
    for _, is_claim, index in _events(leases):
        if not is_claim:
            holding.discard(index)
            continue
        claim = claim_of.get(index)
        if claim is not None and claim not in room:  # its first lease: none of its own held yet
            room[claim] = limit - len(holding)
        holding.add(index)
    found: list[Lane] = []
    for index, lease in enumerate(leases):
        claim = claim_of.get(index)
        if claim is None or len(claims[claim]) <= room[claim]:
            found.append(Lane((lease,)))
        elif index == claims[claim][0]:
            members = sorted((leases[i] for i in claims[claim]), key=lambda x: x.claimed)
            found.append(Lane(tuple(members)))
    return sorted(found, key=lambda lane: lane.claimed)


def limit_rows(ev: Evidence, workload: Workload, data: dict[str, Any], per_database: bool = False) -> list[Row]:
    """A row per key: the most lanes at once (on any one database, ``per_database``), which must
    not exceed the key's limit, with the most leases at once beside it."""
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
        scope_lanes = {scope: lanes(leases, limit) for scope, leases in sorted(scopes.items())}
        peaks = {scope: peak(held, limit) for scope, held in scope_lanes.items()}
        found = max(peaks.values(), key=lambda p: p.count, default=peak(list[Lane](), limit))
        most_leases = max((peak(leases, limit).count for leases in scopes.values()), default=0)
        leases = sum(len(x) for x in scopes.values())
        lane_count = sum(len(x) for x in scope_lanes.values())
        together = sum(1 for x in scope_lanes.values() for lane in x if len(lane.leases) > 1)
        at_limit = sum(p.seconds_at_limit for p in peaks.values())
        offenders = [f"{scope}: {_describe(key, limit, p)}" for scope, p in peaks.items() if p.count > limit]
        exceeded += offenders
        report[key] = {
            "max_concurrent": limit,
            "max_overlap": found.count,  # lanes: the rule's count
            "max_leases_at_once": most_leases,
            "jobs": len(jobs),
            "leases": leases,
            "lanes": lane_count,
            "lanes_taken_together": together,
            "seconds_at_limit": round(at_limit, 3),
        }
        if len(peaks) > 1:
            report[key]["by_scope"] = {scope: p.count for scope, p in peaks.items()}
        where = f", {len(peaks)} scopes (task, database)" if len(peaks) > 1 else ""
        rows.append(
            Row(
                f"  {key} (max_concurrent {limit}): most lanes at once",
                f"{found.count} (most leases at once {most_leases}; {len(jobs)} jobs, {leases} leases in "
                f"{lane_count} lanes, {together} lanes of several; {at_limit:.1f}s at the limit{where})",
                f"must be <= {limit}",
                not offenders,
                offenders,
            )
        )
    data.update(limits=report, limit_exceeded=exceeded)
    return rows


def _describe(key: str, limit: int, found: Peak[Lane]) -> str:
    """The key, and the lanes it held at once when it first went over its limit."""
    held = "; ".join(_lane(lane) for lane in found.holders)
    return f"{key}: {found.count} lanes at once (max_concurrent {limit}): {held}"


def _lane(lane: Lane) -> str:
    """A lane: its one lease, or the leases taken together and when each was held."""
    if len(lane.leases) == 1:
        x = lane.leases[0]
        return f"job {x.job} attempt {x.attempt} by {x.worker} from {_clock(x.claimed)} to {_clock(x.ended)}"
    jobs = ", ".join(
        f"job {x.job} attempt {x.attempt} from {_clock(x.claimed)} to {_clock(x.ended)}" for x in lane.leases
    )
    return f"{len(lane.leases)} leases taken together by {lane.leases[0].worker} ({jobs})"


def _clock(at: float | None) -> str:
    """A time of this host's clock, to the millisecond ('open' for a lease that never ended)."""
    return "open" if at is None else dt.datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
