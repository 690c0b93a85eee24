"""Periodic jobs: cron schedules turned into jobs, each slot enqueued exactly once.

The scheduler runs in the reaper process. On each pass it reads the database clock, finds each
schedule's latest due slot, and, if that slot is newer than the one recorded, advances the
record and enqueues the slot's job in one transaction. The record's conditional upsert lets
exactly one scheduler win a slot however many supervisors (hosts) run, without a leader.

After downtime only the latest missed slot is considered: ``catch_up="latest"`` enqueues it
late; ``catch_up="skip"`` (the default) enqueues it only if it is at most ``grace`` seconds
old, and otherwise records it as skipped. A schedule seen for the first time starts from
its latest due slot without enqueuing it, so deploying a daily job at noon does not run it
at once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from croniter import croniter

from ..core.errors import ConfigError, InvalidInput
from ..core.validation import check_task_name, encode_payload

CatchUp = Literal["latest", "skip"]


@dataclass(frozen=True)
class Periodic:
    """A cron schedule that enqueues a job of ``task`` (with the task's defaults) at each slot."""

    name: str
    cron: str
    task: str
    payload: Any = None
    catch_up: CatchUp = "skip"
    grace: float = 300.0

    def __post_init__(self) -> None:
        check_task_name(self.name)
        if not croniter.is_valid(self.cron):
            raise ConfigError(f"cron expression {self.cron!r} of schedule {self.name!r} is invalid")
        if self.catch_up not in ("latest", "skip"):
            raise ConfigError(f"catch_up {self.catch_up!r} is invalid: use 'latest' or 'skip'")
        if not 0 <= self.grace < float("inf"):
            raise ConfigError(f"grace {self.grace!r} of schedule {self.name!r} is invalid: use seconds >= 0")
        try:
            encode_payload(self.payload)
        except InvalidInput as exc:
            raise ConfigError(f"schedule {self.name!r}: {exc}") from None

    def latest_slot(self, now: dt.datetime) -> dt.datetime:
        """The most recent slot at or before ``now`` (UTC)."""
        base = now.astimezone(dt.timezone.utc) + dt.timedelta(microseconds=1)
        slot: dt.datetime = croniter(self.cron, base).get_prev(dt.datetime)
        return slot

    def next_slot(self, now: dt.datetime) -> dt.datetime:
        slot: dt.datetime = croniter(self.cron, now.astimezone(dt.timezone.utc)).get_next(dt.datetime)
        return slot
