"""What the databases of a shard map answered, put together for an operator: pure functions, no
I/O (:class:`~miniqueue.client.sharded.ShardedClient` reads, the CLI and the dashboard show).

Each database answers for itself or not at all: an :data:`Answers` holds, per database of the
map, its answer or the :class:`DatabaseUnavailable` that says why it did not answer, so that a
database that is down is named and never counted as holding nothing.

Figures that each database keeps alone add up: a queue's jobs, its cap (each database enforces
its own, so the fleet runs at most their sum), a limit's waiting jobs, slots and tokens.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from ..core.errors import DatabaseUnavailable
from ..core.records import JobRecord, State
from ..store.store import LimitWait

T = TypeVar("T")
N = TypeVar("N", int, float)

#: Per database of a map (by name, in the map's order): its answer, or why it did not answer.
Answers = dict[str, T | DatabaseUnavailable]

#: The row name of a merged figure, beside each database's rows.
TOTAL = "total"


def answered(answers: Mapping[str, T | DatabaseUnavailable]) -> dict[str, T]:
    """The answers of the databases that answered."""
    return {name: found for name, found in answers.items() if not isinstance(found, DatabaseUnavailable)}


def unreachable(answers: Mapping[str, object]) -> dict[str, DatabaseUnavailable]:
    """The databases that did not answer, each with its error (its DSN masked)."""
    return {name: found for name, found in answers.items() if isinstance(found, DatabaseUnavailable)}


def every_answer(answers: Mapping[str, T | DatabaseUnavailable]) -> dict[str, T]:
    """Every database's answer; DatabaseUnavailable naming those that did not answer, for a
    caller that cannot go on with a part (a sum would pass for the whole)."""
    down = unreachable(answers)
    if down:
        first = next(iter(down.values()))
        raise DatabaseUnavailable(f"database(s) {', '.join(down)} of the shard map did not answer: {first}")
    return answered(answers)


# -- queues: paused, capped ----------------------------------------------------------------------


class QueueSetting(NamedTuple):
    """A queue as ``miniqueue queues list`` shows it: whether it is paused, and its cap. As a
    total over databases: paused where ``paused_on`` says (``paused`` only if on every one
    that knows it), and the sum of the caps (None when one of them has none: no bound)."""

    queue: str
    paused: bool
    max_running: int | None
    paused_on: tuple[str, ...] = ()


def queue_settings(paused: Mapping[str, bool], caps: Mapping[str, int]) -> list[QueueSetting]:
    """One database's queues (those with jobs, paused or capped), by name."""
    names = sorted(set(paused) | set(caps))
    return [QueueSetting(name, paused.get(name, False), caps.get(name)) for name in names]


def total_settings(found: Mapping[str, list[QueueSetting]]) -> list[QueueSetting]:
    """Each queue's setting over the databases that know it, by name."""
    by_queue: dict[str, list[tuple[str, QueueSetting]]] = {}
    for name, settings in found.items():
        for setting in settings:
            by_queue.setdefault(setting.queue, []).append((name, setting))
    totals = []
    for queue in sorted(by_queue):
        rows = by_queue[queue]
        paused_on = tuple(name for name, s in rows if s.paused)
        caps = [s.max_running for _, s in rows]
        cap = None if None in caps else sum(c for c in caps if c is not None)
        totals.append(QueueSetting(queue, len(paused_on) == len(rows), cap, paused_on))
    return totals


# -- limits ---------------------------------------------------------------------------------------


def _add(a: N | None, b: N | None) -> N | None:
    return b if a is None else a if b is None else a + b


def summed_wait(a: LimitWait, b: LimitWait) -> LimitWait:
    """One limit over two databases: its waiting jobs, slots, caps, rates and tokens summed
    (each database enforces it alone), its holders side by side."""
    return LimitWait(
        scope=a.scope,
        waiting=a.waiting + b.waiting,
        max_running=_add(a.max_running, b.max_running),
        rate=_add(a.rate, b.rate),
        held=_add(a.held, b.held),
        tokens=_add(a.tokens, b.tokens),
        holders=[*a.holders, *b.holders],
    )


def total_waits(found: Mapping[str, list[LimitWait]], limit: int) -> list[LimitWait]:
    """Each limit summed over the databases, most waiting first, then most held; at most ``limit``."""
    totals: dict[str, LimitWait] = {}
    for waits in found.values():
        for w in waits:
            totals[w.scope] = summed_wait(totals[w.scope], w) if w.scope in totals else w
    ranked = sorted(totals.values(), key=lambda w: (-w.waiting, -(w.held or 0), w.scope))
    return ranked[:limit]


# -- jobs -----------------------------------------------------------------------------------------


class JobsPage(NamedTuple):
    """A page of jobs over a map: the newest that the databases which answered hold, and
    those that did not (their jobs missing from the page, never taken as none)."""

    jobs: list[JobRecord]
    unreachable: dict[str, DatabaseUnavailable]


def newest_key(job: JobRecord) -> tuple[dt.datetime, int]:
    """The order of a merged job list, newest first: creation time, then id. (Ids do not
    follow time across databases: each database draws its own.)"""
    return (job.created_at, job.id)


def page_filters(filters: Mapping[str, Any], cursor: JobRecord, on_cursors: bool) -> dict[str, Any]:
    """A database's filters for the page after ``cursor`` (the last job of the page before):
    created no later than it, and, on the cursor's own database, with a smaller id (a batch
    shares one creation time)."""
    until = cursor.created_at + dt.timedelta(microseconds=1)  # created_at <= the cursor's
    given = filters.get("created_before")
    page = {**filters, "created_before": min(until, given) if given is not None else until}
    if on_cursors:
        page["before_id"] = cursor.id
    return page


def newest_first(lists: Iterable[list[JobRecord]], limit: int, cursor: JobRecord | None = None) -> list[JobRecord]:
    """The ``limit`` newest of the jobs each database listed (see :func:`newest_key`), after
    ``cursor`` when one is given."""
    jobs = [job for found in lists for job in found]
    if cursor is not None:
        jobs = [job for job in jobs if newest_key(job) < newest_key(cursor)]
    return sorted(jobs, key=newest_key, reverse=True)[:limit]


# -- throughput -----------------------------------------------------------------------------------


def summed_throughput(
    lists: Iterable[list[tuple[dt.datetime, State, int]]],
) -> list[tuple[dt.datetime, State, int]]:
    """Jobs finished per minute and state over the databases: each ``(minute, state)`` once."""
    summed: dict[tuple[dt.datetime, State], int] = {}
    for rows in lists:
        for minute, state, n in rows:
            summed[(minute, state)] = summed.get((minute, state), 0) + n
    return [(minute, state, n) for (minute, state), n in sorted(summed.items(), key=lambda kv: kv[0][0])]
