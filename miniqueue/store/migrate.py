"""Schema migrations: numbered plain-SQL files, applied in order, recorded, safe to run concurrently.

The files live in the top-level ``migrations/`` folder of the source tree and are shipped
inside the wheel as ``miniqueue/migrations``. Every run takes an advisory lock, so twenty
processes migrating at once apply each file exactly once; the pending files are applied in one
transaction, so a failure leaves the schema as it was, but for a file that says it runs outside
a transaction (see :mod:`miniqueue.store.schema`), which is written to be run again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..core.db import Connection, connect
from ..core.errors import MiniqueueError, SchemaOutOfDate
from .store import Store

_FILE_RE = re.compile(r"(\d{3})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str


def _migrations_dir() -> Path:
    packaged = Path(str(resources.files("miniqueue"))) / "migrations"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"  # a source checkout


def load_migrations() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    found = []
    for path in sorted(_migrations_dir().glob("*.sql")):
        match = _FILE_RE.fullmatch(path.name)
        if not match:
            raise MiniqueueError(f"migration file {path.name!r} is misnamed: use NNN_lower_snake_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    if not found:
        raise MiniqueueError(f"no migrations found in {_migrations_dir()}: the installation is incomplete")
    return found


def latest_version() -> int:
    """The version the schema has once every shipped migration is applied."""
    return load_migrations()[-1].version


def apply_migrations(conn: Connection, schema: str = "public") -> list[Migration]:
    """Apply the pending migrations on ``conn`` (autocommit); return those applied by this call."""
    shipped = load_migrations()
    store = Store(schema)
    applied = store.apply_migrations(conn, [(m.version, m.name, m.sql) for m in shipped])
    # The history's partitions of this hour and day and the next (the reaper makes the later ones).
    store.ensure_partitions(conn)
    return [m for m in shipped if m.version in applied]


def run_migrations(dsn: str, schema: str = "public") -> list[Migration]:
    """Bring the schema at ``dsn`` up to date; return the migrations this call applied.

    Idempotent, and safe to run from many processes at once.
    """
    with connect(dsn, purpose="migrate", schema=schema) as conn:
        return apply_migrations(conn, schema)


def check_schema_version(conn: Connection, schema: str = "public") -> None:
    """Raise SchemaOutOfDate unless every shipped migration has been applied, and no migration
    applied since says this version's workers can no longer serve the schema (see "Rolling
    deploys" in docs/operations/schema.md)."""
    store = Store(schema)
    have, want = store.schema_version(conn) or 0, latest_version()
    if have < want:
        raise SchemaOutOfDate(
            f"schema {schema!r} is at version {have}, this miniqueue needs {want}: run `miniqueue migrate`"
        )
    check_workers_from(conn, schema)


def check_workers_from(conn: Connection, schema: str = "public") -> None:
    """Raise SchemaOutOfDate if a migration applied says this version's workers can no longer
    serve the schema (see "Rolling deploys" in docs/operations/schema.md)."""
    store = Store(schema)
    needed, want = store.workers_from(conn), latest_version()
    if needed > want:
        raise SchemaOutOfDate(
            f"schema {schema!r} is at version {store.schema_version(conn)}, which workers before version {needed} "
            f"cannot serve, and this miniqueue is at {want}: upgrade miniqueue here"
        )
