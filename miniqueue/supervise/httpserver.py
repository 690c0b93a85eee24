"""A small threaded HTTP responder for the supervisor's /metrics, /livez and /readyz.

It runs beside the supervisor's loop, never inside it, so no client can hold up supervision:
one thread accepts, and each connection gets a short-lived thread of its own, at most
``max_connections`` at once (more are closed at once rather than queued behind slow ones). A
request head must arrive whole within ``deadline`` seconds however slowly its bytes trickle in,
and the answer must be taken within as long again. Routes run on those threads.

The supervisor forks while these threads run. A child never touches them: it closes the
sockets ``filenos()`` lists and ends with ``os._exit()``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from ..core.service import Service

log = logging.getLogger("miniqueue.http")

#: A route returns (status, content type, body).
Answer = tuple[int, str, bytes]
Route = Callable[[], Answer]

#: Enough for Prometheus and two probers; a slow client holds one for at most two deadlines.
MAX_CONNECTIONS = 8
#: Seconds a client gets to send its request head (and again to take the answer): a probe or a
#: scrape sends ~100 bytes at once.
DEADLINE = 2.0

_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class TinyHTTPServer:
    """Answers ``GET <path>`` for a fixed set of routes, on threads of its own (see ``start``)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: dict[str, Route],
        *,
        deadline: float = DEADLINE,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.routes = routes
        self.deadline = deadline
        self.free = threading.BoundedSemaphore(max_connections)
        self.clients: set[socket.socket] = set()
        self.closing = False
        self.sock = socket.create_server((host, port), reuse_port=False)
        self.address = self.sock.getsockname()
        self.acceptor = Service("miniqueue-http", target=self.accept_forever, log=log)

    def start(self) -> None:
        """Accept connections on a daemon thread from now on."""
        self.acceptor.start()

    def filenos(self) -> list[int]:
        """The listening socket and every open connection, for a forked child to close. Call it
        in the child: no server thread runs there, so the set holds still."""
        return [self.sock.fileno(), *(client.fileno() for client in self.clients)]

    def close(self) -> None:
        """Stop accepting; answers in flight finish within their deadlines on their own threads."""
        self.closing = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.sock.close()

    def accept_forever(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError as exc:
                if self.closing:
                    return
                log.warning("http accept failed: %s", exc)  # out of file descriptors, say: let some close
                time.sleep(0.1)
                continue
            if not self.free.acquire(blocking=False):
                client.close()  # over the cap: refuse at once rather than queue behind slow clients
                continue
            self.clients.add(client)
            try:
                threading.Thread(target=self.serve, args=(client,), name="miniqueue-http-client", daemon=True).start()
            except RuntimeError as exc:  # no thread to be had: drop this client, keep accepting
                log.warning("http: %s", exc)
                self.drop(client)

    def serve(self, client: socket.socket) -> None:
        try:
            answer = self.answer(self.read_head(client))
            client.settimeout(self.deadline)  # sendall's timeout bounds the whole answer, not each send
            client.sendall(answer)
        except OSError as exc:  # TimeoutError included
            log.debug("http client dropped: %s", exc)
        finally:
            self.drop(client)

    def drop(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)  # ends the connection even if a child forked meanwhile holds it
        self.clients.discard(client)  # before close: a child must never close an fd number reused since
        client.close()
        self.free.release()

    def read_head(self, client: socket.socket) -> bytes:
        """The request head, whole within the deadline however slowly it trickles in."""
        deadline = time.monotonic() + self.deadline
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 8192:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no request head within {self.deadline:g}s")
            client.settimeout(left)
            chunk = client.recv(4096)
            if not chunk:
                break
            request += chunk
        return request

    def answer(self, request: bytes) -> bytes:
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
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode("latin-1") + (b"" if method == "HEAD" else body)
