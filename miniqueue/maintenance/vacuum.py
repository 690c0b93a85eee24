"""The reaper's upkeep of the jobs table: vacuum and fresh planner statistics between
autovacuum's visits.

A queue table churns as no other: every job is inserted, updated when claimed and updated
again when it finishes. Two things follow, and both slow the claim down as a backlog drains:

- every claimed job leaves a dead entry at the head of the claim index until the table is
  vacuumed, and each claim steps over all of them;
- the planner's statistics describe the table as it was when last analyzed (empty, say, before
  a million jobs arrived), and the plans of the worker's statements are made from them.

Autovacuum deals with both, but the server looks at each database once per
``autovacuum_naptime`` (a minute by default), and a queue drains tens of thousands of jobs in
that time. So the reaper's process runs this loop on a thread and a connection of its own.
Once a second it reads the table's statistics (a catalog lookup). When claims and completions
have updated ``after_rows`` rows plus ``MAINTAIN_SCALE`` of the live ones since the last vacuum
(its own or autovacuum's), it runs ``VACUUM (SKIP_LOCKED, ANALYZE)``; when as many rows were
inserted or updated since the last ANALYZE (a backlog arrived, say), only ``ANALYZE``. Rows
deleted by pruning call for neither: they lie off the claim's path, and vacuuming or analyzing
a table of millions of finished rows as they go would take the database's time from the jobs.
After upkeep the loop rests at least ``REST_FACTOR`` times as long as it took, so that
it never takes more than a third of one backend's time. A role that does not own the table
cannot vacuum it: the loop says so once and leaves the table to autovacuum. See "Vacuum and
planner statistics" in docs/guides/retention.md for what it buys.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import psycopg

from ..core.db import Connection, connect
from ..core.errors import DatabaseUnavailable, MiniqueueError
from ..core.service import Service
from ..store.store import Store

log = logging.getLogger("miniqueue.vacuum")

#: Seconds between readings of the table's statistics.
CHECK_INTERVAL = 1.0
#: Rows updated (for a vacuum) or inserted and updated (for an ANALYZE) that call for upkeep:
#: this many, plus this share of the live rows.
MAINTAIN_AFTER_ROWS = 10_000
MAINTAIN_SCALE = 0.02
#: After upkeep, rest at least this many times as long as it took.
REST_FACTOR = 2.0
#: Seconds to rest after upkeep failed for another reason than the database being unreachable.
ERROR_REST = 60.0


class Vacuum(Service):
    """Keeps the jobs table of ``store``'s schema vacuumed and analyzed until ``stopping`` is set
    (upkeep is due at ``after_rows`` rows plus ``MAINTAIN_SCALE`` of the live ones), on a thread
    of its own once started (or on the caller's, through :meth:`run`)."""

    log = log

    def __init__(
        self, dsn: str, store: Store, stopping: threading.Event, *, after_rows: int = MAINTAIN_AFTER_ROWS
    ) -> None:
        super().__init__("miniqueue-vacuum", stopping=stopping)
        self.dsn = dsn
        self.store = store
        self.after_rows = after_rows
        self._conn: Connection | None = None
        #: The counts of rows updated at the last vacuum, and inserted and updated at the last
        #: ANALYZE, that this loop knows of (None: not read yet), and when those happened.
        self._vacuumed_at: int | None = None
        self._analyzed_at: int | None = None
        self._last_vacuum: dt.datetime | None = None
        self._last_analyze: dt.datetime | None = None

    def run(self) -> None:
        rest = CHECK_INTERVAL
        while not self.stopping.wait(rest):
            try:
                rest = self.step()
            except DatabaseUnavailable as exc:
                log.warning("vacuum: %s; retrying", exc)
                self.close()
                rest = CHECK_INTERVAL
            except (psycopg.Error, MiniqueueError) as exc:  # upkeep must never end the reaper: say so, go on
                log.warning("vacuum: %s failed: %s; trying again in %.0f s", self.store.table_name, exc, ERROR_REST)
                self.close()
                rest = ERROR_REST
            if rest < 0:
                break
        self.close()

    def step(self) -> float:
        """Read the table's statistics and vacuum or analyze it if due; return the seconds to
        rest before the next step (negative: this role may not, so stop)."""
        if self._conn is None:
            self._conn = connect(self.dsn, purpose="vacuum", schema=self.store.schema, connect_timeout=5)
        churn = self.store.jobs_churn(self._conn)
        if not churn.may_maintain:
            log.info(
                "vacuum: this role does not own %s; vacuum and analyze are left to autovacuum", self.store.table_name
            )
            return -1.0
        written = churn.inserted + churn.updated
        if self._vacuumed_at is None or churn.updated < self._vacuumed_at or churn.last_vacuum != self._last_vacuum:
            # The first reading, statistics reset, or a vacuum finished since: count from here.
            self._vacuumed_at, self._last_vacuum = churn.updated, churn.last_vacuum
        if self._analyzed_at is None or written < self._analyzed_at or churn.last_analyze != self._last_analyze:
            # As above; what changed before the first reading still counts (a backlog that
            # arrived while no reaper ran).
            first = self._analyzed_at is None
            self._analyzed_at = written - (min(churn.changed, written) if first else 0)
            self._last_analyze = churn.last_analyze
        due = self.after_rows + MAINTAIN_SCALE * churn.live
        vacuum = churn.updated - self._vacuumed_at >= due
        if not vacuum and written - self._analyzed_at < due:
            return CHECK_INTERVAL
        started = time.monotonic()
        self.store.vacuum_jobs(self._conn, analyze_only=not vacuum)
        took = time.monotonic() - started
        log.debug(
            "vacuum: %s %s in %.2f s (%d live rows, %d updated since vacuumed, %d written since analyzed)",
            self.store.table_name,
            "vacuumed and analyzed" if vacuum else "analyzed",
            took,
            churn.live,
            churn.updated - self._vacuumed_at,
            written - self._analyzed_at,
        )
        if vacuum:
            self._vacuumed_at = churn.updated
        self._analyzed_at = written
        return max(CHECK_INTERVAL, REST_FACTOR * took)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
