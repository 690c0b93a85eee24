"""Commands on fair share: ``keys`` (set, unset, list) and ``queues fair`` (see docs/guides/fairness.md)."""

from __future__ import annotations

import click

from ..client.client import Client
from ..core.fairness import KeyRule, KeyShare
from .database import client_command
from .output import to_json


@click.group()
def keys() -> None:
    """Rules for the keys of fair jobs: each key's limit on running jobs and its weight."""


@keys.command("set")
@click.argument("pattern")
@click.option("--limit", type=int, help="At most this many of a matching key's fair jobs run at once, on every host.")
@click.option("--weight", type=float, help="A matching key's jobs take this many turns for one of a key of weight 1.")
@click.option("--every-key", is_flag=True, help="PATTERN is '*' alone and means every key.")
@client_command
def set_rule(pattern: str, limit: int | None, weight: float | None, every_key: bool, client: Client) -> None:
    """Set the rule of the keys PATTERN matches ('*' matches any characters), replacing its rule.
    It holds from the next claim, for the jobs waiting too; a key takes each setting from the
    most specific rule that sets it (its own name, then the longest pattern)."""
    rule = client.set_key_rule(pattern, limit=limit, weight=weight, every_key=every_key)
    click.echo(f"keys {rule.pattern!r}: {_settings(rule)}")


@keys.command("unset")
@click.argument("pattern")
@client_command
def unset_rule(pattern: str, client: Client) -> None:
    """Remove the rule of PATTERN (the keys it matched take the other rules')."""
    removed = client.remove_key_rule(pattern)
    if not removed:
        raise click.ClickException(f"no rule has the pattern {pattern!r} (see `miniqueue keys list`)")
    click.echo(f"keys {pattern!r}: rule removed")


@keys.command("list")
@click.option("--queue", help="Only the keys of this queue.")
@click.option("--json", "as_json", is_flag=True, help='Print {"rules": [...], "keys": [...]} as JSON.')
@client_command
def list_keys(queue: str | None, as_json: bool, client: Client) -> None:
    """The rules, most specific first, then each fair key with jobs: its weight, limit, and its
    jobs waiting and running now."""
    rules = client.key_rules()
    shares = client.key_shares(queue)
    if as_json:
        click.echo(to_json({"rules": [r._asdict() for r in rules], "keys": [s._asdict() for s in shares]}))
        return
    for rule in rules:
        click.echo(f"rule {rule.pattern!r}: {_settings(rule)}")
    if not shares:
        click.echo("no fair key has jobs")
    for share in shares:
        click.echo(_share_line(share))


@click.command("fair")
@click.argument("name")
@click.option("--off", is_flag=True, help="Only jobs whose task or caller says so are fair again.")
@click.option(
    "--create", is_flag=True, help="Also accept a queue not seen yet (no job waiting or running, never paused)."
)
@client_command
def fair_queue(name: str, off: bool, create: bool, client: Client) -> None:
    """Make every job of queue NAME fair: jobs take turns by key (their concurrency key, or the
    fair_key they were given); the jobs waiting take theirs at once."""
    ranked = client.fair_queue(name, not off, create=create)
    if off:
        click.echo(f"queue {name}: only jobs whose task or caller says so are fair")
    else:
        click.echo(f"queue {name}: fair by key ({ranked} waiting job(s) took their turns)")


def _settings(rule: KeyRule) -> str:
    limit = "no limit" if rule.max_running is None else f"at most {rule.max_running} running"
    weight = "weight unset" if rule.weight is None else f"weight {rule.weight:g}"
    return f"{limit}, {weight}"


def _share_line(share: KeyShare) -> str:
    limit = "no limit" if share.max_running is None else f"at most {share.max_running} running"
    return (
        f"{share.queue:<20} {share.key or '(no key)':<32} weight {share.weight:<6g} {limit:<20} "
        f"{share.available} waiting, {share.running} running"
    )
