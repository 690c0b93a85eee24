"""``periodic``: list the schedules the database holds (and an app's); add, change and delete
those created at run time; enable and disable any."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from ..client.client import Client
from ..client.schedules import UNCHANGED, ListedSchedule
from ..core.errors import InvalidInput
from ..core.records import Schedule
from ..core.validation import parse_json
from ..tasks.loading import load_app
from .database import client_command, database_option, open_client
from .errors import friendly_errors
from .output import to_json
from .params import JsonText, Seconds


@click.group()
def periodic() -> None:
    """Periodic schedules."""


@periodic.command("list")
@click.option(
    "--app",
    "app_ref",
    help="An app (module:attribute): list its schedules in full, then the runtime ones.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the schedules as a JSON array, one object each.")
@database_option
@friendly_errors
def list_periodic(app_ref: str | None, as_json: bool, database_url: str | None) -> None:
    """Each schedule the database holds, by name: those created at run time (runtime) and those
    of the code a scheduler has run or an operator switched (code; their cron, zone and task are
    in the code: '-'). With --app: the app's schedules, then the runtime ones. Each with cron,
    time zone, task, enabled, last and next slot (in its zone)."""
    app = load_app(app_ref) if app_ref else None
    with open_client(database_url) as client:
        listed = client.schedules.overview(app.schedules if app else None)
        now = client.now()
    # With the app, as its reapers see it: a name the database alone holds is another app's.
    rows = [_listed(row, now) for row in listed if app is None or row.schedule is not None]
    if as_json:
        click.echo(to_json(rows))
        return
    for row in rows:
        click.echo(
            f"{row['name']:<24} {row['cron'] or '-':<16} {row['timezone'] or '-':<16} {row['kind']:<7} "
            f"task {row['task'] or '-':<20} {'enabled ' if row['enabled'] else 'disabled'} "
            f"last {row['last_slot'] or '-'}  next {row['next_slot'] or '-'}"
        )


def _listed(row: ListedSchedule, now: dt.datetime) -> dict[str, Any]:
    """One schedule as listed: its slots on its zone's clock (UTC where its zone is not known here)."""
    schedule = row.schedule
    zone = schedule.zone if schedule else dt.timezone.utc
    return {
        "name": row.name,
        "kind": "runtime" if row.runtime else "code",
        "cron": schedule.cron if schedule else None,
        "timezone": schedule.timezone if schedule else None,
        "task": schedule.task if schedule else None,
        "payload": schedule.payload if schedule else None,
        "enabled": row.enabled,
        "last_slot": row.last_slot.astimezone(zone) if row.last_slot else None,
        "next_slot": schedule.next_slot(now).astimezone(zone) if schedule else None,
    }


def _show(schedule: Schedule, as_json: bool, done: str) -> None:
    if as_json:
        click.echo(to_json(schedule._asdict()))
    else:
        click.echo(f"schedule {schedule.name} {done}: {schedule.cron} ({schedule.timezone}), task {schedule.task}")


json_option = click.option("--json", "as_json", is_flag=True, help="Print the schedule as a JSON object.")


@periodic.command("add")
@click.argument("name")
@click.argument("cron")
@click.option("--task", required=True, help="The task of the jobs it enqueues.")
@click.option("--payload", type=JsonText(), default=None, help="The jobs' payload, as JSON.  [default: none]")
@click.option("--timezone", default="UTC", show_default=True, help="The tz database zone whose clock CRON is read on.")
@click.option(
    "--catch-up",
    type=click.Choice(["skip", "latest"]),
    default="skip",
    show_default=True,
    help="A slot missed longer than --grace: skip it, or run the latest one late.",
)
@click.option(
    "--grace",
    type=Seconds(min=0),
    default=300.0,
    show_default=True,
    help="Seconds a slot may run late and still run (with --catch-up skip).",
)
@click.option("--disabled", is_flag=True, help="Create it disabled (enable it later).")
@json_option
@client_command
def add_periodic(
    name: str,
    cron: str,
    task: str,
    payload: Any,
    timezone: str,
    catch_up: str,
    grace: float,
    disabled: bool,
    as_json: bool,
    client: Client,
) -> None:
    """Create schedule NAME at run time: a job of --task at each slot of CRON, from the next one.

    Every reaper of the database schedules it from its next pass. A name a schedule of the code
    already has is refused."""
    made = client.schedules.create(
        name,
        cron,
        task=task,
        payload=payload,
        timezone=timezone,
        catch_up=catch_up,
        grace=grace,
        enabled=not disabled,
    )
    _show(made, as_json, "created")


@periodic.command("change")
@click.argument("name")
@click.option("--cron", default=None, help="A new cron expression.")
@click.option("--payload", default=None, help="A new payload, as JSON (null: none).")
@click.option("--timezone", default=None, help="A new time zone for the cron.")
@click.option("--enable/--disable", "enabled", default=None, help="Enable or disable it.")
@json_option
@database_option
@friendly_errors
def change_periodic(
    name: str,
    cron: str | None,
    payload: str | None,
    timezone: str | None,
    enabled: bool | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Change schedule NAME, created at run time; the reapers follow from their next pass."""
    given = UNCHANGED if payload is None else _payload(payload)
    with open_client(database_url) as client:
        changed = client.schedules.change(name, cron=cron, payload=given, timezone=timezone, enabled=enabled)
    _show(changed, as_json, "changed")


def _payload(text: str) -> Any:
    """``--payload`` of ``change``, read here: ``null`` is a payload (none), not the option left out."""
    try:
        return parse_json(text)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="'--payload'") from None


@periodic.command("delete")
@click.argument("name")
@client_command
def delete_periodic(name: str, client: Client) -> None:
    """Delete schedule NAME, created at run time: it enqueues nothing more (its jobs stay)."""
    client.schedules.delete(name)
    click.echo(f"schedule {name} deleted")


schedule_app_option = click.option(
    "--app",
    "app_ref",
    help="The app that defines the schedule (module:attribute): needed for one no scheduler has run yet.",
)


def _switch_command(verb: str, enabled: bool, doc: str) -> click.Command:
    """``periodic enable`` or ``periodic disable``: one command, but for the verb."""

    @periodic.command(verb, help=doc)
    @click.argument("name")
    @schedule_app_option
    @database_option
    @friendly_errors
    def switch(name: str, app_ref: str | None, database_url: str | None) -> None:
        app = load_app(app_ref) if app_ref else None
        with open_client(database_url) as client:
            (client.enable_schedule if enabled else client.disable_schedule)(name, app=app)
        click.echo(f"schedule {name} {verb}d")

    return switch


enable_periodic = _switch_command(
    "enable", True, "Enable schedule NAME (a schedule a scheduler has run, or one of --app's)."
)
disable_periodic = _switch_command(
    "disable", False, "Disable schedule NAME (its slots are skipped until enabled again)."
)
