"""The rules of a job's keys and deadline: unique keys, sequence keys and expiry (see
docs/guides/keys.md). Checked before the job reaches the database, so a bad value stores nothing;
each check raises :class:`~miniqueue.core.errors.InvalidInput` naming the value and the rule.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from collections.abc import Collection
from typing import NamedTuple

from .errors import InvalidInput
from .records import Debounce, JobSpec, KeyOptions

MAX_KEY_LENGTH = 255
# 100 years, as for a delay: far inside PostgreSQL's interval range.
_MAX_SECONDS = 100 * 365.25 * 86400

#: The states a unique key can conflict in: a job holds its key from its enqueue until it starts
#: (waiting for its parents or its turn, scheduled for later, available), and with "running"
#: until it finishes (its retries included).
PENDING_STATES = frozenset({"waiting", "scheduled", "available"})
UNIQUE_STATES = (*sorted(PENDING_STATES), "running")
ON_CONFLICT = ("keep", "replace", "debounce")
ON_FAILURE = ("block", "continue")


class JobKeys(NamedTuple):
    """A job's keys and deadline, checked (all None or defaults for a job without any)."""

    unique_key: str | None = None
    #: Whether the key is held while the job runs (and waits out its retries), not only until it starts.
    unique_while_running: bool = True
    unique_window: float | None = None
    on_conflict: str = "keep"
    debounce_wait: float | None = None
    debounce_max_wait: float | None = None
    sequence_key: str | None = None
    on_failure: str = "block"
    expires_at: dt.datetime | None = None
    expires_in: float | None = None

    @property
    def keyed(self) -> bool:
        """Whether the job needs the store's keyed enqueue (it has a key or a deadline)."""
        return (
            self.unique_key is not None
            or self.sequence_key is not None
            or self.expires_at is not None
            or self.expires_in is not None
        )


NO_KEYS = JobKeys()


def check_key(name: str, key: object) -> str:
    """Return ``key`` if it can be a unique or sequence key, else raise InvalidInput."""
    rule = f"use 1-{MAX_KEY_LENGTH} characters, none of them a control character"
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"{name} {show(key)} is invalid: {rule}")
    if not key.isprintable() and any(unicodedata.category(c) in ("Cc", "Cs") for c in key):
        raise InvalidInput(f"{name} {show(key)} is invalid: {rule}")
    return key


def check_keys(spec: JobSpec) -> JobKeys:
    """Check the keys and deadline of ``spec`` (its options filled from its task's declaration)."""
    if (
        spec.unique_key is None
        and spec.sequence_key is None
        and spec.expires_in is None
        and spec.expires_at is None
        and spec.unique_states is None
        and spec.unique_window is None
        and spec.on_conflict is None
        and spec.on_failure is None
    ):
        return NO_KEYS  # the common case, at the cost of eight comparisons
    unique = None if spec.unique_key is None else check_key("unique_key", spec.unique_key)
    sequence = None if spec.sequence_key is None else check_key("sequence_key", spec.sequence_key)
    if unique is None:
        for option in ("unique_states", "unique_window", "on_conflict"):
            if getattr(spec, option) is not None:
                raise InvalidInput(f"{option} is given without a unique_key: give the key too, or leave it out")
    if sequence is None and spec.on_failure is not None:
        raise InvalidInput("on_failure is given without a sequence_key: give the key too, or leave it out")
    # (Each option checked only when given: a batch checks thousands of these.)
    while_running = True if spec.unique_states is None else _check_states(spec.unique_states)
    window = None if spec.unique_window is None else _positive("unique_window", spec.unique_window)
    mode, wait, max_wait = ("keep", None, None) if spec.on_conflict is None else _check_on_conflict(spec.on_conflict)
    if mode != "keep":
        _check_replacing(spec, mode, window)
    on_failure = "block" if spec.on_failure is None else spec.on_failure
    if on_failure not in ON_FAILURE:
        raise InvalidInput(f"on_failure {show(on_failure)} is invalid: use 'block' or 'continue'")
    expires_at, expires_in = (
        (None, None) if spec.expires_at is None and spec.expires_in is None else _check_expiry(spec)
    )
    return JobKeys(unique, while_running, window, mode, wait, max_wait, sequence, on_failure, expires_at, expires_in)


def _check_states(states: Collection[str]) -> bool:
    """Whether the unique key is held while the job runs, from the states it conflicts in."""
    if isinstance(states, str) or not isinstance(states, Collection):
        raise InvalidInput(f"unique_states {show(states)} is invalid: give a collection of state names")
    chosen = set(states)
    unknown = sorted(str(s) for s in chosen - set(UNIQUE_STATES))
    if unknown:
        raise InvalidInput(
            f"unique_states {sorted(map(str, chosen))} are invalid: {', '.join(map(repr, unknown))} cannot hold a "
            f"key (use {', '.join(UNIQUE_STATES)}; to refuse repeats of a finished job, give a unique_window or an "
            "idempotency_key)"
        )
    if not chosen >= PENDING_STATES:
        raise InvalidInput(
            f"unique_states {sorted(chosen)} are invalid: a job holds its key from its enqueue, so they include "
            f"{', '.join(sorted(PENDING_STATES))}; add 'running' to hold it until the job finishes"
        )
    return "running" in chosen


def _check_on_conflict(on_conflict: str | Debounce | None) -> tuple[str, float | None, float | None]:
    """The mode of ``on_conflict`` and, for a debounce, its wait and maximum wait."""
    if on_conflict is None or on_conflict == "keep":
        return "keep", None, None
    if on_conflict == "replace":
        return "replace", None, None
    if isinstance(on_conflict, Debounce):
        wait = _positive("debounce wait", on_conflict.wait)
        max_wait = _positive("debounce max_wait", on_conflict.max_wait)
        if max_wait < wait:
            raise InvalidInput(
                f"debounce max_wait {max_wait:g}s is shorter than its wait {wait:g}s: the job would run before "
                "its wait ends; give a max_wait of at least the wait"
            )
        return "debounce", wait, max_wait
    raise InvalidInput(f"on_conflict {show(on_conflict)} is invalid: use 'keep', 'replace' or Debounce(wait, max_wait)")


def _check_replacing(spec: JobSpec, mode: str, window: float | None) -> None:
    """Refuse the options a replacing enqueue cannot honour."""
    what = "on_conflict='replace'" if mode == "replace" else "a Debounce"
    if spec.idempotency_key is not None:
        raise InvalidInput(
            f"{what} cannot be combined with an idempotency_key: a repeat of the key must store nothing, "
            "a conflict of the unique key changes the waiting job; give one of the two"
        )
    if window is not None:
        raise InvalidInput(
            f"{what} cannot be combined with a unique_window: the job holding the window may have finished, "
            "and a finished job is never changed; use on_conflict='keep' with a window"
        )
    if mode == "debounce" and (spec.run_at is not None or spec.delay is not None):
        raise InvalidInput("a Debounce sets the job's run-at itself: leave run_at and delay out")


def _check_expiry(spec: JobSpec) -> tuple[dt.datetime | None, float | None]:
    """``(expires_at, expires_in)``, checked against each other and the job's own schedule."""
    if spec.expires_at is not None and spec.expires_in is not None:
        raise InvalidInput("expires_at and expires_in are mutually exclusive: give one or neither")
    if spec.expires_in is not None:
        expires_in = _positive("expires_in", spec.expires_in)
        delay = spec.delay.total_seconds() if isinstance(spec.delay, dt.timedelta) else spec.delay
        if isinstance(delay, (int, float)) and delay >= expires_in:
            raise InvalidInput(
                f"expires_in {expires_in:g}s is not after the job's delay {delay:g}s: it would expire before it "
                "could start"
            )
        return None, expires_in
    if spec.expires_at is None:
        return None, None
    at = spec.expires_at
    if not isinstance(at, dt.datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise InvalidInput(f"expires_at {show(at)} is invalid: use a timezone-aware datetime")
    if isinstance(spec.run_at, dt.datetime) and spec.run_at.tzinfo is not None and spec.run_at >= at:
        raise InvalidInput(
            f"expires_at {at.isoformat()} is not after run_at {spec.run_at.isoformat()}: the job would expire "
            "before it could start"
        )
    return at, None


def _positive(name: str, value: object) -> float:
    """A positive duration in seconds from a number or a timedelta, else InvalidInput."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= _MAX_SECONDS:
        raise InvalidInput(f"{name} {show(value)} is invalid: use a positive number of seconds, at most 100 years")
    return float(seconds)


def declared_keys(spec: JobSpec, options: KeyOptions) -> JobSpec:
    """``spec`` with the key options its caller left None filled from its task's declaration."""
    on_conflict: str | Debounce | None = options.on_conflict
    if on_conflict == "debounce" and options.debounce_wait is not None and options.debounce_max_wait is not None:
        on_conflict = Debounce(options.debounce_wait, options.debounce_max_wait)
    unique = options.unique_key if spec.unique_key is None else spec.unique_key
    sequence = options.sequence_key if spec.sequence_key is None else spec.sequence_key
    if unique is None and options.unique_key_computed:
        raise computed_key_error(spec.task, "unique_key")
    if sequence is None and options.sequence_key_computed:
        raise computed_key_error(spec.task, "sequence_key")
    has_deadline = spec.expires_at is not None or spec.expires_in is not None
    # A declared option applies only to a job that has the key; the caller's always wins.
    if unique is not None:
        spec = spec._replace(
            unique_states=options.unique_states if spec.unique_states is None else spec.unique_states,
            unique_window=options.unique_window if spec.unique_window is None else spec.unique_window,
            on_conflict=on_conflict if spec.on_conflict is None else spec.on_conflict,
        )
    if sequence is not None and spec.on_failure is None:
        spec = spec._replace(on_failure=options.on_failure)
    return spec._replace(
        unique_key=unique,
        sequence_key=sequence,
        expires_in=spec.expires_in if has_deadline else options.expires_in,
    )


def computed_key_error(task: str, option: str) -> InvalidInput:
    """Why a job of ``task`` needs its ``option`` passed: the task computes it with a function of its app."""
    return InvalidInput(
        f"task {task!r} computes its {option} from each payload with a function of its app: pass "
        f"{option}=... here, or enqueue it with the app (app.enqueue) so that the function runs",
        arguments={option: "..."},
    )


def show(value: object, limit: int = 80) -> str:
    """``value`` as an error message quotes it: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
