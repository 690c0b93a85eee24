"""Commands on sequence keys: ``sequences`` (list the blocked ones) and ``sequences release``."""

from __future__ import annotations

import click

from ..client.client import Client
from .database import client_command, database_option, open_client
from .errors import friendly_errors
from .output import to_json


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the blocked keys as a JSON array.")
@database_option
@click.pass_context
@friendly_errors
def sequences(ctx: click.Context, as_json: bool, database_url: str | None) -> None:
    """The sequence keys that a failed or dead job blocks, and which job (see
    docs/guides/keys.md): requeue, cancel or delete that job, or release the key."""
    if ctx.invoked_subcommand is not None:
        return
    with open_client(database_url) as client:
        blocked = client.blocked_sequences()
    if as_json:
        click.echo(to_json([b._asdict() for b in blocked]))
        return
    if not blocked:
        click.echo("no sequence key is blocked")
    for b in blocked:
        error = f": {b.last_error}" if b.last_error else ""
        click.echo(f"{b.key}  blocked by job {b.job_id} ({b.task}, {b.state}{error}); {b.waiting} waiting")


@sequences.command("release")
@click.argument("key")
@client_command
def release(key: str, client: Client) -> None:
    """Let sequence KEY go on past the failed or dead job that blocks it (which stays as it is)."""
    blocking, holder = client.release_sequence(key)
    after = "no job waited" if holder is None else f"job {holder} runs next"
    click.echo(f"sequence {key!r} released from job {blocking}: {after}")
