"""``miniqueue doctor``: the database's health for the queue, and whether it needs a human."""

from __future__ import annotations

import sys

import click

from ..client.client import Client
from ..core.health import HORIZON_WARN_SECONDS, diagnose
from .database import client_command
from .output import to_json
from .params import Seconds


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON object.")
@click.option(
    "--horizon-seconds",
    type=Seconds(0.1, 86400),
    default=HORIZON_WARN_SECONDS,
    show_default=True,
    help="Report a snapshot held longer than this.",
)
@client_command
def doctor(as_json: bool, horizon_seconds: float, client: Client) -> None:
    """What holds the MVCC horizon back (a long or idle transaction, a prepared transaction, a
    replication slot, a standby's feedback), the jobs table's dead rows and sizes, autovacuum,
    connection headroom, the schema's version and this host's clock. Exit 0 when all is well, 1
    when something needs a human (see docs/operations/health.md)."""
    reading = client.health()
    checks = diagnose(reading, horizon_seconds=horizon_seconds)
    healthy = all(check.ok for check in checks)
    if as_json:
        holders = [h._asdict() for h in reading.horizon]
        partitions = [p._asdict() for p in reading.history]
        checks_json = [c._asdict() for c in checks]
        click.echo(to_json({"healthy": healthy, "checks": checks_json, "horizon": holders, "history": partitions}))
    else:
        for check in checks:
            click.echo(f"{'ok  ' if check.ok else 'FAIL'}  {check.name:<12} {check.detail}")
    sys.exit(0 if healthy else 1)
