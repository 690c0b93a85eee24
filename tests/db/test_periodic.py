"""Periodic jobs on a real database: cron slots turned into jobs, each slot exactly once.

The scheduler reads the database clock, so tests travel in time by moving a schedule's stored
``last_slot`` back (as if the previous run happened earlier) rather than by waiting. Schedules
that must not gain a new slot during a test are hourly ones whose minute is chosen from the
database clock, so the next slot is always most of an hour away.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from miniqueue import App, ConfigError, MiniqueueError, Reaper, ReaperConfig
from miniqueue.core.db import Connection, connect
from miniqueue.maintenance.scheduler import schedule_due
from miniqueue.store.store import Store
from miniqueue.tasks.job import Job
from miniqueue.tasks.periodic import Periodic

from ..helpers import count, db_now, row, run_on_threads, wait_until
from ..supervised import FAST, Supervised

UTC = dt.timezone.utc

#: Run by a real supervisor in test_a_supervisors_reaper_enqueues_due_slots_and_its_workers_run_them.
SUPERVISED_APP = App()


@pytest.fixture(autouse=True)
def periodic_table(conn: Connection) -> Connection:
    conn.execute("TRUNCATE miniqueue_periodic")
    return conn


def noop(job: Job) -> None:
    """A handler; these tests only schedule jobs, nothing runs them."""


SUPERVISED_APP.task("tick", queue="ticks", cron="* * * * *")(noop)


def report_app(cron: str, **options: Any) -> App:
    """An app whose ``report`` task (queue reports, priority 7, 2 attempts) runs on ``cron``."""
    app = App()
    app.task("report", queue="reports", priority=7, max_attempts=2)(noop)
    app.periodic(cron, task="report", payload={"kind": "daily"}, **options)
    return app


def hourly_due(conn: Connection, minutes_ago: int) -> str:
    """An hourly cron whose latest slot is ``minutes_ago`` to ``minutes_ago + 1`` minutes ago."""
    return f"{(db_now(conn).minute - minutes_ago) % 60} * * * *"


def last_slot(conn: Connection, name: str = "report") -> dt.datetime | None:
    """The schedule's recorded slot (UTC), or None if it has no row."""
    found = conn.execute("SELECT last_slot FROM miniqueue_periodic WHERE name = %s", [name]).fetchone()
    if found is None:
        return None
    slot: dt.datetime = found[0]
    return slot.astimezone(UTC)


def recorded(conn: Connection, name: str = "report") -> dt.datetime:
    """The schedule's recorded slot, which must exist."""
    slot = last_slot(conn, name)
    assert slot is not None, f"schedule {name} has no row"
    return slot


def set_last_slot(conn: Connection, slot: dt.datetime, name: str = "report") -> None:
    """Record ``slot`` as the schedule's last slot, as an earlier run would have."""
    conn.execute(
        "INSERT INTO miniqueue_periodic (name, last_slot) VALUES (%s, %s)"
        " ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot",
        [name, slot],
    )


def key(slot: dt.datetime, name: str = "report") -> str:
    return f"periodic:{name}:{slot.astimezone(UTC).isoformat()}"


def runner(dsn: str, app: App) -> Callable[[], list[int]]:
    """One scheduler pass over ``app``'s schedules on a connection of its own."""
    conn = connect(dsn, purpose="test-scheduler")
    schedules = list(app.schedules.values())
    specs = {s.name: app.task_spec(s.task, s.payload) for s in schedules}
    store = Store()
    return lambda: schedule_due(conn, store, schedules, specs)


def scheduler(dsn: str, app: App) -> Reaper:
    return Reaper(dsn, ReaperConfig(prune=False), app=app)


# --- one scheduler ----------------------------------------------------------------------------------


def test_a_schedule_seen_for_the_first_time_records_its_latest_slot_without_enqueuing(
    dsn: str, conn: Connection
) -> None:
    app = report_app("* * * * *")
    before = db_now(conn)
    assert runner(dsn, app)() == []
    after = db_now(conn)
    first_slot = last_slot(conn)
    assert first_slot is not None and first_slot.second == 0 and first_slot.microsecond == 0
    assert app.schedules["report"].latest_slot(before) <= first_slot <= app.schedules["report"].latest_slot(after)
    assert count(conn) == 0


def test_the_next_due_slot_is_enqueued_once_with_the_tasks_options(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 1))
    run = runner(dsn, app)
    assert run() == []  # first sighting
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(hours=1))  # the previous slot ran an hour ago

    (job_id,) = run()
    stored = row(conn, job_id)
    assert (stored["task"], stored["queue"], stored["priority"], stored["max_attempts"]) == ("report", "reports", 7, 2)
    assert stored["payload"] == {"kind": "daily"} and stored["state"] == "available"
    assert stored["idempotency_key"] == key(slot)
    assert stored["scheduled_at"] <= db_now(conn)
    assert last_slot(conn) == slot
    for _ in range(5):
        assert run() == []
    assert count(conn) == 1


def test_the_reaper_runs_the_scheduler(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 2))
    reaper = scheduler(dsn, app)
    try:
        assert reaper.run_once().scheduled == 0
        slot = recorded(conn)
        set_last_slot(conn, slot - dt.timedelta(hours=1))
        assert reaper.run_once().scheduled == 1
        assert reaper.run_once().scheduled == 0
    finally:
        reaper.close()
    assert conn.execute("SELECT idempotency_key FROM miniqueue_jobs").fetchall() == [(key(slot),)]


def test_a_slot_is_not_enqueued_again_after_its_job_was_pruned(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 1))
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(hours=1))
    assert len(run()) == 1
    Store().delete(conn, [job_id for (job_id,) in conn.execute("SELECT id FROM miniqueue_jobs")])  # and its key
    assert run() == []
    assert count(conn) == 0


def test_every_minute_schedule_enqueues_only_the_latest_missed_slot(dsn: str, conn: Connection) -> None:
    app = report_app("* * * * *")
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(minutes=10))  # ten slots missed
    enqueued = run()
    assert len(enqueued) == 1
    newest = last_slot(conn)
    assert newest is not None and newest >= slot
    assert row(conn, enqueued[0])["idempotency_key"] == key(newest)


def test_a_task_with_cron_is_scheduled_under_its_own_name(dsn: str, conn: Connection) -> None:
    app = App()
    app.task("tick", queue="ticks", cron="* * * * *")(noop)
    assert app.schedules["tick"] == Periodic("tick", "* * * * *", "tick")
    run = runner(dsn, app)
    run()
    slot = recorded(conn, "tick")
    set_last_slot(conn, slot - dt.timedelta(minutes=1), "tick")
    (job_id,) = run()
    stored = row(conn, job_id)
    assert (stored["task"], stored["queue"], stored["payload"]) == ("tick", "ticks", {})
    assert stored["idempotency_key"].startswith("periodic:tick:")


def test_two_schedules_of_one_task_get_their_own_slots(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 1))
    app.periodic(hourly_due(conn, 2), task="report", name="report-late", payload={"kind": "late"})
    run = runner(dsn, app)
    run()
    slots = {name: recorded(conn, name) for name in ("report", "report-late")}
    for name, slot in slots.items():
        set_last_slot(conn, slot - dt.timedelta(hours=1), name)
    assert len(run()) == 2
    found = conn.execute("SELECT idempotency_key, payload FROM miniqueue_jobs ORDER BY id").fetchall()
    assert sorted(found, key=lambda r: r[0]) == sorted(
        [
            (key(slots["report"], "report"), {"kind": "daily"}),
            (key(slots["report-late"], "report-late"), {"kind": "late"}),
        ],
        key=lambda r: r[0],
    )


def test_a_supervisors_reaper_enqueues_due_slots_and_its_workers_run_them(
    dsn: str, conn: Connection, tmp_path: Path, repo_root: Path
) -> None:
    slot = SUPERVISED_APP.schedules["tick"].latest_slot(db_now(conn))
    set_last_slot(conn, slot - dt.timedelta(minutes=1), "tick")
    args = ["--app", "tests.db.test_periodic:SUPERVISED_APP", "--workers", "1", *FAST]
    sup = Supervised(dsn, args, tmp_path, repo_root)
    try:
        sup.wait_ready(1)
        wait_until(lambda: count(conn, "task = 'tick' AND state = 'completed'"), timeout=10, what="the tick job")
    finally:
        sup.stop()
    # One job per slot; a second one only if the clock reached the next minute meanwhile.
    jobs = conn.execute("SELECT idempotency_key, queue FROM miniqueue_jobs ORDER BY id").fetchall()
    expected = [(key(slot + dt.timedelta(minutes=i), "tick"), "ticks") for i in range(len(jobs))]
    assert jobs in (expected, [(key(slot + dt.timedelta(minutes=1), "tick"), "ticks")])
    assert "periodic tick: enqueued job" in sup.output()


# --- catching up after downtime ---------------------------------------------------------------------


def test_catch_up_skip_skips_a_slot_older_than_grace_but_records_it(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 30), catch_up="skip", grace=300)
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(hours=3))  # down for three slots; the latest is 30 min late
    assert run() == []
    assert last_slot(conn) == slot
    assert run() == []
    assert count(conn) == 0


def test_catch_up_skip_still_runs_a_late_slot_within_grace(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 30), catch_up="skip", grace=3600)
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(hours=1))
    assert len(run()) == 1
    assert conn.execute("SELECT idempotency_key FROM miniqueue_jobs").fetchall() == [(key(slot),)]


def test_catch_up_latest_enqueues_the_latest_missed_slot_once(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 30), catch_up="latest")
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    set_last_slot(conn, slot - dt.timedelta(hours=5))  # down for five slots
    assert len(run()) == 1
    assert run() == []
    assert conn.execute("SELECT idempotency_key FROM miniqueue_jobs").fetchall() == [(key(slot),)]
    assert last_slot(conn) == slot


def test_catch_up_latest_does_not_run_a_schedule_seen_for_the_first_time(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 30), catch_up="latest")
    assert runner(dsn, app)() == []
    assert last_slot(conn) is not None and count(conn) == 0


# --- enabled and disabled ---------------------------------------------------------------------------


def test_a_disabled_schedule_enqueues_nothing_until_enabled(dsn: str, store: Store, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 1))
    run = runner(dsn, app)
    run()
    slot = recorded(conn)
    earlier = slot - dt.timedelta(hours=1)
    set_last_slot(conn, earlier)
    store.set_periodic_enabled(conn, "report", False)
    assert run() == []
    assert last_slot(conn) == earlier, "a disabled schedule's slot must not advance"
    assert count(conn) == 0
    store.set_periodic_enabled(conn, "report", True)
    assert len(run()) == 1
    assert last_slot(conn) == slot


def test_a_schedule_disabled_before_it_ever_ran_enqueues_nothing(dsn: str, store: Store, conn: Connection) -> None:
    app = report_app("* * * * *")
    store.set_periodic_enabled(conn, "report", False)
    run = runner(dsn, app)
    for _ in range(3):
        assert run() == []
    conn.execute("UPDATE miniqueue_periodic SET last_slot = last_slot - interval '1 hour'")
    assert run() == []
    assert count(conn) == 0
    assert store.periodic_state(conn)["report"][1] is False


# --- several schedulers at once ---------------------------------------------------------------------


def race(passes: list[Callable[[], Any]], repeat: int) -> list[Any]:
    """Run each pass ``repeat`` times on threads of their own, all released together."""
    barrier = threading.Barrier(len(passes))
    results: list[list[Any]] = [[] for _ in passes]

    def loop(i: int) -> None:
        barrier.wait(10)
        for _ in range(repeat):
            results[i].append(passes[i]())

    run_on_threads(loop, len(passes))
    return [result for per_thread in results for result in per_thread]


def test_two_schedulers_at_once_enqueue_each_slot_exactly_once(dsn: str, conn: Connection) -> None:
    """Each round deletes the jobs first, so the idempotency key cannot hide a double claim: the
    slot record alone must let exactly one scheduler through."""
    app = report_app(hourly_due(conn, 1))
    first, second = runner(dsn, app), runner(dsn, app)
    first()
    slot = recorded(conn)
    for round_ in range(25):
        conn.execute("TRUNCATE miniqueue_jobs, miniqueue_idempotency_keys")  # every job and its key
        set_last_slot(conn, slot - dt.timedelta(hours=1 + round_))
        enqueued = [ids for ids in race([first, second], repeat=3) if ids]
        assert len(enqueued) == 1, f"round {round_}: {enqueued}"
        assert len(enqueued[0]) == 1
        assert count(conn) == 1
        assert last_slot(conn) == slot


def test_two_schedulers_seeing_a_schedule_for_the_first_time_enqueue_nothing(dsn: str, conn: Connection) -> None:
    app = report_app("* * * * *")
    for _ in range(10):
        conn.execute("TRUNCATE miniqueue_periodic")
        assert race([runner(dsn, app), runner(dsn, app)], repeat=2) == [[], [], [], []]
        assert last_slot(conn) is not None
    assert count(conn) == 0


def test_two_reapers_with_the_same_app_enqueue_each_slot_exactly_once(dsn: str, conn: Connection) -> None:
    app = report_app(hourly_due(conn, 1))
    reapers = [scheduler(dsn, app), scheduler(dsn, app)]
    try:
        reapers[0].run_once()
        slot = recorded(conn)
        for round_ in range(10):
            set_last_slot(conn, slot - dt.timedelta(hours=1 + round_))
            conn.execute("TRUNCATE miniqueue_jobs, miniqueue_idempotency_keys")  # every job and its key
            results = race([r.run_once for r in reapers], repeat=5)
            assert sum(r.scheduled for r in results) == 1, f"round {round_}"
            assert count(conn) == 1
    finally:
        for reaper in reapers:
            reaper.close()


def test_many_schedulers_many_schedules_one_job_per_slot(dsn: str, conn: Connection) -> None:
    app = App()
    app.task("report")(noop)
    names = [f"report-{i}" for i in range(5)]
    for i, name in enumerate(names):
        app.periodic(hourly_due(conn, 1 + i), task="report", name=name, grace=3600)
    passes = [runner(dsn, app) for _ in range(4)]
    passes[0]()
    slots = {name: recorded(conn, name) for name in names}
    for name, slot in slots.items():
        set_last_slot(conn, slot - dt.timedelta(hours=2), name)
    results = race(passes, repeat=3)
    assert sum(len(ids) for ids in results) == len(names)
    found = sorted(k for (k,) in conn.execute("SELECT idempotency_key FROM miniqueue_jobs").fetchall())
    assert found == sorted(key(slot, name) for name, slot in slots.items())


# --- configuration errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("cron", ["61 * * * *", "every day", "* * *", "", "* * * * 8"])
def test_an_invalid_cron_is_a_config_error(cron: str) -> None:
    app = App()
    app.task("report")(noop)
    with pytest.raises(ConfigError, match=r"cron expression .* is invalid"):
        app.periodic(cron, task="report")
    with pytest.raises(ConfigError, match="cron expression"):
        app.task("other", cron=cron)(noop)
    assert app.schedules == {}


def test_an_invalid_catch_up_is_a_config_error() -> None:
    app = App()
    app.task("report")(noop)
    with pytest.raises(ConfigError, match="catch_up 'sometimes' is invalid"):
        app.periodic("* * * * *", task="report", catch_up="sometimes")  # type: ignore[arg-type]


def test_a_schedule_of_an_unknown_task_is_a_config_error(dsn: str) -> None:
    app = App()
    app.task("report")(noop)
    app.periodic("* * * * *", task="nope")
    with pytest.raises(ConfigError, match="task 'nope' is not registered"):
        Reaper(dsn, app=app)


def test_a_schedule_registered_twice_is_a_config_error() -> None:
    app = report_app("* * * * *")
    with pytest.raises(ConfigError, match="registered twice"):
        app.periodic("*/5 * * * *", task="report")


@pytest.mark.parametrize("grace", [-1.0, math.nan])
def test_a_negative_or_nan_grace_is_a_config_error(grace: float) -> None:
    app = App()
    app.task("report")(noop)
    with pytest.raises(ConfigError, match="grace"):
        app.periodic("* * * * *", task="report", grace=grace)


@pytest.mark.parametrize("payload", [{"x": math.nan}, {"x": object()}, {"x": "\u0000"}])
def test_a_payload_that_cannot_be_stored_is_rejected_when_the_schedule_is_registered(payload: Any) -> None:
    """Not at the first slot, where it would stop the reaper's every pass."""
    app = App()
    app.task("report")(noop)
    with pytest.raises(MiniqueueError, match="payload"):
        app.periodic("* * * * *", task="report", payload=payload)
