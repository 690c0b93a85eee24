"""The pages (GET): overview, jobs, job detail, workers, periodic schedules, queues.

Each handler gathers what its page needs on one connection, then renders; pages that refresh
live render only their fragment when asked with ``?partial=1``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response

from ..client.client import Client
from ..client.merging import answered, unreachable
from ..client.schedules import ListedSchedule
from ..client.sharded import ShardedClient
from ..core.db import Connection
from ..core.diagnosis import Diagnosis
from ..core.errors import InvalidInput
from ..core.health import held_too_long
from ..core.records import (
    CANCELLABLE_STATES,
    REQUEUEABLE_STATES,
    JobRecord,
    ProcessInfo,
    Progress,
    State,
)
from . import merged, present
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
    "delete-schedule": "Deleted the schedule: it enqueues nothing more.",
    "set-rule": "Set the key rule: it holds from the next claim.",
    "unset-rule": "Removed the key rule.",
}


def notice(request: Request) -> str | None:
    """The confirmation of the action that redirected here (``?done=requeue&n=3``), from fixed texts."""
    text = NOTICES.get(request.query_params.get("done", ""))
    n = request.query_params.get("n", "")
    return text.format(n=int(n) if n.isascii() and n.isdigit() else "some") if text else None


class PeriodicRow(NamedTuple):
    """A schedule as the periodic page shows it: on its database (``""`` without a map), with
    its next slot while it is enabled."""

    database: str
    listed: ListedSchedule
    next_slot: dt.datetime | None


class Pages:
    """The GET handlers."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    async def overview(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> merged.Reading:
            return merged.Reading(
                now=client.now(conn=conn),
                stats=client.queue_stats(conn=conn),  # as `miniqueue stats`: with the queues no worker serves
                throughput=client.throughput(conn=conn),
                paused=client.paused_queues(conn=conn),
                held=[h for h in client.horizon(conn=conn) if held_too_long(h)],
            )

        data = merged.overview(await self.dash.query_each(load))
        return self.dash.render(request, "overview.html", {**data, "states": list(State)}, live="_overview.html")

    async def jobs(self, request: Request) -> Response:
        try:
            flt = JobFilter.parse(request.query_params)
            before_id = _int_param(request, "before_id")
        except InvalidInput as exc:
            context = {"filter": JobFilter(), "error": str(exc), "jobs": [], "before_id": None, "next_before_id": None}
            return self.dash.render(request, "jobs.html", {**self._jobs_context(request), **context}, status=400)

        def load(client: Client, conn: Connection) -> JobsFound:
            found = []
            if flt.matchable(before_id):
                found = client.list_jobs(before_id=before_id, limit=PAGE_SIZE + 1, conn=conn, **flt.client_kwargs())
            return found, client.now(conn=conn), {}

        def load_map(sharded: ShardedClient) -> JobsFound:
            if not flt.matchable(before_id):
                return [], _clock(sharded), {}
            page = sharded.jobs_page(before_id=before_id, limit=PAGE_SIZE + 1, **flt.client_kwargs())
            return page.jobs, _clock(sharded), {name: str(why) for name, why in page.unreachable.items()}

        found, now, down = await (self.dash.query_map(load_map) if self.dash.sharded else self.dash.query(load))
        page = found[:PAGE_SIZE]
        context = {
            "filter": flt,
            "error": None,
            "jobs": page,
            "now": now,
            "before_id": before_id,
            "next_before_id": page[-1].id if len(found) > PAGE_SIZE else None,
            "previews": {j.id: present.preview(j.payload, self.dash.redact) for j in page},
            "unreachable": down,
            "where": {j.id: self.dash.database_of(j.id) for j in page} if self.dash.sharded else {},
        }
        return self.dash.render(request, "jobs.html", {**self._jobs_context(request), **context}, live="_jobs.html")

    def _jobs_context(self, request: Request) -> dict[str, object]:
        app = self.dash.app
        return {
            "states": list(State),
            "notice": notice(request),
            "queues": app.queues if app else [],
            "tasks": sorted(app.tasks) if app else [],
            "unreachable": {},
            "where": {},
        }

    async def job(self, request: Request) -> Response:
        job_id = parse_id(str(request.path_params["job_id"]))

        def load(client: Client, conn: Connection) -> tuple[JobRecord, Diagnosis, Progress | None]:
            found = client.get(stored_id(job_id), conn=conn), client.why(stored_id(job_id), conn=conn)
            return (*found, client.progress(stored_id(job_id), conn=conn).progress)

        job, why, progress = await self.dash.query(load, job_id=job_id)
        context = {
            "database": self.dash.database_of(job_id),
            "job": job,
            "now": why.checked_at,
            "why": why,
            "notice": notice(request),
            "timeline": present.timeline(job),
            "payload": present.render_payload(job.payload, self.dash.redact),
            "result": present.render_payload(job.result, self.dash.redact) if job.state is State.COMPLETED else None,
            "attempts": [(e, present.parse_worker_id(e.worker)) for e in reversed(job.errors)],
            "steps": [(step, present.preview(step.value, self.dash.redact, 200)) for step in job.steps],
            "progress": progress,
            "progress_meta": present.preview(progress.meta, self.dash.redact, 200) if progress else None,
            "holder": present.parse_worker_id(job.leased_by),
            "can_requeue": job.state in REQUEUEABLE_STATES,
            "can_cancel": job.state in CANCELLABLE_STATES,
            "can_delete": job.state is not State.RUNNING,
        }
        return self.dash.render(request, "job.html", context, live="_job.html")

    async def workers(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> tuple[list[ProcessInfo], dt.datetime]:
            return client.processes(conn=conn), client.now(conn=conn)

        answers = await self.dash.query_each(load)  # over a map: a supervisor per database
        found = answered(answers)
        now = next((now for _, now in found.values()), None) or dt.datetime.now(dt.timezone.utc)
        groups: dict[tuple[str, str], list[ProcessInfo]] = {}
        for name, (processes, _) in found.items():
            for process in processes:
                groups.setdefault((name, process.supervisor or process.id), []).append(process)
        context = {
            "groups": groups,
            "now": now,
            "count": sum(len(processes) for processes in groups.values()),
            "unreachable": {name: str(why) for name, why in unreachable(answers).items()},
        }
        return self.dash.render(request, "workers.html", context, live="_workers.html")

    async def periodic(self, request: Request) -> Response:
        def load_on(name: str) -> Callable[[Client, Connection], tuple[list[ListedSchedule], dt.datetime]]:
            code = self.dash.schedules_on(name)
            return lambda client, conn: (client.schedules.overview(code, conn=conn), client.now(conn=conn))

        answers = await self.dash.query_each_named(load_on)  # over a map: each database's schedules
        found = answered(answers)
        rows = [
            PeriodicRow(name, row, row.schedule.next_slot(now) if row.schedule and row.enabled else None)
            for name, (listed, now) in found.items()
            for row in listed
        ]
        context = {
            "rows": rows,
            "now": next((now for _, now in found.values()), None) or dt.datetime.now(dt.timezone.utc),
            "notice": notice(request),
            "detailed": any(row.listed.schedule for row in rows),
            "unreachable": {name: str(why) for name, why in unreachable(answers).items()},
        }
        return self.dash.render(request, "periodic.html", context)

    async def queues(self, request: Request) -> Response:
        def load(client: Client, conn: Connection) -> merged.QueuesReading:
            # (Not whether a worker serves each queue: this page does not show it.)
            return merged.QueuesReading(
                stats=client.queue_stats(check_served=False, conn=conn),
                paused=client.paused_queues(conn=conn),
                caps=client.queue_limits(conn=conn),
                waits=client.limit_waits(conn=conn),
                blocked=client.blocked_sequences(limit=100, conn=conn),
                rules=client.key_rules(conn=conn),
                shares=client.key_shares(limit=200, conn=conn),
            )

        known = self.dash.app.queues if self.dash.app else []
        context = merged.queues(await self.dash.query_each(load), list(known))
        return self.dash.render(request, "queues.html", {**context, "notice": notice(request)}, live="_queues.html")


#: What the jobs page reads: a page of jobs (one more than shown: is there a next page?), the
#: database's clock, and over a map the databases that did not answer, with why.
JobsFound = tuple[list[JobRecord], dt.datetime, dict[str, str]]


def _clock(sharded: ShardedClient) -> dt.datetime:
    """The time by the clock of the first database of the map that answers (the host's if none does)."""
    clocks = answered(sharded.read_each(lambda client: client.now()))
    return next(iter(clocks.values()), None) or dt.datetime.now(dt.timezone.utc)


def _int_param(request: Request, name: str) -> int | None:
    text = request.query_params.get(name, "").strip()
    return parse_id(text, name) if text else None
