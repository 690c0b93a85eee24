"""Who may see the dashboard and change things: allowed hosts, authentication, read-only mode and CSRF.

ASGI middlewares, outermost first: :class:`SecurityHeadersMiddleware` (no framing, no inline
script), :class:`AllowedHostsMiddleware` (only the hosts it serves, against DNS rebinding),
:class:`AuthMiddleware` (HTTP Basic from the environment, or the user's ``auth(request)``
callable), :class:`ReadOnlyMiddleware` (every non-GET refused) and :class:`CsrfMiddleware`
(every POST must carry the token of a signed double-submit cookie).
Being middlewares, they guard every route, including ones added later. With Basic auth,
:class:`AuthMiddleware` also writes an audit line for each login and each failed one, and
answers 429 to a client address that failed too often (see :mod:`miniqueue.web.logins`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from urllib.parse import parse_qs

from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import ConfigError
from .logins import LoginThrottle

Auth = Callable[[Request], "bool | Awaitable[bool]"]
audit_log = logging.getLogger("miniqueue.web.audit")

USER_ENV, PASSWORD_ENV, SECRET_ENV = "MINIQUEUE_WEB_USER", "MINIQUEUE_WEB_PASSWORD", "MINIQUEUE_WEB_SECRET"
CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER = "miniqueue_csrf", "csrf_token", "x-csrf-token"
USER_STATE, TOKEN_STATE = "miniqueue_user", "miniqueue_csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_FORM_BYTES = 1024 * 1024
#: The names a dashboard on this machine is reached by when nobody names others.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
#: How much of a user name a failed login's audit line shows.
MAX_LOGGED_USER = 100
# [IPv6 literal] or a name or IPv4 address, then an optional port that may be empty (RFC 3986 3.2).
_HOST_HEADER = re.compile(r"(?:\[([0-9a-z:.%]+)\]|([a-z0-9._~%!$&'()*+,;=-]+))(?::([0-9]*))?", re.IGNORECASE)


class BasicAuth:
    """HTTP Basic authentication against one user name and password (compared in constant time)."""

    challenge = 'Basic realm="miniqueue", charset="UTF-8"'

    def __init__(self, user: str, password: str) -> None:
        self._user, self._password = user.encode(), password.encode()

    def __call__(self, request: Request) -> bool:
        credentials = basic_credentials(request)
        if credentials is None:
            return False
        user, password = credentials
        # Both comparisons always run, so the time taken does not tell which part was wrong.
        ok = hmac.compare_digest(user.encode(), self._user) & hmac.compare_digest(password.encode(), self._password)
        if ok:
            request.state.miniqueue_user = user
        return bool(ok)


def basic_credentials(request: HTTPConnection) -> tuple[str, str] | None:
    """The user name and password of the request's Basic ``Authorization`` header, if it has a readable one."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def auth_from_env(environ: Mapping[str, str] = os.environ) -> BasicAuth | None:
    """Basic auth from MINIQUEUE_WEB_USER and MINIQUEUE_WEB_PASSWORD; None when neither is set."""
    user, password = environ.get(USER_ENV, ""), environ.get(PASSWORD_ENV, "")
    if not user and not password:
        return None
    if not user or not password:
        missing = USER_ENV if not user else PASSWORD_ENV
        raise ConfigError(f"{missing} is not set: set both {USER_ENV} and {PASSWORD_ENV} for Basic auth, or neither")
    return BasicAuth(user, password)


def actor(request: HTTPConnection) -> str:
    """Who is acting, for audit lines: the authenticated user (or ``anonymous``) at the client address."""
    user = request.scope.get("state", {}).get(USER_STATE) or "anonymous"
    return f"{user}@{client_address(request)}"


def client_address(request: HTTPConnection) -> str:
    """The address the request came from (as the server saw it: a proxy's unless it passes the client's)."""
    return request.client.host if request.client else "unknown"


def printable(text: str) -> str:
    """``text`` with line breaks and other control characters escaped, so that no input can
    forge a second log line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def csrf_token(request: HTTPConnection) -> str:
    """The CSRF token that forms on this page must send back (set by :class:`CsrfMiddleware`)."""
    token: str = request.scope["state"][TOKEN_STATE]
    return token


SECURITY_HEADERS = {
    # Action buttons in a frame on another site are a clickjacking target; pages load only
    # their own stylesheet and script.
    "content-security-policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'; object-src 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


class SecurityHeadersMiddleware:
    """Add :data:`SECURITY_HEADERS` to every response (also the 401 and 403 refusals)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


class AllowedHostsMiddleware:
    """Refuse with 400 every request whose Host header is not one of ``hosts`` (any port).

    A page on another site can point its own name at 127.0.0.1 (DNS rebinding) and then read
    and post to a dashboard on localhost as its own origin, CSRF token included; its requests
    still name that site in Host, so they are refused before anything else runs. ``"*"``
    admits every host: only for a dashboard behind a proxy that checks Host itself.
    """

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(allowed_host(host) for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or ANY_HOST in self.hosts:
            await self.app(scope, receive, send)
            return
        host = request_host(HTTPConnection(scope).headers.get("host", ""))
        if host in self.hosts:
            await self.app(scope, receive, send)
            return
        named = f"host {host!r}" if host else "a missing or malformed Host header"
        message = f"the dashboard does not answer for {named}: add the name to its allowed hosts (--allowed-host)"
        await PlainTextResponse(message, 400)(scope, receive, send)


def allowed_host(entry: str) -> str:
    """An allowed-hosts entry in the form :func:`request_host` returns (``"[::1]"`` is ``"::1"``)."""
    name = entry.strip()
    if name == ANY_HOST:
        return name
    if name.count(":") > 1 and not name.startswith("["):
        name = f"[{name}]"  # a bare IPv6 address: bracket it as a Host header would
    match = _HOST_HEADER.fullmatch(name)
    if match is None:
        raise ConfigError(f"allowed host {entry!r} is not a host name or address (or '*' for any host)")
    if match[3] is not None:
        raise ConfigError(f"allowed host {entry!r} has a port: give the name alone (every port is allowed)")
    return (match[1] or match[2]).lower().rstrip(".")


def request_host(header: str) -> str | None:
    """The host a Host header names, lowercased, without its port or IPv6 brackets; None if malformed."""
    match = _HOST_HEADER.fullmatch(header.strip())
    if match is None:
        return None
    return (match[1] or match[2]).lower().rstrip(".") or None


class AuthMiddleware:
    """Refuse every request that ``auth`` rejects with 401 (a Basic challenge for BasicAuth).

    ``auth`` may be async. To name the user in audit lines, it may set
    ``request.state.miniqueue_user``.

    With a ``throttle`` (for Basic auth, whose every request carries a password), each login and
    each request with rejected credentials writes an audit line, and a client address that has
    failed too often gets 429 with ``Retry-After``, its credentials unchecked, until its wait is over.
    """

    def __init__(self, app: ASGIApp, auth: Auth, throttle: LoginThrottle | None = None) -> None:
        self.app, self.auth, self.throttle = app, auth, throttle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})
        request = Request(scope)
        address = client_address(request)
        wait = self.throttle.retry_after(address, time.monotonic()) if self.throttle is not None else 0.0
        if wait > 0:
            seconds = str(math.ceil(wait))
            message = f"too many failed logins from this address: retry in {seconds} s"
            await PlainTextResponse(message, 429, {"Retry-After": seconds})(scope, receive, send)
            return
        verdict = self.auth(request)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is True:
            if self.throttle is not None:
                _admitted(self.throttle, request, address)
            await self.app(scope, receive, send)
            return
        if self.throttle is not None and "authorization" in request.headers:  # without, a browser has not asked yet
            _failed(self.throttle, request, address)
        challenge = getattr(self.auth, "challenge", None)
        headers = {"WWW-Authenticate": challenge} if challenge else None
        await PlainTextResponse("authentication required", 401, headers)(scope, receive, send)


def _admitted(throttle: LoginThrottle, request: Request, address: str) -> None:
    user = str(request.scope["state"].get(USER_STATE) or "anonymous")
    new, cleared = throttle.admitted(address, user, time.monotonic())
    if new:
        _audit_login(printable(user), address, cleared, "ok")


def _failed(throttle: LoginThrottle, request: Request, address: str) -> None:
    credentials = basic_credentials(request)  # the password stays out of every line
    tried = printable(credentials[0][:MAX_LOGGED_USER]) if credentials else "?"
    failures, wait = throttle.failed(address, time.monotonic())
    _audit_login(tried, address, failures, "failed", math.ceil(wait))


def _audit_login(user: str, address: str, failures: int, outcome: str, retry_after: int = 0) -> None:
    """The audit line of a login (INFO) or a failed one (WARNING). ``failures``: those in a row
    that a login cleared, or that a failed one makes; ``retry_after``: the wait it imposes."""
    who = f"{user}@{printable(address)}"
    wait = f" retry_after={retry_after}" if retry_after else ""
    audit_log.log(
        logging.INFO if outcome == "ok" else logging.WARNING,
        "user=%s action=login failures=%d outcome=%s%s",
        who,
        failures,
        outcome,
        wait,
        extra={
            "audit": {
                "user": who,
                "action": "login",
                "failures": failures,
                "outcome": outcome,
                "retry_after": retry_after,
            }
        },
    )


class ReadOnlyMiddleware:
    """Refuse every request that could change something (anything but GET, HEAD, OPTIONS) with 403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            await PlainTextResponse("the dashboard is read-only", 403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class CsrfMiddleware:
    """Signed double-submit cookie: every unsafe request must send the cookie's token back.

    The cookie holds ``nonce.signature`` (HMAC-SHA256 under ``secret``), so a cookie planted
    by a sibling domain is rejected; forms send the same value in the ``csrf_token`` field
    (``application/x-www-form-urlencoded``) or the ``X-CSRF-Token`` header. The cookie is
    ``SameSite=Strict`` and ``HttpOnly``; pages get the token from ``request.state``.
    """

    def __init__(self, app: ASGIApp, secret: bytes) -> None:
        self.app, self.secret = app, secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cookie = HTTPConnection(scope).cookies.get(CSRF_COOKIE, "")
        valid = cookie if self._signed(cookie) else None
        scope.setdefault("state", {})[TOKEN_STATE] = valid or self._new_token()
        if scope["method"] not in SAFE_METHODS:
            body = await _read_body(receive)
            if body is None:
                await PlainTextResponse("request body too large", 413)(scope, receive, send)
                return
            submitted = _submitted_token(scope, body)
            if valid is None or submitted is None or not _same(submitted, valid):
                await PlainTextResponse("CSRF token missing or invalid: reload the page and retry", 403)(
                    scope, receive, send
                )
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send if valid else self._setting_cookie(scope, send))

    def _new_token(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def _signed(self, token: str) -> bool:
        nonce, _, signature = token.partition(".")
        return bool(nonce and signature) and _same(signature, self._sign(nonce))

    def _setting_cookie(self, scope: Scope, send: Send) -> Send:
        path = scope.get("root_path") or "/"
        secure = "; Secure" if scope.get("scheme") == "https" else ""
        value = f"{CSRF_COOKIE}={scope['state'][TOKEN_STATE]}; Path={path}; HttpOnly; SameSite=Strict{secure}"

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("set-cookie", value)
            await send(message)

        return send_with_cookie


def csrf_secret(secret: str | bytes | None = None) -> bytes:
    """The key CSRF cookies are signed with: given, else MINIQUEUE_WEB_SECRET, else random per process."""
    chosen = secret if secret is not None else os.environ.get(SECRET_ENV)
    if chosen is None:
        return secrets.token_bytes(32)
    return chosen.encode() if isinstance(chosen, str) else chosen


def _same(a: str, b: str) -> bool:
    """Constant-time equality that also accepts non-ASCII input (compare_digest on str does not)."""
    return hmac.compare_digest(a.encode(), b.encode())


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None if it exceeds MAX_FORM_BYTES."""
    chunks, total = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > MAX_FORM_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _submitted_token(scope: Scope, body: bytes) -> str | None:
    headers = HTTPConnection(scope).headers
    if CSRF_HEADER in headers:
        return headers[CSRF_HEADER]
    if headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return None
    values = parse_qs(body.decode("latin-1"), keep_blank_values=True).get(CSRF_FIELD, [])
    return values[0] if len(values) == 1 else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the already-read body to the app, then defers to the server."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
