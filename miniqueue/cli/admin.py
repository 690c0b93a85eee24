"""Commands around the queue rather than on its jobs: ``migrate``, ``prune``, ``healthcheck``
and ``demo``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import click

from ..client.client import Client
from ..client.sharded import migrate_shards
from ..core.db import mask_dsn
from ..core.records import State
from ..store.migrate import latest_version, run_migrations
from ..supervise.healthcheck import probe_database, probe_url
from .database import current_schema, database_option, open_client, resolve_database
from .errors import friendly_errors
from .params import Duration, Seconds
from .shards import database_or_map_command, load_map


@click.command()
@database_or_map_command
def migrate(database_url: str | None, shards_source: str | None) -> None:
    """Create or upgrade the queue's tables (safe to run concurrently); with a shard map, on
    every database of the map, each then joining it (its ids carry its index from then on)."""
    if shards_source:
        for name, joined in migrate_shards(load_map(shards_source), schema=current_schema()).items():
            click.echo(f"{name}: migrated{', joined the shard map' if joined else ''}")
        return
    dsn = resolve_database(database_url)
    applied = run_migrations(dsn, current_schema())
    names = ", ".join(f"{m.version:03d}_{m.name}" for m in applied)
    click.echo(f"applied {len(applied)} migration(s){': ' + names if names else ''} to {mask_dsn(dsn)}")


@click.command()
@click.option("--older-than", type=Duration(), required=True, help="Only jobs finished longer ago (e.g. 7d).")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["completed", "cancelled", "failed", "dead", "expired"]),
    help="States to prune (repeatable; default: completed and cancelled).",
)
@database_option
@friendly_errors
def prune(older_than: float, states: tuple[str, ...], database_url: str | None) -> None:
    """Delete finished jobs older than --older-than (an explicit age is required)."""
    chosen = [State(s) for s in states] or [State.COMPLETED, State.CANCELLED]
    with open_client(database_url) as client:
        deleted = client.prune(chosen, older_than)
    click.echo(f"deleted {deleted} job(s) ({', '.join(s.value for s in chosen)}) finished over {older_than:g}s ago")


@click.command()
@click.option("--url", help="Probe this URL (e.g. http://127.0.0.1:9187/readyz) instead of the database.")
@click.option("--timeout", type=Seconds(0.1, 3600), default=5.0, show_default=True, help="Seconds.")
@database_option
@friendly_errors
def healthcheck(url: str | None, timeout: float, database_url: str | None) -> None:
    """Exit 0 if healthy, 1 if not (for exec probes): the supervisor's probe URL, or else the
    database's reachability and schema version."""
    if url:
        healthy, detail = probe_url(url, timeout)
    else:
        healthy, detail = probe_database(resolve_database(database_url), timeout, current_schema())
    click.echo(f"{'healthy' if healthy else 'unhealthy'}: {detail}")
    sys.exit(0 if healthy else 1)


@click.command()
@database_option
@friendly_errors
def demo(database_url: str | None) -> None:
    """Enqueue five jobs of different priorities and run them under a real supervisor with one
    worker: each prints a line as it is processed, highest priority first (FIFO within a priority).
    A database named by --database-url or DATABASE_URL is migrated first."""
    from .demo import DEMO_JOBS
    from .demo import app as demo_app

    dsn = resolve_database(database_url)
    if database_url:  # the embedded server's database was migrated as it started
        run_migrations(dsn, current_schema())
        click.echo(f"migrated {mask_dsn(dsn)} to schema version {latest_version()}")
    with Client(dsn, schema=current_schema()) as client:
        ids = []
        for name, _priority in DEMO_JOBS:
            ids.append(demo_app.enqueue(client, name).id)
            click.echo(f"enqueued {name} (priority {_priority})")
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "miniqueue.cli",
                "supervise",
                "--schema",
                current_schema(),
                "--app",
                "miniqueue.cli.demo:app",
                "--workers",
                "1",
                "--log-level",
                "WARNING",
                "--poll-interval",
                "0.2",
            ],
            env={**os.environ, "DATABASE_URL": dsn},
        )
        try:
            deadline = time.monotonic() + 60
            while any(client.get(i).state != State.COMPLETED for i in ids):
                if supervisor.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException("the demo did not finish: see the supervisor's output above")
                time.sleep(0.1)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
    click.echo("all 5 demo jobs completed, in priority order (FIFO within a priority)")
