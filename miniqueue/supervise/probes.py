"""``--metrics-port``: ``/metrics``, ``/livez`` and ``/readyz``, served on threads of their own so
that neither a slow client nor the scrape's database query holds up the supervisor's loop.

The loop publishes a snapshot once per tick (readiness and process counts) and the queue gauges
the reaper sends; the HTTP threads read only those and the time of the last tick, never the
loop's own dicts, and never the database.
"""

from __future__ import annotations

import logging
import time

from ..core.errors import ConfigError
from ..core.records import QueueStats
from .httpserver import Answer, TinyHTTPServer
from .metrics import Gauges, Metrics
from .reports import DeadRowsGauge, HorizonGauge, Tally

log = logging.getLogger("miniqueue.supervisor")

#: /livez fails once the loop has not ticked for this long.
STALL_SECONDS = 5.0


class Probes:
    """The metrics registry and the HTTP server in front of it."""

    def __init__(self, host: str, port: int, *, database: str | None = None) -> None:
        self.last_tick = time.monotonic()
        self._ready: Answer = (503, "text/plain", b"starting\n")
        self._counts: dict[str, int] = {}
        self._gauges: Gauges = Gauges([], True, {}, {}, [], None)
        self._reading: list[QueueStats] = []
        self._limits_reading: dict[str, int] = {}
        self._sequences_reading: dict[tuple[str, int], int] = {}
        self._horizon_reading: list[HorizonGauge] = []
        self._dead_rows_reading: int | None = None
        self.metrics = Metrics(lambda: self._counts, lambda: self._gauges, database=database)
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

    def queue_gauges(self, stats: QueueStats) -> None:
        """One queue of the reaper's reading (kept aside until the reading is complete)."""
        self._reading.append(stats)

    def gauges_sent(self, database_up: bool) -> None:
        """The reaper's reading is complete: serve it (or, if the database did not answer, keep
        the last one and say the database is down)."""
        if database_up:
            self._gauges = Gauges(
                self._reading,
                True,
                self._limits_reading,
                self._sequences_reading,
                self._horizon_reading,
                self._dead_rows_reading,
            )
        else:
            self._gauges = self._gauges._replace(database_up=False)
        self._reading, self._limits_reading, self._sequences_reading = [], {}, {}
        self._horizon_reading, self._dead_rows_reading = [], None

    def limit_gauge(self, scope: str, waiting: int) -> None:
        """One limit of the reaper's reading: the jobs waiting on it."""
        self._limits_reading[scope] = waiting

    def sequence_gauge(self, key: str, job_id: int, waiting: int) -> None:
        """One blocked sequence key of the reaper's reading: the job blocking it, the jobs behind it."""
        self._sequences_reading[(key, job_id)] = waiting

    def health_gauge(self, report: HorizonGauge | DeadRowsGauge) -> None:
        """What holds the horizon back, or the jobs table's dead rows, in the reaper's reading."""
        if isinstance(report, HorizonGauge):
            self._horizon_reading.append(report)
        else:
            self._dead_rows_reading = report.dead_rows

    def jobs_finished(self, queue: str, task: str, outcome: str, tally: Tally) -> None:
        self.metrics.jobs_finished(queue, task, outcome, tally)

    def scaling(self, target: int | None, running: int | None, desired: int | None) -> None:
        """An autoscaling supervisor's workers, the number it aims at and the number running (None:
        not autoscaling), and what ``miniqueue_desired_workers`` last said (None: not read yet)."""
        if target is not None and running is not None:
            self.metrics.supervisor_workers.labels("target").set(target)
            self.metrics.supervisor_workers.labels("running").set(running)
        if desired is not None:
            self.metrics.desired_workers.set(desired)

    def restarted(self, kind: str) -> None:
        self.metrics.restarts.labels(kind).inc()

    def filenos(self) -> list[int]:
        """What a forked child must close."""
        return self.http.filenos()

    def close(self) -> None:
        self.http.close()
