"""Bad input: a clear InvalidInput naming the value and the rule, and nothing stored."""

from __future__ import annotations

import datetime as dt
import json
import re
import traceback
from typing import Any

import psycopg
import pytest

from miniqueue import Client, ConfigError, DatabaseUnavailable, InvalidInput, JobSpec
from miniqueue.core.db import Connection, check_dsn, mask_dsn, translate_errors
from miniqueue.core.validation import encode_payload
from miniqueue.store.store import Store

from ..helpers import count, row

UTC = dt.timezone.utc
PASSWORD = "hunter2-s3cret"


def rejected(client: Client, conn: Connection, spec: JobSpec, *fragments: str) -> str:
    """Enqueue ``spec`` one by one and as a batch; both must raise InvalidInput whose message
    holds every fragment, and store nothing. Return the single-job message."""
    with pytest.raises(InvalidInput) as single:
        client.enqueue(
            spec.task,
            spec.payload,
            queue=spec.queue,
            priority=spec.priority,
            run_at=spec.run_at,
            delay=spec.delay,
            max_attempts=spec.max_attempts,
            idempotency_key=spec.idempotency_key,
        )
    message = str(single.value)
    for fragment in fragments:
        assert fragment.lower() in message.lower(), f"{fragment!r} not in {message!r}"
    assert count(conn) == 0

    good = JobSpec("fine", {"ok": True})
    with pytest.raises(InvalidInput) as batch:
        client.enqueue_many([good, good, spec, good])
    assert str(batch.value).startswith("job 2: "), "the batch error names the index of the bad job"
    for fragment in fragments:
        assert fragment.lower() in str(batch.value).lower()
    assert count(conn) == 0, "one bad job stores none of the batch"
    return message


# --- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "queue",
    ["", "x" * 65, "x'; drop", "Emails", "with space", "tab\t", "new\nline", "ünïcode", "semi;colon", "dot.ted"],
)
def test_bad_queue_name(client: Client, conn: Connection, queue: str) -> None:
    rejected(client, conn, JobSpec("t", queue=queue), f"queue name {queue!r}", "1-64 characters")


@pytest.mark.parametrize("task", ["", "x'; drop", "has space", "slash/ed", "nul\x00", "back\\slash"])
def test_bad_task_name(client: Client, conn: Connection, task: str) -> None:
    rejected(client, conn, JobSpec(task), f"task name {task!r}", "1-128 characters")


def test_task_name_too_long(client: Client, conn: Connection) -> None:
    task = "t" * 129
    rejected(client, conn, JobSpec(task), "task name 'tttttttttt", "1-128 characters")


def test_longest_names_are_accepted(client: Client, conn: Connection) -> None:
    result = client.enqueue("T" * 128, queue="q" * 64)
    assert (row(conn, result.id)["task"], row(conn, result.id)["queue"]) == ("T" * 128, "q" * 64)


# --- payloads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "named"),
    [({"when": dt.date(2024, 1, 1)}, "date"), ({1, 2}, "set"), ({"obj": object()}, "object"), ({(1, 2): "k"}, "tuple")],
)
def test_payload_not_json_serialisable(client: Client, conn: Connection, payload: Any, named: str) -> None:
    rejected(client, conn, JobSpec("t", payload), "not JSON-serialisable", named)


def test_circular_payload(client: Client, conn: Connection) -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    rejected(client, conn, JobSpec("t", loop), "not JSON-serialisable", "circular")


def test_payload_nested_too_deeply(client: Client, conn: Connection) -> None:
    deep: list[Any] = []
    for _ in range(50_000):
        deep = [deep]
    rejected(client, conn, JobSpec("t", deep), "not JSON-serialisable", "nested too deeply")


@pytest.mark.parametrize(
    "payload",
    [
        {"a": [1, 2.5, True, None], "é": "ünïcødé ✓"},
        {2: "int key", True: "bool key", None: "none key"},
        "just a string",
        7,
        [],
        {"nested": {"deeper": [{"x": -1e300}]}},
        {"s": "tab\there\nnewline \\ back"},
    ],
)
def test_payload_encoding_is_compact_json_as_json_dumps_writes_it(payload: Any) -> None:
    expected = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    assert encode_payload(payload) == expected


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"x": float("nan")}, "nan"),
        ([1.0, float("inf")], "inf"),
        ({"deep": [{"v": float("-inf")}]}, "inf"),
    ],
)
def test_payload_nan_and_infinity(client: Client, conn: Connection, payload: Any, named: str) -> None:
    rejected(client, conn, JobSpec("t", payload), "JSON", named)


@pytest.mark.parametrize("payload", [{"s": "a\u0000b"}, ["\u0000"], {"key\u0000": 1}, "\\\u0000"])
def test_payload_with_nul_character(client: Client, conn: Connection, payload: Any) -> None:
    rejected(client, conn, JobSpec("t", payload), "U+0000")


def test_payload_with_escaped_backslash_u0000_text_is_accepted(client: Client, conn: Connection) -> None:
    text = "C:\\u0000\\dir and \\\\u0000"  # backslashes followed by the text u0000, no NUL
    result = client.enqueue("t", {"path": text, "\\u0000": "key"})
    assert row(conn, result.id)["payload"] == {"path": text, "\\u0000": "key"}


def test_payload_with_lone_surrogate(client: Client, conn: Connection) -> None:
    # Not encodable as UTF-8, so PostgreSQL cannot store it either.
    rejected(client, conn, JobSpec("t", {"s": "\ud800"}), "payload")


def test_payload_over_the_size_limit(dsn: str, conn: Connection) -> None:
    with Client(dsn, max_payload_bytes=64) as small:
        at_limit = {"s": "x" * 56}  # {"s":"..."} is 8 bytes of JSON around the string
        assert small.enqueue("t", at_limit).id
        assert count(conn) == 1
        conn.execute("TRUNCATE miniqueue_jobs")
        rejected(small, conn, JobSpec("t", {"s": "x" * 57}), "65 bytes", "limit is 64 bytes")
        rejected(small, conn, JobSpec("t", {"s": "é" * 40}), "88 bytes", "limit is 64 bytes")


def test_default_size_limit_is_one_mebibyte(client: Client, conn: Connection) -> None:
    rejected(client, conn, JobSpec("t", "x" * (1024 * 1024)), f"{1024 * 1024 + 2} bytes", "limit is 1048576 bytes")


# --- numbers, schedules, keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"priority": 32768}, ("priority 32768", "-32768 to 32767")),
        ({"priority": -32769}, ("priority -32769", "-32768 to 32767")),
        ({"priority": True}, ("priority True", "whole number")),
        ({"priority": 1.5}, ("priority 1.5", "whole number")),
        ({"priority": "5"}, ("priority '5'", "whole number")),
        ({"max_attempts": 0}, ("max_attempts 0", "from 1")),
        ({"max_attempts": -3}, ("max_attempts -3", "from 1")),
        ({"max_attempts": False}, ("max_attempts False", "whole number")),
        ({"max_attempts": 1001}, ("max_attempts 1001", "to 1000")),
    ],
)
def test_bad_numbers(client: Client, conn: Connection, options: dict[str, Any], fragments: tuple[str, ...]) -> None:
    rejected(client, conn, JobSpec("t", **options), *fragments)


def test_naive_run_at(client: Client, conn: Connection) -> None:
    naive = dt.datetime(2030, 1, 2, 3, 4, 5)
    rejected(client, conn, JobSpec("t", run_at=naive), "2030-01-02T03:04:05", "naive", "timezone")


def test_run_at_that_is_not_a_datetime(client: Client, conn: Connection) -> None:
    rejected(client, conn, JobSpec("t", run_at="2030-01-01T00:00:00Z"), "run_at '2030-01-01T00:00:00Z'", "timezone")  # type: ignore[arg-type]


def test_run_at_and_delay_together(client: Client, conn: Connection) -> None:
    rejected(client, conn, JobSpec("t", run_at=dt.datetime.now(UTC), delay=5), "run_at and delay", "mutually exclusive")


@pytest.mark.parametrize(
    ("delay", "shown"),
    [
        (-1, "delay -1"),
        (-0.001, "delay -0.001"),
        (dt.timedelta(seconds=-5), "delay datetime.timedelta"),
        (float("nan"), "delay nan"),
        (float("inf"), "delay inf"),
        (True, "delay True"),
    ],
)
def test_bad_delay(client: Client, conn: Connection, delay: Any, shown: str) -> None:
    rejected(client, conn, JobSpec("t", delay=delay), shown, "non-negative number of seconds")


@pytest.mark.parametrize("delay", [1e13, 1e300, dt.timedelta(days=999_999_999)])
def test_delay_beyond_any_representable_time(client: Client, conn: Connection, delay: Any) -> None:
    # now() + delay overflows PostgreSQL's timestamp range: that must be a clear InvalidInput,
    # not a DataError from the insert.
    rejected(client, conn, JobSpec("t", delay=delay), "delay")


@pytest.mark.parametrize("key", ["", "k" * 256, "nul\x00key"])
def test_bad_idempotency_key(client: Client, conn: Connection, key: str) -> None:
    rejected(client, conn, JobSpec("t", idempotency_key=key), "idempotency key", "1-255 characters")


def test_longest_idempotency_key_is_accepted(client: Client, conn: Connection) -> None:
    result = client.enqueue("t", idempotency_key="k" * 255)
    assert row(conn, result.id)["idempotency_key"] == "k" * 255


def test_batch_error_names_the_index_of_the_first_bad_job(client: Client, conn: Connection) -> None:
    specs = [JobSpec("t", {"i": i}) for i in range(1000)]
    specs[637] = JobSpec("t", {"i": float("nan")})
    specs[900] = JobSpec("t", queue="")
    with pytest.raises(InvalidInput, match=r"^job 637: payload"):
        client.enqueue_many(specs)
    assert count(conn) == 0


def test_a_bad_job_late_in_a_streamed_batch_leaves_the_callers_transaction_intact(
    client: Client, conn: Connection, dsn: str
) -> None:
    # A large batch without keys streams by COPY, each job checked as it is sent: the bad one
    # aborts the COPY after 1,999 rows went to the server, and only the batch is undone.
    specs = [JobSpec("t", {"i": i}) for i in range(2000)]
    specs[-1] = JobSpec("t", run_at=dt.datetime(2030, 1, 1))  # naive
    with psycopg.connect(dsn) as own:
        mine = client.enqueue("t", {"mine": True}, conn=own)
        with pytest.raises(InvalidInput, match=r"^job 1999: run_at .* naive"):
            client.enqueue_many(specs, conn=own)
        after = client.enqueue("t", {"after": True}, conn=own)
        own.commit()
    assert count(conn) == 2
    assert row(conn, mine.id)["payload"] == {"mine": True}
    assert row(conn, after.id)["payload"] == {"after": True}


# --- DSNs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://alice:{PASSWORD}@[::1/app",  # unterminated IPv6 host: libpq echoes the URI
        f"postgresql://alice:{PASSWORD}@db.example.com:54x2/app",
        f"postgresql://alice:{PASSWORD}@db.example.com/app?bogus",
        f"postgresql://alice:{PASSWORD}@db.example.com/app?password={PASSWORD}&x",
        f"host=db.example.com password={PASSWORD} port=seventy",
        f"host=db.example.com password='{PASSWORD} with space' junk",
        f"host=db.example.com password = {PASSWORD} dbname",
        f"postgresql:/alice:{PASSWORD}@db.example.com/app",  # one slash short of a URL
        f"postgres//alice:{PASSWORD}@db.example.com/app",
    ],
)
def test_unparseable_dsn_raises_config_error_without_the_password(dsn: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_dsn(dsn)
    shown = "".join(traceback.format_exception(raised.value))
    assert "invalid" in str(raised.value)
    assert PASSWORD not in shown, shown
    assert PASSWORD not in repr(raised.value.args)


def test_client_with_an_unparseable_dsn_raises_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as raised:
        Client(f"postgresql://alice:{PASSWORD}@db.example.com:notaport/app")
    assert "port 'notaport'" in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_empty_dsn() -> None:
    with pytest.raises(ConfigError, match="empty"):
        check_dsn("  ")


def test_valid_dsn_parses() -> None:
    assert check_dsn("postgresql://alice:pw@db.example.com:5433/app")["port"] == "5433"
    assert check_dsn("host=/tmp dbname=app")["dbname"] == "app"


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (f"postgresql://alice:{PASSWORD}@db.example.com/app", "postgresql://alice:***@db.example.com/app"),
        (f"postgres://:{PASSWORD}@db/app", "postgres://:***@db/app"),
        (f"postgresql://alice:pa:ss/{PASSWORD}@db/app", "postgresql://alice:***@db/app"),
        ("postgresql://alice@db.example.com/app", "postgresql://alice@db.example.com/app"),
        (f"host=db password={PASSWORD} user=alice", "host=db password=*** user=alice"),
        (f"host=db PASSWORD = '{PASSWORD} x\\'y' user=alice", "host=db PASSWORD = *** user=alice"),
        (f"postgresql://db/app?user=alice&password={PASSWORD}", "postgresql://db/app?user=alice&password=***"),
        ("host=db user=alice", "host=db user=alice"),
    ],
)
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


#: (dsn, every form of its password that must never be shown)
PASSWORD_FORMS = [
    # libpq reads host "app", port "S3cret@x" (decoded) and database "word@127.0.0.1:1/db".
    ("postgresql://app:S3cret%40x/word@127.0.0.1:1/db", ["S3cret", "S3cret@x", "S3cret%40x", "x/word"]),
    ("postgresql://app:ab/Cdefgh@db.example/app", ["Cdefgh", "'ab'"]),  # a 2-character piece read as port
    ("postgresql://app:Pass%20Word@[::1/app", ["Pass", "Pass Word", "Pass%20Word"]),  # echoed whole
    ("postgresql://app:Pa ss@db.example/app", ["Pa ss", '"Pa']),  # spaces: "unexpected spaces found in ..."
    ("postgresql://app:Pa%zzss@db.example/app", ["Pa%zzss"]),  # "invalid percent-encoded token: ..."
    ("postgresql://db.example/app?pass%77ord=Hid%64en&bogus", ["Hidden", "Hid%64en"]),
    ("host=db.example password=Two Words", ['"Words"', "Two"]),  # libpq: missing "=" after "Words"
    ("host=db.example password=Two wd", ['"wd"', "Two"]),  # ... after "wd", too short to find anywhere
]


@pytest.mark.parametrize(("dsn", "forms"), PASSWORD_FORMS)
def test_no_form_of_the_password_reaches_a_dsn_error(dsn: str, forms: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        check_dsn(dsn)
    message = str(raised.value)
    assert "is invalid" in message
    for form in forms:
        assert form not in message, message
    assert re.search(r"(?<!pass)word", message) is None, message


def test_the_port_error_names_a_port_that_is_not_part_of_the_password() -> None:
    with pytest.raises(ConfigError, match=r"port 'nope' is not a number from 1 to 65535"):
        check_dsn("postgresql://app:pw@db.example:nope/app")
    with pytest.raises(ConfigError, match=r"the port is not a number .*: it is part of the password"):
        check_dsn("postgresql://app:S3cret%40x/word@127.0.0.1:1/db")


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("not a url", 'missing "=" after "not" in connection info string'),
        ("host=db.example nosuch=1", 'invalid connection option "nosuch"'),
        (
            "postgresql://alice:pw@db.example/app?bogus",
            'missing key/value separator "=" in URI query parameter: "bogus"',
        ),
    ],
)
def test_a_dsn_error_keeps_the_parsers_reason(dsn: str, reason: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_dsn(dsn)
    assert reason in str(raised.value)
    assert "use postgresql://user:password@host:port/dbname" in str(raised.value)


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://app:Pa ss@db/app", "postgresql://app:***@db/app"),
        ("postgresql://db/app?pass%77ord=Hidden&user=a", "postgresql://db/app?pass%77ord=***&user=a"),
        ("host=db password=Two Words user=alice", "host=db password=*** user=alice"),
        ("host=db password=pw user = alice", "host=db password=*** user = alice"),
    ],
)
def test_mask_dsn_hides_every_way_of_writing_a_password(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


def test_an_unreachable_database_error_hides_the_password_pieces(dsn: str) -> None:
    # The password's "/" ends the host early, and the port parsed from it is a number: libpq
    # tries host "app", port 5432, and may name any of those pieces in its error.
    with pytest.raises(DatabaseUnavailable) as raised:
        Client("postgresql://app:5432/Secretpart@127.0.0.1:1/db?connect_timeout=2")
    assert "Secretpart" not in str(raised.value)
    assert "5432/" not in str(raised.value)


# --- values the database cannot take ----------------------------------------------------------------


def test_a_number_out_of_a_columns_range_is_invalid_input(store: Store, conn: Connection) -> None:
    # psycopg's DataError is translated where every error is: nothing was stored.
    with pytest.raises(
        InvalidInput, match='the database rejected a value: value "18446744073709551616" is out of range'
    ):
        store.cancel(conn, [2**64])
    with pytest.raises(InvalidInput, match="the database rejected a value"):
        store.requeue(conn, [2**63])


@pytest.mark.parametrize("call", ["cancel", "requeue"])
@pytest.mark.parametrize("job_id", [2**64, 2**63, 0, -1])
def test_client_checks_job_ids(client: Client, call: str, job_id: int) -> None:
    with pytest.raises(InvalidInput, match=f"job id {job_id} is invalid: use a whole number from 1 to {2**63 - 1}"):
        getattr(client, call)([job_id])
    with pytest.raises(InvalidInput, match=f"job id {job_id} is invalid"):
        client.get(job_id)


def test_a_lone_surrogate_that_reaches_the_driver_is_invalid_input(store: Store, conn: Connection) -> None:
    # The store's filters take any text; psycopg fails to encode it before anything is sent.
    with pytest.raises(InvalidInput, match=r"'\\udcff' is invalid: a lone surrogate"):
        store.list_jobs(conn, search="\udcff")
    with pytest.raises(InvalidInput, match=r"the database rejected a value: .* NUL"):
        store.list_jobs(conn, search="a\x00b")
    assert store.list_jobs(conn) == []


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (JobSpec("t\udcff"), "task name"),
        (JobSpec("t", queue="q\udcff"), "queue name"),
        (JobSpec("t", {"s": "\udcff"}), "lone surrogate"),
        (JobSpec("t", {"k\udcff": 1}), "lone surrogate"),
        (JobSpec("t", idempotency_key="k\udcff"), "idempotency key 'k\\udcff' is invalid"),
    ],
)
@pytest.mark.parametrize("size", [10, 600], ids=["insert", "copy"])
def test_a_lone_surrogate_in_a_batch_names_the_job_and_stores_nothing(
    client: Client, conn: Connection, spec: JobSpec, named: str, size: int
) -> None:
    # 600 jobs without keys go by COPY; a key sends the batch by INSERT whatever its size.
    specs = [JobSpec("t", {"i": i}) for i in range(size)]
    specs[size - 3] = spec
    with pytest.raises(InvalidInput, match=rf"^job {size - 3}: .*{re.escape(named)}"):
        client.enqueue_many(specs)
    assert count(conn) == 0


def test_a_program_limit_is_refused_input_never_database_unavailable(conn: Connection) -> None:
    """A statement the server refuses for its size (SQLSTATE class 54, such as an aggregate past
    jsonb's limit) would fail again on any connection: it is not an outage to retry."""
    too_many_arguments = "SELECT concat(" + ", ".join(["1"] * 101) + ")"
    refused = "the database refused the statement: cannot pass more than 100"
    with pytest.raises(InvalidInput, match=refused), translate_errors():
        conn.execute(too_many_arguments)
    assert conn.execute("SELECT 1").fetchone() == (1,), "the connection is fine"
