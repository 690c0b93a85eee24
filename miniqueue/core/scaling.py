"""Autoscaling's arithmetic, with no I/O: how far behind the served queues are, how fast the
workers drain them, and what that calls for within ``--workers MIN:MAX`` and what the host's CPU
can feed. The supervisor feeds :class:`Autoscaler` readings and acts on its decisions (see
docs/operations/autoscaling.md); the same rule, in SQL, is ``miniqueue_desired_workers``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from .errors import ConfigError

#: The default ``--scale-target``: the longest the served queues' due jobs should take to drain.
DEFAULT_SCALE_TARGET = 30.0
#: The default ``--scale-cooldown``: how long workers sit idle before one is retired.
DEFAULT_SCALE_COOLDOWN = 30.0
#: The least time between two additions: a new worker's drain shows in the rate by then.
STEP_SECONDS = 2.0
#: The host's CPU busy share at which no worker is added: another could not be fed.
CPU_SATURATED = 0.9
#: How far back the rate of finished jobs is measured.
RATE_WINDOW_SECONDS = 5.0


class Backlog(NamedTuple):
    """The served queues' backlog, as ``miniqueue_backlog`` reads it (a bounded walk of the
    claim's order, so its cost does not grow with the backlog)."""

    #: Available jobs due now among those walked (a lower bound when ``walked`` hit its bound).
    due: int
    #: Available jobs walked.
    walked: int
    #: How long the oldest due job walked has been due (0: none).
    oldest_seconds: float
    #: Running jobs (up to the same bound).
    running: int


def parse_workers(text: str) -> tuple[int, int | None]:
    """``--workers``: ``N`` (a fixed number: ``(N, None)``) or ``MIN:MAX`` (autoscaling between
    them); ConfigError naming the problem otherwise."""
    low_text, colon, high_text = text.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if colon else None
    except ValueError:
        raise ConfigError(f"--workers {text!r} is invalid: use a number (4) or a range MIN:MAX (2:16)") from None
    if high is None:
        if low < 1:
            raise ConfigError(f"--workers {text} is invalid: run at least 1 worker process")
        return low, None
    if low < 1 or high < 1:
        raise ConfigError(f"--workers {text} is invalid: both ends of MIN:MAX are at least 1 worker process")
    if low > high:
        raise ConfigError(f"--workers {text} is invalid: MIN ({low}) is above MAX ({high})")
    return low, high


def parse_cpu_ceiling(text: str) -> float:
    """``--scale-cpu-ceiling``: a busy share above 0 and at most 1, or ``off`` (never hold: +inf)."""
    if text.strip().lower() == "off":
        return math.inf
    try:
        ceiling = float(text)
    except ValueError:
        ceiling = math.nan
    if not 0 < ceiling <= 1:
        raise ConfigError(f"--scale-cpu-ceiling {text!r} is invalid: use a share above 0 and at most 1 (0.9), or 'off'")
    return ceiling


@dataclass
class RateMeter:
    """Jobs finished per second over the last ``window`` seconds."""

    window: float = RATE_WINDOW_SECONDS
    _since: float | None = None
    _counts: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, count: int, now: float) -> None:
        if self._since is None:
            self._since = now
        if count:
            self._counts.append((now, count))

    def measured_for(self, now: float) -> float:
        """How long the meter has been measuring (0 before its first count)."""
        return 0.0 if self._since is None else now - self._since

    def rate(self, now: float) -> float:
        while self._counts and self._counts[0][0] <= now - self.window:
            self._counts.popleft()
        if self._since is None:
            return 0.0
        span = min(self.window, now - self._since)
        return sum(count for _, count in self._counts) / span if span > 0 else 0.0


class Reading(NamedTuple):
    """What the supervisor knows when it decides."""

    backlog: Backlog
    #: Jobs its workers finished per second lately (see :class:`RateMeter`).
    rate: float
    #: Worker slots (the processes the supervisor keeps running).
    workers: int
    #: Of them, those running a job now.
    busy: int
    #: The host's CPU busy share since the last decision, 0 to 1.
    cpu: float
    #: How long the rate has been measured: a rate of 0 means "none finished" only after a window.
    measured_for: float = RATE_WINDOW_SECONDS


class Decision(NamedTuple):
    """One more worker (+1), one fewer (-1) or as many (0), and why, in the log's words; a hold
    that keeps workers from being added says what holds them (``hold``), so that the log says it
    once, not every second."""

    change: int
    reason: str
    hold: str = ""


@dataclass
class Autoscaler:
    """How many worker processes, between ``low`` and ``high``: one more while the due jobs
    would take longer than ``target`` seconds to drain at the rate the workers finish them (or
    the oldest has waited longer than that), unless the host's CPU is saturated; one fewer once
    nothing is due and some workers have sat idle for ``cooldown`` seconds."""

    low: int
    high: int
    target: float = DEFAULT_SCALE_TARGET
    cooldown: float = DEFAULT_SCALE_COOLDOWN
    step: float = STEP_SECONDS
    #: The host's CPU busy share at which no worker is added.
    cpu_ceiling: float = CPU_SATURATED
    last_change: float = -math.inf
    idle_since: float | None = None

    def __post_init__(self) -> None:
        if not self.target > 0:
            raise ConfigError(f"--scale-target {self.target} is invalid: use a positive number of seconds")
        if self.cooldown < 0:
            raise ConfigError(f"--scale-cooldown {self.cooldown} is invalid: use 0 or more seconds")

    def decide(self, reading: Reading, now: float) -> Decision:
        backlog, workers = reading.backlog, reading.workers
        drain = drain_seconds(backlog, reading.rate)
        behind = backlog.due > 0 and (drain > self.target or backlog.oldest_seconds > self.target)
        idle = backlog.due == 0 and reading.busy < workers
        self.idle_since = (self.idle_since if self.idle_since is not None else now) if idle else None
        if behind:
            why = _behind(backlog, reading.rate, drain, self.target)
            if (
                math.isinf(drain)
                and reading.measured_for < RATE_WINDOW_SECONDS
                and backlog.oldest_seconds <= self.target
            ):
                return Decision(0, f"{why}: the workers' rate is not measured yet", "starting")
            if workers >= self.high:
                return Decision(0, f"{why}, at the maximum of {self.high}", "maximum")
            if reading.cpu >= self.cpu_ceiling:
                return Decision(0, f"{why}, but the host's CPU is saturated ({reading.cpu:.0%} busy)", "cpu")
            if now - self.last_change < self.step:
                return Decision(0, f"{why}: the last worker added is starting", "starting")
            return self._changed(+1, now, why)
        idle_for = -1.0 if self.idle_since is None else now - self.idle_since
        if workers > self.low and idle_for >= self.cooldown and now - self.last_change >= self.cooldown:
            self.idle_since = now
            why = f"nothing due and {workers - reading.busy} of {workers} idle for {idle_for:.0f}s"
            return self._changed(-1, now, why)
        return Decision(0, "")

    def _changed(self, change: int, now: float, reason: str) -> Decision:
        self.last_change = now
        return Decision(change, reason)


def drain_seconds(backlog: Backlog, rate: float) -> float:
    """How long the due jobs take at ``rate`` jobs per second (infinite with jobs due and no rate)."""
    if backlog.due == 0:
        return 0.0
    return backlog.due / rate if rate > 0 else math.inf


def _behind(backlog: Backlog, rate: float, drain: float, target: float) -> str:
    due = f"{backlog.due:,} due"
    pace = "no job finished lately" if math.isinf(drain) else f"{drain:.0f}s to drain at {rate:,.0f} jobs/s"
    oldest = f", the oldest due {backlog.oldest_seconds:.0f}s" if backlog.oldest_seconds > target else ""
    return f"{due} ({pace}{oldest}; target {target:g}s)"
