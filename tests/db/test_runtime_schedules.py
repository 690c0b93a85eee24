"""Periodic schedules created, changed and deleted at run time, on a real database.

Slots are driven by an injected ``now`` (as tests/db/test_timezones.py does), passed to two real
Reapers on connections of their own. A schedule's first slot is the first after its creation
(by the database clock), so every ``now`` here is after the test's start.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from miniqueue import App, AsyncClient, Client, InvalidInput, Reaper, ReaperConfig
from miniqueue.cli import main
from miniqueue.core.db import Connection
from miniqueue.tasks.job import Job
from miniqueue.web import create_app

from ..helpers import db_now
from .test_web import AUDIT, audit_lines, on_localhost, post

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
HOUR = dt.timedelta(hours=1)


@pytest.fixture(autouse=True)
def no_schedules(conn: Connection) -> Iterator[None]:
    """No schedule before or after (the suite's cleaning predates the table)."""
    conn.execute("TRUNCATE miniqueue_schedules, miniqueue_periodic")
    yield
    conn.execute("TRUNCATE miniqueue_schedules, miniqueue_periodic")


def noop(job: Job) -> None:
    """A handler; nothing runs these jobs."""


def reports_app() -> App:
    """An app with a ``report`` task (queue reports, priority 7) and a code schedule ``nightly``."""
    app = App()
    app.task("report", queue="reports", priority=7)(noop)
    app.periodic("0 3 * * *", task="report", name="nightly")
    return app


def next_hour(conn: Connection) -> dt.datetime:
    """The start of the hour after the database clock's."""
    return db_now(conn).replace(minute=0, second=0, microsecond=0) + HOUR


def reapers(dsn: str, app: App | None = None, count: int = 2, **config: Any) -> list[Reaper]:
    return [Reaper(dsn, ReaperConfig(**config), app=app) for _ in range(count)]


def passes(fleet: list[Reaper], start: dt.datetime, end: dt.datetime, step: dt.timedelta = 5 * MINUTE) -> list[int]:
    """Every reaper's pass at each ``now`` from ``start`` to ``end``: the jobs enqueued."""
    enqueued: list[int] = []
    now = start
    while now <= end:
        for reaper in fleet:
            enqueued += reaper.schedule_periodic(now)
        now += step
    return enqueued


def slots(conn: Connection, name: str) -> list[dt.datetime]:
    """The slots of the jobs schedule ``name`` enqueued, from their idempotency keys."""
    keys = conn.execute(
        "SELECT idempotency_key FROM miniqueue_jobs WHERE idempotency_key LIKE %s ORDER BY id", [f"periodic:{name}:%"]
    ).fetchall()
    return [dt.datetime.fromisoformat(key.removeprefix(f"periodic:{name}:")) for (key,) in keys]


def every(step: dt.timedelta, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    return [start + i * step for i in range(int((end - start) / step) + 1)]


def close(fleet: list[Reaper]) -> None:
    for reaper in fleet:
        reaper.close()


# -- the client ---------------------------------------------------------------------------------------


def test_create_list_get_change_and_delete(client: Client) -> None:
    made = client.schedules.create(
        "digest", "*/15 * * * *", task="report", payload={"kind": "short"}, timezone="Europe/Berlin", grace=60
    )
    assert (made.name, made.cron, made.task, made.payload, made.timezone) == (
        "digest",
        "*/15 * * * *",
        "report",
        {"kind": "short"},
        "Europe/Berlin",
    )
    assert (made.catch_up, made.grace, made.enabled) == ("skip", 60.0, True)
    assert made.last_slot is not None  # from its creation: slots before it never run
    assert client.schedules.list() == [made] and client.schedules.get("digest") == made
    assert client.schedules.get("nope") is None

    changed = client.schedules.change("digest", cron="0 * * * *", payload=None, enabled=False)
    assert (changed.cron, changed.payload, changed.timezone, changed.enabled) == (
        "0 * * * *",
        None,
        "Europe/Berlin",
        False,
    )
    assert changed.updated_at > made.updated_at and changed.last_slot == made.last_slot
    assert client.schedules.change("digest", timezone="UTC").payload is None  # the payload left as it was
    assert client.periodic_state()["digest"][1] is False  # enabled where every schedule's is

    client.schedules.delete("digest")
    assert client.schedules.list() == [] and "digest" not in client.periodic_state()
    client.schedules.create("digest", "0 * * * *", task="report")  # its name free again


def test_the_async_client_does_the_same(dsn: str) -> None:
    async def scenario() -> list[Any]:
        async with AsyncClient(dsn) as client:
            await client.schedules.create("tick", "* * * * *", task="report", catch_up="latest")
            changed = await client.schedules.change("tick", cron="*/5 * * * *", payload=[1, 2])
            listed = await client.schedules.list()
            got = await client.schedules.get("tick")
            await client.schedules.delete("tick")
            return [
                changed.cron,
                changed.payload,
                changed.catch_up,
                listed == [changed],
                got,
                await client.schedules.list(),
            ]

    cron, payload, catch_up, same, got, after = asyncio.run(scenario())
    assert (cron, payload, catch_up, same, after) == ("*/5 * * * *", [1, 2], "latest", True, [])
    assert got is not None and got.name == "tick"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "bad name!"}, r"schedule name 'bad name!' is invalid"),
        ({"cron": "61 * * * *"}, r"cron expression '61 \* \* \* \*' of schedule 'digest' is invalid"),
        ({"task": ""}, r"task name '' is invalid"),
        ({"timezone": "Europe/Berln"}, r"timezone 'Europe/Berln' of schedule 'digest' is unknown"),
        ({"catch_up": "all"}, r"catch_up 'all' is invalid: use 'latest' or 'skip'"),
        ({"grace": -1}, r"grace -1.0 of schedule 'digest' is invalid: use seconds >= 0"),
        ({"grace": math.inf}, r"grace inf of schedule 'digest' is invalid"),
        ({"payload": {"x": math.nan}}, r"schedule 'digest': payload contains a float nan"),
        ({"payload": "\u0000"}, r"schedule 'digest': payload"),
    ],
)
def test_bad_options_are_invalid_input_naming_the_value_and_store_nothing(
    client: Client, options: dict[str, Any], message: str
) -> None:
    given: dict[str, Any] = {"name": "digest", "cron": "0 * * * *", "task": "report"} | options
    with pytest.raises(InvalidInput, match=message):
        client.schedules.create(given.pop("name"), given.pop("cron"), **given)
    assert client.schedules.list() == [] and client.periodic_state() == {}


def test_a_bad_change_stores_nothing(client: Client) -> None:
    made = client.schedules.create("digest", "0 * * * *", task="report", payload={"a": 1})
    with pytest.raises(InvalidInput, match=r"cron expression 'every hour' of schedule 'digest' is invalid"):
        client.schedules.change("digest", cron="every hour", enabled=False)
    with pytest.raises(InvalidInput, match=r"timezone 'Mars/Olympus' of schedule 'digest' is unknown"):
        client.schedules.change("digest", timezone="Mars/Olympus")
    with pytest.raises(InvalidInput, match=r"nothing to change in schedule 'digest'"):
        client.schedules.change("digest")
    assert client.schedules.get("digest") == made


def test_names_are_one_namespace_with_the_codes_schedules(dsn: str, client: Client) -> None:
    fleet = reapers(dsn, reports_app(), count=1)
    fleet[0].schedule_periodic()  # the code's schedule "nightly" is now known to the database
    with pytest.raises(InvalidInput, match=r"schedule 'nightly' is a schedule of the code .* a name of its own"):
        client.schedules.create("nightly", "0 4 * * *", task="report")
    client.schedules.create("digest", "0 * * * *", task="report")
    with pytest.raises(InvalidInput, match=r"schedule 'digest' exists already: change it, or delete it first"):
        client.schedules.create("digest", "0 2 * * *", task="report")
    for call in (
        lambda: client.schedules.delete("nightly"),
        lambda: client.schedules.change("nightly", cron="* * * * *"),
    ):
        with pytest.raises(InvalidInput, match=r"no schedule 'nightly' was created at run time"):
            call()
    assert [s.name for s in client.schedules.list()] == ["digest"] and "nightly" in client.periodic_state()
    close(fleet)


# -- the reapers --------------------------------------------------------------------------------------


def test_two_reapers_over_many_passes_enqueue_each_slot_once_with_the_tasks_options(
    dsn: str, conn: Connection, client: Client
) -> None:
    client.schedules.create("digest", "*/15 * * * *", task="report", payload={"kind": "short"})
    fleet = reapers(dsn, reports_app())
    start = next_hour(conn)
    enqueued = passes(fleet, start, start + 2 * HOUR)
    assert len(enqueued) == len(set(enqueued))
    # The app's code schedule (03:00 UTC) may fall in these two hours too: count the digest's alone.
    assert slots(conn, "digest") == every(15 * MINUTE, start, start + 2 * HOUR)
    jobs = conn.execute(
        "SELECT DISTINCT queue, priority, task, payload FROM miniqueue_jobs WHERE idempotency_key LIKE %s",
        ["periodic:digest:%"],
    ).fetchall()
    assert jobs == [("reports", 7, "report", {"kind": "short"})]
    close(fleet)


def test_a_reaper_without_the_task_uses_its_published_declaration_or_the_defaults(
    dsn: str, conn: Connection, client: Client
) -> None:
    client.declare(reports_app())
    client.schedules.create("declared", "0 * * * *", task="report")
    client.schedules.create("unknown", "0 * * * *", task="elsewhere")
    fleet = reapers(dsn, None, count=1)
    start = next_hour(conn)
    passes(fleet, start, start)
    rows = conn.execute("SELECT task, queue, priority FROM miniqueue_jobs ORDER BY task").fetchall()
    assert rows == [("elsewhere", "default", 0), ("report", "reports", 7)]
    close(fleet)


def test_a_change_takes_effect_at_the_next_pass_and_enqueues_no_slot_again(
    dsn: str, conn: Connection, client: Client
) -> None:
    client.schedules.create("digest", "*/15 * * * *", task="report")
    fleet = reapers(dsn, reports_app())
    start = next_hour(conn)
    passes(fleet, start, start + 30 * MINUTE)
    client.schedules.change("digest", cron="0 * * * *", payload={"v": 2})
    # The latest hourly slot is the one the old cron enqueued at start: not enqueued again.
    assert passes(fleet, start + 30 * MINUTE, start + 55 * MINUTE) == []
    passes(fleet, start + HOUR, start + 2 * HOUR)
    assert slots(conn, "digest") == [*every(15 * MINUTE, start, start + 30 * MINUTE), start + HOUR, start + 2 * HOUR]
    payloads = conn.execute(
        "SELECT payload FROM miniqueue_jobs WHERE idempotency_key LIKE %s ORDER BY id", ["periodic:digest:%"]
    ).fetchall()
    assert [p for (p,) in payloads] == [{}, {}, {}, {"v": 2}, {"v": 2}]
    close(fleet)


def test_a_reaper_that_read_the_old_definition_claims_nothing(dsn: str, conn: Connection, client: Client) -> None:
    made = client.schedules.create("digest", "*/15 * * * *", task="report")
    client.schedules.change("digest", cron="*/5 * * * *")
    fleet = reapers(dsn, count=1)
    store, reaper_conn = fleet[0].store, conn
    assert not store.claim_stored_slot(reaper_conn, "digest", next_hour(conn), made.updated_at)
    current = client.schedules.get("digest")
    assert current is not None and store.claim_stored_slot(reaper_conn, "digest", next_hour(conn), current.updated_at)
    close(fleet)


def test_disabled_and_deleted_schedules_enqueue_nothing_from_the_next_pass(
    dsn: str, conn: Connection, client: Client
) -> None:
    client.schedules.create("digest", "0 * * * *", task="report")
    client.schedules.create("paused", "0 * * * *", task="report", enabled=False)
    fleet = reapers(dsn, reports_app())
    start = next_hour(conn)
    passes(fleet, start, start)
    client.schedules.delete("digest")
    client.schedules.change("paused", enabled=True)
    passes(fleet, start + HOUR, start + 2 * HOUR)
    assert slots(conn, "digest") == [start] and slots(conn, "paused") == [start + HOUR, start + 2 * HOUR]
    close(fleet)


def test_a_code_schedule_of_the_same_name_wins(dsn: str, conn: Connection, client: Client) -> None:
    client.schedules.create("nightly", "*/15 * * * *", task="report")  # before the code had it
    fleet = reapers(dsn, reports_app(), count=1)
    start = next_hour(conn)
    passes(fleet, start, start + HOUR)
    # Only the code's slots, at 03:00 UTC: one if the hour passed through holds it (the test ran
    # between 02:00 and 03:00), none otherwise; never the quarter hours of the one made at run time.
    utc = [t.astimezone(dt.timezone.utc) for t in every(5 * MINUTE, start, start + HOUR)]
    code_slots = [t for t in utc if (t.hour, t.minute) == (3, 0)]
    assert slots(conn, "nightly") == code_slots
    close(fleet)


def test_over_a_shard_map_a_reaper_schedules_only_the_queues_it_is_first_for(
    dsn: str, conn: Connection, client: Client
) -> None:
    client.schedules.create("digest", "0 * * * *", task="report")
    elsewhere = reapers(dsn, reports_app(), count=1, schedules_here=lambda queue: queue != "reports")
    start = next_hour(conn)
    assert passes(elsewhere, start, start + HOUR) == []
    here = reapers(dsn, reports_app(), count=1, schedules_here=lambda queue: queue == "reports")
    passes(here, start + HOUR, start + HOUR)
    assert slots(conn, "digest") == [start + HOUR]
    close(elsewhere + here)


def test_run_once_schedules_runtime_schedules_by_the_database_clock(dsn: str, conn: Connection, client: Client) -> None:
    client.schedules.create("tick", "* * * * *", task="report")
    conn.execute("UPDATE miniqueue_periodic SET last_slot = last_slot - interval '2 minutes'")
    fleet = reapers(dsn, reports_app())
    assert sum(reaper.run_once().scheduled for reaper in fleet) == 1
    close(fleet)


def test_a_schedule_in_a_time_zone_keeps_its_wall_clock_across_a_change(
    dsn: str, conn: Connection, client: Client
) -> None:
    # Berlin springs forward on 28 March 2027 from 02:00 to 03:00: the 02:30 appointment runs at 03:00.
    client.schedules.create("berlin", "30 2 * * *", task="report", timezone="Europe/Berlin")
    fleet = reapers(dsn, reports_app())
    start = dt.datetime(2027, 3, 27, 0, 0, tzinfo=UTC)
    passes(fleet, start, start + 3 * 24 * HOUR, step=10 * MINUTE)
    local = [slot.astimezone(dt.timezone(dt.timedelta(0))).isoformat() for slot in slots(conn, "berlin")]
    assert local == ["2027-03-27T01:30:00+00:00", "2027-03-28T01:00:00+00:00", "2027-03-29T00:30:00+00:00"]
    close(fleet)


def test_the_stored_payload_is_the_jobs(client: Client, conn: Connection) -> None:
    client.schedules.create("digest", "0 * * * *", task="report", payload={"nested": [1, "two", None]})
    stored = conn.execute("SELECT payload::text FROM miniqueue_schedules").fetchone()
    assert stored is not None and json.loads(stored[0]) == {"nested": [1, "two", None]}


# -- the command line ---------------------------------------------------------------------------------

#: For `miniqueue periodic list --app tests.db.test_runtime_schedules:CLI_APP`.
CLI_APP = reports_app()
CLI_APP_PATH = f"{__name__}:CLI_APP"


def cli(dsn: str, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--database-url", dsn], env={"DATABASE_URL": None})


def test_the_cli_adds_changes_lists_and_deletes(dsn: str, client: Client) -> None:
    added = cli(dsn, "periodic", "add", "digest", "*/15 * * * *", "--task", "report", "--payload", '{"a": 1}',
                "--timezone", "Europe/Berlin", "--json")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout) | {"created_at": None, "updated_at": None, "last_slot": None} == {
        "name": "digest", "cron": "*/15 * * * *", "task": "report", "payload": {"a": 1}, "timezone": "Europe/Berlin",
        "catch_up": "skip", "grace": 300.0, "enabled": True, "last_slot": None, "created_at": None, "updated_at": None,
    }  # fmt: skip
    changed = cli(dsn, "periodic", "change", "digest", "--cron", "0 * * * *", "--payload", "null", "--disable")
    assert (
        changed.exit_code == 0 and changed.stdout == "schedule digest changed: 0 * * * * (Europe/Berlin), task report\n"
    )
    got = client.schedules.get("digest")
    assert got is not None and (got.cron, got.payload, got.enabled) == ("0 * * * *", None, False)

    listed = cli(dsn, "periodic", "list", "--app", CLI_APP_PATH)
    nightly, digest = listed.stdout.splitlines()
    assert nightly.split()[:8] == ["nightly", "0", "3", "*", "*", "*", "UTC", "code"]
    assert digest.split()[:8] == ["digest", "0", "*", "*", "*", "*", "Europe/Berlin", "runtime"]
    assert "disabled" in digest and "task report" in digest
    as_json = json.loads(cli(dsn, "periodic", "list", "--app", CLI_APP_PATH, "--json").stdout)
    assert [(s["name"], s["kind"], s["enabled"]) for s in as_json] == [
        ("nightly", "code", True),
        ("digest", "runtime", False),
    ]

    assert cli(dsn, "periodic", "enable", "digest").exit_code == 0  # switched as any schedule is
    deleted = cli(dsn, "periodic", "delete", "digest")
    assert deleted.exit_code == 0 and deleted.stdout == "schedule digest deleted\n"
    assert client.schedules.list() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["add", "digest", "61 * * * *", "--task", "report"],
            "cron expression '61 * * * *' of schedule 'digest' is invalid",
        ),
        (["add", "digest", "0 * * * *", "--task", "report", "--timezone", "Nowhere/Else"], "timezone 'Nowhere/Else'"),
        (["add", "digest", "0 * * * *", "--task", "report", "--payload", "{"], "Invalid value for '--payload'"),
        (["change", "digest", "--cron", "0 * * * *"], "no schedule 'digest' was created at run time"),
        (["change", "digest", "--payload", "{nope"], "Invalid value for '--payload': not valid JSON"),
        (["delete", "digest"], "no schedule 'digest' was created at run time"),
    ],
)
def test_the_cli_says_what_is_wrong_in_one_line_exits_2_and_stores_nothing(
    dsn: str, client: Client, args: list[str], message: str
) -> None:
    result = cli(dsn, "periodic", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and client.schedules.list() == []


# -- the dashboard ------------------------------------------------------------------------------------


def test_the_dashboard_lists_runtime_schedules_beside_the_codes_and_switches_and_deletes_them(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    client.schedules.create("digest", "*/15 * * * *", task="report", timezone="Europe/Berlin")
    with on_localhost(create_app(client, app=reports_app())) as web:
        page = web.get("/periodic").text
        assert 'title="defined by the app\'s code">code</span>' in page and ">runtime</span>" in page
        assert "*/15 * * * *" in page and "Europe/Berlin" in page
        assert 'href="/periodic/digest/delete"' in page and 'href="/periodic/nightly/delete"' not in page
        assert post(web, "/periodic/digest/disable").headers["location"] == "/periodic?done=disable"
        assert client.schedules.list()[0].enabled is False

        confirm = web.get("/periodic/digest/delete").text
        assert "Delete schedule digest?" in confirm and 'action="/periodic/digest/delete"' in confirm
        assert len(client.schedules.list()) == 1  # looking at the confirmation changes nothing
        response = post(web, "/periodic/digest/delete")
        assert response.headers["location"] == "/periodic?done=delete-schedule"
        assert client.schedules.list() == [] and "Deleted the schedule" in web.get(response.headers["location"]).text
        assert web.get("/periodic/digest/delete").status_code == 404
        assert post(web, "/periodic/nightly/delete").status_code == 400  # the code's is not deleted here
    assert audit_lines(caplog) == [
        "user=anonymous@testclient action=disable-schedule schedule=digest count=1 outcome=ok",
        "user=anonymous@testclient action=delete-schedule schedule=digest count=1 outcome=ok",
    ]


def test_without_an_app_the_dashboard_shows_runtime_schedules_in_full(client: Client) -> None:
    client.schedules.create("digest", "0 * * * *", task="report")
    with on_localhost(create_app(client)) as web:
        page = web.get("/periodic").text
        assert ">runtime</span>" in page and "0 * * * *" in page and "Run now" not in page


def test_a_delete_needs_the_csrf_token_and_a_writable_dashboard(client: Client) -> None:
    client.schedules.create("digest", "0 * * * *", task="report")
    with on_localhost(create_app(client)) as web:
        web.get("/periodic")
        forged = web.post("/periodic/digest/delete", data={"csrf_token": "forged"}, follow_redirects=False)
        assert forged.status_code == 403
    with on_localhost(create_app(client, read_only=True)) as web:
        assert "/periodic/digest/delete" not in web.get("/periodic").text
        assert 'method="post"' not in web.get("/periodic/digest/delete").text
        assert post(web, "/periodic/digest/delete").status_code == 403
    assert [s.name for s in client.schedules.list()] == ["digest"]
