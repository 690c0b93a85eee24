"""Every statement the store runs, as a reviewer reads it, and the one row shape mapped by
position (the claim's) pinned to the Lease it fills; the parts written out in several statements
kept identical, and the claim's forms different only where claim.sql says."""

from __future__ import annotations

import os
import re
from pathlib import Path

from miniqueue.core.db import Connection
from miniqueue.core.records import Lease
from miniqueue.store.base import Statement, Statements
from miniqueue.store.claim import load_statements
from miniqueue.store.keyed import HELD
from miniqueue.store.store import Store

SNAPSHOT = Path(__file__).parent / "sql" / "store.sql"
#: Set to 1 to rewrite the snapshot after changing a statement (then read the diff).
UPDATE = "MINIQUEUE_UPDATE_SQL_SNAPSHOT"

CLAIMS = ["_claim_one", "_claim_many", "_claim_one_down", "_claim_many_down"]
# The statements that finish jobs (and count them, and settle them), and those that remove
# finished ones (and count them off).
FINISHING = ["_complete", "_record_failures", "_fail", "_recover", "_expire", "_cancel", *CLAIMS]
REMOVING = ["_requeue", "_prune", "_prune_defaults", "_delete"]
#: The statements that delete finished jobs, and with them their idempotency keys (`unkeyed`).
UNKEYING = ["_prune", "_prune_defaults", "_delete"]
# The worker-side transitions, fenced; those that add to a job's error history.
FENCED = ["_complete", "_renew", "_record_failures", "_fail", "_snooze", "_release", *CLAIMS]
WITH_HISTORY = ["_record_failures", "_fail", "_release", "_recover", "_expire"]
# The enqueues that create the rows of the limits their jobs name; those that say which job holds
# a unique key (as the unique index's predicate does).
LIMITED = [
    "_enqueue_limited",
    "_enqueue_waiting_limited",
    "_enqueue_many_limited",
    "_enqueue_keyed",
    "_enqueue_replacing",
    "_enqueue_many_keyed",
]
HOLDING = ["_enqueue_keyed", "_enqueue_replacing", "_holder", "_enqueue_many_keyed"]


def test_every_statement_that_says_who_holds_a_unique_key_says_it_as_the_unique_index_does() -> None:
    """An ON CONFLICT names the partial unique index by its predicate, word for word; the
    statements that look up a key's holder read it the same way."""
    store = Store("public")
    migration = (Path(__file__).parent.parent / "migrations" / "021_unique_sequences_expiry.sql").read_text()
    index = migration[migration.index("CREATE UNIQUE INDEX idx_miniqueue_jobs_unique_key") :].split(";")[0]
    assert index.endswith(HELD)
    for name in HOLDING:
        assert HELD in getattr(store, name), name


def rendered(store: Store) -> str:
    """Each statement's final text under its attribute name, in the order the store declares them."""
    parts = []
    for name in store.statement_names():
        value = getattr(store, name)
        statements = value if isinstance(value, list) else [value]
        for i, text in enumerate(statements):
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
    params = {
        "worker": "w",
        "lease": 30.0,
        "limit": 1,
        "queue": "q",
        "queues": ["q", "r"],
        "ids": [],
        "attempts": [],
        "after": [],
        "groups": 2,
        "scan": 68,
        "kept": 1,
        "results": [],
        "tasks": None,
    }
    for name in CLAIMS:  # the ids completed, then the lease's fields
        cur = conn.execute(getattr(store, name), {**params, "shared": name.startswith("_claim_many")})
        assert cur.description is not None
        assert [column.name for column in cur.description][1:] == list(Lease._fields)


def _copies(store: Store, pattern: str, names: list[str]) -> dict[str, str]:
    """Each named statement's one copy of a part (what ``pattern``'s group finds), with the CTE
    it reads (``FROM <name>``) and the table alias ``j.`` left out."""
    copies = {}
    for name in names:
        found = re.findall(pattern, getattr(store, name), re.DOTALL)
        assert len(found) == 1, f"{name} has {len(found)} copies of {pattern!r}, not one"
        copies[name] = re.sub(r"FROM \w+", "FROM <rows>", found[0]).replace("j.", "")
    return copies


def _as_counted_on(counted: str) -> str:
    """A `counted` that takes jobs off the counts, in the hours they finished in, written as one
    that counts them on, in this hour (the two differ in these three places alone)."""
    hour = "date_trunc('hour', finished_at, 'UTC')"
    return counted.replace(f"{hour}, -count(*)", "date_trunc('hour', now(), 'UTC'), count(*)").replace(
        f"GROUP BY queue, state, {hour}", "GROUP BY queue, state"
    )


def test_the_parts_written_in_several_statements_stay_identical() -> None:
    store = Store("public")
    parts = {
        "counted": (r"counted AS \((.*?RETURNING 1)\)", FINISHING + REMOVING),
        "per_minute": (r"per_minute AS \((.*?RETURNING 1)\)", FINISHING),
        "settled": (r"settled AS \((.*?>= 0)\)", [*FINISHING, "_delete"]),
        "the fence": (r"(AND state = 'running' AND leased_by = %\(worker\)s)", FENCED),
        "the history entry": (
            r"(errors = \S*errors \|\| jsonb_build_array\(jsonb_build_object\(.*?'error', )",
            WITH_HISTORY,
        ),
        "the limits' rows": (r"scoped AS \((.*?)\n\)", LIMITED),
        "a single job's sequence row": (r"sequenced AS \((.*?)\n\)", ["_enqueue_keyed", "_enqueue_replacing"]),
        "the keys let go": (r"unkeyed AS \(\n    DELETE FROM \S+ k USING \w+ (gone .*?)\n\)", UNKEYING),
    }
    for part, (pattern, names) in parts.items():
        copies = _copies(store, pattern, names)
        if part == "counted":  # a statement that removes finished jobs counts them off, in their hour
            assert all(("-count(*)" in copy) == (name in REMOVING) for name, copy in copies.items())
            copies = {name: _as_counted_on(copy) for name, copy in copies.items()}
        assert len(set(copies.values())) == 1, f"the copies of {part} differ: {copies}"
    for name in store.statement_names():  # and no other statement has one it should not
        text = str(getattr(store, name))
        assert ("counted AS (" in text) == (name in FINISHING + REMOVING), name
        assert ("settled AS (" in text) == (name in [*FINISHING, "_delete"]), name


def test_claim_sql_is_read_as_written() -> None:
    """A statement of claim.sql is the text after its name and comment, up to the next one."""
    text = "-- header\n\n-- name: a\n-- what a does\nSELECT 1\n  FROM t \n\n-- name: b\n-- b\n--\nSELECT 2\n"
    assert load_statements(text) == {"a": "\nSELECT 1\n  FROM t \n", "b": "\nSELECT 2\n"}


def test_the_store_names_the_arguments_of_the_functions_it_calls() -> None:
    """Each call of a function of the migrations names every argument (the migrations' names:
    013 for miniqueue_settle, 020 for miniqueue_retry_delay), so that it reads without them."""
    text = rendered(Store("public"))
    arguments = {
        '"public"."miniqueue_settle"(': [
            "notify_ids",
            "released",
            "cancel_children",
            "cancel_parents",
            "cancel_states",
            "channel",
            "queue_channel",
        ],
        '"public"."miniqueue_retry_delay"(': ["task", "attempt", "default_base", "default_cap"],
    }
    for function, names in arguments.items():
        calls = text.count(function)
        assert calls > 0
        for name in names:
            assert len(re.findall(rf"\b{name} => ", text)) == calls, f"{function} called without {name} => "


def test_no_two_parts_of_the_store_name_a_statement_alike() -> None:
    """Each part's statements are attributes of the one Store: two parts that named one alike
    would each run the other's (the later base silently wins)."""
    seen: dict[str, str] = {}
    clashes = []
    for part in Store.__mro__:
        for name, value in vars(part).items():
            if isinstance(value, (Statement, Statements)):
                if name in seen:
                    clashes.append(f"{name}: {seen[name]} and {part.__name__}")
                seen[name] = part.__name__
    assert not clashes
