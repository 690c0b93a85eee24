"""Every statement the store runs, as a reviewer reads it, and the one row shape mapped by
position (the claim's) pinned to the Lease it fills; the fence in every worker-side write, and the
counts and settling in every statement that finishes jobs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from miniqueue.core.db import Connection
from miniqueue.core.records import Lease
from miniqueue.store.base import Statement, Statements
from miniqueue.store.claim import load_statements
from miniqueue.store.insertion import HOLDS_UNIQUE_KEY
from miniqueue.store.store import Store

SNAPSHOT = Path(__file__).parents[1] / "sql" / "store.sql"
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
# The statements that say which job holds a unique key (as the unique index's predicate does).
HOLDING = ["_enqueue_keyed", "_enqueue_replacing", "_holder", "_enqueue_many_keyed"]


def test_every_statement_that_says_who_holds_a_unique_key_says_it_as_the_unique_index_does() -> None:
    """An ON CONFLICT names the partial unique index by its predicate, word for word; the
    statements that look up a key's holder read it the same way."""
    store = Store("public")
    migration = (Path(__file__).parents[2] / "migrations" / "021_unique_sequences_expiry.sql").read_text()
    index = migration[migration.index("CREATE UNIQUE INDEX idx_miniqueue_jobs_unique_key") :].split(";")[0]
    assert index.endswith(HOLDS_UNIQUE_KEY)
    for name in HOLDING:
        assert HOLDS_UNIQUE_KEY in getattr(store, name), name


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
        "lease_duration": 30.0,
        "limit": 1,
        "queue": "q",
        "queues": ["q", "r"],
        "ids": [],
        "attempts": [],
        "after": [],
        "groups": 2,
        "scan": 68,
        "needed": 1,
        "results": [],
        "keep": [],
        "tasks": None,
        "together": 1,
    }
    # The ids completed and those taken together, then the lease's fields (but whether it was
    # taken together), then its turn.
    for name in CLAIMS:
        cur = conn.execute(getattr(store, name), {**params, "shared": name.startswith("_claim_many")})
        assert cur.description is not None
        assert [column.name for column in cur.description][2:] == [*Lease._fields[:-1], "turn"]


def test_every_worker_side_write_is_fenced_and_every_finishing_statement_counts_and_settles() -> None:
    """The fence is in every worker-side transition; the statements that finish jobs count them
    and settle them (store/finishing.py), those that remove finished jobs count them off, and no
    other statement does either."""
    store = Store("public")
    for name in FENCED:
        assert "AND state = 'running' AND leased_by = %(worker)s" in getattr(store, name), name
    for name in store.statement_names():
        text = str(getattr(store, name))
        assert ("counted AS (" in text) == (name in FINISHING + REMOVING), name
        assert ("counted AS (" in text and "-count(*)" in text) == (name in REMOVING), name
        assert ("per_minute AS (" in text) == (name in FINISHING), name
        assert ("settled AS (" in text) == (name in [*FINISHING, "_delete"]), name
        assert ("unkeyed AS (" in text) == (name in UNKEYING), name


def test_every_entry_of_the_error_history_has_one_shape() -> None:
    """The history's readers (jobs show, the timeline) read each entry's fields by name."""
    store = Store("public")
    entry = re.compile(
        r"jsonb_build_object\(\s*'attempt', (?:j\.)?attempt, 'started', (?:j\.)?started_at, 'at', now\(\)"
    )
    for name in WITH_HISTORY:
        assert entry.search(getattr(store, name)), name


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
