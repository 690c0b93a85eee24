"""miniqueue/store/schema.sql, the schema written out for readers, is the schema the migrations build.

One fresh database gets the file, another the migrations; each is then described from the
catalogs, through PostgreSQL's own functions (format_type, pg_get_expr, pg_get_constraintdef,
pg_get_indexdef, pg_get_functiondef, pg_get_triggerdef) and catalog columns that every
supported major version has (CI runs the suite on PostgreSQL 15 and 18); both databases are on
the same server, so the two descriptions must be equal. The bookkeeping table
miniqueue_migrations is included: schema.sql defines it too (its rows, the applied versions,
are data and are not compared), so nothing in the schema is left out of the comparison.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import miniqueue.store
from miniqueue import run_migrations
from miniqueue.core.db import Connection, connect
from miniqueue.store.migrate import load_migrations
from miniqueue.testing import database as testing_db

SCHEMA_FILE = Path(miniqueue.store.__file__).resolve().parent / "schema.sql"
SCHEMA = "public"

# As `miniqueue migrate` runs the migrations: in one transaction, with search_path pinned to the
# queue's schema and pg_catalog (which the functions' `SET search_path FROM CURRENT` records).
_PIN_SEARCH_PATH = "SET LOCAL search_path TO public, pg_catalog"

# What the schema holds, section by section: one row per object, named by its first column
# (`object`), in a stable order. Only columns every supported server has; values that older and
# newer servers spell differently are normalised (a column's default statistics target is -1
# before PostgreSQL 17 and NULL from it). NOT NULL is read from pg_attribute, where every server
# keeps it; PostgreSQL 18 also records it as a constraint (contype 'n'), left out for that reason.
# A column's options are those ALTER COLUMN ... SET (...) takes (n_distinct, n_distinct_inherited):
# a server may keep entries of its own beside them that vary with when a table was created.
DESCRIBE = {
    "schema": """
        SELECT nspname AS object FROM pg_namespace
         WHERE nspname !~ '^pg_' AND nspname <> 'information_schema' ORDER BY 1""",
    "extension": """
        SELECT extname AS object, extnamespace::regnamespace::text AS schema FROM pg_extension ORDER BY 1""",
    # Tables, indexes, sequences, views: with their storage settings (reloptions, in any order),
    # and a partitioned table's key and a partition's bounds.
    "relation": """
        SELECT c.relname AS object, c.relkind AS kind, c.relpersistence AS persistence,
               am.amname AS access_method, c.relrowsecurity AS row_security, c.relreplident AS replica_identity,
               array(SELECT o FROM unnest(c.reloptions) AS o ORDER BY o) AS storage,
               c.relacl::text AS privileges, obj_description(c.oid, 'pg_class') AS comment,
               CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid) END AS view,
               pg_get_partkeydef(c.oid) AS partition_key, pg_get_expr(c.relpartbound, c.oid) AS partition_of
          FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam
         WHERE c.relnamespace = %(schema)s::regnamespace
         ORDER BY c.relname""",
    # In the tables' own order (attnum), without the numbers, in which dropped columns leave gaps.
    "column": """
        SELECT c.relname || '.' || a.attname AS object, format_type(a.atttypid, a.atttypmod) AS type,
               a.attnotnull AS not_null, pg_get_expr(d.adbin, d.adrelid) AS default,
               a.attidentity AS identity, a.attgenerated AS generated,
               CASE WHEN a.attstattarget >= 0 THEN a.attstattarget END AS statistics,
               a.attstorage AS storage, a.attcompression AS compression,
               a.attcollation::regcollation::text AS collation,
               array(SELECT o FROM unnest(a.attoptions) AS o WHERE o ~ '^n_distinct' ORDER BY o) AS options,
               a.attacl::text AS privileges, col_description(c.oid, a.attnum) AS comment
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
           AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY c.relname, a.attnum""",
    "constraint": """
        SELECT c.relname || '.' || k.conname AS object, pg_get_constraintdef(k.oid) AS definition,
               obj_description(k.oid, 'pg_constraint') AS comment
          FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
         WHERE c.relnamespace = %(schema)s::regnamespace AND k.contype <> 'n'
         ORDER BY c.relname, k.conname""",
    "index": """
        SELECT i.relname AS object, pg_get_indexdef(i.oid) AS definition, x.indisclustered AS clustered,
               x.indisreplident AS replica_identity
          FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
         WHERE i.relnamespace = %(schema)s::regnamespace
         ORDER BY i.relname""",
    "sequence": """
        SELECT c.relname AS object, format_type(s.seqtypid, NULL) AS type, s.seqstart AS start,
               s.seqincrement AS increment, s.seqmin AS min, s.seqmax AS max, s.seqcache AS cache,
               s.seqcycle AS cycle,
               (SELECT t.relname || '.' || a.attname || ' (' || d.deptype::text || ')'
                  FROM pg_depend d
                  JOIN pg_class t ON t.oid = d.refobjid
                  JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                 WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                   AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')) AS owned_by
          FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
         WHERE c.relnamespace = %(schema)s::regnamespace
         ORDER BY c.relname""",
    # Enums, domains, composite and range types of their own (not the row type of a table).
    "type": """
        SELECT t.typname AS object, t.typtype AS kind, format_type(t.typbasetype, t.typtypmod) AS base,
               t.typnotnull AS not_null,
               array(SELECT e.enumlabel::text FROM pg_enum e WHERE e.enumtypid = t.oid
                      ORDER BY e.enumsortorder) AS labels,
               array(SELECT pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.contypid = t.oid
                      ORDER BY k.conname) AS constraints
          FROM pg_type t
         WHERE t.typnamespace = %(schema)s::regnamespace AND t.typtype IN ('c', 'd', 'e', 'm', 'r')
           AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
         ORDER BY t.typname""",
    "function": """
        SELECT p.oid::regprocedure::text AS object, p.prokind AS kind,
               CASE WHEN p.prokind <> 'a' THEN pg_get_functiondef(p.oid) END AS definition,
               p.proacl::text AS privileges, obj_description(p.oid, 'pg_proc') AS comment
          FROM pg_proc p
         WHERE p.pronamespace = %(schema)s::regnamespace
         ORDER BY 1""",
    "trigger": """
        SELECT c.relname || '.' || t.tgname AS object, pg_get_triggerdef(t.oid) AS definition,
               t.tgenabled AS enabled
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = %(schema)s::regnamespace AND NOT t.tgisinternal
         ORDER BY c.relname, t.tgname""",
    "rule": """
        SELECT tablename || '.' || rulename AS object, definition
          FROM pg_rules WHERE schemaname = %(schema)s ORDER BY 1""",
    "policy": """
        SELECT tablename || '.' || policyname AS object, permissive, roles::text, cmd, qual, with_check
          FROM pg_policies WHERE schemaname = %(schema)s ORDER BY 1""",
}


def describe(conn: Connection) -> list[str]:
    """The schema's description as lines: ``section object: name=value ...`` per object (values
    that are NULL or empty left out), the lines of a multi-line definition indented below."""
    lines = []
    for section, query in DESCRIBE.items():
        cursor = conn.execute(query, {"schema": SCHEMA})
        names = [column.name for column in cursor.description or ()]
        for name, *values in cursor:
            settings = [
                f"{key}={value}" for key, value in zip(names[1:], values, strict=True) if value not in (None, "", [])
            ]
            text = f"{section} {name}: " + " ".join(settings)
            lines.extend(text.replace("\n", "\n    ").splitlines())
    return lines


def apply_schema_file(dsn: str) -> None:
    with connect(dsn, purpose="test") as conn, conn.transaction():
        conn.execute(_PIN_SEARCH_PATH)
        conn.execute(SCHEMA_FILE.read_text(encoding="utf-8").encode())


@pytest.fixture
def second_fresh_database(server_dsn: str) -> Iterator[str]:
    """Another empty, unmigrated database (as ``fresh_database``), so that one test has two."""
    dsn = testing_db.create_database(server_dsn, prefix="miniqueue_fresh", migrate=False)
    yield dsn
    testing_db.drop_database(server_dsn, dsn)


def drop_history_partitions(conn: Connection) -> None:
    """Drop the history's partitions by finish time that migrate made: they depend on the clock,
    and schema.sql leaves them out."""
    for (name,) in conn.execute("DELETE FROM miniqueue_history_partitions RETURNING name").fetchall():
        conn.execute(f'DROP TABLE "{name}"')


def test_schema_file_is_the_schema_the_migrations_build(fresh_database: str, second_fresh_database: str) -> None:
    run_migrations(fresh_database)
    apply_schema_file(second_fresh_database)
    with connect(fresh_database, purpose="test") as conn:
        drop_history_partitions(conn)
        migrated = describe(conn)
    with connect(second_fresh_database, purpose="test") as conn:
        from_file = describe(conn)

    assert any(line.startswith("relation miniqueue_jobs:") for line in migrated), "the description finds the jobs"
    if from_file != migrated:
        diff = difflib.unified_diff(migrated, from_file, "the migrations", SCHEMA_FILE.name, lineterm="")
        pytest.fail("schema.sql does not build the schema the migrations build:\n" + "\n".join(diff))


def test_schema_file_is_as_of_the_latest_migration() -> None:
    """A migration that changes no catalog (an UPDATE, an ANALYZE) still makes schema.sql name it,
    so that whoever adds one reads this file and brings it up to date."""
    latest = load_migrations()[-1]
    latest_file = f"{latest.version:03d}_{latest.name}.sql"
    stated = re.search(r"as of migration (\d{3}) \((\w+\.sql)\)", SCHEMA_FILE.read_text(encoding="utf-8"))
    assert stated, "schema.sql says which migration it is as of: 'as of migration NNN (NNN_name.sql)'"
    assert (int(stated[1]), stated[2]) == (latest.version, latest_file), (
        f"schema.sql is as of migration {stated[1]} ({stated[2]}), but the latest is {latest_file}: "
        "write what it changes into schema.sql, then name it there"
    )
