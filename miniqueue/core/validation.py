"""Input rules, checked before a job reaches the database, so that a bad value stores nothing.

Each check raises :class:`~miniqueue.core.errors.InvalidInput` with a message naming the value and
the rule it broke.
"""

from __future__ import annotations

import datetime as dt
import json
import json.encoder
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from .errors import InvalidInput
from .keys import NO_KEYS, JobKeys, check_keys, computed_key_error, declared_keys, show
from .limits import Scope, check_rate_cost, job_scopes
from .records import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, JobSpec, TaskDeclaration

QUEUE_NAME_RE = re.compile(r"[a-z0-9_-]{1,64}")
QUEUE_NAME_RULE = "use 1-64 characters of a-z, 0-9, '_' or '-'"
TASK_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
TASK_NAME_RULE = "use 1-128 characters of A-Z, a-z, 0-9, '_', '.', ':' or '-'"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
PRIORITY_RANGE = (-32768, 32767)  # the column is a SMALLINT
MAX_ATTEMPTS_RANGE = (1, 1000)
JOB_ID_RANGE = (1, 2**63 - 1)  # the column is a BIGINT, filled from a sequence starting at 1
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
# 100 years: far beyond any sane schedule, far inside PostgreSQL's timestamp range.
MAX_DELAY_SECONDS = 100 * 365.25 * 86400

# An escaped NUL that is not itself an escaped backslash followed by "u0000": PostgreSQL's
# jsonb cannot store U+0000, and would reject the whole statement (or batch) at insert time.
_JSON_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)``, built once.

    json.dumps with options builds a new encoder on every call, which cost more than all the
    other checks together; the C encoder built here once is three times faster. It keeps no
    markers, so a circular payload raises RecursionError (as a too-deeply nested one does).
    """
    encoder = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # a Python without the _json accelerator
        return encoder.encode
    chunks = make(None, encoder.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    return lambda value: "".join(chunks(value, 0))


_encode_json = _json_encoder()


class NewJob(NamedTuple):
    """A validated job, its payload already encoded as JSON text, ready for the store.

    (A NamedTuple: batches build thousands of these, and a frozen dataclass's __init__
    cost more than the checks themselves.)"""

    queue: str
    task: str
    payload_json: str
    priority: int
    max_attempts: int
    run_at: dt.datetime | None
    delay_seconds: float
    idempotency_key: str | None
    #: The limits the job is subject to, in scope-name order (() for none).
    scopes: tuple[Scope, ...] = ()
    #: Its unique and sequence keys and its deadline (NO_KEYS for none).
    keys: JobKeys = NO_KEYS
    #: Tokens it takes from its rate limit's bucket when it starts.
    rate_cost: int = 1


def check_queue_name(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name, else raise InvalidInput."""
    if not isinstance(queue, str) or not QUEUE_NAME_RE.fullmatch(queue):
        raise InvalidInput(f"queue name {show(queue)} is invalid: {QUEUE_NAME_RULE}")
    return queue


def check_task_name(task: object) -> str:
    """Return ``task`` if it is a valid task name, else raise InvalidInput."""
    if not isinstance(task, str) or not TASK_NAME_RE.fullmatch(task):
        raise InvalidInput(f"task name {show(task)} is invalid: {TASK_NAME_RULE}")
    return task


def check_schedule_name(name: object) -> str:
    """Return ``name`` if it can name a periodic schedule (the rule of task names), else raise InvalidInput."""
    if not isinstance(name, str) or not TASK_NAME_RE.fullmatch(name):
        raise InvalidInput(f"schedule name {show(name)} is invalid: {TASK_NAME_RULE}")
    return name


def check_job_ids(job_ids: Iterable[object]) -> list[int]:
    """Return ``job_ids`` as a list if each is a possible job id, else raise InvalidInput naming the first bad one."""
    return [check_int_range("job id", job_id, JOB_ID_RANGE) for job_id in job_ids]


def check_text(name: str, value: str) -> str:
    """Return ``value`` if it is valid Unicode text (no lone surrogate), else raise InvalidInput.

    A lone surrogate is what Python makes of bytes that are not UTF-8 (a command-line argument,
    a file name); PostgreSQL cannot store it.
    """
    if not value.isascii():  # ASCII is the common case, and cannot hold a surrogate
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise InvalidInput(
                f"{name} {show(value)} is invalid: {bad!r} is a lone surrogate, not valid Unicode"
            ) from None
    return value


def parse_json(text: str) -> Any:
    """Parse JSON text (a payload given on the command line, say), or raise InvalidInput saying why."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("not valid JSON: it is nested too deeply to parse") from None


def check_int_range(name: str, value: object, bounds: tuple[int, int]) -> int:
    """Return ``value`` if it is an int within ``bounds`` (inclusive), else raise InvalidInput."""
    low, high = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} {show(value)} is invalid: use a whole number from {low} to {high}")
    return value


def encode_payload(payload: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode ``payload`` as compact JSON text, enforcing the payload rules.

    ``None`` becomes ``{}``. NaN and Infinity are rejected (they are not JSON), as is U+0000
    (PostgreSQL's jsonb cannot hold it), as is anything larger than ``max_bytes`` encoded.
    """
    return "{}" if payload is None else _encode_value("payload", payload, max_bytes)


def encode_result(value: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str | None:
    """Encode a handler's return value as JSON text by the payload's rules (and size limit);
    None (a handler that returns nothing) stays None: the job has no result. ``False``, ``0``,
    ``""`` and ``[]`` are results like any other."""
    return None if value is None else _encode_value("result", value, max_bytes)


def encode_value(what: str, value: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """``value`` as JSON text by the result's rules (None is JSON null), or InvalidInput naming
    ``what`` (a step's value, a signal's data)."""
    return "null" if value is None else _encode_value(what, value, max_bytes)


def _encode_value(what: str, value: Any, max_bytes: int) -> str:
    """``value`` as compact JSON text, or InvalidInput saying which rule ``what`` breaks."""
    try:
        text = _encode_json(value)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise InvalidInput(f"{what} contains a float nan, inf or -inf, which JSON cannot represent") from None
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from exc
    except TypeError as exc:
        raise InvalidInput(f"{what} is not JSON-serialisable: {exc}") from exc
    except RecursionError:
        raise InvalidInput(f"{what} is not JSON-serialisable: it is circular or nested too deeply") from None
    if "\\u0000" in text and _JSON_NUL_RE.search(text):
        raise InvalidInput(f"{what} contains the character U+0000, which PostgreSQL jsonb cannot store")
    if text.isascii():  # the common case: one byte per character, and no surrogates
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            bad = exc.object[exc.start : exc.end]
            raise InvalidInput(f"{what} contains {bad!r}, a lone surrogate that is not valid Unicode text") from None
    if size > max_bytes:
        raise InvalidInput(f"{what} is {size} bytes encoded as JSON: the limit is {max_bytes} bytes")
    return text


#: The most parents one job may wait for (a group's callback waits for each of its members).
MAX_PARENTS = 100_000


def check_depends_on(depends_on: object) -> list[int] | None:
    """Return ``depends_on`` as a list of distinct job ids (None when not given), else raise
    InvalidInput. Whether the jobs exist is checked by the store, under lock."""
    if depends_on is None:
        return None
    if isinstance(depends_on, (str, bytes)) or not isinstance(depends_on, Iterable):
        raise InvalidInput(f"depends_on {show(depends_on)} is invalid: give a list of job ids")
    ids = list(dict.fromkeys(check_int_range("depends_on job id", i, JOB_ID_RANGE) for i in depends_on))
    if not ids:
        raise InvalidInput("depends_on is empty: name at least one job, or leave it out")
    if len(ids) > MAX_PARENTS:
        raise InvalidInput(f"depends_on names {len(ids)} jobs: the limit is {MAX_PARENTS}")
    return ids


def check_idempotency_key(key: object) -> str | None:
    """Return ``key`` if it is None or a valid idempotency key, else raise InvalidInput."""
    if key is None:
        return None
    rule = f"use 1-{MAX_IDEMPOTENCY_KEY_LENGTH} characters, without U+0000"
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or "\x00" in key:
        raise InvalidInput(f"idempotency key {show(key)} is invalid: {rule}")
    return check_text("idempotency key", key)


def check_seconds(name: str, value: object, *, limit: float = MAX_DELAY_SECONDS) -> float:
    """Return a non-negative duration in seconds (at most ``limit``) from a number or a timedelta."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= limit:
        raise InvalidInput(
            f"{name} {show(value)} is invalid: use a non-negative number of seconds, at most {limit:.0f}"
        )
    return float(seconds)


def check_age_after(value: object) -> float:
    """A queue's priority aging interval: a positive number of seconds, at most ``MAX_DELAY_SECONDS``
    (NaN and infinity are neither)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DELAY_SECONDS:
        raise InvalidInput(
            f"age_after {show(value)} is invalid: use a positive number of seconds, at most {MAX_DELAY_SECONDS:.0f}"
        )
    return float(value)


def check_schedule(run_at: object, delay: object) -> tuple[dt.datetime | None, float]:
    """Validate the two ways of scheduling a job; return ``(run_at, delay_seconds)``."""
    if run_at is not None and delay is not None:
        raise InvalidInput("run_at and delay are mutually exclusive: give one or neither")
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise InvalidInput(f"run_at {show(run_at)} is invalid: use a timezone-aware datetime")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidInput(
                f"run_at {run_at.isoformat()} is a naive datetime: give it a timezone "
                "(e.g. datetime.now(timezone.utc)), since a naive time is ambiguous"
            )
        return run_at, 0.0
    return None, (0.0 if delay is None else check_seconds("delay", delay))


def declared(spec: JobSpec, declaration: TaskDeclaration | None) -> JobSpec:
    """``spec`` with what its caller left None filled from its task's ``declaration`` (or, for a
    task no app has declared, the defaults: queue ``"default"``, priority 0, 5 attempts, no
    limits). Each option the caller set wins over the declaration.

    A declared key computed from the payload by a function of the app cannot be computed without
    the app: unless the caller passes the key, that raises InvalidInput rather than enqueue a
    job that escapes its limit.
    """
    if declaration is None:
        if spec.queue is not None and spec.priority is not None and spec.max_attempts is not None:
            return spec
        return spec._replace(
            queue=DEFAULT_QUEUE if spec.queue is None else spec.queue,
            priority=DEFAULT_PRIORITY if spec.priority is None else spec.priority,
            max_attempts=DEFAULT_MAX_ATTEMPTS if spec.max_attempts is None else spec.max_attempts,
        )
    d = declaration
    filled = spec._replace(
        queue=d.queue if spec.queue is None else spec.queue,
        priority=d.priority if spec.priority is None else spec.priority,
        max_attempts=d.max_attempts if spec.max_attempts is None else spec.max_attempts,
        concurrency_key=d.concurrency_key if spec.concurrency_key is None else spec.concurrency_key,
        max_concurrent=d.max_concurrent if spec.max_concurrent is None else spec.max_concurrent,
        rate_limit=d.rate_limit if spec.rate_limit is None else spec.rate_limit,
        rate_limit_key=d.rate_limit_key if spec.rate_limit_key is None else spec.rate_limit_key,
        rate_cost=d.rate_cost if spec.rate_cost is None else spec.rate_cost,
    )
    if filled.concurrency_key is None and d.concurrency_key_computed:
        raise computed_key_error(spec.task, "concurrency_key")
    if filled.rate_limit_key is None and d.rate_limit_key_computed and filled.rate_limit is not None:
        raise computed_key_error(spec.task, "rate_limit_key")
    return filled if d.keys is None else declared_keys(filled, d.keys)


def validate(spec: JobSpec, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> NewJob:
    """Check every field of ``spec`` and return it ready for the store (what is left unset takes
    the defaults: fill it from the task's declaration first, with :func:`declared`)."""
    if spec.queue is None or spec.priority is None or spec.max_attempts is None:
        spec = declared(spec, None)
    run_at, delay_seconds = check_schedule(spec.run_at, spec.delay)
    if spec.allow_failure is not True and spec.allow_failure is not False:
        raise InvalidInput(f"allow_failure {show(spec.allow_failure)} is invalid: use True or False")
    if spec.allow_failure and spec.depends_on is None:
        raise InvalidInput("allow_failure needs depends_on: it says what a parent's failure does to this job")
    scopes = job_scopes(spec.task, spec.concurrency_key, spec.max_concurrent, spec.rate_limit, spec.rate_limit_key)
    return NewJob(
        queue=check_queue_name(spec.queue),
        task=check_task_name(spec.task),
        payload_json=encode_payload(spec.payload, max_bytes=max_payload_bytes),
        priority=check_int_range("priority", spec.priority, PRIORITY_RANGE),
        max_attempts=check_int_range("max_attempts", spec.max_attempts, MAX_ATTEMPTS_RANGE),
        run_at=run_at,
        delay_seconds=delay_seconds,
        idempotency_key=check_idempotency_key(spec.idempotency_key),
        scopes=scopes,
        keys=check_keys(spec),
        rate_cost=1 if spec.rate_cost is None else check_rate_cost(spec.rate_cost, scopes),
    )


def validate_each(specs: Iterable[JobSpec], *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Iterator[NewJob]:
    """Check each job of a batch as it is consumed; an invalid one raises InvalidInput naming its index."""
    for index, spec in enumerate(specs):
        try:
            yield validate(spec, max_payload_bytes=max_payload_bytes)
        except InvalidInput as exc:
            raise InvalidInput(f"job {index}: {exc}") from exc
