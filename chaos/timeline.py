"""The run over time, for the report's plots: every second, each database's jobs by state
(sampled by a thread of the harness on connections of its own), and every completion (from the
transition trigger's records, once the run is over).

Times are this host's epoch seconds; the report counts them from the moment the chaos began. A
database that does not answer a sample (a restart, a stopped server) leaves a gap in it: its
counts are missing, not zero.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .site import Site

SAMPLE_EVERY = 1.0
APP_NAME = "chaos:timeline"

_COUNTS = """
SELECT count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'available' AND scheduled_at <= now()),
       count(*) FILTER (WHERE state = 'available' AND scheduled_at > now()),
       count(*) FILTER (WHERE state = 'waiting'),
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE relname LIKE 'miniqueue_jobs%')
  FROM miniqueue_jobs WHERE state IN ('running', 'available', 'waiting')
"""
_COMPLETIONS = "SELECT extract(epoch FROM at)::float8 FROM chaos_transitions WHERE to_state = 'completed'"

#: What each sample counts, in order.
COLUMNS = ("running", "available", "scheduled", "waiting", "dead tuples")


@dataclass(frozen=True)
class Sample:
    """The jobs by state at ``at``, summed over the databases that answered (``answered`` of
    ``databases``)."""

    at: float
    counts: tuple[int, ...]
    answered: int
    databases: int


@dataclass
class Timeline:
    """The samples, and the run's completion times (this host's clock)."""

    samples: list[Sample] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)

    def load_completions(self, site: Site) -> None:
        """Every completion transition, from every database's records."""
        for shard in site.shards:
            self.completions += [float(r[0]) - shard.offset for r in shard.db.rows(_COMPLETIONS)]
        self.completions.sort()


class Sampler(threading.Thread):
    """Counts the jobs of every database by state every SAMPLE_EVERY seconds until stopped."""

    def __init__(self, site: Site, timeline: Timeline) -> None:
        super().__init__(name="chaos-timeline", daemon=True)
        self.dsns = [shard.server.dsn for shard in site.shards]
        self.timeline = timeline
        self._stop_event = threading.Event()

    def run(self) -> None:
        conns: dict[str, psycopg.Connection[Any]] = {}
        next_at = time.monotonic()
        while not self._stop_event.wait(max(0.0, next_at - time.monotonic())):
            next_at += SAMPLE_EVERY
            at = time.time()
            total = [0] * len(COLUMNS)
            answered = 0
            for dsn in self.dsns:
                try:
                    conn = conns.get(dsn)
                    if conn is None or conn.closed:
                        conn = conns[dsn] = psycopg.connect(
                            dsn, autocommit=True, application_name=APP_NAME, connect_timeout=2
                        )
                    row = conn.execute(_COUNTS).fetchone()
                except psycopg.Error:
                    dropped = conns.pop(dsn, None)
                    if dropped is not None:
                        with contextlib.suppress(psycopg.Error):
                            dropped.close()
                    continue
                if row is not None:
                    total = [t + int(v or 0) for t, v in zip(total, row, strict=True)]
                    answered += 1
            self.timeline.samples.append(Sample(at, tuple(total), answered, len(self.dsns)))
        for conn in conns.values():
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
