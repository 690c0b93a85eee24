"""Where a command's queue lives: the ``--database-url`` and ``--schema`` options every command
takes, and the :class:`~miniqueue.Client` opened on them.

With neither ``--database-url`` nor ``DATABASE_URL``, a private embedded PostgreSQL is started in
``./.miniqueue/pgdata`` (or ``$MINIQUEUE_DATA_DIR``) and migrated, so a first try needs no server.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from .. import embedded
from ..client.client import Client
from ..core.db import check_dsn, check_schema
from ..core.errors import MiniqueueError
from ..store.migrate import run_migrations
from .errors import friendly_errors

F = TypeVar("F", bound=Callable[..., Any])

_database_url_option = click.option(
    "--database-url",
    envvar="DATABASE_URL",
    help="PostgreSQL URL (default: $DATABASE_URL, else an embedded server in ./.miniqueue).",
)

_SCHEMA = "miniqueue.schema"


def _remember_schema(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        ctx.meta[_SCHEMA] = check_schema(value)
    except MiniqueueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


_schema_option = click.option(
    "--schema",
    envvar="MINIQUEUE_SCHEMA",
    default="public",
    show_default=True,
    expose_value=False,
    callback=_remember_schema,
    help="The PostgreSQL schema of miniqueue's tables (every process of a deployment uses one).",
)


def database_option(command: F) -> F:
    """``--database-url`` and ``--schema``: where the queue lives."""
    return _database_url_option(_schema_option(command))


def client_command(command: Callable[..., None]) -> Callable[..., None]:
    """``--database-url`` and ``--schema``, errors in one line (:func:`friendly_errors`), and
    ``command`` called with ``client``: a Client on that database, closed when it returns. For
    a command that opens the client first thing."""

    @functools.wraps(command)
    def with_client(*args: Any, database_url: str | None, **kwargs: Any) -> None:
        with open_client(database_url) as client:
            command(*args, client=client, **kwargs)

    return database_option(friendly_errors(with_client))


def current_schema() -> str:
    """The ``--schema`` of the command being run."""
    schema: str = click.get_current_context().meta.get(_SCHEMA, "public")
    return schema


def open_client(database_url: str | None) -> Client:
    """A Client on the command's database and schema."""
    return Client(resolve_database(database_url), schema=current_schema())


def resolve_database(url: str | None, announce: Callable[[str], None] | None = None) -> str:
    """The DSN to use: the given one (checked), or the embedded server's (started, migrated,
    and announced on stderr, or through ``announce``)."""
    if url:
        check_dsn(url)
        return url
    uri = embedded.start()
    run_migrations(uri, current_schema())
    message = (
        f"using the embedded PostgreSQL in {embedded.data_dir()}; it runs while this command does and "
        f"keeps its data for the next one (to look inside meanwhile: psql '{uri}')"
    )
    (announce or functools.partial(click.echo, err=True))(message)
    return uri
