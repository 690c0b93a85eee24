"""What every page handler shares: the database, the templates, the settings, the audit log."""

from __future__ import annotations

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
from ..core.db import Connection
from ..tasks.app import App
from . import present
from .security import actor, audit_log, csrf_token, printable

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
MAX_AUDIT_IDS = 50


class Database:
    """The dashboard's Client: the caller's, or one opened on first use from a DSN.

    Opening lazily keeps ``create_app()`` free of connections, so an app created at import
    time in a pre-forking server opens its pool in each worker process, never before the fork.
    """

    def __init__(self, dsn_or_client: str | Client) -> None:
        self._dsn = dsn_or_client if isinstance(dsn_or_client, str) else None
        self._client = dsn_or_client if isinstance(dsn_or_client, Client) else None
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
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

    async def query(self, fn: Callable[[Client, Connection], T]) -> T:
        """Run ``fn(client, conn)`` in a worker thread, ``conn`` one pooled connection that
        ``fn`` passes to each of its client calls (``conn=conn``): a page's reads share it."""

        def call() -> T:
            client = self.database.client
            with client.connection() as conn:
                return fn(client, conn)

        return await run_in_threadpool(call)

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
            "live_url": _live_url(request) if live else None,
            "has_app": self.app is not None,
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
