"""Periodic schedules in a time zone, across the DST changes of 2026 in Berlin and New York.

The rules (miniqueue/tasks/periodic.py): a cron whose hour field starts with ``*`` has a slot
at each instant whose wall-clock time matches (none in a skipped hour, two for each time of a
repeated one); any other has one at the first instant the wall clock reaches or passes each
matching time (a repeated time once, at its first occurrence; a skipped one at the end of the
jump). Slots are UTC instants, and so are the idempotency keys built from them.

The slot computation is a pure function of ``now``, tested here against slots written out by
hand and, minute by minute over each change's day, against an oracle that walks the real clock.
The scheduler is then driven with an injected ``now`` over passes across each change.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from croniter import croniter
from starlette.testclient import TestClient

from miniqueue import App, Client, ConfigError
from miniqueue.cli import main
from miniqueue.core.db import Connection, connect
from miniqueue.maintenance.scheduler import schedule_due
from miniqueue.store.store import Store
from miniqueue.tasks.job import Job
from miniqueue.tasks.periodic import Periodic
from miniqueue.web import create_app

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)
TICK = dt.timedelta(microseconds=1)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, tzinfo=UTC)


@dataclass(frozen=True)
class Change:
    """A DST change: the zone, the instant it happens, whether the clock jumps forward, and a
    daily cron at a time in the hour it skips or repeats, with its slots on the day before, the
    day of and the day after, written out by hand."""

    zone: str
    at: dt.datetime
    forward: bool
    daily: str
    daily_slots: tuple[dt.datetime, ...]

    @property
    def day(self) -> tuple[dt.datetime, dt.datetime]:
        """The local calendar day of the change, as UTC instants (23 or 25 hours)."""
        local = self.at.astimezone(ZoneInfo(self.zone)).date()
        start = dt.datetime.combine(local, dt.time(), ZoneInfo(self.zone))
        return start.astimezone(UTC), (start + dt.timedelta(days=1)).astimezone(UTC)


CHANGES = {
    # 02:00 CET becomes 03:00 CEST: 02:30 is skipped, so it runs at 03:00 CEST.
    "berlin-spring": Change(
        "Europe/Berlin",
        utc(2026, 3, 29, 1),
        True,
        "30 2 * * *",
        (utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1), utc(2026, 3, 30, 0, 30)),
    ),
    # 03:00 CEST becomes 02:00 CET: 02:30 happens twice and runs at the first, 02:30 CEST.
    "berlin-fall": Change(
        "Europe/Berlin",
        utc(2026, 10, 25, 1),
        False,
        "30 2 * * *",
        (utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)),
    ),
    # 02:00 EST becomes 03:00 EDT.
    "new-york-spring": Change(
        "America/New_York",
        utc(2026, 3, 8, 7),
        True,
        "30 2 * * *",
        (utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7), utc(2026, 3, 9, 6, 30)),
    ),
    # 02:00 EDT becomes 01:00 EST: 01:30 happens twice and runs at the first, 01:30 EDT.
    "new-york-fall": Change(
        "America/New_York",
        utc(2026, 11, 1, 6),
        False,
        "30 1 * * *",
        (utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)),
    ),
}
each_change = pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())


def every(step: dt.timedelta, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The instants from ``start`` (aligned to ``step``) up to ``end``, excluded."""
    return [start + i * step for i in range(int((end - start) / step))]


def slots_between(schedule: Periodic, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The schedule's slots from ``start`` up to ``end``, by following next_slot."""
    found = []
    slot = schedule.next_slot(start - TICK)
    while slot < end:
        found.append(slot)
        slot = schedule.next_slot(slot)
    return found


def local_hours(slots: list[dt.datetime], zone: str) -> list[str]:
    return [slot.astimezone(ZoneInfo(zone)).strftime("%H:%M%z") for slot in slots]


# --- the slots, written out by hand -------------------------------------------------------------


@each_change
def test_a_daily_schedule_runs_once_a_day_across_the_change(change: Change) -> None:
    schedule = Periodic("daily", change.daily, "report", timezone=change.zone)
    window = (change.at - dt.timedelta(days=1, hours=12), change.at + dt.timedelta(days=1, hours=12))
    assert slots_between(schedule, *window) == list(change.daily_slots)


@each_change
@pytest.mark.parametrize(("cron", "step"), [("0 * * * *", HOUR), ("*/15 * * * *", 15 * MINUTE)])
def test_hourly_and_quarter_hourly_schedules_run_at_every_real_hour_or_quarter(
    change: Change, cron: str, step: dt.timedelta
) -> None:
    """Both zones' offsets are whole hours, so every real hour and quarter hour shows a
    matching wall-clock time: 23 or 25 hourly slots on the day of the change."""
    schedule = Periodic("interval", cron, "report", timezone=change.zone)
    start, end = change.day
    slots = slots_between(schedule, start, end)
    assert slots == every(step, start, end)
    assert len(slots) == (23 if change.forward else 25) * (HOUR // step)


def test_in_the_hour_berlin_repeats_a_quarter_hourly_schedule_runs_8_times_a_daily_one_once() -> None:
    repeated = (utc(2026, 10, 25, 0), utc(2026, 10, 25, 2))  # 02:00 CEST to 03:00 CET
    quarters = slots_between(Periodic("q", "*/15 * * * *", "report", timezone="Europe/Berlin"), *repeated)
    assert local_hours(quarters, "Europe/Berlin") == [
        *(f"02:{m:02}+0200" for m in (0, 15, 30, 45)),
        *(f"02:{m:02}+0100" for m in (0, 15, 30, 45)),
    ]
    at_two = slots_between(Periodic("fixed", "*/15 2 * * *", "report", timezone="Europe/Berlin"), *repeated)
    assert local_hours(at_two, "Europe/Berlin") == [f"02:{m:02}+0200" for m in (0, 15, 30, 45)]


def test_in_the_hour_berlin_skips_nothing_runs_and_skipped_appointments_run_once_at_three() -> None:
    around = (utc(2026, 3, 28, 23), utc(2026, 3, 29, 3))  # 00:00 CET to 05:00 CEST
    fixed = slots_between(Periodic("fixed", "*/15 2 * * *", "report", timezone="Europe/Berlin"), *around)
    assert local_hours(fixed, "Europe/Berlin") == ["03:00+0200"]
    # 01:00, the skipped 02:00, and 03:00: the skipped one and 03:00 are one instant, one slot.
    merged = slots_between(Periodic("merged", "0 1-3 * * *", "report", timezone="Europe/Berlin"), *around)
    assert local_hours(merged, "Europe/Berlin") == ["01:00+0100", "03:00+0200"]
    # Every two hours on the real clock: 02:00 does not exist, so 00:00, then 04:00.
    two_hourly = slots_between(Periodic("2h", "0 */2 * * *", "report", timezone="Europe/Berlin"), *around)
    assert local_hours(two_hourly, "Europe/Berlin") == ["00:00+0100", "04:00+0200"]


def test_a_yearly_appointment_on_the_day_of_a_change_is_found_a_year_away() -> None:
    spring = Periodic("spring", "30 2 29 3 *", "report", timezone="Europe/Berlin")
    assert spring.next_slot(utc(2026, 1, 1)) == utc(2026, 3, 29, 1)  # 03:00 CEST
    assert spring.latest_slot(utc(2027, 2, 1)) == utc(2026, 3, 29, 1)
    fall = Periodic("fall", "30 2 25 10 *", "report", timezone="Europe/Berlin")
    assert fall.latest_slot(utc(2027, 10, 1)) == utc(2026, 10, 25, 0, 30)  # the first 02:30
    assert fall.next_slot(utc(2026, 10, 25, 0, 30)) == utc(2027, 10, 25, 0, 30)  # CEST until Oct 31


@pytest.mark.parametrize("cron", ["* * * * *", "*/15 * * * *", "30 2 * * *", "0 0 1 * *", "0 0 29 2 *"])
def test_a_zone_without_changes_gives_the_slots_of_utc(cron: str) -> None:
    """Etc/UTC takes the zone path, UTC the plain one: they must agree."""
    plain, zoned = Periodic("a", cron, "t"), Periodic("b", cron, "t", timezone="Etc/UTC")
    for now in (utc(2026, 3, 29, 1), utc(2026, 6, 1, 12, 34) + 56789 * TICK, utc(2028, 1, 1) - TICK):
        assert zoned.latest_slot(now) == plain.latest_slot(now)
        assert zoned.next_slot(now) == plain.next_slot(now)


# --- every minute of each change's day, against an oracle that walks the real clock ---------------


def oracle(cron: str, zone: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The slots from ``start`` to ``end`` by walking the real clock a minute at a time: a
    real-clock cron has a slot at each minute whose wall-clock time matches; any other at each
    minute at which the wall clock first reaches or passes a matching time."""
    tz = ZoneInfo(zone)

    def wall(t: dt.datetime) -> dt.datetime:
        return t.astimezone(tz).replace(tzinfo=None)

    matching = set(walls_of(cron, wall(start) - dt.timedelta(days=1), wall(end) + dt.timedelta(days=1)))
    real_clock = cron.split()[1].startswith("*")
    reached = wall(start - MINUTE)
    slots = []
    for t in every(MINUTE, start, end):
        passed = every(MINUTE, reached + MINUTE, wall(t) + MINUTE)  # empty while a repeated hour replays
        if (wall(t) in matching) if real_clock else any(w in matching for w in passed):
            slots.append(t)
        reached = max(reached, wall(t))
    return slots


def walls_of(cron: str, start: dt.datetime, end: dt.datetime) -> Iterator[dt.datetime]:
    """The wall-clock times ``cron`` matches from ``start`` to ``end`` (naive datetimes)."""
    times = croniter(cron, start - TICK)
    while (wall := times.get_next(dt.datetime)) < end:
        yield wall


ORACLE_CRONS = ["daily", "0 * * * *", "*/15 * * * *", "*/15 2 * * *", "0 1-3 * * *", "0 */2 * * *", "7 * * * *"]


@each_change
@pytest.mark.parametrize("cron", ORACLE_CRONS)
def test_latest_and_next_slot_agree_with_the_oracle_at_every_minute_of_the_day(change: Change, cron: str) -> None:
    cron = change.daily if cron == "daily" else cron
    schedule = Periodic("s", cron, "report", timezone=change.zone)
    start, end = change.day
    expected = oracle(cron, change.zone, start - dt.timedelta(days=1), end + dt.timedelta(days=1))
    instants = every(MINUTE, start, end) + [slot + d for slot in expected if start <= slot < end for d in (-TICK, TICK)]
    for now in instants:
        assert schedule.latest_slot(now) == max(s for s in expected if s <= now), now
        assert schedule.next_slot(now) == min(s for s in expected if s > now), now


# --- the scheduler, driven across each change -----------------------------------------------------


def noop(job: Job) -> None:
    """A handler; nothing runs these jobs."""


def change_app(change: Change) -> App:
    app = App()
    app.task("report")(noop)
    app.periodic(change.daily, task="report", name="daily", timezone=change.zone)
    app.periodic("0 * * * *", task="report", name="hourly", timezone=change.zone)
    app.periodic("*/15 * * * *", task="report", name="quarterly", timezone=change.zone)
    return app


def scheduler_pass(dsn: str, app: App) -> Callable[[dt.datetime], list[int]]:
    """One pass of the real scheduler at an injected ``now``, on a connection of its own."""
    conn = connect(dsn, purpose="test-scheduler")
    schedules = list(app.schedules.values())
    specs = {s.name: app.task_spec(s.task, s.payload) for s in schedules}
    return lambda now: schedule_due(conn, Store(), schedules, specs, now=now)


def enqueued_slots(conn: Connection, name: str) -> list[dt.datetime]:
    """The slots of the jobs schedule ``name`` enqueued, read back from their idempotency keys."""
    keys = conn.execute(
        "SELECT idempotency_key FROM miniqueue_jobs WHERE idempotency_key LIKE %s ORDER BY id", [f"periodic:{name}:%"]
    ).fetchall()
    return [dt.datetime.fromisoformat(key.removeprefix(f"periodic:{name}:")) for (key,) in keys]


@each_change
def test_two_schedulers_passing_every_5_minutes_across_the_change_enqueue_each_slot_once(
    dsn: str, conn: Connection, change: Change
) -> None:
    conn.execute("TRUNCATE miniqueue_periodic")
    app = change_app(change)
    passes = [scheduler_pass(dsn, app), scheduler_pass(dsn, app)]
    start, end = change.at - 4 * HOUR, change.at + 4 * HOUR
    enqueued: list[int] = []
    for now in every(5 * MINUTE, start, end + 5 * MINUTE):  # the last pass at end
        for run in passes:
            enqueued += run(now)
    assert len(enqueued) == len(set(enqueued)), "a slot was enqueued twice (its key matched an existing job)"

    # The first pass only records each schedule's latest slot: the slots after it, up to the last pass.
    assert enqueued_slots(conn, "hourly") == every(HOUR, start + HOUR, end + HOUR)
    assert enqueued_slots(conn, "quarterly") == every(15 * MINUTE, start + 15 * MINUTE, end + 15 * MINUTE)
    assert enqueued_slots(conn, "daily") == [slot for slot in change.daily_slots if start < slot <= end]
    assert len(enqueued) == sum(len(enqueued_slots(conn, name)) for name in app.schedules)

    hours = [slot.astimezone(ZoneInfo(change.zone)).hour for slot in enqueued_slots(conn, "hourly")]
    jumped = change.at.astimezone(ZoneInfo(change.zone)).hour - (1 if change.forward else 0)
    assert hours.count(jumped) == (0 if change.forward else 2)  # none in the skipped hour, both real ones


# --- registration, and the views that show the zone -----------------------------------------------


def test_an_unknown_zone_is_a_config_error_naming_it_and_registers_nothing() -> None:
    app = App()
    app.task("report")(noop)
    with pytest.raises(ConfigError, match=r"timezone 'Europe/Berln' of schedule 'report' is unknown"):
        app.periodic("0 3 * * *", task="report", timezone="Europe/Berln")
    with pytest.raises(ConfigError, match=r"timezone '\.\./etc/passwd' of schedule 'tick' is unknown"):
        app.task("tick", cron="* * * * *", timezone="../etc/passwd")(noop)
    assert app.schedules == {} and "tick" not in app.tasks


def test_a_zone_without_a_cron_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="task 'tick': timezone 'Europe/Berlin' is for a cron schedule"):
        App().task("tick", timezone="Europe/Berlin")(noop)


def test_a_task_with_cron_and_timezone_is_scheduled_in_that_zone() -> None:
    app = App()
    app.task("tick", cron="30 2 * * *", timezone="America/New_York")(noop)
    assert app.schedules["tick"] == Periodic("tick", "30 2 * * *", "tick", timezone="America/New_York")
    assert App().periodic("* * * * *", task="t").timezone == "UTC"


@pytest.mark.parametrize(
    ("cron", "real_clock"),
    [
        *[("*/15 * * * *", True), ("0 * * * *", True), ("@hourly", True), ("0 */2 * * *", True)],
        *[("30 2 * * *", False), ("@daily", False), ("*/15 2 * * *", False), ("0 9-17 * * 1-5", False)],
    ],
)
def test_the_hour_field_decides_whether_a_cron_follows_the_real_clock(cron: str, real_clock: bool) -> None:
    assert Periodic("s", cron, "t", timezone="Europe/Berlin").real_clock is real_clock


#: For `miniqueue periodic list --app tests.db.test_timezones:ZONED_APP`.
ZONED_APP = App()
ZONED_APP.task("report")(noop)
ZONED_APP.periodic("0 9 * * *", task="report", name="berlin-morning", timezone="Europe/Berlin")


def test_the_cli_lists_each_schedules_zone_and_its_next_slot_on_that_clock(dsn: str) -> None:
    result = CliRunner().invoke(
        main,
        ["periodic", "list", "--app", "tests.db.test_timezones:ZONED_APP", "--database-url", dsn],
        env={"DATABASE_URL": None},
    )
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert line.split()[:7] == ["berlin-morning", "0", "9", "*", "*", "*", "Europe/Berlin"]
    next_slot = dt.datetime.fromisoformat(line.split("next ")[1].strip())
    assert (next_slot.hour, next_slot.minute) == (9, 0)
    assert next_slot.utcoffset() == next_slot.astimezone(ZoneInfo("Europe/Berlin")).utcoffset()


def test_the_dashboard_shows_each_schedules_zone_and_next_run_on_that_clock(client: Client) -> None:
    with TestClient(create_app(client, app=ZONED_APP), base_url="http://localhost") as web:
        page = web.get("/periodic").text
    assert '<th scope="col">Time zone</th>' in page and "<td>Europe/Berlin</td>" in page
    assert "09:00 CET" in page or "09:00 CEST" in page
