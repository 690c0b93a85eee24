"""Every statement the store runs, as a reviewer reads it, and the one row shape mapped by
position (the claim's) pinned to the Lease it fills."""

from __future__ import annotations

import os
from pathlib import Path

from miniqueue.core.db import Connection
from miniqueue.core.records import Lease
from miniqueue.store.store import Store

SNAPSHOT = Path(__file__).parent / "sql" / "store.sql"
#: Set to 1 to rewrite the snapshot after changing a statement (then read the diff).
UPDATE = "MINIQUEUE_UPDATE_SQL_SNAPSHOT"


def rendered(store: Store) -> str:
    """Each statement's final text under its attribute name, in the order the store builds them."""
    parts = []
    for name, value in vars(store).items():
        statements = value if isinstance(value, list) else [value]
        for i, text in enumerate(statements):
            if isinstance(text, str) and name.startswith("_"):
                label = f"{name}[{i}]" if isinstance(value, list) else name
                parts.append(f"-- {label}\n{text.strip()};\n")
    return "\n".join(parts)


def test_every_statement_matches_its_snapshot() -> None:
    text = rendered(Store("public"))
    if os.environ.get(UPDATE) == "1":
        SNAPSHOT.write_text(text)
    assert text == SNAPSHOT.read_text(), (
        f"a statement changed: rerun with {UPDATE}=1 to rewrite {SNAPSHOT.name}, and review its diff"
    )


def test_a_schema_qualifies_every_table() -> None:
    text = rendered(Store("tenant_a"))
    assert '"public"' not in text
    assert text.count('"tenant_a"."miniqueue_jobs"') == rendered(Store("public")).count('"public"."miniqueue_jobs"')


def test_the_claims_columns_are_the_leases_fields(store: Store, conn: Connection) -> None:
    params = {"worker": "w", "lease": 30.0, "limit": 1, "queue": "q", "queues": ["q", "r"], "ids": [], "attempts": [],
              "after": [], "groups": 2, "scan": 68, "kept": 1, "results": []}
    for query, skip in ((store._claim_one, 0), (store._claim_many, 0), (store._complete_and_claim_one, 1),
                        (store._complete_and_claim_many, 1)):  # fmt: skip
        cur = conn.execute(query, params)
        assert cur.description is not None
        assert [column.name for column in cur.description][skip:] == list(Lease._fields)
