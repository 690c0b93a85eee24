"""``periodic``: list the schedules of an app, enable and disable them."""

from __future__ import annotations

import click

from ..tasks.app import load_app
from .database import database_option, open_client
from .errors import friendly_errors


@click.group()
def periodic() -> None:
    """Periodic schedules."""


@periodic.command("list")
@click.option("--app", "app_ref", required=True, help="The app whose schedules to list, as module:attribute.")
@database_option
@friendly_errors
def list_periodic(app_ref: str, database_url: str | None) -> None:
    """Each schedule of the app: cron, task, enabled, last and next slot."""
    app = load_app(app_ref)
    with open_client(database_url) as client:
        state = client.periodic_state()
        now = client.now()
    for name, schedule in sorted(app.schedules.items()):
        last, enabled = state.get(name, (None, True))
        click.echo(
            f"{name:<24} {schedule.cron:<16} task {schedule.task:<20} {'enabled ' if enabled else 'disabled'} "
            f"last {last or '-'}  next {schedule.next_slot(now)}"
        )


schedule_app_option = click.option(
    "--app",
    "app_ref",
    help="The app that defines the schedule (module:attribute): needed for one no scheduler has run yet.",
)


@periodic.command("enable")
@click.argument("name")
@schedule_app_option
@database_option
@friendly_errors
def enable_periodic(name: str, app_ref: str | None, database_url: str | None) -> None:
    """Enable schedule NAME (a schedule a scheduler has run, or one of --app's)."""
    app = load_app(app_ref) if app_ref else None
    with open_client(database_url) as client:
        client.enable_schedule(name, app=app)
    click.echo(f"schedule {name} enabled")


@periodic.command("disable")
@click.argument("name")
@schedule_app_option
@database_option
@friendly_errors
def disable_periodic(name: str, app_ref: str | None, database_url: str | None) -> None:
    """Disable schedule NAME (its slots are skipped until enabled again)."""
    app = load_app(app_ref) if app_ref else None
    with open_client(database_url) as client:
        client.disable_schedule(name, app=app)
    click.echo(f"schedule {name} disabled")
