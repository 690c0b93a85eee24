"""Fair share by key: which jobs take turns by key, and the rules that set a key's limit and
weight (see docs/guides/fairness.md). Pure: the store ranks the jobs and keeps the rules."""

from __future__ import annotations

import math
from typing import NamedTuple

from .errors import InvalidInput
from .limits import MAX_KEY_LENGTH, check_key
from .records import JobSpec

#: What a queue or a task may take turns by.
FAIR_BY = ("key",)
#: The fair key of a fair job that has no key: such jobs share one turn.
NO_KEY = ""
#: A key's weight: its jobs take this many turns for every one of a key of weight 1.
MAX_WEIGHT = 1000.0
#: The wildcard of a rule's pattern: any characters, none included.
WILDCARD = "*"


class KeyRule(NamedTuple):
    """A rule for the keys ``pattern`` matches: at most ``max_running`` of a key's jobs run at
    once (None: the rule sets no limit), and the key's ``weight`` (None: the rule sets none)."""

    pattern: str
    max_running: int | None
    weight: float | None


class KeyShare(NamedTuple):
    """A fair key of a queue as it stands: its weight, the jobs it has waiting (available) and
    running, and the limit a rule gives it (None: none)."""

    queue: str
    key: str
    weight: float
    available: int
    running: int
    max_running: int | None


def check_fair_by(value: object) -> str | None:
    """A queue's or a task's ``fair_by``: ``"key"`` or None."""
    if value is None:
        return None
    if isinstance(value, str) and value in FAIR_BY:
        return value
    raise InvalidInput(f"fair_by {value!r} is invalid: use 'key' (jobs take turns by their fair key) or None")


def check_fair_key(key: object) -> str:
    """A job's ``fair_key``: a key as limits take them, or "" for the jobs without one."""
    return NO_KEY if key == NO_KEY else check_key("fair_key", key)


def fair_spec(spec: JobSpec, *, fair_by: str | None, fair_queue: bool) -> JobSpec:
    """``spec`` with its fair key: its own (checked), else, when its task declares ``fair_by``
    or its queue is fair, its concurrency key ("" without one); unchanged for a job that is not
    fair."""
    if spec.fair_key is not None:
        return spec._replace(fair_key=check_fair_key(spec.fair_key))
    if fair_by is None and not fair_queue:
        return spec
    return spec._replace(fair_key=NO_KEY if spec.concurrency_key is None else spec.concurrency_key)


def check_rule(pattern: object, max_running: object, weight: object, *, every_key: bool = False) -> KeyRule:
    """A rule as given, checked: a pattern of 1-255 characters (``*`` matching any), and a
    limit, a weight or both. A pattern of wildcards alone matches every key: it is refused unless
    ``every_key`` says that is meant."""
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_KEY_LENGTH or any(c < " " for c in pattern):
        raise InvalidInput(
            f"key pattern {pattern!r} is invalid: use 1-{MAX_KEY_LENGTH} characters without control characters, "
            f"'{WILDCARD}' matching any characters"
        )
    if set(pattern) == {WILDCARD} and not every_key:
        raise InvalidInput(
            f"key pattern {pattern!r} matches every key: to set a rule for every key, say so (--every-key, "
            "every_key=True); to set one key's, name it"
        )
    if max_running is None and weight is None:
        raise InvalidInput(f"a rule for {pattern!r} sets nothing: give a limit, a weight or both")
    return KeyRule(pattern, _check_limit(max_running), _check_weight(weight))


def like_pattern(pattern: str) -> str:
    """``pattern`` as a LIKE pattern: ``*`` matches any characters, every other one itself."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace(WILDCARD, "%")


def _check_limit(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        hint = " (a limit of 0 would never run a job of the key: pause its queue instead)" if value == 0 else ""
        raise InvalidInput(f"limit {value!r} is invalid: use a whole number of running jobs, at least 1{hint}")
    return value


def _check_weight(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"weight {value!r} is invalid: use a number above 0, at most {MAX_WEIGHT:g}")
    if not 0 < value <= MAX_WEIGHT:
        raise InvalidInput(f"weight {value!r} is invalid: use a number above 0, at most {MAX_WEIGHT:g}")
    return float(value)
