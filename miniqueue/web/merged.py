"""What the overview and queues pages show, made of what each database answered: one database,
or every database of a shard map (a row per database where one means something, the totals,
and a banner naming each database that did not answer, whose jobs are then missing from the
totals, never counted as none). Pure functions: the pages read, these put it together."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..client.inspection import LimitWait
from ..client.merging import TOTAL, Answers, answered, summed_throughput, total_waits, unreachable
from ..client.sharded import summed
from ..core.fairness import KeyRule, KeyShare
from ..core.records import BlockedSequence, HorizonHolder, QueueStats, State
from . import present


class Reading(NamedTuple):
    """What the overview reads on one database, on one connection (see ``Pages.overview``):
    its queues as ``miniqueue stats`` shows them (with those no worker serves), its finished
    jobs per minute, its paused queues, and what holds its MVCC horizon back too long."""

    now: dt.datetime
    stats: list[QueueStats]
    throughput: list[tuple[dt.datetime, State, int]]
    paused: list[str]
    held: list[HorizonHolder]


@dataclass(frozen=True)
class DatabaseRow:
    """A database's line of the overview over a map: its totals, or why it did not answer."""

    name: str
    totals: dict[str, Any] | None
    unreachable: str | None = None


def overview(answers: Answers[Reading]) -> dict[str, Any]:
    """The overview's template context from each database's reading: queues summed over the
    databases, the chart of their finished jobs, where each queue is paused, and (over a map)
    a row per database and the databases that did not answer."""
    found, down = answered(answers), unreachable(answers)
    now = next((r.now for r in found.values()), None) or dt.datetime.now(dt.timezone.utc)
    merged: dict[str, QueueStats] = {}
    paused: dict[str, list[str]] = {}
    for name, reading in found.items():
        for q in reading.stats:
            merged[q.queue] = summed(merged[q.queue], q) if q.queue in merged else q
        for queue in reading.paused:
            paused.setdefault(queue, []).append(name)
    stats = [merged[queue] for queue in sorted(merged)]
    rows = [
        DatabaseRow(name, totals(found[name].stats)) if name in found else DatabaseRow(name, None, str(down[name]))
        for name in answers
    ]
    return {
        "now": now,
        "stats": stats,
        "paused": paused,
        "chart": present.throughput_chart(summed_throughput(r.throughput for r in found.values()), now),
        "totals": totals(stats),
        "held": [(name, h) for name, reading in found.items() for h in reading.held],
        "databases": rows if len(answers) > 1 or "" not in answers else [],
        "unreachable": {name: str(why) for name, why in down.items()},
    }


def totals(stats: list[QueueStats]) -> dict[str, Any]:
    """The figures of the overview's cards: jobs by state, scheduled, expired leases, the oldest wait."""
    waits = [s.oldest_available_seconds for s in stats if s.oldest_available_seconds is not None]
    return {
        "counts": {state.value: sum(s.counts[state] for s in stats) for state in State},
        "scheduled": sum(s.scheduled for s in stats),
        "expired": sum(s.expired_leases for s in stats),
        "oldest": max(waits, default=None),
    }


# -- the queues page ------------------------------------------------------------------------------


class QueuesReading(NamedTuple):
    """What the queues page reads on one database: queue figures, paused queues, caps, the
    limits jobs wait on, and the blocked sequence keys."""

    stats: list[QueueStats]
    paused: list[str]
    caps: dict[str, int]
    waits: list[LimitWait]
    blocked: list[BlockedSequence]
    rules: list[KeyRule]
    shares: list[KeyShare]


@dataclass(frozen=True)
class QueueRow:
    """A queue's line: its jobs over the databases holding it, where it is paused, its caps."""

    name: str
    paused_on: tuple[str, ...]  # the databases where it is paused ("" for the one database)
    paused: bool  # on every database that holds it
    available: int
    running: int
    scheduled: int  # of the available jobs, those not to run before a later time
    oldest: float | None
    max_running: int | None = None  # the cap (over a map: the sum of the databases' caps)
    caps: tuple[tuple[str, int | None], ...] = ()  # over a map: each database's cap


def queues(answers: Answers[QueuesReading], known: list[str]) -> dict[str, Any]:
    """The queues page's context: a row per queue (those with jobs, paused or capped, and the
    ``known`` queues of the app), the limits (over a map: each database's rows and the totals)
    and the blocked sequence keys, each with its database, and the databases that did not answer."""
    found = answered(answers)
    names = sorted({n for r in found.values() for n in [*(s.queue for s in r.stats), *r.paused, *r.caps]} | {*known})
    waits = [(name, w) for name, r in found.items() for w in r.waits]
    if len(answers) > 1:
        waits += [(TOTAL, w) for w in total_waits({name: r.waits for name, r in found.items()}, 100)]
    return {
        "rows": [_queue_row(queue, found) for queue in names],
        "waits": waits,
        "blocked": [(name, b) for name, r in found.items() for b in r.blocked],
        "rules": [(name, rule) for name, r in found.items() for rule in r.rules],
        "shares": [(name, share, _running_share(share, r.shares)) for name, r in found.items() for share in r.shares],
        "sharded": len(answers) > 1 or "" not in answers,
        "unreachable": {name: str(why) for name, why in unreachable(answers).items()},
    }


def _queue_row(queue: str, found: dict[str, QueuesReading]) -> QueueRow:
    holding = {name: r for name, r in found.items() if _holds(r, queue)} or found
    stats = [s for r in holding.values() for s in r.stats if s.queue == queue]
    counts = totals(stats)
    caps = tuple((name, r.caps.get(queue)) for name, r in holding.items())
    cap_values = [cap for _, cap in caps]
    paused_on = tuple(name for name, r in holding.items() if queue in r.paused)
    return QueueRow(
        name=queue,
        paused_on=paused_on,
        paused=bool(holding) and len(paused_on) == len(holding),
        available=counts["counts"][State.AVAILABLE.value],
        running=counts["counts"][State.RUNNING.value],
        scheduled=counts["scheduled"],
        oldest=counts["oldest"],
        max_running=None if None in cap_values else sum(c for c in cap_values if c is not None),
        caps=caps if len(found) > 1 else (),
    )


def _running_share(share: KeyShare, shares: list[KeyShare]) -> float | None:
    """A fair key's share of its queue's running fair jobs now (None: none run)."""
    running = sum(s.running for s in shares if s.queue == share.queue)
    return share.running / running if running else None


def _holds(reading: QueuesReading, queue: str) -> bool:
    return queue in reading.caps or queue in reading.paused or any(s.queue == queue for s in reading.stats)
