"""Prometheus metrics for ``miniqueue-supervise --metrics-port``.

Job counters and the duration histogram are fed by the supervisor from its children's
reports (each worker sends a tally of the jobs it finished, several times a second), so they
are correct with any number of forked workers without prometheus-client's multiprocess mode.
Queue gauges are read by the reaper child every few seconds (it already holds a connection) and
sent over its report pipe; a scrape serves the latest reading, so it never waits on the
database and the supervisor opens no connection for it.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.records import QueueStats
from .reports import DURATION_BUCKETS, HorizonGauge, Tally


class Gauges(NamedTuple):
    """The queue gauges as last read, whether the database answered that reading, and the jobs
    waiting on each limit (by scope name)."""

    stats: list[QueueStats]
    database_up: bool
    limits: dict[str, int]
    #: The jobs waiting behind each blocked sequence key, by (key, the job blocking it).
    sequences: dict[tuple[str, int], int]
    #: What holds the MVCC horizon back, and the jobs table's dead rows (None: not read yet).
    horizon: list[HorizonGauge]
    dead_rows: int | None


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
    """Queue depth by state, oldest waiting job and expired leases, as the reaper last read them,
    and process counts, as the supervisor's loop last published them: no query at scrape time."""

    def __init__(
        self, processes: Callable[[], dict[str, int]], gauges: Callable[[], Gauges], database: str | None
    ) -> None:
        self.processes, self.gauges = processes, gauges
        # With a shard map, each database's supervisor serves its own metrics: the label says whose.
        self.database = database

    def collect(self) -> Iterator[GaugeMetricFamily]:
        alive = GaugeMetricFamily("miniqueue_processes", "Child processes alive, by kind", labels=["kind"])
        for kind, count in self.processes().items():
            alive.add_metric([kind], count)
        stats, database_up, limits, sequences, horizon, dead_rows = self.gauges()
        labels = [] if self.database is None else ["database"]
        up = GaugeMetricFamily(
            "miniqueue_database_up", "1 if the reaper's last reading of the gauges worked", labels=labels
        )
        up.add_metric([] if self.database is None else [self.database], 1 if database_up else 0)
        depth = GaugeMetricFamily("miniqueue_jobs", "Jobs in the table, by queue and state", labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "miniqueue_oldest_available_seconds", "Age of the oldest runnable available job", labels=["queue"]
        )
        expired = GaugeMetricFamily("miniqueue_expired_leases", "Running jobs with an expired lease", labels=["queue"])
        signal_waits = GaugeMetricFamily(
            "miniqueue_signal_waiting_jobs", "Jobs parked until a signal (see docs/guides/durable.md)", labels=["queue"]
        )
        for queue in stats:
            for state, count in queue.counts.items():
                depth.add_metric([queue.queue, state.value], count)
            oldest.add_metric([queue.queue], queue.oldest_available_seconds or 0.0)
            expired.add_metric([queue.queue], queue.expired_leases)
            signal_waits.add_metric([queue.queue], queue.signal_waits)
        waiting = GaugeMetricFamily(
            "miniqueue_limit_waiting_jobs", "Due jobs waiting on a limit (see docs/guides/limits.md)", labels=["limit"]
        )
        for scope, count in sorted(limits.items()):
            waiting.add_metric([scope], count)
        blocked = GaugeMetricFamily(
            "miniqueue_sequence_blocked_jobs",
            "Jobs waiting behind a sequence key that a failed or dead job blocks (see docs/guides/keys.md)",
            labels=["key", "job"],
        )
        for (key, job_id), count in sorted(sequences.items()):
            blocked.add_metric([key, str(job_id)], count)
        held = GaugeMetricFamily(
            "miniqueue_horizon_held_seconds",
            "How long each oldest snapshot has held the MVCC horizon back (see docs/operations/health.md); "
            "-1 for a replication slot, whose start the server does not know",
            labels=["kind", "pid", "name"],
        )
        for h in horizon:
            held.add_metric(
                [h.kind, "" if h.pid is None else str(h.pid), h.name or ""], -1 if h.seconds is None else h.seconds
            )
        dead = GaugeMetricFamily("miniqueue_jobs_dead_rows", "Dead rows in the jobs table, as the server counts them")
        if dead_rows is not None:
            dead.add_metric([], dead_rows)
        yield from (alive, up, depth, oldest, expired, signal_waits, waiting, blocked, held, dead)


class Metrics:
    """The supervisor's metrics registry."""

    def __init__(
        self, processes: Callable[[], dict[str, int]], gauges: Callable[[], Gauges], *, database: str | None = None
    ) -> None:
        self.registry = CollectorRegistry()
        self.jobs = _JobCollector()
        self.registry.register(self.jobs)
        self.restarts = Counter(
            "miniqueue_child_restarts",
            "Children that died unexpectedly and were replaced",
            ["kind"],
            registry=self.registry,
        )
        self.registry.register(_QueueCollector(processes, gauges, database))
        #: With ``--workers MIN:MAX`` (see docs/operations/autoscaling.md).
        self.supervisor_workers = Gauge(
            "miniqueue_supervisor_workers",
            "Worker processes the autoscaling supervisor aims at (target) and runs (running)",
            ["state"],
            registry=self.registry,
        )
        self.desired_workers = Gauge(
            "miniqueue_desired_workers",
            "Worker processes that would drain the served queues within --scale-target "
            "(miniqueue_desired_workers), for a horizontal autoscaler",
            registry=self.registry,
        )

    def jobs_finished(self, queue: str, task: str, outcome: str, tally: Tally) -> None:
        """Count a worker's tally of finished jobs."""
        self.jobs.add(queue, task, outcome, tally)

    def render(self) -> tuple[int, str, bytes]:
        """The /metrics answer."""
        return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
