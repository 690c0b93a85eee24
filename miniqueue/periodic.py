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
import logging
from dataclasses import dataclass
from typing import Any, Literal

from croniter import croniter

from .db import Connection
from .errors import ConfigError, DatabaseUnavailable, InvalidInput, MiniqueueError
from .job import JobSpec
from .store import Store
from .validation import check_task_name, encode_payload, validate

log = logging.getLogger("miniqueue.periodic")

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


def schedule_due(conn: Connection, store: Store, schedules: list[Periodic], specs: dict[str, JobSpec]) -> list[int]:
    """Enqueue the due slot of each schedule that has one; return the ids of the jobs enqueued.

    ``specs`` gives, per schedule name, the JobSpec of its job (its task's options and limits, its payload).
    """
    if not schedules:
        return []
    now = store.now(conn)
    state = store.periodic_state(conn)
    enqueued = []
    for schedule in schedules:
        try:
            job_id = _schedule_one(conn, store, schedule, specs[schedule.name], now, state)
        except MiniqueueError as exc:
            if isinstance(exc, DatabaseUnavailable):
                raise
            log.error("periodic %s: cannot enqueue its slot: %s", schedule.name, exc)  # the others still run
            continue
        if job_id is not None:
            enqueued.append(job_id)
    return enqueued


def _schedule_one(
    conn: Connection,
    store: Store,
    schedule: Periodic,
    base: JobSpec,
    now: dt.datetime,
    state: dict[str, tuple[dt.datetime, bool]],
) -> int | None:
    """Enqueue ``schedule``'s latest due slot if this scheduler wins it; return the job's id."""
    slot = schedule.latest_slot(now)
    last, enabled = state.get(schedule.name, (None, True))
    if not enabled or (last is not None and slot <= last):
        return None
    late = (now - slot).total_seconds()
    run = last is not None and (schedule.catch_up == "latest" or late <= schedule.grace)
    with conn.transaction():
        if not store.claim_periodic_slot(conn, schedule.name, slot) or not run:
            return None
        spec = base._replace(idempotency_key=f"periodic:{schedule.name}:{slot.isoformat()}")
        result = store.enqueue(conn, validate(spec))
    log.info("periodic %s: enqueued job %d for slot %s", schedule.name, result.id, slot.isoformat())
    return result.id
