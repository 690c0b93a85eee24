"""Prometheus metrics for ``miniqueue-supervise --metrics-port``.

Job counters and the duration histogram are fed by the supervisor from its children's
reports (each worker reports every job it finishes), so they are correct with any number of
forked workers without prometheus-client's multiprocess mode. Queue gauges are read from the
database at scrape time, on a short-lived connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .db import connect
from .errors import MiniqueueError
from .store import Store

log = logging.getLogger("miniqueue.metrics")

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, float("inf"))


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
        self.jobs = Counter(
            "miniqueue_jobs_finished", "Job outcomes recorded by workers", ["queue", "task", "outcome"],
            registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            "miniqueue_job_duration_seconds", "Handler run time", ["queue", "task"], buckets=DURATION_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.restarts = Counter(
            "miniqueue_child_restarts", "Children that died unexpectedly and were replaced", ["kind"],
            registry=self.registry,
        )  # fmt: skip
        self.registry.register(_QueueCollector(dsn, store, processes))

    def job_finished(self, queue: str, task: str, outcome: str, seconds: float) -> None:
        self.jobs.labels(queue, task, outcome).inc()
        self.duration.labels(queue, task).observe(seconds)

    def render(self) -> tuple[int, str, bytes]:
        return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
