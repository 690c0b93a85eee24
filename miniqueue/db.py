"""Connections: DSN checking and masking, connection and pool factories, error translation.

Every connection miniqueue opens sets ``application_name`` (so operators can see what each
backend is) and pins ``search_path`` to the queue's schema. Connections are never shared
across ``fork()``: create them in the process that uses them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from .errors import ConfigError, DatabaseUnavailable, SchemaOutOfDate

# A URL's "user:password@" part; the slashes are optional so that a URL missing one (which
# libpq then echoes back whole in its error) is still masked.
# Greedy up to the last "@": a password with an unescaped "@" or "/" is still masked whole.
_URL_PASSWORD_RE = re.compile(r"([:/][^:/@\s]*:)(\S*)(@)")
_KV_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUOTED_RE = re.compile(r'"[^"]*"')
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

Connection = psycopg.Connection[Any]


class PooledConnection(psycopg.Connection[Any]):
    """A connection of one of miniqueue's pools, which keeps one cursor for the store's statements.

    A psycopg cursor works out the adapter for each parameter and column type once and keeps
    it; on a fresh cursor per statement that work cost a one-by-one enqueue more than all of
    its validation. A pool hands a connection to one thread at a time, so sharing is safe.
    """

    _statement_cursor: psycopg.Cursor[Any] | None = None

    def statement_cursor(self) -> psycopg.Cursor[Any]:
        """This connection's cursor for one statement at a time (opened on first use)."""
        if self._statement_cursor is None or self._statement_cursor.closed:
            self._statement_cursor = self.cursor()
        return self._statement_cursor


_decode_json = json.JSONDecoder().decode


def _load_json(data: str | bytes) -> Any:
    """json.loads for the UTF-8 text PostgreSQL sends: json.loads(bytes) first guesses the
    encoding, which cost a worker as much per claimed job as the decoding itself."""
    return _decode_json(data.decode() if isinstance(data, bytes) else data)


def _configure(conn: Connection) -> None:
    """What every connection miniqueue opens needs before its first statement."""
    set_json_loads(_load_json, conn)


def cursor_for(conn: Connection) -> psycopg.Cursor[Any]:
    """A cursor to run one statement on ``conn``: a pooled connection's own, else a new one."""
    return conn.statement_cursor() if isinstance(conn, PooledConnection) else conn.cursor()


def mask_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``, safe to log or print."""
    masked = _URL_PASSWORD_RE.sub(r"\1***\3", dsn)
    return _KV_PASSWORD_RE.sub(r"\1***", masked)


def _scrub(text: str, dsn: str) -> str:
    """Remove from ``text`` any password that ``dsn`` contains, even one the parser echoed."""
    secrets = [m.group(2) for m in _URL_PASSWORD_RE.finditer(dsn)]
    secrets += [m.group(2).strip("'") for m in _KV_PASSWORD_RE.finditer(dsn)]
    # libpq may echo a piece of an unescaped password (read as a port, say): hide the pieces too.
    pieces = [p for secret in secrets for p in re.split(r"[/@:?#]", secret) if len(p) >= 3]
    for secret in sorted(filter(None, {*secrets, *pieces}), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def check_dsn(dsn: str) -> dict[str, str]:
    """Parse ``dsn`` (URL or ``key=value`` form) and return its parts, or raise ConfigError.

    The error names the problem and never echoes the password.
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigError("database URL is empty: pass --database-url or set DATABASE_URL")
    try:
        parts = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    except psycopg.ProgrammingError as exc:
        # libpq quotes the text it choked on, which may be the password: never show quoted text.
        reason = _QUOTED_RE.sub('"…"', _scrub(str(exc).strip(), dsn))
        raise ConfigError(f"database URL {mask_dsn(dsn)} is invalid: {reason}") from None
    port = parts.get("port")
    if port is not None and not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        shown = _scrub(repr(port), dsn)
        raise ConfigError(
            f"database URL {mask_dsn(dsn)} is invalid: port {shown} is not a number from 1 to 65535 "
            "(percent-encode any '@', '/' or ':' in the password)"
        )
    return parts


def check_schema(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case SQL identifier, else raise ConfigError."""
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        raise ConfigError(
            f"schema name {schema!r} is invalid: use 1-63 characters of a-z, 0-9 or '_', not starting with a digit"
        )
    return schema


def conninfo(dsn: str, *, purpose: str, schema: str = "public", **extra: Any) -> str:
    """The connection string miniqueue uses: ``dsn`` plus application_name and a pinned search_path."""
    check_dsn(dsn)
    return make_conninfo(
        dsn,
        application_name=f"miniqueue:{purpose}"[:63],
        # JIT compilation costs more than a queue's short statements ever gain: on PostgreSQL 15
        # it spent 400+ ms compiling a 10,000-job enqueue_many that runs in 100 ms.
        options=f"-c search_path={check_schema(schema)},pg_catalog -c jit=off",
        **extra,
    )


def connect(dsn: str, *, purpose: str, schema: str = "public", autocommit: bool = True, **extra: Any) -> Connection:
    """Open one connection (autocommit by default: one statement, one round trip); ``extra``
    adds libpq parameters such as ``connect_timeout``."""
    info = conninfo(dsn, purpose=purpose, schema=schema, **extra)
    with translate_errors(dsn):
        conn = psycopg.connect(info, autocommit=autocommit)
    _configure(conn)
    return conn


def create_pool(
    dsn: str,
    *,
    purpose: str,
    schema: str = "public",
    min_size: int = 1,
    max_size: int = 4,
    timeout: float = 30.0,
    check: Callable[[Connection], None] | None = None,
) -> ConnectionPool[Connection]:
    """Open a pool of autocommit connections that waits at most ``timeout`` s for one;
    ``check`` (e.g. ``ConnectionPool.check_connection``) vets each connection handed out."""
    info = conninfo(dsn, purpose=purpose, schema=schema)
    # Typed as a pool of plain connections, as a caller's own pool is: a PooledConnection is one.
    pool: ConnectionPool[Any] = ConnectionPool(
        info,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        connection_class=PooledConnection,
        configure=_configure,
        timeout=timeout,
        open=True,
        name=f"miniqueue-{purpose}",
        check=check,
    )
    return pool


class translate_errors:  # lower case: it reads as the function it replaced, `with translate_errors(dsn):`
    """Turn psycopg's connectivity and missing-schema errors into miniqueue's own.

    The one place where psycopg exceptions become :class:`MiniqueueError` subclasses; other
    database errors (constraint violations and the like) are bugs and propagate unchanged.
    (A class rather than a @contextmanager generator: every statement runs inside one.)
    """

    __slots__ = ("dsn",)

    def __init__(self, dsn: str | None = None) -> None:
        self.dsn = dsn

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)):
            table = isinstance(exc, psycopg.errors.UndefinedTable)
            missing = "tables are missing" if table else "schema is out of date"
            raise SchemaOutOfDate(
                f"the miniqueue {missing} ({exc.diag.message_primary}): run `miniqueue migrate` first"
            ) from exc
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if self.dsn:
                detail = _scrub(detail, self.dsn)
            where = f" at {mask_dsn(self.dsn)}" if self.dsn else ""
            raise DatabaseUnavailable(f"database unavailable{where}: {detail}") from exc
