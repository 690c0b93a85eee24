"""Commands on signals: ``signal`` (send one) and ``signals`` (the ones kept for no job yet)."""

from __future__ import annotations

from typing import Any

import click

from ..client.client import Client
from .database import client_command
from .output import to_json
from .params import JsonText


@click.command()
@click.argument("key")
@click.option("--data", type=JsonText(), default="null", show_default=True, help="The signal's data, as JSON.")
@client_command
def signal(key: str, data: Any, client: Client) -> None:
    """Send signal KEY: it resumes the oldest job waiting for it, or is kept until one waits
    (see docs/guides/durable.md)."""
    job_id = client.signal(key, data)
    if job_id is None:
        click.echo(f"signal {key!r} kept: no job waits for it yet")
    else:
        click.echo(f"signal {key!r} resumed job {job_id}")


@click.command()
@click.option("--key", help="Only this key.")
@click.option("--json", "as_json", is_flag=True, help="Print them as a JSON array.")
@client_command
def signals(key: str | None, as_json: bool, client: Client) -> None:
    """The signals kept for no job yet, per key, oldest first."""
    kept = client.kept_signals(key)
    if as_json:
        click.echo(to_json([{"key": k, "count": n, "oldest": oldest} for k, n, oldest in kept]))
        return
    if not kept:
        click.echo("no signal is kept")
    for k, n, oldest in kept:
        click.echo(f"{k}  {n} kept, the oldest sent {oldest:%Y-%m-%d %H:%M:%S%z}")
