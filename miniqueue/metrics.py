"""Prometheus metrics for ``miniqueue-supervise --metrics-port``.

Job counters and the duration histogram are fed by the supervisor from its children's
reports (each worker sends a tally of the jobs it finished, several times a second), so they
are correct with any number of forked workers without prometheus-client's multiprocess mode.
Queue gauges are read from the database at scrape time, on a short-lived connection opened on
the HTTP thread that serves the scrape (never on the supervisor's loop), one scrape at a time.
A child forked during a scrape inherits that connection's socket but never uses it, and leaves
with ``os._exit()``, which sends nothing on it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .db import connect
from .errors import MiniqueueError
from .reports import DURATION_BUCKETS, Tally
from .store import Store

log = logging.getLogger("miniqueue.metrics")

#: How long a scrape waits for the one before it to finish before answering 503.
SCRAPE_WAIT = 0.5


def _bound(seconds: float) -> str:
    """A bucket's ``le`` label, as prometheus-client writes it: 0.005, 1.0, +Inf."""
    return "+Inf" if seconds == float("inf") else repr(float(seconds))


class _JobCollector(Collector):
    """Job outcomes and handler durations, summed from the workers' tallies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # tallies arrive on the supervisor's loop, scrapes on the HTTP thread
        self.outcomes: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, str], Tally] = {}

    def add(self, queue: str, task: str, outcome: str, tally: Tally) -> None:
        with self.lock:
            key = (queue, task, outcome)
            self.outcomes[key] = self.outcomes.get(key, 0) + tally.count
            self.durations.setdefault((queue, task), Tally()).merge(tally)

    def collect(self) -> Iterator[Metric]:
        jobs = CounterMetricFamily(
            "miniqueue_jobs_finished", "Job outcomes recorded by workers", labels=["queue", "task", "outcome"]
        )
        duration = HistogramMetricFamily("miniqueue_job_duration_seconds", "Handler run time", labels=["queue", "task"])
        with self.lock:
            for labels, count in sorted(self.outcomes.items()):
                jobs.add_metric(list(labels), count)
            for (queue, task), total in sorted(self.durations.items()):
                cumulative = itertools.accumulate(total.buckets)
                buckets = [(_bound(le), n) for le, n in zip(DURATION_BUCKETS, cumulative, strict=True)]
                duration.add_metric([queue, task], buckets, total.seconds)
        yield from (jobs, duration)


class _QueueCollector(Collector):
    """Queue depth by state, oldest waiting job, expired leases, and process counts, at scrape time."""

    def __init__(self, dsn: str, store: Store, processes: Callable[[], dict[str, int]]) -> None:
        self.dsn, self.store, self.processes = dsn, store, processes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        alive = GaugeMetricFamily("miniqueue_processes", "Child processes alive, by kind", labels=["kind"])
        for kind, count in self.processes().items():
            alive.add_metric([kind], count)
        yield alive
        up = GaugeMetricFamily("miniqueue_database_up", "1 if the last scrape could query the database")
        try:
            with connect(self.dsn, purpose="metrics", schema=self.store.schema, connect_timeout=2) as conn:
                stats = self.store.queue_stats(conn)
        except MiniqueueError as exc:
            log.warning("metrics: cannot read queue gauges: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily("miniqueue_jobs", "Jobs in the table, by queue and state", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "miniqueue_oldest_available_seconds", "Age of the oldest runnable available job", labels=["queue"]
        )
        expired = GaugeMetricFamily("miniqueue_expired_leases", "Running jobs with an expired lease", labels=["queue"])
        for queue in stats:
            for state, count in queue.counts.items():
                depth.add_metric([queue.queue, state.value], count)
            oldest.add_metric([queue.queue], queue.oldest_available_seconds or 0.0)
            expired.add_metric([queue.queue], queue.expired_leases)
        yield from (depth, oldest, expired)


class Metrics:
    """The supervisor's metrics registry."""

    def __init__(self, dsn: str, store: Store, processes: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.jobs = _JobCollector()
        self.registry.register(self.jobs)
        self.restarts = Counter(
            "miniqueue_child_restarts", "Children that died unexpectedly and were replaced", ["kind"],
            registry=self.registry,
        )  # fmt: skip
        self.registry.register(_QueueCollector(dsn, store, processes))
        # One scrape at a time: a database that hangs (a lock, a dead network) holds one HTTP
        # thread, not all of them, so /livez and /readyz still get through.
        self.scraping = threading.Lock()

    def jobs_finished(self, queue: str, task: str, outcome: str, tally: Tally) -> None:
        """Count a worker's tally of finished jobs."""
        self.jobs.add(queue, task, outcome, tally)

    def render(self) -> tuple[int, str, bytes]:
        """The /metrics answer; 503 if another scrape still waits on the database."""
        if not self.scraping.acquire(timeout=SCRAPE_WAIT):
            return 503, "text/plain", b"another scrape is still waiting for the database\n"
        try:
            return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
        finally:
            self.scraping.release()
