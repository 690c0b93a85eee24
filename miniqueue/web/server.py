"""The dashboard as an ASGI app (:func:`create_app`) and as a standalone server (:func:`serve`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..app import App, load_app
from ..client import Client
from ..errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    MiniqueueError,
    SchemaOutOfDate,
)
from ..process import configure_logging
from .actions import Actions
from .dashboard import HERE, Dashboard, Database
from .pages import Pages
from .present import Redact
from .security import (
    Auth,
    AuthMiddleware,
    CsrfMiddleware,
    ReadOnlyMiddleware,
    SecurityHeadersMiddleware,
    auth_from_env,
    csrf_secret,
)

log = logging.getLogger("miniqueue.web")
LOCAL_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
STATUS = {JobNotFound: 404, InvalidInput: 400, InvalidTransition: 409, ConfigError: 400,
          DatabaseUnavailable: 503, SchemaOutOfDate: 503}  # fmt: skip


def create_app(
    dsn_or_client: str | Client,
    *,
    read_only: bool = False,
    auth: Auth | None = None,
    redact: Redact | None = None,
    app: App | None = None,
    secret: str | bytes | None = None,
    refresh_seconds: float = 2.0,
) -> Starlette:
    """The dashboard as a Starlette app, to serve or mount (``Mount("/queue", create_app(dsn))``).

    ``dsn_or_client``: a DSN (the dashboard opens its own small pool on first request) or your
    :class:`~miniqueue.Client`. ``auth(request) -> bool`` (may be async) admits a request;
    without it, HTTP Basic auth applies when MINIQUEUE_WEB_USER and MINIQUEUE_WEB_PASSWORD are
    set, else no authentication. ``read_only`` hides every action and refuses every POST (403).
    ``redact(payload) -> payload`` is applied to every payload shown. ``app`` (your App) lists
    its schedules and queues and enables "run now". ``secret`` signs the CSRF cookie (default:
    MINIQUEUE_WEB_SECRET, else random per process, which is fine for one server process).
    """
    database = Database(dsn_or_client)
    dash = Dashboard(database, read_only=read_only, redact=redact, app=app, refresh_seconds=refresh_seconds)
    checker = auth if auth is not None else auth_from_env()
    middleware = [Middleware(SecurityHeadersMiddleware)]
    if checker:
        middleware.append(Middleware(AuthMiddleware, auth=checker))
    if read_only:
        middleware.append(Middleware(ReadOnlyMiddleware))
    middleware.append(Middleware(CsrfMiddleware, secret=csrf_secret(secret)))

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        database.close()

    return Starlette(
        routes=_routes(dash),
        middleware=middleware,
        exception_handlers={MiniqueueError: _error_page(dash), HTTPException: _error_page(dash)},
        lifespan=lifespan,
    )


def _routes(dash: Dashboard) -> list[Route | Mount]:
    pages, actions = Pages(dash), Actions(dash)
    return [
        Route("/", pages.overview, name="overview"),
        Route("/jobs", pages.jobs, name="jobs"),
        Route("/jobs/confirm", actions.confirm, name="confirm"),
        Route("/jobs/action", actions.jobs, methods=["POST"], name="jobs_action"),
        Route("/jobs/{job_id:int}", pages.job, name="job"),
        Route("/jobs/{job_id:int}/{action}", actions.job, methods=["POST"], name="job_action"),
        Route("/workers", pages.workers, name="workers"),
        Route("/periodic", pages.periodic, name="periodic"),
        Route("/periodic/{name}/{action}", actions.schedule, methods=["POST"], name="schedule_action"),
        Route("/queues", pages.queues, name="queues"),
        Route("/queues/{name}/{action}", actions.queue, methods=["POST"], name="queue_action"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


def _error_page(dash: Dashboard) -> Any:
    async def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status, message = exc.status_code, str(exc.detail)
        else:
            status = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 500)
            message = str(exc)
        if status >= 500:
            log.warning("dashboard request %s failed: %s", request.url.path, message)
        template = "_error.html" if request.query_params.get("partial") else "error.html"
        return dash.render(request, template, {"status": status, "message": message}, status=status)

    return handle


def serve(
    dsn: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    read_only: bool = False,
    app_ref: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve the dashboard with uvicorn until interrupted (localhost by default).

    ``app_ref`` (``module:attribute``) loads your App for periodic "run now" and its queues.
    """
    import uvicorn

    if not logging.getLogger().handlers:  # audit lines are INFO: show them unless the host app decided
        configure_logging(log_level)
    app = load_app(app_ref) if app_ref else None
    asgi = create_app(dsn, read_only=read_only, app=app)
    if host not in LOCAL_HOSTS and auth_from_env() is None:
        log.warning("the dashboard listens on %s without authentication: set MINIQUEUE_WEB_USER and "
                    "MINIQUEUE_WEB_PASSWORD, or put it behind an authenticating proxy", host)  # fmt: skip
    uvicorn.run(asgi, host=host, port=port, log_level=log_level)
