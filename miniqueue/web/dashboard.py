"""What every page handler shares: the database (or the databases of a shard map), the
templates, the settings, the audit log.

Over a shard map a page reads every database (:meth:`Dashboard.query_each`: a database that
does not answer is named, never read as empty), the one a job's id names
(:meth:`Dashboard.query` with ``job_id``), or the one the request names
(:meth:`Dashboard.query_on`, as a periodic schedule's actions do); a read of one database with
none of these is refused over a map (501)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from ..client.client import Client
from ..client.merging import Answers
from ..client.sharded import ShardedClient
from ..core.db import Connection
from ..core.errors import InvalidInput, MiniqueueError
from ..core.records import DEFAULT_QUEUE
from ..tasks.app import App
from ..tasks.periodic import Periodic
from . import present
from .security import actor, audit_log, csrf_token, printable

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
MAX_AUDIT_IDS = 50


class NotOverMap(MiniqueueError):
    """A page or action that reads or changes one database, asked of a dashboard over a map."""


class Database:
    """The dashboard's Client: the caller's, or one opened on first use from a DSN; or the
    caller's ShardedClient (each database's client opens on first use too).

    Opening lazily keeps ``create_app()`` free of connections, so an app created at import
    time in a pre-forking server opens its pool in each worker process, never before the fork.
    """

    def __init__(self, source: str | Client | ShardedClient) -> None:
        self._dsn = source if isinstance(source, str) else None
        self._client = source if isinstance(source, Client) else None
        self.sharded = source if isinstance(source, ShardedClient) else None
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        if self.sharded is not None:
            raise NotOverMap("this dashboard reads a shard map: name the database (see Dashboard.query)")
        with self._lock:
            if self._client is None:
                assert self._dsn is not None
                self._client = Client(self._dsn)
            return self._client

    def close(self) -> None:
        """Close the Client if this dashboard opened it."""
        with self._lock:
            if self._dsn is not None and self._client is not None:
                self._client.close()
                self._client = None


class Dashboard:
    """Settings plus the helpers handlers use: :meth:`query` (the client's blocking calls off the event loop),
    :meth:`render` (a page, or only its live fragment) and :meth:`audit`."""

    def __init__(
        self,
        database: Database,
        *,
        read_only: bool,
        redact: present.Redact | None,
        app: App | None,
        refresh_seconds: float,
    ) -> None:
        self.database = database
        self.read_only = read_only
        self.redact = redact
        self.app = app
        self.refresh_seconds = refresh_seconds
        self.templates = Jinja2Templates(env=_environment())

    @property
    def sharded(self) -> ShardedClient | None:
        """The client over the map, when the dashboard shows one."""
        return self.database.sharded

    @property
    def databases(self) -> list[str]:
        """The databases' names: the map's, or ``[""]`` for the one database."""
        return list(self.sharded.shards.databases) if self.sharded else [""]

    def database_of(self, job_id: int) -> str:
        """The name of the database job ``job_id`` lives on (``""`` without a map)."""
        return self.sharded.shards.database_of(job_id).name if self.sharded else ""

    def by_database(self, job_ids: Iterable[int]) -> dict[str, list[int]]:
        """``job_ids`` by the database each names (all under ``""`` without a map)."""
        ids = list(job_ids)
        return self.sharded.by_database(ids) if self.sharded else {"": ids}

    def queue_databases(self, queue: str) -> list[str]:
        """The databases queue ``queue`` lives on (``[""]`` without a map)."""
        return [d.name for d in self.sharded.shards.databases_of(queue)] if self.sharded else [""]

    def schedules_on(self, database: str) -> dict[str, Periodic]:
        """The app's schedules that database ``database``'s reaper runs: over a map, those whose
        task's queue it schedules (see ShardMap.scheduler_of); without one, all of them."""
        if self.app is None:
            return {}
        if self.sharded is None:
            return dict(self.app.schedules)
        shards, tasks = self.sharded.shards, self.app.tasks
        found = {}
        for name, schedule in self.app.schedules.items():
            task = tasks.get(schedule.task)
            scheduler = shards.scheduler_of(task.queue if task else DEFAULT_QUEUE)
            if scheduler is not None and scheduler.name == database:
                found[name] = schedule
        return found

    def database_named(self, request: Request) -> str:
        """The database of the map that a schedule's action names (``?database=NAME``: each
        database holds schedules of its own); ``""`` without a map."""
        if self.sharded is None:
            return ""
        name = request.query_params.get("database", "")
        if name not in self.sharded.shards.databases:
            known = ", ".join(self.databases)
            raise InvalidInput(f"database {name!r} is not in the shard map (known: {known}): name it with ?database=")
        return name

    async def query(self, fn: Callable[[Client, Connection], T], *, job_id: int | None = None) -> T:
        """Run ``fn(client, conn)`` in a worker thread, ``conn`` one pooled connection that
        ``fn`` passes to each of its client calls (``conn=conn``): a page's reads share it.
        Over a map, on the database ``job_id`` names (NotOverMap without one)."""
        if self.sharded is None:
            return await self.query_on("", fn)
        if job_id is None:
            raise NotOverMap("this page reads one database: over a shard map it is not available yet")
        return await self.query_on(self.database_of(job_id), fn)

    async def query_on(self, name: str, fn: Callable[[Client, Connection], T]) -> T:
        """:meth:`query` on database ``name`` of the map (``""``: the one database);
        DatabaseUnavailable naming it when it does not answer."""
        sharded = self.sharded

        def call() -> T:
            if sharded is None:
                return _on_connection(self.database.client, fn)
            return sharded.read_on(name, lambda client: _on_connection(client, fn))

        return await run_in_threadpool(call)

    async def query_map(self, fn: Callable[[ShardedClient], T]) -> T:
        """Run ``fn(sharded)`` in a worker thread, on the client over the map (NotOverMap without one)."""
        sharded = self.sharded
        if sharded is None:
            raise NotOverMap("this dashboard shows one database, not a shard map")
        return await run_in_threadpool(fn, sharded)

    async def query_each(self, fn: Callable[[Client, Connection], T]) -> Answers[T]:
        """:meth:`query` on every database: per database (``""`` without a map), its answer or
        the DatabaseUnavailable that says it did not answer. (The one database's error
        propagates: without a map there is nothing else to show.)"""
        return await self.query_each_named(lambda name: fn)

    async def query_each_named(self, fn_on: Callable[[str], Callable[[Client, Connection], T]]) -> Answers[T]:
        """:meth:`query_each`, running ``fn_on(name)`` on database ``name`` (``""`` without a map)."""
        sharded = self.sharded
        if sharded is None:
            return {"": await self.query_on("", fn_on(""))}

        def each() -> Answers[T]:
            names = sharded.shards.databases
            return {name: sharded.answer(name, functools.partial(_on_connection, fn=fn_on(name))) for name in names}

        return await run_in_threadpool(each)

    def render(
        self, request: Request, template: str, context: dict[str, Any], *, live: str | None = None, status: int = 200
    ) -> Response:
        """Render ``template``; with ``?partial=1`` render only its ``live`` fragment (for polling)."""
        if live and request.query_params.get("partial"):
            template = live
        base = {
            "read_only": self.read_only,
            "csrf_token": csrf_token(request),
            "root": request.scope.get("root_path", ""),
            "refresh_ms": int(self.refresh_seconds * 1000),
            "live": live,
            "live_url": _live_url(request) if live else None,
            "has_app": self.app is not None,
            "over_map": self.sharded is not None,
        }
        return self.templates.TemplateResponse(request, template, {**base, **context}, status_code=status)

    def audit(
        self,
        request: Request,
        action: str,
        count: int,
        *,
        ids: Iterable[int] | None = None,
        target: str = "",
        outcome: str = "ok",
    ) -> None:
        """One log line per action: who, what, on which ids or filter, how many, and the outcome."""
        who = actor(request)
        id_list = list(ids) if ids is not None else None
        if id_list is not None:
            shown = ",".join(str(i) for i in id_list[:MAX_AUDIT_IDS])
            more = f",…(+{len(id_list) - MAX_AUDIT_IDS})" if len(id_list) > MAX_AUDIT_IDS else ""
            target = f"ids={shown}{more}" + (f" {target}" if target else "")
        # The filter and the user name come from the request: escape line breaks and other
        # control characters, so that no input can forge a second audit line.
        who, target, outcome = printable(who), printable(target), printable(outcome)
        audit_log.info(
            "user=%s action=%s %s count=%d outcome=%s",
            who,
            action,
            target,
            count,
            outcome,
            extra={
                "audit": {
                    "user": who,
                    "action": action,
                    "target": target,
                    "count": count,
                    "ids": id_list[:MAX_AUDIT_IDS] if id_list is not None else None,
                    "outcome": outcome,
                }
            },
        )


def _on_connection(client: Client, fn: Callable[[Client, Connection], T]) -> T:
    with client.connection() as conn:
        return fn(client, conn)


def _live_url(request: Request) -> str:
    """This page's URL, relative to the host, asking for its fragment (the path includes any mount prefix)."""
    return f"{request.url.path}?{request.url.include_query_params(partial='1').query}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html", "svg"]),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(age=present.age, size=present.size, ts=present.timestamp, summary=present.summary)
    env.globals["since"] = present.since
    return env
