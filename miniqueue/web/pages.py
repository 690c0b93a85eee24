"""The pages (GET): overview, jobs, job detail, workers, periodic schedules, queues.

Each handler gathers what its page needs on one connection, then renders; pages that refresh
live render only their fragment when asked with ``?partial=1``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import Response

from ..client.client import Client
from ..client.inspection import LimitWait
from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.health import held_too_long
from ..core.records import (
    CANCELLABLE_STATES,
    REQUEUEABLE_STATES,
    BlockedSequence,
    JobRecord,
    ProcessInfo,
    QueueStats,
    State,
)
from ..tasks.periodic import Periodic
from . import present
from .dashboard import Dashboard
from .filters import JobFilter, parse_id, stored_id

PAGE_SIZE = 50
NOTICES = {
    "requeue": "Requeued {n} job(s).",
    "cancel": "Cancelled {n} job(s).",
    "delete": "Deleted {n} job(s).",
    "pause": "Paused the queue: no worker claims from it until it is resumed.",
    "resume": "Resumed the queue.",
    "enable": "Enabled the schedule.",
    "disable": "Disabled the schedule: its slots are skipped.",
    "run": "Enqueued a run of the schedule now.",
}


def notice(request: Request) -> str | None:
    """The confirmation of the action that redirected here (``?done=requeue&n=3``), from fixed texts."""
    text = NOTICES.get(request.query_params.get("done", ""))
    n = request.query_params.get("n", "")
    return text.format(n=int(n) if n.isascii() and n.isdigit() else "some") if text else None


@dataclass(frozen=True)
class PeriodicRow:
    name: str
    schedule: Periodic | None
    enabled: bool
    last_slot: dt.datetime | None
    next_slot: dt.datetime | None


@dataclass(frozen=True)
class QueueRow:
    name: str
    paused: bool
    available: int
    running: int
    scheduled: int  # of the available jobs, those not to run before a later time
    oldest: float | None
    max_running: int | None = None  # the queue's cap on running jobs


class Pages:
    """The GET handlers."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    async def overview(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> dict[str, object]:
            now = client.now(conn=conn)
            stats = client.queue_stats(conn=conn)  # as `miniqueue stats`: with the queues no worker serves
            chart = present.throughput_chart(client.throughput(conn=conn), now)
            paused = set(client.paused_queues(conn=conn))
            held = [h for h in client.horizon(conn=conn) if held_too_long(h)]
            totals = _totals(stats)
            return {"now": now, "stats": stats, "paused": paused, "chart": chart, "totals": totals, "held": held}

        data = await self.dash.query(load)
        return self.dash.render(request, "overview.html", {**data, "states": list(State)}, live="_overview.html")

    async def jobs(self, request: Request) -> Response:
        try:
            flt = JobFilter.parse(request.query_params)
            before_id = _int_param(request, "before_id")
        except InvalidInput as exc:
            context = {"filter": JobFilter(), "error": str(exc), "jobs": [], "before_id": None, "next_before_id": None}
            return self.dash.render(request, "jobs.html", {**self._jobs_context(request), **context}, status=400)

        def load(client: Client, conn: Connection) -> tuple[list[JobRecord], dt.datetime]:
            found = []
            if flt.matchable(before_id):
                found = client.list_jobs(before_id=before_id, limit=PAGE_SIZE + 1, conn=conn, **flt.client_kwargs())
            return found, client.now(conn=conn)

        found, now = await self.dash.query(load)
        page = found[:PAGE_SIZE]
        context = {
            "filter": flt,
            "error": None,
            "jobs": page,
            "now": now,
            "before_id": before_id,
            "next_before_id": page[-1].id if len(found) > PAGE_SIZE else None,
            "previews": {j.id: present.preview(j.payload, self.dash.redact) for j in page},
        }
        return self.dash.render(request, "jobs.html", {**self._jobs_context(request), **context}, live="_jobs.html")

    def _jobs_context(self, request: Request) -> dict[str, object]:
        app = self.dash.app
        return {
            "states": list(State),
            "notice": notice(request),
            "queues": app.queues if app else [],
            "tasks": sorted(app.tasks) if app else [],
        }

    async def job(self, request: Request) -> Response:
        job_id = parse_id(str(request.path_params["job_id"]))

        def load(client: Client, conn: Connection) -> tuple[JobRecord, dt.datetime]:
            return client.get(stored_id(job_id), conn=conn), client.now(conn=conn)

        job, now = await self.dash.query(load)
        context = {
            "job": job,
            "now": now,
            "notice": notice(request),
            "timeline": present.timeline(job),
            "payload": present.render_payload(job.payload, self.dash.redact),
            "result": present.render_payload(job.result, self.dash.redact) if job.state is State.COMPLETED else None,
            "attempts": [(e, present.parse_worker_id(e.worker)) for e in reversed(job.errors)],
            "holder": present.parse_worker_id(job.leased_by),
            "can_requeue": job.state in REQUEUEABLE_STATES,
            "can_cancel": job.state in CANCELLABLE_STATES,
            "can_delete": job.state is not State.RUNNING,
        }
        return self.dash.render(request, "job.html", context, live="_job.html")

    async def workers(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> tuple[list[ProcessInfo], dt.datetime]:
            return client.processes(conn=conn), client.now(conn=conn)

        processes, now = await self.dash.query(load)
        groups: dict[str, list[ProcessInfo]] = {}
        for process in processes:
            groups.setdefault(process.supervisor or process.id, []).append(process)
        context = {"groups": groups, "now": now, "count": len(processes)}
        return self.dash.render(request, "workers.html", context, live="_workers.html")

    async def periodic(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> tuple[dict[str, tuple[dt.datetime, bool]], dt.datetime]:
            return client.periodic_state(conn=conn), client.now(conn=conn)

        state, now = await self.dash.query(load)
        schedules = self.dash.app.schedules if self.dash.app else {}
        rows = []
        for name in sorted(set(schedules) | set(state)):
            last, enabled = state.get(name, (None, True))
            schedule = schedules.get(name)
            upcoming = schedule.next_slot(now) if schedule and enabled else None
            rows.append(PeriodicRow(name, schedule, enabled, last, upcoming))
        context = {"rows": rows, "now": now, "notice": notice(request)}
        return self.dash.render(request, "periodic.html", context)

    async def queues(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> QueuesData:
            # (Not whether a worker serves each queue: this page does not show it.)
            stats = client.queue_stats(check_served=False, conn=conn)
            paused, caps = client.paused_queues(conn=conn), client.queue_limits(conn=conn)
            return stats, paused, caps, client.limit_waits(conn=conn), client.blocked_sequences(limit=100, conn=conn)

        stats, paused, caps, waits, blocked = await self.dash.query(load)
        by_name = {s.queue: s for s in stats}
        names = sorted(set(by_name) | set(paused) | set(caps) | set(self.dash.app.queues if self.dash.app else []))
        rows = [
            replace(_queue_row(name, by_name.get(name), name in paused), max_running=caps.get(name)) for name in names
        ]
        context = {"rows": rows, "waits": waits, "blocked": blocked, "notice": notice(request)}
        return self.dash.render(request, "queues.html", context, live="_queues.html")


#: What the queues page reads: queue stats, paused queues, caps, the limits jobs wait on, and the
#: blocked sequence keys.
QueuesData = tuple[list[QueueStats], list[str], dict[str, int], list[LimitWait], list[BlockedSequence]]


def _queue_row(name: str, stats: QueueStats | None, paused: bool) -> QueueRow:
    if stats is None:
        return QueueRow(name, paused, 0, 0, 0, None)
    counts = stats.counts
    return QueueRow(
        name, paused, counts[State.AVAILABLE], counts[State.RUNNING], stats.scheduled, stats.oldest_available_seconds
    )


def _totals(stats: list[QueueStats]) -> dict[str, object]:
    waits = [s.oldest_available_seconds for s in stats if s.oldest_available_seconds is not None]
    return {
        "counts": {state.value: sum(s.counts[state] for s in stats) for state in State},
        "scheduled": sum(s.scheduled for s in stats),
        "expired": sum(s.expired_leases for s in stats),
        "oldest": max(waits, default=None),
    }


def _int_param(request: Request, name: str) -> int | None:
    text = request.query_params.get(name, "").strip()
    return parse_id(text, name) if text else None
