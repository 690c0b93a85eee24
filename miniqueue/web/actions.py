"""The actions: the confirmation page (GET) and every POST that changes something.

Every POST has passed the CSRF and read-only middlewares before it gets here; each writes an
audit line and redirects (303) to a page that shows the result.

Over a shard map, an action on a job goes to the database its id names, an action on several
jobs to each of their databases in turn (on every job matching a filter: database after
database, at most the confirmed count in all), pausing a queue to every database it lives on,
and an action on a periodic schedule to the database the request names (each holds its own).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..client.client import Client
from ..core.db import Connection
from ..core.errors import InvalidInput, MiniqueueError
from ..core.validation import check_queue_name, check_task_name
from .dashboard import Dashboard
from .filters import parse_id, stored_id
from .jobactions import Preview, Target, action_named, apply, apply_to_ids, preview


class Actions:
    """The handlers that act on jobs, queues and schedules."""

    def __init__(self, dash: Dashboard) -> None:
        self.dash = dash

    def _redirect(self, request: Request, path: str) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path', '')}{path}", status_code=303)

    async def confirm(self, request: Request) -> Response:
        """Show how many jobs an action will touch, with the button that does it."""
        action = action_named(request.query_params.get("action", ""))
        target = Target.parse(request.query_params)

        previews = []
        for name, part in self._by_database(target).items():
            previews.append(await self.dash.query_on(name, functools.partial(preview, action=action, target=part)))
        result = Preview.total(previews)
        context = {"action": action, "target": target, "preview": result, "back": target.filter.query()}
        return self.dash.render(request, "confirm.html", context)

    async def jobs(self, request: Request) -> Response:
        """Apply a confirmed action to a selection or to every matching job (at most the confirmed count)."""
        form = await request.form()
        action = action_named(str(form.get("action", "")))
        target = Target.parse(form)
        if not form.get("expected"):
            raise InvalidInput("the confirmed job count is missing: confirm the action first")
        expected = parse_id(str(form["expected"]), "confirmed job count")

        scope = "" if target.ids is not None else f"filter=[{target.filter.describe()}]"
        done: list[int] = []
        try:
            for name, part in self._by_database(target).items():
                if len(done) >= expected:
                    break
                run = functools.partial(apply, action=action, target=part, limit=expected - len(done))
                done += await self.dash.query_on(name, run)
        except MiniqueueError as exc:
            what = f"refused after {len(done)}: {exc}" if done else f"refused: {exc}"
            self.dash.audit(request, action.name, len(done), ids=done or target.ids, target=scope, outcome=what)
            raise
        self.dash.audit(request, action.name, len(done), ids=done, target=scope)
        return self._redirect(request, f"/jobs?{target.filter.query(done=action.name, n=len(done))}")

    async def job(self, request: Request) -> Response:
        """Requeue, cancel or delete one job (from its page)."""
        action = action_named(request.path_params["action"])
        job_id = parse_id(str(request.path_params["job_id"]))

        def run(client: Client, conn: Connection) -> list[int]:
            if action.name == "delete":
                return apply_to_ids(client, conn, action, [job_id])
            return action.run(client, conn, [stored_id(job_id)])

        try:
            done = await self.dash.query(run, job_id=job_id)
        except MiniqueueError as exc:
            self.dash.audit(request, action.name, 0, ids=[job_id], outcome=f"refused: {exc}")
            raise
        self.dash.audit(request, action.name, len(done), ids=[job_id])
        if action.name == "delete":
            return self._redirect(request, f"/jobs?done=delete&n={len(done)}")
        return self._redirect(request, f"/jobs/{job_id}?done={action.name}&n={len(done)}")

    async def queue(self, request: Request) -> Response:
        """Pause or resume a queue."""
        name = check_queue_name(request.path_params["name"])
        paused = {"pause": True, "resume": False}.get(request.path_params["action"])
        if paused is None:
            raise InvalidInput(f"queue action {request.path_params['action']!r} is invalid: use pause or resume")

        def run(client: Client, conn: Connection) -> None:
            # create: a queue with no job yet can be paused ahead of its first one.
            (client.pause_queues if paused else client.resume_queues)([name], create=True, conn=conn)

        for database in self.dash.queue_databases(name):
            await self.dash.query_on(database, run)
        verb = "pause" if paused else "resume"
        self.dash.audit(request, f"{verb}-queue", 1, target=f"queue={name}")
        return self._redirect(request, f"/queues?done={verb}")

    async def key_rule(self, request: Request) -> Response:
        """Set a key rule (pattern, limit, weight, every_key) or remove one (pattern), on every
        database (each enforces its own rules)."""
        form = await request.form()
        pattern = str(form.get("pattern", ""))
        verb = request.path_params["action"]
        if verb not in ("set", "unset"):
            raise InvalidInput(f"key rule action {verb!r} is invalid: use set or unset")
        limit, weight = _number(form.get("limit"), int, "limit"), _number(form.get("weight"), float, "weight")

        def run(client: Client, conn: Connection) -> None:
            if verb == "set":
                client.set_key_rule(
                    pattern, limit=limit, weight=weight, every_key=bool(form.get("every_key")), conn=conn
                )
            else:
                client.remove_key_rule(pattern, conn=conn)

        for database in self.dash.databases:
            await self.dash.query_on(database, run)
        self.dash.audit(request, f"{verb}-key-rule", 1, target=f"pattern={pattern}")
        return self._redirect(request, f"/queues?done={verb}-rule")

    def _by_database(self, target: Target) -> dict[str, Target]:
        """The part of ``target`` on each database: its own ids, or the filter on every one."""
        if target.ids is None:
            return dict.fromkeys(self.dash.databases, target)
        return {name: Target(tuple(ids), target.filter) for name, ids in self.dash.by_database(target.ids).items()}

    async def schedule(self, request: Request) -> Response:
        """Enable, disable, or run now (needs the app) a periodic schedule; delete one created at
        run time. Over a map, on the database the request names (``?database=``)."""
        database = self.dash.database_named(request)
        name = check_task_name(request.path_params["name"])
        verb = request.path_params["action"]
        if verb == "run":
            return await self._run_schedule(request, database, name)
        if verb == "delete":
            return await self._delete_schedule(request, database, name)
        enabled = {"enable": True, "disable": False}.get(verb)
        if enabled is None:
            raise InvalidInput(f"schedule action {verb!r} is invalid: use enable, disable, run or delete")

        def run(client: Client, conn: Connection) -> None:
            # create: no check that the name is known (the page lists the database's and the app's).
            (client.enable_schedule if enabled else client.disable_schedule)(name, create=True, conn=conn)

        await self.dash.query_on(database, run)
        self.dash.audit(request, f"{verb}-schedule", 1, target=_schedule_target(database, name))
        return self._redirect(request, f"/periodic?done={verb}")

    async def confirm_schedule_delete(self, request: Request) -> Response:
        """Show the schedule created at run time that a delete will remove, with the button that does it."""
        database = self.dash.database_named(request)
        name = check_task_name(request.path_params["name"])
        schedule = await self.dash.query_on(database, lambda client, conn: client.schedules.get(name, conn=conn))
        if schedule is None:
            raise HTTPException(404, f"no schedule {name!r} was created at run time")
        return self.dash.render(request, "confirm_schedule.html", {"schedule": schedule, "database": database})

    async def _delete_schedule(self, request: Request, database: str, name: str) -> Response:
        await self.dash.query_on(database, lambda client, conn: client.schedules.delete(name, conn=conn))
        self.dash.audit(request, "delete-schedule", 1, target=_schedule_target(database, name))
        return self._redirect(request, "/periodic?done=delete-schedule")

    async def _run_schedule(self, request: Request, database: str, name: str) -> Response:
        app = self.dash.app
        schedule = self.dash.schedules_on(database).get(name)
        if app is None or schedule is None:
            raise HTTPException(404, f"schedule {name!r} is not in this dashboard's app: pass app= to run it")

        def run(client: Client, conn: Connection) -> int:
            # On the database whose reaper runs the schedule, as its slots are.
            return app.enqueue(client, schedule.task, schedule.payload, conn=conn).id

        job_id = await self.dash.query_on(database, run)
        self.dash.audit(request, "run-schedule", 1, ids=[job_id], target=_schedule_target(database, name))
        return self._redirect(request, f"/jobs/{job_id}?done=run")


def _number(value: object, kind: type[int] | type[float], name: str) -> Any:
    """A form's number field (None when left empty); InvalidInput naming it when it is no number."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise InvalidInput(f"{name} {text!r} is invalid: use a number") from None


def _schedule_target(database: str, name: str) -> str:
    """A schedule as the audit line names it (with its database over a map)."""
    return f"schedule={name}" + (f" database={database}" if database else "")
