"""The schema's version and its migrations, as miniqueue.store.migrate applies them.

A migration runs in one transaction with the others pending, unless its file says
``-- miniqueue: no transaction`` (an index built ``CONCURRENTLY``, say): then each of its
statements runs on its own, and the file is written so that it can run again after a failure.
Every statement that takes a lock waits for it at most ``lock_timeout`` (a queue's claims queue
up behind a DDL statement waiting for its lock, so a long wait stalls the queue), and is tried
again, a few times, before the migration gives up. A file that says ``-- miniqueue: workers from
NNN`` records that workers of a version before NNN can no longer serve the schema.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg

from ..core.db import Connection, translate_errors
from ..core.errors import MiniqueueError
from .base import Statement, Statements, StoreBase

log = logging.getLogger("miniqueue.migrate")
T = TypeVar("T")

#: How long a migration's statement waits for a lock before it gives way and tries again.
LOCK_TIMEOUT_SECONDS = 2.0
#: How many times a migration (or a statement of one outside a transaction) tries.
LOCK_ATTEMPTS = 10

# Whether the migrations table exists (its qualified name a parameter: see `_versions_table`),
# then the newest applied migration, and the oldest workers' version the schema allows.
_HAS_VERSIONS = "SELECT to_regclass(%(versions)s) IS NOT NULL"
_SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM {migrations}"
_WORKERS_FROM = "SELECT coalesce(max(workers_from), 0) FROM {migrations}"

# Migrations: one migrator at a time per schema; the others wait on the lock, then find nothing
# to do. A transaction's lock for the migrations that run in one, a session's (taken and given
# back) for one that runs outside a transaction, statement by statement: the two conflict.
_MIGRATION_XACT_LOCK = "SELECT pg_advisory_xact_lock(hashtext('miniqueue-migrate:' || %(schema)s))"
_MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('miniqueue-migrate:' || %(schema)s))"
_MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(hashtext('miniqueue-migrate:' || %(schema)s))"
_MIGRATION_DDL = [
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    """
CREATE TABLE IF NOT EXISTS {migrations} (
    version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
""",
    # The oldest workers' version that can serve the schema once this migration is applied.
    "ALTER TABLE {migrations} ADD COLUMN IF NOT EXISTS workers_from INT",
]
_APPLIED_VERSIONS = "SELECT version FROM {migrations}"
# The migrations' own statements name tables without a schema: they land in this one.
_PIN_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"
_PIN_SESSION_SEARCH_PATH = "SET search_path TO {schema}, pg_catalog"
_RESET_SEARCH_PATH = "RESET search_path"
_RESET_LOCK_TIMEOUT = "RESET lock_timeout"
_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %(timeout)s, %(local)s)"
_RECORD_VERSION = (
    "INSERT INTO {migrations} (version, name, workers_from) VALUES (%(version)s, %(name)s, %(workers_from)s)"
)

NO_TRANSACTION = "-- miniqueue: no transaction"
WORKERS_FROM = "-- miniqueue: workers from "


class SchemaStatements(StoreBase):
    """The schema's version and migrations."""

    _schema_version = Statement(_SCHEMA_VERSION)
    _workers_from = Statement(_WORKERS_FROM)
    _versions_table = Statement("{migrations}")
    _migration_ddl = Statements(_MIGRATION_DDL)
    _applied_versions = Statement(_APPLIED_VERSIONS)
    _pin_search_path = Statement(_PIN_SEARCH_PATH)
    _pin_session_search_path = Statement(_PIN_SESSION_SEARCH_PATH)
    _record_version = Statement(_RECORD_VERSION)

    def schema_version(self, conn: Connection) -> int:
        """The newest migration applied to this schema, or 0 if none is."""
        if not self._rows(conn, _HAS_VERSIONS, {"versions": self._versions_table})[0][0]:
            return 0
        return int(self._rows(conn, self._schema_version, {})[0][0])

    def workers_from(self, conn: Connection) -> int:
        """The oldest workers' version (its latest migration) that can serve this schema; 0: any."""
        if not self._rows(conn, _HAS_VERSIONS, {"versions": self._versions_table})[0][0]:
            return 0
        try:
            return int(self._rows(conn, self._workers_from, {})[0][0])
        except MiniqueueError:  # a schema migrated before the column existed allows every worker
            return 0

    def apply_migrations(self, conn: Connection, migrations: Sequence[tuple[int, str, str]]) -> set[int]:
        """Apply the ``(version, name, sql)`` migrations not yet recorded, and return the versions
        this call applied. ``conn`` is in autocommit. Each run of the files that go in a
        transaction is applied in one, under a transaction-scoped advisory lock (so it works
        through a transaction pooler too); a file that says ``-- miniqueue: no transaction`` is
        applied statement by statement under a session lock, which needs a connection of its
        own to the server (a direct one, or a session pooler)."""
        applied: set[int] = set()
        with translate_errors():
            # (Read again under the lock before anything is applied: this only spares a file
            # outside a transaction that is recorded already the session lock.)
            exists = self._rows(conn, _HAS_VERSIONS, {"versions": self._versions_table})[0][0]
            recorded = {row[0] for row in conn.execute(self._applied_versions)} if exists else set()
            for batch in _batches(list(migrations)):
                if _outside_a_transaction(batch[0][2]):
                    if batch[0][0] not in recorded:
                        applied |= self._apply_outside_a_transaction(conn, batch[0])
                else:
                    attempt = functools.partial(self._apply_in_one_transaction, conn, batch)
                    applied |= _retrying_locks(attempt, batch[0][1])
        return applied

    def _pending(self, conn: Connection, batch: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
        """The migrations of ``batch`` not recorded yet (read under the migration lock)."""
        recorded = {row[0] for row in conn.execute(self._applied_versions)}
        return [m for m in batch if m[0] not in recorded]

    def _apply_in_one_transaction(self, conn: Connection, batch: list[tuple[int, str, str]]) -> set[int]:
        with conn.transaction():  # the migrations table too: a failure leaves nothing behind
            conn.execute(_MIGRATION_XACT_LOCK, {"schema": self.schema})
            for ddl in self._migration_ddl:
                conn.execute(ddl)
            pending = self._pending(conn, batch)
            conn.execute(_LOCK_TIMEOUT, {"timeout": f"{LOCK_TIMEOUT_SECONDS * 1000:.0f}ms", "local": True})
            conn.execute(self._pin_search_path)
            for version, name, text in pending:
                conn.execute(text.encode())
                conn.execute(self._record_version, {"version": version, "name": name, "workers_from": _workers(text)})
        return {m[0] for m in pending}

    def _apply_outside_a_transaction(self, conn: Connection, migration: tuple[int, str, str]) -> set[int]:
        version, name, text = migration
        conn.execute(_MIGRATION_LOCK, {"schema": self.schema})
        try:
            for ddl in self._migration_ddl:
                conn.execute(ddl)
            if not self._pending(conn, [migration]):
                return set()
            conn.execute(_LOCK_TIMEOUT, {"timeout": f"{LOCK_TIMEOUT_SECONDS * 1000:.0f}ms", "local": False})
            conn.execute(self._pin_session_search_path)
            try:
                for statement in split_statements(text):
                    _retrying_locks(functools.partial(conn.execute, statement.encode()), name)
                conn.execute(self._record_version, {"version": version, "name": name, "workers_from": _workers(text)})
            finally:
                conn.execute(_RESET_SEARCH_PATH)
                conn.execute(_RESET_LOCK_TIMEOUT)
        finally:
            conn.execute(_MIGRATION_UNLOCK, {"schema": self.schema})
        return {version}


def _batches(pending: list[tuple[int, str, str]]) -> list[list[tuple[int, str, str]]]:
    """The pending migrations in order, each run of those that go in a transaction together, each
    that does not alone."""
    batches: list[list[tuple[int, str, str]]] = []
    for migration in pending:
        if _outside_a_transaction(migration[2]) or not batches or _outside_a_transaction(batches[-1][0][2]):
            batches.append([migration])
        else:
            batches[-1].append(migration)
    return batches


def _retrying_locks(attempt: Callable[[], T], name: str) -> T:
    """Call ``attempt`` until it gets its locks within the lock timeout, LOCK_ATTEMPTS times at most."""
    for tries in range(1, LOCK_ATTEMPTS + 1):
        try:
            return attempt()
        except psycopg.errors.LockNotAvailable:
            if tries == LOCK_ATTEMPTS:
                raise MiniqueueError(
                    f"migration {name}: a lock it needs was held for over {LOCK_TIMEOUT_SECONDS:g}s, "
                    f"{LOCK_ATTEMPTS} times (a long transaction on the queue's tables? see `miniqueue doctor`)"
                ) from None
            log.warning("migration %s: a lock was not free within %gs, trying again", name, LOCK_TIMEOUT_SECONDS)
            time.sleep(min(5.0, 0.2 * 2**tries))
    raise AssertionError("unreachable")


def _outside_a_transaction(text: str) -> bool:
    """Whether a migration file has the line that says it runs outside a transaction."""
    return any(line.strip() == NO_TRANSACTION for line in text.splitlines())


def _workers(text: str) -> int | None:
    """The version a migration file says workers must have at least, or None."""
    for line in text.splitlines():
        if line.startswith(WORKERS_FROM):
            return int(line.removeprefix(WORKERS_FROM).strip())
    return None


def split_statements(text: str) -> list[str]:
    """The statements of a migration file, each whole: split at a ``;`` that ends a line outside
    a dollar-quoted body, with comment lines kept with the statement they precede."""
    statements, current, quoted = [], [], False
    for line in text.splitlines():
        current.append(line)
        if line.count("$$") % 2 == 1:
            quoted = not quoted
        if not quoted and line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            statement = "\n".join(current).strip()
            if any(not s.strip().startswith("--") for s in statement.splitlines() if s.strip()):
                statements.append(statement)
            current = []
    return statements
