"""How many jobs a worker holds beyond its free handler threads.

Prefetching is what makes a drain fast: a worker that claims a batch, runs it and completes it
in one statement commits once per batch instead of once per job. It is also what can make a
short job wait behind a long one, since a prefetched job is leased to one worker. ``auto``
sizes the buffer from what the worker has seen: it holds only as many jobs as its threads are
expected to finish within a latency budget (0.1 s by default), judged from the run times of the
last jobs it ran. A worker that has not run a job yet claims its free threads only, and one
whose every handler of a kind is busy past the budget holds no job of that kind (the worker
hands them back, see :meth:`PrefetchPolicy.stuck`), so a long job never holds short ones hostage.
"""

from __future__ import annotations

import collections
from typing import Literal

from ..core.errors import ConfigError

#: ``"auto"`` or a fixed number of jobs.
Prefetch = int | Literal["auto"]

#: The most jobs ``auto`` holds beyond the handler threads. Batches of about 100 to 1,000 are
#: where the drain's rate levels off; more only lengthens the lease list the heartbeat renews.
AUTO_CAP = 1000
#: The most ``auto`` holds while the worker's jobs are fair (docs/guides/fairness.md): a job it
#: holds is out of the turns, so a key that arrives waits behind every job the workers hold.
FAIR_CAP = 400
#: How many recent run times ``auto`` averages: enough to smooth noise, few enough to follow a
#: change of workload within a second of a fast drain.
WINDOW = 256


def parse_prefetch(value: str | int) -> Prefetch:
    """``"auto"`` or a non-negative count, from a CLI flag, an environment variable or code."""
    if value == "auto":
        return "auto"
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"prefetch {value!r} is invalid: use 'auto' or a number of jobs (0 or more)") from None
    if count < 0 or str(count) != str(value).strip():
        raise ConfigError(f"prefetch {value!r} is invalid: use 'auto' or a number of jobs (0 or more)")
    return count


class PrefetchPolicy:
    """Decides the prefetch of one worker; called from its claim loop only (not thread-safe)."""

    def __init__(self, prefetch: Prefetch, *, concurrency: int, budget: float, kinds: int = 1) -> None:
        self.fixed = None if prefetch == "auto" else prefetch
        #: Handlers of one kind (threads, or coroutines) a worker runs at once.
        self.concurrency = concurrency
        #: Kinds of handler the worker runs (2 for an app with ``def`` and ``async def`` tasks).
        self.kinds = kinds
        self.budget = budget
        self._durations: collections.deque[float] = collections.deque(maxlen=WINDOW)

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def record(self, seconds: float) -> None:
        """Learn one finished handler's run time."""
        if self.fixed is None:
            self._durations.append(seconds)

    def size(self, *, stuck: bool = False, fair: bool = False) -> int:
        """Jobs to hold beyond the handler threads right now (``fair``: the last claim took fair jobs)."""
        if self.fixed is not None:
            return self.fixed
        if stuck or not self._durations:
            return 0
        # Floor the mean at 10 us: a no-op job measures near zero, and the cap decides anyway.
        mean = max(sum(self._durations) / len(self._durations), 1e-5)
        return min(FAIR_CAP if fair else AUTO_CAP, int(self.concurrency * self.kinds * self.budget / mean))

    def stuck(self, running_for: list[float]) -> bool:
        """True when every handler of one kind (``running_for``: how long each of that kind has
        run) is busy with a job that has outlived the budget: the jobs of that kind waiting
        behind them would wait longer than the budget, so they are better handed back for an
        idle worker to take (``auto`` only)."""
        return (
            self.fixed is None and len(running_for) >= self.concurrency and min(running_for, default=0.0) > self.budget
        )
