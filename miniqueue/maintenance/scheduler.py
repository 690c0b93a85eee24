"""The periodic scheduler, run by the reaper: enqueues each schedule's due slot exactly once
across every reaper on the database (the slot is claimed in the same transaction as the job)."""

from __future__ import annotations

import datetime as dt
import logging

from ..core.db import Connection
from ..core.errors import DatabaseUnavailable, MiniqueueError
from ..core.records import JobSpec
from ..core.validation import validate
from ..store.store import Store
from ..tasks.periodic import Periodic

log = logging.getLogger("miniqueue.periodic")


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
