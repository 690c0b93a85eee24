"""A minimal HTTP responder that lives inside the supervisor's select loop.

The supervisor is single-threaded on purpose (it forks), so instead of a server thread it
watches one listening socket among its other file descriptors and answers each request in
turn. Requests are tiny (a Prometheus scrape, a probe); a client that stalls is cut off
after a short timeout so it can never hold up supervision for long.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

log = logging.getLogger("miniqueue.http")

#: A route returns (status, content type, body).
Route = Callable[[], tuple[int, str, bytes]]

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error",
            503: "Service Unavailable"}  # fmt: skip


class TinyHTTPServer:
    """Answers ``GET <path>`` for a fixed set of routes, one request at a time."""

    def __init__(self, host: str, port: int, routes: dict[str, Route], *, timeout: float = 0.5) -> None:
        self.routes = routes
        self.timeout = timeout
        self.sock = socket.create_server((host, port), reuse_port=False)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def handle(self) -> None:
        """Accept and answer every pending connection (call when the socket is readable)."""
        while True:
            try:
                client, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            with client:
                client.settimeout(self.timeout)
                try:
                    self._answer(client)
                except OSError as exc:
                    log.debug("http client dropped: %s", exc)

    def _answer(self, client: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 8192:
            chunk = client.recv(4096)
            if not chunk:
                break
            request += chunk
        method, _, rest = request.decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            status, ctype, body = 405, "text/plain", b"only GET\n"
        elif path not in self.routes:
            status, ctype, body = 404, "text/plain", b"not found\n"
        else:
            try:
                status, ctype, body = self.routes[path]()
            except Exception:
                log.exception("http route %s failed", path)
                status, ctype, body = 500, "text/plain", b"internal error\n"
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
        client.sendall(head.encode("latin-1") + (b"" if method == "HEAD" else body))
