"""The schema's version and its migrations, as miniqueue.store.migrate applies them."""

from __future__ import annotations

from collections.abc import Sequence

from ..core.db import Connection, translate_errors
from .base import Statement, Statements, StoreBase

# Whether the migrations table exists (its qualified name a parameter: see `_versions_table`),
# then the newest applied migration.
_HAS_VERSIONS = "SELECT to_regclass(%(versions)s) IS NOT NULL"
_SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM {migrations}"

# Migrations: one migrator at a time per schema; the others wait on the lock, then find nothing to do.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtext('miniqueue-migrate:' || %(schema)s))"
_MIGRATION_DDL = [
    "CREATE SCHEMA IF NOT EXISTS {schema}",
    """
CREATE TABLE IF NOT EXISTS {migrations} (
    version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
""",
]
_APPLIED_VERSIONS = "SELECT version FROM {migrations}"
# The migrations' own statements name tables without a schema: they land in this one.
_PIN_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"
_RECORD_VERSION = "INSERT INTO {migrations} (version, name) VALUES (%(version)s, %(name)s)"


class SchemaStatements(StoreBase):
    """The schema's version and migrations."""

    _schema_version = Statement(_SCHEMA_VERSION)
    _versions_table = Statement("{migrations}")
    _migration_ddl = Statements(_MIGRATION_DDL)
    _applied_versions = Statement(_APPLIED_VERSIONS)
    _pin_search_path = Statement(_PIN_SEARCH_PATH)
    _record_version = Statement(_RECORD_VERSION)

    def schema_version(self, conn: Connection) -> int:
        """The newest migration applied to this schema, or 0 if none is."""
        if not self._rows(conn, _HAS_VERSIONS, {"versions": self._versions_table})[0][0]:
            return 0
        return int(self._rows(conn, self._schema_version, {})[0][0])

    def apply_migrations(self, conn: Connection, migrations: Sequence[tuple[int, str, str]]) -> set[int]:
        """Apply the ``(version, name, sql)`` migrations not yet recorded, in one transaction
        under an advisory lock; return the versions this call applied."""
        with translate_errors(), conn.transaction():
            conn.execute(_MIGRATION_LOCK, {"schema": self.schema})
            for ddl in self._migration_ddl:
                conn.execute(ddl)
            applied = {row[0] for row in conn.execute(self._applied_versions)}
            pending = [m for m in migrations if m[0] not in applied]
            conn.execute(self._pin_search_path)
            for version, name, text in pending:
                conn.execute(text.encode())
                conn.execute(self._record_version, {"version": version, "name": name})
        return {m[0] for m in pending}
