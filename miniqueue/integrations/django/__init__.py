"""Django: enqueue on Django's own database connection, inside ``transaction.atomic()``.

Add ``"miniqueue.integrations.django"`` to ``INSTALLED_APPS`` (for ``manage.py miniqueue``)
and, optionally, a ``MINIQUEUE`` setting::

    MINIQUEUE = {
        "APP": "myproject.tasks:app",   # what `manage.py miniqueue supervise` runs
        "DATABASE": "default",          # the alias whose connection enqueues, and whose DSN workers use
        "SCHEMA": "public",             # where miniqueue's tables are
        "DATABASE_URL": None,           # a DSN for workers instead of the alias's (e.g. around PgBouncer)
    }

Then, in a view::

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue("send_receipt", {"order": order.pk})   # exists only if the block commits

Outside an atomic block Django's connection is in autocommit mode, and the job is stored at
once. It needs Django 4.2+ on psycopg 3 (``django.db.backends.postgresql`` with ``psycopg``
installed): the job's ``INSERT`` runs on the psycopg connection under Django's.

``manage.py migrate`` applies miniqueue's pending migrations to ``MINIQUEUE['DATABASE']``
before the project's own (so the test runner's new test database has the queue's tables),
and the test runner's teardown drops its test database with no connection of this module's
left on it (see :func:`close_clients`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from django.conf import settings
from django.db import connections
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from ...client.client import Client
from ...core.db import Connection, check_schema, create_pool
from ...core.errors import ConfigError
from ...core.options import JobOptions
from ...core.records import EnqueueResult, JobSpec
from ...store.migrate import Migration, apply_migrations

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

__all__ = [
    "MiniqueueSettings",
    "close_clients",
    "database_url",
    "enqueue",
    "enqueue_many",
    "get_client",
    "get_settings",
    "migrate",
    "psycopg_connection",
    "reading_connection",
]

T = TypeVar("T")

_DSN_SETTINGS = ("NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
_KEYS = frozenset({"APP", "DATABASE", "SCHEMA", "DATABASE_URL"})
# Django's own OPTIONS for its PostgreSQL backend, which are not libpq parameters.
_DJANGO_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "assume_role", "pool", "cursor_factory", "context"}
)


@dataclass(frozen=True)
class MiniqueueSettings:
    """The ``MINIQUEUE`` setting, checked, with its defaults."""

    app: str | None = None
    database: str = "default"
    schema: str = "public"
    database_url: str | None = None


def get_settings() -> MiniqueueSettings:
    """Read and check ``settings.MINIQUEUE``; ConfigError names an unknown key or a bad value."""
    given: dict[str, Any] = dict(getattr(settings, "MINIQUEUE", None) or {})
    unknown = sorted(set(given) - _KEYS)
    if unknown:
        raise ConfigError(f"MINIQUEUE setting has unknown keys {unknown}: use {', '.join(sorted(_KEYS))}")
    chosen = MiniqueueSettings(
        app=given.get("APP"),
        database=given.get("DATABASE", "default"),
        schema=check_schema(given.get("SCHEMA", "public")),
        database_url=given.get("DATABASE_URL"),
    )
    if chosen.database not in settings.DATABASES:
        raise ConfigError(
            f"MINIQUEUE['DATABASE'] {chosen.database!r} is not in DATABASES ({', '.join(settings.DATABASES)})"
        )
    return chosen


def database_url(using: str | None = None) -> str:
    """The DSN workers use: ``MINIQUEUE['DATABASE_URL']``, else the one Django's connection
    ``using`` (default ``MINIQUEUE['DATABASE']``) connects with (under the test runner, the
    test database)."""
    chosen = get_settings()
    if chosen.database_url and using is None:
        return chosen.database_url
    connection = connections[using or chosen.database]
    if connection.vendor != "postgresql":
        raise ConfigError(f"database {connection.alias!r} is {connection.vendor}: miniqueue needs PostgreSQL")
    params = connection.settings_dict
    options = {key: value for key, value in (params.get("OPTIONS") or {}).items() if key not in _DJANGO_OPTIONS}
    parts = {
        "dbname": params.get("NAME"),
        "user": params.get("USER"),
        "password": params.get("PASSWORD"),
        "host": params.get("HOST"),
        "port": params.get("PORT"),
        **options,
    }
    return make_conninfo("", **{key: str(value) for key, value in parts.items() if value not in (None, "")})


def psycopg_connection(using: str | None = None) -> Connection:
    """The psycopg connection under Django's connection ``using`` (default
    ``MINIQUEUE['DATABASE']``), connected if it was not: inside ``transaction.atomic()`` a
    statement on it is part of the block's transaction."""
    connection = connections[using or get_settings().database]
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigError(
            f"Django's database {connection.alias!r} connects with {type(raw).__module__}, and miniqueue enqueues "
            "on psycopg 3 connections only: install psycopg (Django 4.2+ then uses it in place of psycopg2)"
        )
    return raw


_clients: dict[tuple[Any, ...], Client] = {}
# Each client's pool, which the client borrows (Client(pool) leaves a pool it was given open).
_pools: dict[tuple[Any, ...], ConnectionPool[Connection]] = {}
_clients_lock = threading.Lock()


def get_client() -> Client:
    """This process's :class:`Client` for Django's database (made on first use).

    Its pool opens no connection until a method runs without ``conn=`` (``get``,
    ``list_jobs``...): enqueues through this module run on Django's connection. Made per
    process, since no connection may cross a fork (gunicorn's, say), and anew when the
    settings change (``override_settings``, the test runner's test database).
    """
    chosen = get_settings()
    params = connections[chosen.database].settings_dict
    # Keyed by what the DSN is made of, not by the DSN: parsing it cost each enqueue ~50 us.
    key = (os.getpid(), chosen, *(repr(params.get(name)) for name in _DSN_SETTINGS))
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                pool = _pools[key] = create_pool(
                    database_url(), purpose="django", schema=chosen.schema, min_size=0, max_size=2
                )
                client = _clients[key] = Client(pool, schema=chosen.schema)
    return client


def close_clients() -> None:
    """Close the pools of every :class:`Client` :func:`get_client` made in this process, and
    forget them (the next call makes a new one).

    Called for you when Django connects to no particular database, which it does to create or
    drop a test database: a pooled connection left open on the test database would make the
    test runner's ``DROP DATABASE`` fail ("is being accessed by other users") and leave the
    database behind. Call it yourself where a process must let go of its connections.
    """
    with _clients_lock:
        pools = list(_pools.values())
        _clients.clear()
        _pools.clear()
    for pool in pools:
        pool.close()


def reading_connection(client: Client) -> Connection | None:
    """Django's psycopg connection (this thread's) to the database ``client`` serves, if
    ``client`` is one :func:`get_client` made; else None.

    Reading there sees what the current transaction wrote: inside ``django.test.TestCase``
    (a transaction per test, never committed), the jobs the test enqueued. miniqueue's testing
    assertions read through it.
    """
    with _clients_lock:
        aliases = [key[1].database for key, known in _clients.items() if known is client]
    return psycopg_connection(aliases[0]) if aliases else None


def migrate(using: str | None = None) -> list[Migration]:
    """Apply miniqueue's pending migrations on Django's connection ``using`` (default
    ``MINIQUEUE['DATABASE']``) into ``MINIQUEUE['SCHEMA']``; return those applied.
    ``manage.py migrate`` calls it (see :mod:`miniqueue.integrations.django.apps`)."""
    chosen = get_settings()
    return apply_migrations(psycopg_connection(using or chosen.database), chosen.schema)


def enqueue(
    task: str, payload: Any = None, *, using: str | None = None, **options: Unpack[JobOptions]
) -> EnqueueResult:
    """:meth:`Client.enqueue` on Django's connection ``using``: inside ``transaction.atomic()``
    the job exists only if the block commits (workers are notified at that commit).
    ``options`` are a job's (see :class:`~miniqueue.JobOptions`)."""
    return _on_django_connection(using, lambda conn: get_client().enqueue(task, payload, conn=conn, **options))


def enqueue_many(jobs: Iterable[JobSpec], *, using: str | None = None) -> list[EnqueueResult]:
    """:meth:`Client.enqueue_many` on Django's connection ``using`` (see :func:`enqueue`)."""
    return _on_django_connection(using, lambda conn: get_client().enqueue_many(jobs, conn=conn))


def _on_django_connection(using: str | None, write: Callable[[Connection], T]) -> T:
    """Run ``write(conn)`` on Django's psycopg connection. A statement that fails leaves the
    transaction aborted: mark the atomic block for rollback, as Django does when one of its
    own queries fails, so a caller that catches the error cannot commit the rest."""
    connection = connections[using or get_settings().database]
    raw = psycopg_connection(connection.alias)
    try:
        return write(raw)
    except Exception:
        if connection.in_atomic_block and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            connection.set_rollback(True)
        raise
