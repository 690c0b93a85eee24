"""Connections: DSN checking and masking, connection and pool factories, error translation.

Every connection miniqueue opens sets ``application_name`` (so operators can see what each
backend is) and pins ``search_path`` to the queue's schema. Connections are never shared
across ``fork()``: create them in the process that uses them.

Behind a transaction pooler (``MINIQUEUE_PGBOUNCER=1``) a connection sends no ``options``
startup parameter and never prepares a statement on the server: see :func:`behind_pooler`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import unquote

import psycopg
import psycopg.errors
from psycopg.abc import Buffer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import JsonbLoader, JsonLoader, set_json_loads
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from .errors import ConfigError, DatabaseUnavailable, InvalidInput, SchemaOutOfDate

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

# A URL's "user:password@" part; the slashes are optional so that a URL missing one (which
# libpq then echoes back whole in its error) is still masked.
# Greedy up to the last "@": a password with an unescaped "@" or "/" is still masked whole.
_URL_PASSWORD_RE = re.compile(r"([:/][^:/@\s]*:)(\S*)(@)")
# A key=value password: quoted, or unquoted together with any bare words after it (libpq reads
# "password=two words" as a password and a keyword "words", and quotes "words" in its error).
_KV_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+(?:\s+[^\s=']+(?=\s|$)(?!\s*=))*)", re.IGNORECASE)
# A URL query parameter whose name, percent-decoded, is "password" ("pass%77ord" is one too).
_QUERY_PARAM_RE = re.compile(r"([?&])([^=&#\s]*)=([^&#\s]*)")
# Where libpq's URL parser cuts a password holding an unescaped delimiter into pieces.
_URL_DELIMITERS_RE = re.compile(r"[/@:?#,&=\s]")
_QUOTED_RE = re.compile(r'"([^"]*)"')
_URL_PREFIXES = ("postgresql://", "postgres://")
_DSN_FORMS = "use postgresql://user:password@host:port/dbname, or key=value pairs such as 'host=... dbname=...'"
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]*")
#: The longest name PostgreSQL takes, in bytes (NAMEDATALEN - 1): a longer identifier is cut, a
#: longer LISTEN/NOTIFY channel name refused.
MAX_NAME_BYTES = 63
#: The LISTEN/NOTIFY channels of a schema's queue: its new jobs (payload: the queue), and its
#: finished jobs that someone waits for (payload: the job id).
QUEUE_CHANNEL = "miniqueue_{schema}"
FINISHED_CHANNEL = "miniqueue_{schema}_finished"
#: Every name miniqueue derives from a schema's, the schema's own first.
_SCHEMA_NAMES = ("{schema}", QUEUE_CHANNEL, FINISHED_CHANNEL)
#: The longest schema name for which every derived name fits.
MAX_SCHEMA_LENGTH = MAX_NAME_BYTES - max(len(name.format(schema="")) for name in _SCHEMA_NAMES)
# Schema names PostgreSQL keeps for itself: CREATE SCHEMA refuses the prefix (pg_catalog, pg_temp
# and pg_toast have it), and information_schema is its own too.
_RESERVED_PREFIX = "pg_"
_RESERVED_SCHEMAS = frozenset({"information_schema"})

#: Set to 1 when DATABASE_URL (or a Client's DSN) reaches PostgreSQL through PgBouncer, or a
#: pooler like it, in transaction mode.
POOLER_ENV = "MINIQUEUE_PGBOUNCER"
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"", "0", "false", "no", "off"})
# What a connection through a transaction pooler passes to psycopg.connect: PgBouncer before
# 1.21 (Debian 12 ships 1.18) hands each transaction to any server connection, where a statement
# psycopg prepared on another one (after 5 executions) does not exist.
_POOLER_KWARGS: dict[str, Any] = {"prepare_threshold": None}

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]


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


class AsyncPooledConnection(psycopg.AsyncConnection[Any]):
    """:class:`PooledConnection` for an ``AsyncConnectionPool`` (an AsyncClient's own)."""

    _statement_cursor: psycopg.AsyncCursor[Any] | None = None

    def statement_cursor(self) -> psycopg.AsyncCursor[Any]:
        """This connection's cursor for one statement at a time (opened on first use)."""
        if self._statement_cursor is None or self._statement_cursor.closed:
            self._statement_cursor = self.cursor()
        return self._statement_cursor


_decoder = json.JSONDecoder()
_decode_json, _scan_json = _decoder.decode, _decoder.raw_decode


def _load_json(data: Buffer | str) -> Any:
    """json.loads for the UTF-8 text PostgreSQL sends, in one call a value: json.loads(bytes)
    first guesses the encoding, which cost a worker as much per claimed job as the decoding
    itself, and a ``jsonb`` value (never space around it) needs only the scan json.loads ends
    in; a ``json`` value with space around it, or none, goes the whole way."""
    text = data if isinstance(data, str) else bytes(data).decode()
    try:
        value, end = _scan_json(text)
    except ValueError:  # space first, or no value: json.loads says which
        return _decode_json(text)
    return value if end == len(text) else _decode_json(text)


class UndecodableJson:
    """A JSON value this process could not decode (nested deeper than Python's recursion limit,
    say), in the place of the value, on a connection that :func:`tolerate_bad_json`."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"<undecodable JSON: {self.error}>"


def _load_json_or_mark(data: Buffer | str) -> Any:
    try:
        return _load_json(data)
    except (RecursionError, ValueError) as exc:
        return UndecodableJson(f"{type(exc).__name__}: {exc}")


def tolerate_bad_json(conn: Connection) -> None:
    """Decode JSON on ``conn`` without raising: a value that cannot be decoded arrives as an
    :class:`UndecodableJson`. For the worker's claim connection: rows are decoded after the claim
    has committed their leases, so one job's payload must not fail the claim of all the others
    (the worker fails that job alone, without running it)."""
    _use_json_loads(_load_json_or_mark, conn)


def _use_json_loads(loads: Callable[[Buffer | str], Any], conn: Connection | AsyncConnection) -> None:
    """Decode ``json`` and ``jsonb`` values on ``conn`` with ``loads``: called directly for a
    value in text (how every statement here reads them), not through psycopg's own loader."""
    set_json_loads(loads, conn)  # values in binary too
    for name, loader in zip(("json", "jsonb"), _text_loaders(loads), strict=True):
        conn.adapters.register_loader(name, loader)


@functools.cache
def _text_loaders(loads: Callable[[Buffer | str], Any]) -> tuple[type[JsonLoader], type[JsonbLoader]]:
    """psycopg loaders of ``json`` and ``jsonb`` in text that call ``loads`` (made once)."""
    return (
        type("JsonLoader", (JsonLoader,), {"load": staticmethod(loads)}),
        type("JsonbLoader", (JsonbLoader,), {"load": staticmethod(loads)}),
    )


def _configure(conn: Connection | AsyncConnection) -> None:
    """What every connection miniqueue opens needs before its first statement."""
    _use_json_loads(_load_json, conn)


async def _aconfigure(conn: AsyncConnection) -> None:
    _configure(conn)


def cursor_for(conn: Connection) -> psycopg.Cursor[Any]:
    """A cursor to run one statement on ``conn``: a pooled connection's own, else a new one."""
    return conn.statement_cursor() if isinstance(conn, PooledConnection) else conn.cursor()


def acursor_for(conn: AsyncConnection) -> psycopg.AsyncCursor[Any]:
    """:func:`cursor_for` on an async connection."""
    return conn.statement_cursor() if isinstance(conn, AsyncPooledConnection) else conn.cursor()


def named_cursor(conn: Connection) -> psycopg.Cursor[dict[str, Any]]:
    """A new cursor on ``conn`` whose rows are dicts by column name, with JSON decoded as on
    miniqueue's own connections whatever ``conn`` was set up with: a caller's connection may
    load jsonb as text (Django's does, for its JSONField), and a job's payload must not."""
    cur = conn.cursor(row_factory=dict_row)
    if not isinstance(conn, PooledConnection):
        set_json_loads(_load_json, cur)
    return cur


def anamed_cursor(conn: AsyncConnection) -> psycopg.AsyncCursor[dict[str, Any]]:
    """:func:`named_cursor` on an async connection."""
    cur = conn.cursor(row_factory=dict_row)
    if not isinstance(conn, AsyncPooledConnection):
        set_json_loads(_load_json, cur)
    return cur


def mask_dsn(dsn: str) -> str:
    """Return ``dsn`` with any password replaced by ``***``, safe to log or print."""
    span = _url_password_span(dsn)
    masked = f"{dsn[: span[0]]}***{dsn[span[1] :]}" if span else _URL_PASSWORD_RE.sub(r"\1***\3", dsn)
    masked = _QUERY_PARAM_RE.sub(_mask_query_password, masked)
    return _KV_PASSWORD_RE.sub(r"\1***", masked)


def _url_password_span(dsn: str) -> tuple[int, int] | None:
    """Where a URL's password is: from the first ':' of "user:password@" to the last '@', even
    with unescaped spaces, '/' or '@' in it (the pattern stops at a space)."""
    if not dsn.startswith(_URL_PREFIXES):
        return None
    start = dsn.index("://") + 3
    at = dsn.rfind("@")
    colon = dsn.find(":", start, at)
    return (colon + 1, at) if at > start and colon >= 0 else None


def _mask_query_password(match: re.Match[str]) -> str:
    if unquote(match.group(2)).strip().lower() != "password":
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}=***"


def _password_forms(dsn: str) -> list[str]:
    """Every form in which ``dsn``'s password may reach a message, longest first: as written,
    percent-decoded, and the pieces libpq's URL parser makes of a password holding an unescaped
    '/', '@' or ':' (it reads them as host, port or database name, decoded, and may echo them)."""
    span = _url_password_span(dsn)
    written = [dsn[span[0] : span[1]]] if span else []
    written += [m.group(2) for m in _URL_PASSWORD_RE.finditer(dsn)]
    written += [m.group(3) for m in _QUERY_PARAM_RE.finditer(dsn) if unquote(m.group(2)).strip().lower() == "password"]
    written += [m.group(2).strip("'").replace("\\'", "'") for m in _KV_PASSWORD_RE.finditer(dsn)]
    forms: set[str] = set()
    for secret in written:
        for text in (secret, unquote(secret)):
            forms.add(text)
            # A piece shorter than 3 characters would mask innocent text everywhere; the port
            # check names such a piece for what it is instead (see _port_problem).
            for piece in _URL_DELIMITERS_RE.split(text):
                forms.update(p for p in (piece, unquote(piece)) if len(p) >= 3)
    return sorted(filter(None, forms), key=len, reverse=True)


def _scrub(text: str, dsn: str) -> str:
    """Remove from ``text`` every form of the password ``dsn`` holds, even a piece the parser echoed."""
    text = mask_dsn(text)
    for secret in _password_forms(dsn):
        text = text.replace(secret, "***")
    return text


def _parser_reason(exc: psycopg.ProgrammingError, dsn: str) -> str:
    """libpq's explanation of why ``dsn`` does not parse, with any password removed.

    libpq quotes the text it choked on, which is the useful part ("missing "=" after "not""),
    but may be a fragment of the password ("password=two words" fails after "words"): a quoted
    fragment that is part of the password is hidden whole, however short.
    """
    forms = _password_forms(dsn)

    def hide(match: re.Match[str]) -> str:
        quoted = match.group(1)
        return '"***"' if quoted and any(quoted in form for form in forms) else f'"{_scrub(quoted, dsn)}"'

    return _QUOTED_RE.sub(hide, _scrub(str(exc).strip(), dsn))


def _port_problem(port: str, dsn: str) -> str | None:
    """Why ``port`` (as parsed from ``dsn``) is not a port, or None if it is one."""
    if all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        return None
    rule = "is not a number from 1 to 65535"
    userinfo = dsn.split("://", 1)[-1].rpartition("@")[0] if dsn.startswith(_URL_PREFIXES) else ""
    if port and any(port in text for text in (userinfo, unquote(userinfo))):
        # An unescaped '/' in the password ends the host part early: libpq then reads the
        # rest of the password as the port. Never show it, however short.
        return f"the port {rule}: it is part of the password (percent-encode any '@', '/' or ':' in the password)"
    return f"port {_scrub(port, dsn)!r} {rule} (percent-encode any '@', '/' or ':' in the password)"


def check_dsn(dsn: str) -> dict[str, str]:
    """Parse ``dsn`` (URL or ``key=value`` form) and return its parts, or raise ConfigError.

    The error names the problem and never echoes the password.
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigError("database URL is empty: pass --database-url or set DATABASE_URL")
    try:
        parts = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"database URL {mask_dsn(dsn)!r} is invalid: {_parser_reason(exc, dsn)} ({_DSN_FORMS})"
        ) from None
    problem = _port_problem(parts.get("port") or "", dsn) if "port" in parts else None
    if problem:
        raise ConfigError(f"database URL {mask_dsn(dsn)!r} is invalid: {problem}")
    return parts


def check_schema(schema: str) -> str:
    """Return ``schema`` if PostgreSQL takes it, and every name derived from it (see
    :data:`MAX_SCHEMA_LENGTH`), else raise ConfigError naming the problem."""
    if not isinstance(schema, str) or not _SCHEMA_RE.fullmatch(schema):
        problem = f"use 1-{MAX_SCHEMA_LENGTH} characters of a-z, 0-9 or '_', not starting with a digit"
    elif len(schema) > MAX_SCHEMA_LENGTH:
        longest = max(_SCHEMA_NAMES, key=len)
        problem = (
            f"it is {len(schema)} characters long, and at most {MAX_SCHEMA_LENGTH} keep the names miniqueue "
            f"derives from it within PostgreSQL's {MAX_NAME_BYTES} bytes ({longest.format(schema='<schema>')!r} "
            f"would be {len(longest.format(schema=schema))})"
        )
    elif schema.startswith(_RESERVED_PREFIX):
        problem = f"PostgreSQL reserves names starting with {_RESERVED_PREFIX!r} for its system schemas"
    elif schema in _RESERVED_SCHEMAS:
        problem = "it is PostgreSQL's own schema"
    else:
        return schema
    raise ConfigError(f"schema name {schema!r} is invalid: {problem}")


def behind_pooler() -> bool:
    """Whether connections go through a transaction pooler: ``$MINIQUEUE_PGBOUNCER`` is 1.

    Such a connection sends no ``options`` startup parameter (PgBouncer refuses one it was not
    told to ignore, and one it ignores would pin nothing), so neither ``search_path`` nor
    ``jit`` is set: the store names every table with its schema, and ``jit`` can be set for
    the role (``ALTER ROLE ... SET jit = off``). ``application_name`` stays: PgBouncer accepts
    it and sets it on whichever server connection runs each transaction. And psycopg never
    prepares a statement on the server (``prepare_threshold=None``). Read at each connect and
    pool creation, so a process started with it set (a supervisor's children too) needs no code.
    """
    value = os.environ.get(POOLER_ENV, "").strip().lower()
    if value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise ConfigError(f"{POOLER_ENV}={value!r} is invalid: use 1 (connections go through PgBouncer) or 0")


def conninfo(
    dsn: str, *, purpose: str, schema: str = "public", utc: bool = False, generic_plans: bool = False, **extra: Any
) -> str:
    """The connection string miniqueue uses: ``dsn`` plus application_name, client_encoding
    UTF8 and, unless :func:`behind_pooler`, the session settings the store relies on (a pinned
    search_path among them) after the DSN's own options; with ``utc``, timestamps read in UTC
    too (psycopg converts each into the session's zone, and for any zone but UTC itself,
    'Etc/UTC' included, that cost a worker 2 of the 5.6 us it took to read a claimed job).

    With ``generic_plans`` (the worker's claim connection), each prepared statement is planned
    once, not for each run's parameters: each ANALYZE of the jobs table (the reaper's, as a
    drain churns it) had PostgreSQL weigh its plans again and go back to planning the claim
    on every run, a fifth of the server's time per claimed job."""
    check_dsn(dsn)
    check_schema(schema)
    if not behind_pooler():
        # JIT compilation costs more than a queue's short statements ever gain: on PostgreSQL 15
        # it spent 400+ ms compiling a 10,000-job enqueue_many that runs in 100 ms. Timestamps and
        # intervals as psycopg reads them, whatever the server's DateStyle and IntervalStyle
        # (ISO output keeps the server's day/month order for input, which miniqueue never uses).
        # And READ COMMITTED, which the store's statements are written for (a claim or a unique
        # key's enqueue that meets a row changed meanwhile rechecks it, where REPEATABLE READ
        # fails), whatever the server's default_transaction_isolation.
        settings = [
            f"search_path={schema},pg_catalog",
            "jit=off",
            "datestyle=ISO",
            "intervalstyle=postgres",
            "default_transaction_isolation=read\\ committed",
            *(["TimeZone=UTC"] if utc else []),
            *(["plan_cache_mode=force_generic_plan"] if generic_plans else []),
        ]
        # After the DSN's own options (a statement_timeout, say), which stay: the later -c wins.
        own = " ".join(f"-c {setting}" for setting in settings)
        theirs = conninfo_to_dict(dsn).get("options")
        extra = {"options": f"{theirs} {own}" if theirs else own, **extra}
    # Text in UTF8 whatever the database's encoding: on one in SQL_ASCII (a cluster made with
    # `initdb --locale=C`) psycopg would otherwise return text as bytes; from any other, the
    # server converts, and a character the database cannot store is an error naming it.
    extra = {"client_encoding": "UTF8", **extra}
    return make_conninfo(dsn, application_name=f"miniqueue:{purpose}"[:63], **extra)


def connect(dsn: str, *, purpose: str, schema: str = "public", autocommit: bool = True, **extra: Any) -> Connection:
    """Open one connection (autocommit by default: one statement, one round trip); ``extra``
    adds libpq parameters such as ``connect_timeout``, or :func:`conninfo`'s own."""
    info = conninfo(dsn, purpose=purpose, schema=schema, **extra)
    with translate_errors(dsn):
        conn = psycopg.connect(info, autocommit=autocommit, **session_kwargs())
    _configure(conn)
    return conn


async def aconnect(
    dsn: str, *, purpose: str, schema: str = "public", autocommit: bool = True, **extra: Any
) -> AsyncConnection:
    """:func:`connect`, for asyncio: an ``AsyncConnection``."""
    info = conninfo(dsn, purpose=purpose, schema=schema, **extra)
    with translate_errors(dsn):
        conn = await psycopg.AsyncConnection.connect(info, autocommit=autocommit, **session_kwargs())
    _configure(conn)
    return conn


def session_kwargs() -> dict[str, Any]:
    """psycopg.connect's arguments for where the connection goes: none for a direct one (psycopg's
    defaults, prepared statements included), no server-side prepares behind a pooler."""
    return _POOLER_KWARGS if behind_pooler() else {}


#: How long a client waits, by default, to open a connection or to get one from its pool
#: (seconds): a database that is down fails its calls within it (see :func:`connect_seconds`).
DEFAULT_CONNECT_TIMEOUT = 10.0


def connect_seconds(timeout: float) -> int:
    """libpq's ``connect_timeout`` for a client's ``timeout`` (seconds): whole seconds, at least
    2 (libpq waits 2 for less); ConfigError for a timeout that is not a positive number."""
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        raise ConfigError(f"connect_timeout {timeout!r} is invalid: use a positive number of seconds")
    return max(2, math.ceil(timeout))


class PoolOptions(TypedDict, total=False):
    """What :func:`create_pool` and :func:`create_async_pool` take beside the DSN, its
    ``purpose`` and ``check``: the connections' ``schema`` (default ``"public"``), the pool's
    ``min_size`` (1) and ``max_size`` (4), ``timeout``, the longest wait for a connection (30
    seconds), and ``connect_timeout``, libpq's bound on each new connection's attempt (whole
    seconds; None, the default: libpq's own)."""

    schema: str
    min_size: int
    max_size: int
    timeout: float
    connect_timeout: int | None


def _pool_options(dsn: str, purpose: str, options: PoolOptions) -> dict[str, Any]:
    """The options a sync and an async pool share: the connections' conninfo and session settings,
    in autocommit, and the pool's sizes and wait (TypeError for a keyword that is none of
    :class:`PoolOptions`: a TypedDict checks nothing at run time)."""
    unknown = options.keys() - PoolOptions.__annotations__.keys()
    if unknown:
        raise TypeError(f"unknown pool options {sorted(unknown)}")
    connect_timeout = options.get("connect_timeout")
    extra: dict[str, Any] = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
    return {
        "conninfo": conninfo(dsn, purpose=purpose, schema=options.get("schema", "public"), **extra),
        "min_size": options.get("min_size", 1),
        "max_size": options.get("max_size", 4),
        "kwargs": {"autocommit": True, **session_kwargs()},
        "timeout": options.get("timeout", 30.0),
    }


def create_pool(
    dsn: str, *, purpose: str, check: Callable[[Connection], None] | None = None, **options: Unpack[PoolOptions]
) -> ConnectionPool[Connection]:
    """Open a pool of autocommit connections (see :class:`PoolOptions`); ``check`` (e.g.
    ``ConnectionPool.check_connection``) vets each connection handed out."""
    # Typed as a pool of plain connections, as a caller's own pool is: a PooledConnection is one.
    pool: ConnectionPool[Any] = ConnectionPool(
        **_pool_options(dsn, purpose, options),
        connection_class=PooledConnection,
        configure=_configure,
        open=True,
        name=f"miniqueue-{purpose}",
        check=check,
    )
    return pool


def create_async_pool(
    dsn: str,
    *,
    purpose: str,
    check: Callable[[AsyncConnection], Awaitable[None]] | None = None,
    name: str | None = None,
    **options: Unpack[PoolOptions],
) -> AsyncConnectionPool[AsyncConnection]:
    """:func:`create_pool` for asyncio, not yet open: ``await pool.open()`` on the event loop
    that uses it (an asyncio pool belongs to the loop it was opened on)."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        **_pool_options(dsn, purpose, options),
        connection_class=AsyncPooledConnection,
        configure=_aconfigure,
        open=False,
        name=name or f"miniqueue-{purpose}",
        check=check,
    )
    return pool


# The data errors that mean "this value does not fit" (a number beyond a BIGINT, text the
# database cannot encode), plus psycopg's own (sqlstate None: a NUL in text, caught before
# sending). Other data errors, such as a division by zero in a migration, are bugs: they propagate.
_BAD_VALUE_ERRORS = (
    psycopg.errors.NumericValueOutOfRange,
    psycopg.errors.InvalidTextRepresentation,
    psycopg.errors.InvalidBinaryRepresentation,
    psycopg.errors.CharacterNotInRepertoire,
    psycopg.errors.UntranslatableCharacter,
    psycopg.errors.StringDataRightTruncation,
    psycopg.errors.DatetimeFieldOverflow,
    psycopg.errors.InvalidDatetimeFormat,
)


class translate_errors:  # lower case: it reads as the function it replaced, `with translate_errors(dsn):`
    """Turn psycopg's connectivity, missing-schema and bad-value errors into miniqueue's own.

    The one place where psycopg exceptions become :class:`MiniqueueError` subclasses; other
    database errors (constraint violations and the like) are bugs and propagate unchanged.
    A value the database cannot take (a number out of a column's range, text that is not
    valid Unicode) becomes InvalidInput: the statement failed, so nothing was stored.
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
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            raise ConfigError(
                f"the database role lacks a privilege miniqueue needs: {_first_line(exc)} (the privileges "
                'each role needs: "Roles and privileges" in Schema and migrations, docs/operations/schema.md)'
            ) from exc
        if isinstance(exc, psycopg.DataError) and (exc.sqlstate is None or isinstance(exc, _BAD_VALUE_ERRORS)):
            raise InvalidInput(f"the database rejected a value: {_first_line(exc)}") from exc
        if isinstance(exc, UnicodeEncodeError):
            # psycopg encodes each text parameter as it sends it: a lone surrogate (from bytes
            # that were not UTF-8, say) fails there, before the statement reaches the server.
            bad = exc.object[exc.start : exc.end]
            raise InvalidInput(f"text containing {bad!r} is invalid: a lone surrogate is not valid Unicode") from exc
        if isinstance(exc, psycopg.OperationalError) and (exc.sqlstate or "").startswith("54"):
            # A program limit (a value or statement too large for the server): the connection
            # is fine and the same statement would fail again, so never "database unavailable".
            raise InvalidInput(f"the database refused the statement: {_first_line(exc)}") from exc
        if isinstance(exc, psycopg.errors.SerializationFailure):
            # A row the statement waited for moved to another partition of the jobs table under
            # it (its job finished, was requeued or cancelled at that moment): transient, like an
            # outage, but nothing is down. Outside a transaction the statement ran again already
            # (miniqueue.core.steps.fetch); inside one, the transaction is lost.
            raise DatabaseUnavailable(
                f"a job changed under this transaction (finished, requeued or cancelled at the same moment): "
                f"{_first_line(exc)}; run the transaction again"
            ) from exc
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
            detail = _first_line(exc)
            if self.dsn:
                detail = _scrub(detail, self.dsn)
            where = f" at {mask_dsn(self.dsn)}" if self.dsn else ""
            if "unsupported startup parameter" in detail:  # PgBouncer's answer to the options parameter
                detail += f" (behind PgBouncer? set {POOLER_ENV}=1)"
            raise DatabaseUnavailable(f"database unavailable{where}: {detail}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
