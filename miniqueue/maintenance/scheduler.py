"""The periodic scheduler, run by the reaper: enqueues each schedule's due slot exactly once
across every reaper on the database (the slot is claimed in the same transaction as the job).

The schedules are the app's (code) and those created at run time (``client.schedules``), which
:func:`read_runtime` reads from the database once a pass. A runtime schedule's slot is claimed
only while its definition is the one read, so a change or a delete takes effect at the next pass.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import psycopg

from ..core.db import Connection
from ..core.errors import DatabaseUnavailable, MiniqueueError
from ..core.records import DEFAULT_QUEUE, JobSpec, Schedule, TaskDeclaration
from ..core.steps import run
from ..core.validation import declared, validate
from ..store.store import Store
from ..tasks.middleware import MiddlewareStack
from ..tasks.periodic import Periodic, as_periodic

if TYPE_CHECKING:
    from ..tasks.app import App

log = logging.getLogger("miniqueue.periodic")
_NO_MIDDLEWARE = MiddlewareStack()


def schedule_due(
    conn: Connection,
    store: Store,
    schedules: list[Periodic],
    specs: dict[str, JobSpec],
    now: dt.datetime | None = None,
    revisions: Mapping[str, dt.datetime] | None = None,
    middleware: MiddlewareStack | None = None,
) -> list[int]:
    """Enqueue the due slot of each schedule that has one; return the ids of the jobs enqueued.

    ``specs`` gives, per schedule name, the JobSpec of its job (its task's options and limits, its payload).
    Slots fall due by the database clock, or by ``now`` if given (tests travel in time with it).
    ``revisions`` gives, per runtime schedule, the definition read (its updated_at): the claim
    of its slot re-checks it. Each job passes ``middleware``'s enqueue hooks (the app's), inside
    the transaction that claims its slot: a hook that raises leaves the slot to the next pass.
    """
    if not schedules:
        return []
    if now is None:
        now = store.now(conn)
    state = store.periodic_state(conn)
    enqueued = []
    for schedule in schedules:
        try:
            revision = (revisions or {}).get(schedule.name)
            job_id = _schedule_one(conn, store, schedule, specs[schedule.name], now, state, revision, middleware)
        except (DatabaseUnavailable, psycopg.Error):
            raise
        except Exception as exc:  # an invalid job, or an enqueue hook that refused it: the others still run
            log.error("periodic %s: cannot enqueue its slot: %s", schedule.name, exc)
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
    revision: dt.datetime | None,
    middleware: MiddlewareStack | None,
) -> int | None:
    """Enqueue ``schedule``'s latest due slot if this scheduler wins it; return the job's id.

    The slot is a UTC instant, and so is its key: a wall-clock time a DST change repeats is one
    slot or two distinct instants, never one slot under two keys.
    """
    slot = schedule.latest_slot(now)
    last, enabled = state.get(schedule.name, (None, True))
    if not enabled or (last is not None and slot <= last):
        return None
    late = (now - slot).total_seconds()
    due = last is not None and (schedule.catch_up == "latest" or late <= schedule.grace)
    with conn.transaction():
        if not _claim(conn, store, schedule.name, slot, revision) or not due:
            return None
        spec = base._replace(idempotency_key=f"periodic:{schedule.name}:{slot.isoformat()}")
        result = (middleware or _NO_MIDDLEWARE).enqueue_one(spec, lambda spec: store.enqueue(conn, validate(spec)))
    log.info("periodic %s: enqueued job %d for slot %s", schedule.name, result.id, schedule.local(slot).isoformat())
    return result.id


def _claim(conn: Connection, store: Store, name: str, slot: dt.datetime, revision: dt.datetime | None) -> bool:
    """Claim ``slot`` of schedule ``name``; a runtime one (given its ``revision``) only while that is its definition."""
    if revision is None:
        return store.claim_periodic_slot(conn, name, slot)
    return store.claim_stored_slot(conn, name, slot, revision)


class Runtime(NamedTuple):
    """The runtime schedules a reaper schedules on a pass, as :func:`schedule_due` takes them."""

    schedules: list[Periodic]
    specs: dict[str, JobSpec]
    revisions: dict[str, dt.datetime]


def read_runtime(
    conn: Connection,
    store: Store,
    app: App | None,
    here: Callable[[str], bool],
    warned: set[str],
) -> Runtime:
    """The schedules created at run time that this reaper schedules, read once (a small table).

    A name the app's code also uses is the code's (a runtime schedule refuses a name a scheduler
    has run, but code may be deployed later): the runtime one is skipped, logged once per reaper
    (``warned`` holds what was). A job's options are the task's in ``app``, else those its
    workers published; ``here`` keeps the queues this database schedules (see ReaperConfig).
    """
    found = Runtime([], {}, {})
    declarations: dict[str, TaskDeclaration] | None = None
    for row in store.stored_schedules(conn):
        if app is not None and row.name in app.schedules:
            _warn_once(warned, row.name, "the code defines a schedule of this name too: the code's runs")
            continue
        if declarations is None and (app is None or row.task not in app.tasks):
            declarations = run(conn, store.task_declarations_steps())
        try:
            schedule, spec = _runtime_one(row, app, declarations or {})
        except MiniqueueError as exc:
            _warn_once(warned, row.name, f"skipped: {exc}")
            continue
        if here(spec.queue or DEFAULT_QUEUE):
            found.schedules.append(schedule)
            found.specs[row.name] = spec
            found.revisions[row.name] = row.updated_at
    return found


def _runtime_one(
    row: Schedule, app: App | None, declarations: Mapping[str, TaskDeclaration]
) -> tuple[Periodic, JobSpec]:
    """Runtime schedule ``row`` as a Periodic, and the JobSpec of its jobs."""
    schedule = as_periodic(row)
    if app is not None and row.task in app.tasks:
        return schedule, app.task_spec(row.task, row.payload)
    return schedule, declared(JobSpec(row.task, row.payload), declarations.get(row.task))


def _warn_once(warned: set[str], name: str, what: str) -> None:
    if name not in warned:
        warned.add(name)
        log.error("runtime schedule %s: %s", name, what)
