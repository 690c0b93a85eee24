"""Periodic jobs: cron schedules turned into jobs, each slot enqueued exactly once.

The scheduler runs in the reaper process. On each pass it reads the database clock, finds each
schedule's latest due slot, and, if that slot is newer than the one recorded, advances the
record and enqueues the slot's job in one transaction. The record's conditional upsert lets
exactly one scheduler win a slot however many supervisors (hosts) run, without a leader.

After downtime only the latest missed slot is considered: ``catch_up="latest"`` enqueues it
late; ``catch_up="skip"`` (the default) enqueues it only if it is at most ``grace`` seconds
old, and otherwise records it as skipped. A schedule seen for the first time starts from
its latest due slot without enqueuing it, so deploying a daily job at noon does not run it
at once.

Time zones. A schedule's cron is read on the wall clock of its ``timezone`` (UTC by default),
and every slot is resolved to one UTC instant, which is what the record and the job's
idempotency key hold; so a wall-clock time can never yield two slots by being read twice. Where
a zone's clock jumps, the hour field decides:

- A cron whose hour field starts with ``*`` (every n minutes, hourly, every n hours) follows
  the real clock: a slot is each instant whose wall-clock time matches. A skipped wall-clock
  time has no instant, so it has no slot; a repeated one has two, so it has two slots (a
  ``*/15 * * * *`` schedule runs 8 times in the hour a fall-back change repeats).
- Any other cron (fixed hours: ``30 2 * * *``, ``0 9-17 * * 1-5``) is an appointment on the
  wall clock, kept once: a repeated wall-clock time runs at its first occurrence only, and a
  skipped one runs at the first instant after the change (03:00 after a 02:00 to 03:00 jump),
  once however many of its times were skipped and whether or not a slot falls there anyway.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from croniter import croniter

from ..core.errors import ConfigError, InvalidInput
from ..core.records import Schedule
from ..core.validation import check_task_name, encode_payload

CatchUp = Literal["latest", "skip"]

UTC = dt.timezone.utc
_TICK = dt.timedelta(microseconds=1)
# Every change of a zone's UTC offset in the tz database since 1970 is more than two days from
# the next one and moves the clock by at most 24 hours (Samoa skipped 30 December 2011). So
# probes a day apart meet each change alone, and looking two days either side of an instant
# finds every change whose skipped or repeated wall-clock times can matter to it.
_PROBE = dt.timedelta(days=1)
_REACH = 2 * _PROBE


@dataclass(frozen=True)
class Periodic:
    """A cron schedule that enqueues a job of ``task`` (with the task's defaults) at each slot.

    ``cron`` is read on the wall clock of ``timezone`` (a tz database name; the module
    docstring states what happens where the clock jumps); slots are UTC instants.
    """

    name: str
    cron: str
    task: str
    payload: Any = None
    catch_up: CatchUp = "skip"
    grace: float = 300.0
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        check_task_name(self.name)
        if not croniter.is_valid(self.cron):
            raise ConfigError(f"cron expression {self.cron!r} of schedule {self.name!r} is invalid")
        if self.catch_up not in ("latest", "skip"):
            raise ConfigError(f"catch_up {self.catch_up!r} is invalid: use 'latest' or 'skip'")
        if not 0 <= self.grace < float("inf"):
            raise ConfigError(f"grace {self.grace!r} of schedule {self.name!r} is invalid: use seconds >= 0")
        check_zone(self.timezone, self.name)
        try:
            encode_payload(self.payload)
        except InvalidInput as exc:
            raise ConfigError(f"schedule {self.name!r}: {exc}") from None

    @property
    def zone(self) -> dt.tzinfo:
        # UTC needs no tz data, so the default works on a system without any.
        return UTC if self.timezone == "UTC" else zoneinfo.ZoneInfo(self.timezone)

    @functools.cached_property
    def real_clock(self) -> bool:
        """Whether the cron's hour field starts with ``*``: it then fires at every instant whose
        wall-clock time matches, twice in a repeated hour; otherwise once per wall-clock time."""
        hours: str = croniter(self.cron).expressions[1]
        return hours.startswith("*")

    def local(self, slot: dt.datetime) -> dt.datetime:
        """``slot`` on the schedule's wall clock (for display: slots are compared as instants)."""
        return slot.astimezone(self.zone)

    def latest_slot(self, now: dt.datetime) -> dt.datetime:
        """The most recent slot at or before ``now``, as a UTC instant."""
        return self._search(
            now, self._wall_at_or_before, self._last_in, lambda span: min(span.start - _TICK, self._resume_before(span))
        )

    def next_slot(self, now: dt.datetime) -> dt.datetime:
        """The first slot after ``now``, as a UTC instant."""
        return self._search(
            now,
            self._wall_after,
            lambda span, _t: self._first_in(span, now),
            lambda span: max(span.end, self._resume_after(span)),
        )

    def _search(
        self,
        now: dt.datetime,
        on_utc: Callable[[dt.datetime], dt.datetime],
        found_in: Callable[[Span, dt.datetime], dt.datetime | None],
        onward: Callable[[Span], dt.datetime],
    ) -> dt.datetime:
        """The slot sought from ``now``: ``on_utc(now)`` on UTC's clock; in another zone, span by
        span of one offset, ``found_in(span, t)`` in the span of ``t``, from ``now`` and then at
        ``onward(span)`` until a span holds it."""
        t = now.astimezone(UTC)
        if self.timezone == "UTC":
            return on_utc(t)
        while True:
            span = span_of(self.zone, t)
            found = found_in(span, t)
            if found is not None:
                return found
            t = onward(span)

    def _last_in(self, span: Span, t: dt.datetime) -> dt.datetime | None:
        """The latest slot of ``span`` at or before ``t``, an instant of the span."""
        wall = self._wall_at_or_before(span.wall(t))
        if wall >= span.first_wall(self.real_clock):
            return span.instant(wall)
        return span.start if self._moved_to_start(span) else None

    def _first_in(self, span: Span, after: dt.datetime) -> dt.datetime | None:
        """The first slot of ``span`` after ``after``."""
        if span.start > after and self._moved_to_start(span):
            return span.start
        wall = self._wall_after(max(span.wall(after), span.first_wall(self.real_clock) - _TICK))
        slot = span.instant(wall)
        return slot if slot < span.end else None

    def _moved_to_start(self, span: Span) -> bool:
        """Whether a wall-clock appointment the change at ``span``'s start skipped runs then."""
        skipped = span.skipped()
        if self.real_clock or skipped is None:
            return False
        first, end = skipped
        return self._wall_at_or_before(end - _TICK) >= first

    def _resume_before(self, span: Span) -> dt.datetime:
        """An instant no earlier than the latest slot before ``span``, so a sparse cron (monthly,
        yearly) jumps to it instead of stepping back a span at a time: that slot's wall-clock
        time is at most the last matching one before the span's plus the largest offset change."""
        wall = self._wall_at_or_before(span.wall(span.start) + _REACH)
        return span.instant(wall) + _REACH

    def _resume_after(self, span: Span) -> dt.datetime:
        """An instant no later than the first slot after ``span`` (see :meth:`_resume_before`)."""
        wall = self._wall_after(span.wall(span.end) - _REACH - _TICK)
        return span.instant(wall) - _REACH

    def _wall_at_or_before(self, wall: dt.datetime) -> dt.datetime:
        found: dt.datetime = croniter(self.cron, wall + _TICK).get_prev(dt.datetime)
        return found

    def _wall_after(self, wall: dt.datetime) -> dt.datetime:
        found: dt.datetime = croniter(self.cron, wall).get_next(dt.datetime)
        return found


def as_periodic(row: Schedule) -> Periodic:
    """A schedule made at run time (``client.schedules``), stored as ``row``, as the scheduler reads
    its slots (a ConfigError if this host cannot: a zone its tz data lacks)."""
    catch_up: CatchUp = "latest" if row.catch_up == "latest" else "skip"
    return Periodic(row.name, row.cron, row.task, row.payload, catch_up, row.grace, row.timezone)


def check_zone(timezone: str, schedule: str) -> None:
    """Refuse a ``timezone`` the tz database does not know, naming it."""
    if timezone == "UTC":
        return
    try:
        zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        hint = "use a tz database name such as 'Europe/Berlin' or 'UTC'"
        if not zoneinfo.available_timezones():
            hint = "this system has no time zone data: install the tzdata package"
        raise ConfigError(f"timezone {timezone!r} of schedule {schedule!r} is unknown: {hint}") from None


@dataclass(frozen=True)
class Span:
    """Instants from ``start`` to before ``end`` on which a zone keeps one UTC ``offset``.

    ``before`` is the offset just before ``start``: the same one when ``start`` is only as far
    as the search looked rather than a change. Wall-clock times are naive datetimes.
    """

    start: dt.datetime
    end: dt.datetime
    offset: dt.timedelta
    before: dt.timedelta

    def wall(self, t: dt.datetime) -> dt.datetime:
        return (t.astimezone(UTC) + self.offset).replace(tzinfo=None)

    def instant(self, wall: dt.datetime) -> dt.datetime:
        return (wall - self.offset).replace(tzinfo=UTC)

    def first_wall(self, repeated: bool) -> dt.datetime:
        """The span's earliest wall-clock time; after a fall-back change, unless ``repeated``,
        the earliest the span before it did not show already."""
        shown = self.offset if repeated else max(self.offset, self.before)
        return (self.start + shown).replace(tzinfo=None)

    def skipped(self) -> tuple[dt.datetime, dt.datetime] | None:
        """The wall-clock times a spring-forward change at ``start`` skipped, from and to."""
        if self.before >= self.offset:
            return None
        return (self.start + self.before).replace(tzinfo=None), (self.start + self.offset).replace(tzinfo=None)


def span_of(zone: dt.tzinfo, t: dt.datetime) -> Span:
    """The span of ``zone``'s offset around instant ``t``, looked for up to two days either side."""
    offset = offset_at(zone, t)
    start = _change_near(zone, t, -_PROBE, offset) or t - _REACH
    end = _change_near(zone, t, _PROBE, offset) or t + _REACH
    return Span(start.astimezone(UTC), end.astimezone(UTC), offset, offset_at(zone, start - _TICK))


def offset_at(zone: dt.tzinfo, t: dt.datetime) -> dt.timedelta:
    return t.astimezone(zone).utcoffset() or dt.timedelta(0)


def _change_near(zone: dt.tzinfo, t: dt.datetime, step: dt.timedelta, offset: dt.timedelta) -> dt.datetime | None:
    """The nearest change of ``zone``'s offset from ``t`` in the direction of ``step``, within
    two days: the first instant with the new offset."""
    near = t
    while abs(near - t) < _REACH:
        far = near + step
        if offset_at(zone, far) != offset:
            return _first_instant_after_change(zone, min(near, far), max(near, far))
        near = far
    return None


def _first_instant_after_change(zone: dt.tzinfo, early: dt.datetime, late: dt.datetime) -> dt.datetime:
    """The instant the one change between ``early`` and ``late`` happens.

    The tz database changes offsets on whole seconds, so flooring either end keeps its offset
    and the search runs over whole seconds.
    """
    low, high = math.floor(early.timestamp()), math.floor(late.timestamp())
    after = offset_at(zone, late)
    while high - low > 1:
        middle = (low + high) // 2
        if offset_at(zone, dt.datetime.fromtimestamp(middle, UTC)) == after:
            high = middle
        else:
            low = middle
    return dt.datetime.fromtimestamp(high, UTC)
