"""The dashboard as an ASGI app (:func:`create_app`) and as a standalone server (:func:`serve`)."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..client.client import Client
from ..client.sharded import ShardedClient
from ..core.errors import (
    ConfigError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidTransition,
    JobNotFound,
    MiniqueueError,
    SchemaOutOfDate,
)
from ..core.shard_map import ShardMap
from ..observability.logs import configure_logging
from ..tasks.app import App
from ..tasks.loading import load_app
from .actions import Actions
from .dashboard import HERE, Dashboard, Database, NotOverMap
from .logins import LoginThrottle
from .pages import Pages
from .present import Redact
from .security import (
    LOCAL_HOSTS,
    AllowedHostsMiddleware,
    Auth,
    AuthMiddleware,
    BasicAuth,
    CsrfMiddleware,
    ReadOnlyMiddleware,
    SecurityHeadersMiddleware,
    allowed_host,
    auth_from_env,
    csrf_secret,
)

log = logging.getLogger("miniqueue.web")
#: Addresses that mean "every interface": no one name to answer for.
EVERY_ADDRESS = frozenset({"", "0.0.0.0", "::", "[::]"})
STATUS = {
    JobNotFound: 404,
    InvalidInput: 400,
    InvalidTransition: 409,
    ConfigError: 400,
    DatabaseUnavailable: 503,
    SchemaOutOfDate: 503,
    NotOverMap: 501,
}


def create_app(
    dsn_or_client: str | Client | ShardedClient,
    *,
    read_only: bool = False,
    auth: Auth | None = None,
    redact: Redact | None = None,
    app: App | None = None,
    secret: str | bytes | None = None,
    refresh_seconds: float = 2.0,
    allowed_hosts: Iterable[str] = LOCAL_HOSTS,
) -> Starlette:
    """The dashboard as a Starlette app, to serve or mount (``Mount("/queue", create_app(dsn))``).

    ``dsn_or_client``: a DSN (the dashboard opens its own small pool on first request), your
    :class:`~miniqueue.Client`, or your :class:`~miniqueue.ShardedClient` to show every database
    of a shard map (see docs/operations/dashboard.md: what each page shows over a map, and a
    database that does not answer named on the page, never shown as empty).
    ``auth(request) -> bool`` (may be async) admits a request;
    without it, HTTP Basic auth applies when MINIQUEUE_WEB_USER and MINIQUEUE_WEB_PASSWORD are
    set (each login and failed login is an audit line, and an address that failed too often is
    answered 429 for a while), else no authentication. ``read_only`` hides every action and refuses every POST (403).
    ``redact(payload) -> payload`` is applied to every payload shown. ``app`` (your App) lists
    its schedules and queues and enables "run now". ``secret`` signs the CSRF cookie (default:
    MINIQUEUE_WEB_SECRET, else random per process, which is fine for one server process).
    ``allowed_hosts``: the names (any port) a request's Host header may give, else 400; by
    default localhost's; ``["*"]`` admits any, for use behind a proxy that checks Host.
    """
    hosts = _allowed_hosts(allowed_hosts)
    database = Database(dsn_or_client)
    dash = Dashboard(database, read_only=read_only, redact=redact, app=app, refresh_seconds=refresh_seconds)
    checker = auth if auth is not None else auth_from_env()
    middleware = [Middleware(SecurityHeadersMiddleware), Middleware(AllowedHostsMiddleware, hosts=hosts)]
    if checker:
        # Basic auth checks a password on every request: log logins and slow down guessing.
        throttle = LoginThrottle() if isinstance(checker, BasicAuth) else None
        middleware.append(Middleware(AuthMiddleware, auth=checker, throttle=throttle))
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


def _allowed_hosts(hosts: Iterable[str]) -> list[str]:
    """The allowed hosts, checked now: a bad entry fails ``create_app``, not the first request."""
    if isinstance(hosts, str):  # a lone name would be taken letter by letter
        raise ConfigError(f"allowed_hosts={hosts!r} is one string: pass a list of host names")
    return [allowed_host(host) for host in hosts]


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
        Route("/periodic/{name}/delete", actions.confirm_schedule_delete, name="confirm_schedule_delete"),
        Route("/periodic/{name}/{action}", actions.schedule, methods=["POST"], name="schedule_action"),
        Route("/queues", pages.queues, name="queues"),
        Route("/queues/{name}/{action}", actions.queue, methods=["POST"], name="queue_action"),
        Route("/keys/{action}", actions.key_rule, methods=["POST"], name="key_rule_action"),
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
    dsn: str | ShardMap,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    read_only: bool = False,
    app_ref: str | None = None,
    log_level: str = "info",
    allowed_hosts: Iterable[str] = (),
    insecure_bind_public: bool = False,
    schema: str = "public",
) -> None:
    """Serve the dashboard with uvicorn until interrupted (localhost by default), over the
    database ``dsn`` or every database of a shard map.

    It answers for localhost's names, for ``host`` unless that is every address (0.0.0.0),
    and for ``allowed_hosts``. Listening beyond loopback without authentication
    (MINIQUEUE_WEB_USER and MINIQUEUE_WEB_PASSWORD) raises ConfigError unless
    ``insecure_bind_public``. ``app_ref`` (``module:attribute``) loads your App for periodic
    "run now" and its queues.
    """
    import uvicorn

    check_bind(host, insecure_bind_public=insecure_bind_public)
    if not logging.getLogger().handlers:  # audit lines are INFO: show them unless the host app decided
        configure_logging(log_level)
    app = load_app(app_ref) if app_ref else None
    hosts = served_hosts(host, allowed_hosts)
    source = ShardedClient(dsn, schema=schema) if isinstance(dsn, ShardMap) else Client(dsn, schema=schema)
    asgi = create_app(source, read_only=read_only, app=app, allowed_hosts=hosts)
    if not is_loopback(host) and auth_from_env() is None:
        log.warning(
            "the dashboard listens on %s without authentication (--insecure-bind-public): anyone who "
            "can reach it can read and change the queue",
            host,
        )
    log.info("the dashboard answers for the hosts %s", ", ".join(hosts))
    uvicorn.run(asgi, host=host, port=port, log_level=log_level)


def check_bind(host: str, *, insecure_bind_public: bool = False) -> None:
    """Raise ConfigError if listening on ``host`` would serve beyond loopback with no
    authentication, unless ``insecure_bind_public`` accepts that."""
    if is_loopback(host) or insecure_bind_public or auth_from_env() is not None:
        return
    raise ConfigError(
        f"refusing to serve the dashboard on {host} without authentication (anyone who can reach it could "
        "delete jobs): set MINIQUEUE_WEB_USER and MINIQUEUE_WEB_PASSWORD, or pass --insecure-bind-public "
        "(serve(insecure_bind_public=True)) if a proxy in front authenticates"
    )


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve to a public address


def served_hosts(host: str, allowed_hosts: Iterable[str] = ()) -> list[str]:
    """The Host names :func:`serve` answers for: localhost's, the address it listens on (unless
    that is every address) and ``allowed_hosts``."""
    bound = [] if host in EVERY_ADDRESS else [host]
    return list(dict.fromkeys(_allowed_hosts([*LOCAL_HOSTS, *bound]) + _allowed_hosts(allowed_hosts)))
