"""Commands on a shard map (see docs/guides/shards.md): ``shards check``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..client.sharded import ShardedClient
from ..core.db import mask_dsn
from ..core.errors import ConfigError, DatabaseUnavailable
from ..core.records import State
from ..core.shard_map import SHARDS_ENV, ShardMap
from .database import current_schema, database_option
from .errors import friendly_errors
from .output import to_json

#: The ``--shards`` option of the commands that take a map.
shards_option = click.option(
    "--shards",
    "shards_source",
    envvar=SHARDS_ENV,
    help=f"The shard map: a JSON file or the JSON itself (default: ${SHARDS_ENV}).",
)

F = TypeVar("F", bound=Callable[..., Any])


def database_or_map_command(command: F) -> F:
    """``--database-url``, ``--schema`` and ``--shards`` (one database, or every database of a
    shard map), and errors in one line (:func:`friendly_errors`): a command that runs on either."""
    return database_option(shards_option(friendly_errors(command)))


_UNFINISHED = (State.AVAILABLE, State.RUNNING, State.WAITING)


def load_map(source: str | None) -> ShardMap:
    shards = ShardMap.load(source)
    if shards is None:
        raise ConfigError(f"no shard map: pass --shards FILE or set {SHARDS_ENV}")
    return shards


def open_map(source: str | None) -> ShardedClient:
    """A client over the map of ``--shards`` (or ``$MINIQUEUE_SHARDS``), on the command's schema."""
    return ShardedClient(load_map(source), schema=current_schema())


def finish_map(down: dict[str, DatabaseUnavailable], rows: list[dict[str, Any]] | None, what: str) -> None:
    """End a command over a map: print ``rows`` as JSON, with an ``{"database", "unreachable"}``
    entry per database that did not answer, unless ``rows`` is None (then name each such
    database on stderr: its ``what`` are missing, never zero); exit 1 if one did not answer."""
    if rows is not None:
        click.echo(to_json(rows + [{"database": name, "unreachable": str(why)} for name, why in down.items()]))
    else:
        for name, why in down.items():
            click.echo(f"database {name}: unreachable ({why}): its {what} are not shown above", err=True)
    if down:
        raise SystemExit(1)


@click.group()
def shards() -> None:
    """Several databases behind one map (see docs/guides/shards.md)."""


@shards.command("check")
@shards_option
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@friendly_errors
def check(shards_source: str | None, as_json: bool) -> None:
    """Each database of the map: reachable, in its place in the map, and the unfinished jobs of
    queues the map no longer puts there (a queue being moved: the old database is empty when it
    has none). Exits 1 when a database needs a look."""
    shards_map = load_map(shards_source)
    findings: list[dict[str, Any]] = []
    with ShardedClient(shards_map, schema=current_schema()) as client:
        for database in shards_map.databases.values():
            found: dict[str, Any] = {"database": database.name, "url": mask_dsn(database.url), "problems": []}
            findings.append(found)
            try:
                sub = client.client(database)
                place = sub.shard_place()
                stats = sub.queue_stats(check_served=False)
            except DatabaseUnavailable as exc:
                found["problems"].append(f"unreachable: {exc}")
                continue
            if place != (database.name, database.index):
                found["problems"].append(
                    f"not in its place: it is {place or 'in no map'}, the map says ({database.name!r}, "
                    f"{database.index}): run `miniqueue migrate --shards`"
                )
            for queue in stats:
                left = sum(queue.counts[state] for state in _UNFINISHED)
                if left and database not in shards_map.databases_of(queue.queue):
                    found["problems"].append(
                        f"queue {queue.queue!r}: {left} unfinished job(s) here, where the map no longer puts it "
                        "(its workers must drain them before the database leaves the queue)"
                    )
    if as_json:
        click.echo(to_json(findings))
    else:
        for found in findings:
            click.echo(f"{found['database']} ({found['url']}): " + ("; ".join(found["problems"]) or "ok"))
    if any(found["problems"] for found in findings):
        raise SystemExit(1)
