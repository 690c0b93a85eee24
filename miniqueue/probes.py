"""``--metrics-port``: ``/metrics``, ``/livez`` and ``/readyz``, served on threads of their own so
that neither a slow client nor the scrape's database query holds up the supervisor's loop.

The loop publishes a snapshot once per tick (readiness and process counts); the HTTP threads
read only that snapshot and the time of the last tick, never the loop's own dicts.
"""

from __future__ import annotations

import logging
import time

from .errors import ConfigError
from .httpserver import Answer, TinyHTTPServer
from .metrics import Metrics
from .reports import Tally
from .store import Store

log = logging.getLogger("miniqueue.supervisor")

#: /livez fails once the loop has not ticked for this long.
STALL_SECONDS = 5.0


class Probes:
    """The metrics registry and the HTTP server in front of it."""

    def __init__(self, dsn: str, store: Store, host: str, port: int) -> None:
        self.last_tick = time.monotonic()
        self._ready: Answer = (503, "text/plain", b"starting\n")
        self._counts: dict[str, int] = {}
        self.metrics = Metrics(dsn, store, lambda: self._counts)
        routes = {"/metrics": self.metrics.render, "/livez": self.livez, "/readyz": lambda: self._ready}
        try:
            self.http = TinyHTTPServer(host, port, routes)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
        self.http.start()
        log.info("serving /metrics, /livez and /readyz on http://%s:%d", *self.http.address[:2])

    def publish(self, problems: list[str], counts: dict[str, int]) -> None:
        """The loop's tick: what /readyz answers (ready unless ``problems``), and the process counts."""
        self.last_tick = time.monotonic()
        self._counts = counts
        if problems:
            self._ready = 503, "text/plain", ("; ".join(problems) + "\n").encode()
        else:
            self._ready = 200, "text/plain", b"ok\n"

    def livez(self) -> Answer:
        """Alive: the loop ticked recently (no database check: a database outage must not get the
        supervisor restarted). Runs on an HTTP thread, so it answers while the loop is stuck."""
        if time.monotonic() - self.last_tick > STALL_SECONDS:
            return 503, "text/plain", b"supervisor loop stalled\n"
        return 200, "text/plain", b"ok\n"

    def jobs_finished(self, queue: str, task: str, outcome: str, tally: Tally) -> None:
        self.metrics.jobs_finished(queue, task, outcome, tally)

    def restarted(self, kind: str) -> None:
        self.metrics.restarts.labels(kind).inc()

    def filenos(self) -> list[int]:
        """What a forked child must close."""
        return self.http.filenos()

    def close(self) -> None:
        self.http.close()
