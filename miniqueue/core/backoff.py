"""Retry backoff: exponential with full jitter.

The delay before retry *n* is uniform in ``[0, min(cap, base * 2**n)]`` (the "full jitter" of
the AWS Architecture Blog, 2015), so many jobs failing at once spread out instead of retrying
in lockstep. With the defaults: attempt 1 waits 0-2 s, attempt 2 0-4 s, attempt 3 0-8 s, ...,
never more than 30 minutes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

#: A backoff policy: maps the attempt that just failed (1-based) to a delay in seconds.
Backoff = Callable[[int], float]

DEFAULT_BASE_SECONDS = 1.0
DEFAULT_CAP_SECONDS = 30 * 60.0


def backoff_ceiling(attempt: int, *, base: float = DEFAULT_BASE_SECONDS, cap: float = DEFAULT_CAP_SECONDS) -> float:
    """The largest delay full jitter may pick after failed attempt ``attempt`` (1-based)."""
    if attempt < 1:
        raise ValueError(f"attempt {attempt} is invalid: attempts count from 1")
    # Cap the exponent first: 2**attempt overflows a float long before attempt 10,000.
    return min(cap, base * 2.0 ** min(attempt, 64))


class ExponentialBackoff:
    """A full-jitter backoff policy (see :func:`exponential_backoff`). Its ``base`` and ``cap``
    are data: the workers publish them with their task's declaration, so that the supervisor
    and the reaper, which charge crashed and lost attempts without the app, wait the same
    delay (see docs/guarantees.md); the database draws it the same way
    (``miniqueue_retry_delay``)."""

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        if not (0 < base < math.inf and 0 < cap < math.inf):  # also rejects NaN
            raise ValueError(f"backoff base {base} and cap {cap} must both be positive, finite numbers of seconds")
        self.base, self.cap = float(base), float(cap)
        # The module-level generator by default: Python reseeds it in every forked child, so
        # sibling workers do not draw the same "random" delays.
        self._uniform = rng.uniform if rng is not None else random.uniform

    def __call__(self, attempt: int) -> float:
        return self._uniform(0.0, backoff_ceiling(attempt, base=self.base, cap=self.cap))

    def __repr__(self) -> str:
        return f"exponential_backoff(base={self.base:g}, cap={self.cap:g})"


def exponential_backoff(
    base: float = DEFAULT_BASE_SECONDS, cap: float = DEFAULT_CAP_SECONDS, rng: random.Random | None = None
) -> Backoff:
    """Build a full-jitter backoff policy with the given base and cap (seconds)."""
    return ExponentialBackoff(base, cap, rng)


def published_backoff(backoff: Backoff) -> tuple[float, float] | None:
    """The ``(base, cap)`` a task's backoff publishes, or None for a function of the app's own,
    which only a worker with the app can apply (elsewhere the default backoff applies)."""
    return (backoff.base, backoff.cap) if isinstance(backoff, ExponentialBackoff) else None


#: The policy used when a task does not name its own.
default_backoff: Backoff = exponential_backoff()
