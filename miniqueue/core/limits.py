"""Fleet-wide limits: what a job's limits are called in the database, and their checks.

A job may be subject to limits, each a *scope* shared by every worker on every host:

* a concurrency scope, ``concurrency <task> <key>``: at most ``max_concurrent`` jobs of that
  task with that key run at once;
* a rate scope, ``rate <task>`` or ``rate <task> <key>``: at most ``rate`` jobs start per
  second, from a token bucket holding one second's worth of tokens (at least one);
* a queue scope, ``queue <name>``: at most ``max_running`` jobs of the queue run at once (set
  by an operator, see ``miniqueue queues limit``; not named by jobs).

Task and queue names contain no space, so a scope name reads back unambiguously whatever its key
holds. The claim enforces them (see the store); this module only names and checks them.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from .errors import InvalidInput

#: The longest concurrency or rate-limit key, in characters.
MAX_KEY_LENGTH = 255
#: Bounds of a concurrency limit (running jobs per key) and of a queue's cap.
MAX_CONCURRENT_RANGE = (1, 1_000_000)
#: The fastest rate limit, in jobs per second.
MAX_RATE = 1_000_000.0

_RATE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
RATE_RULE = "use '<number>/s', '<number>/min' or '<number>/h', e.g. '100/s'"


class Scope(NamedTuple):
    """One limit as the database keeps it: a concurrency scope has ``max_running``, a rate scope
    ``rate`` (jobs per second) and ``burst`` (the bucket's size)."""

    name: str
    max_running: int | None = None
    rate: float | None = None
    burst: float | None = None


def parse_rate(text: object) -> float:
    """Jobs per second from ``'100/s'``, ``'30/min'`` or ``'1000/h'``; InvalidInput otherwise."""
    match = _RATE_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(f"rate limit {text!r} is invalid: {RATE_RULE}")
    per_second = float(match[1]) / _UNIT_SECONDS[match[2].lower()]
    if not 0 < per_second <= MAX_RATE or not math.isfinite(per_second):
        raise InvalidInput(
            f"rate limit {text!r} is invalid: it must allow more than 0 and at most {MAX_RATE:,.0f} jobs per second"
        )
    return per_second


def check_limit(name: str, value: object) -> int:
    """A positive whole number of running jobs (a concurrency limit or a queue's cap)."""
    low, high = MAX_CONCURRENT_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{name} {value!r} is invalid: use a whole number from {low} to {high:,}")
    return value


def check_key(name: str, key: object) -> str:
    """A concurrency or rate-limit key: 1-255 characters, no control characters."""
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH or any(c < " " for c in key):
        shown = repr(key) if not isinstance(key, str) or len(key) <= 80 else repr(key[:77] + "...")
        raise InvalidInput(f"{name} {shown} is invalid: use 1-{MAX_KEY_LENGTH} characters, without control characters")
    return key


def check_rate_cost(cost: object, scopes: tuple[Scope, ...]) -> int:
    """A job's cost in its rate limit's tokens: a whole number from 1 to the bucket's size. A
    cost above the bucket could never be paid (the bucket never holds more), so it is refused
    here rather than left to wait for ever; a cost without a rate limit has nothing to pay."""
    bucket = next((scope.burst for scope in scopes if scope.rate is not None), None)
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise InvalidInput(f"rate_cost {cost!r} is invalid: use a whole number of tokens, at least 1")
    if bucket is None:
        raise InvalidInput(f"rate_cost {cost!r} needs a rate_limit: it is the tokens a job takes from its bucket")
    if cost > bucket:
        raise InvalidInput(
            f"rate_cost {cost!r} is invalid: the rate limit's bucket never holds more than {bucket:g} tokens "
            "(its jobs per second, at least 1), so the job could never start"
        )
    return cost


_CONCURRENCY = "concurrency "


def holds_a_slot(limits: list[str] | None) -> bool:
    """Whether a job with these scope names holds a concurrency slot while it runs (its
    finishing frees the slot; a rate limit's token is spent for good)."""
    if not limits:
        return False
    return any(scope.startswith(_CONCURRENCY) for scope in limits)


def queue_scope(queue: str) -> str:
    """The scope name of a queue's cap on running jobs."""
    return f"queue {queue}"


def job_scopes(
    task: str,
    concurrency_key: object,
    max_concurrent: object,
    rate_limit: object,
    rate_limit_key: object,
) -> tuple[Scope, ...]:
    """The limits one job is subject to (checked), in scope-name order; () for none.

    ``max_concurrent`` defaults to 1 when a ``concurrency_key`` is given and needs one;
    ``rate_limit_key`` needs a ``rate_limit``.
    """
    if concurrency_key is None and max_concurrent is None and rate_limit is None and rate_limit_key is None:
        return ()
    scopes: list[Scope] = []
    if concurrency_key is not None:
        key = check_key("concurrency key", concurrency_key)
        limit = 1 if max_concurrent is None else check_limit("max_concurrent", max_concurrent)
        scopes.append(Scope(f"{_CONCURRENCY}{task} {key}", max_running=limit))
    elif max_concurrent is not None:
        raise InvalidInput("max_concurrent needs a concurrency key: it limits the running jobs that share one")
    if rate_limit is not None:
        rate = parse_rate(rate_limit)
        name = f"rate {task}"
        if rate_limit_key is not None:
            name += " " + check_key("rate limit key", rate_limit_key)
        scopes.append(Scope(name, rate=rate, burst=max(1.0, rate)))
    elif rate_limit_key is not None:
        raise InvalidInput("rate_limit_key needs a rate_limit: it names whose rate the limit counts")
    return tuple(sorted(scopes))
