"""The reaper: returns expired leases to the queue, expires jobs past their deadline, raises the
priority of waiting jobs in the queues whose jobs age, prunes finished jobs, and (given an app)
enqueues the app's periodic jobs as their slots come due.

It is the backstop for workers that vanish without anyone noticing (a lost host, a killed
process whose supervisor died too). Recovery is one conditional UPDATE per batch that
re-checks the expiry in the same statement. Pruning drops the history's partitions (see
:mod:`miniqueue.store.history`) once every job in one is past its retention, and deletes row by
row, in small batches, only the jobs that finished outside them; neither holds a lock for long.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from typing import TypeVar

from ..core.db import Connection, connect
from ..core.errors import ConfigError, DatabaseUnavailable
from ..core.health import HORIZON_WARN_SECONDS, held_too_long
from ..core.records import DEFAULT_QUEUE, State
from ..core.steps import run
from ..store.aging import AgingPosition
from ..store.history import CLASSES
from ..store.store import Store
from ..tasks.app import App
from .scheduler import read_runtime, schedule_due
from .vacuum import Vacuum

#: The longest a pass spends pruning before it goes back to recovering leases (seconds).
PRUNE_SLICE = 1.0
#: The longest a pass spends raising priorities (seconds); a sweep cut short goes on at the next.
AGING_SLICE = 1.0
#: How often a pass reads the highest priority among an aging queue's jobs with limits (seconds):
#: one probe per group of limits (0.5 s at 10,000 keys), where the jobs without limits take one.
#: Between two readings a pass caps the rise at the higher of the two, that one as last read.
LIMITED_TOP_SECONDS = 30.0

log = logging.getLogger("miniqueue.reaper")

S = TypeVar("S", bound=Sized)

HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class ReaperConfig:
    """How often the reaper runs and what it keeps. Durations are in seconds.

    Finished jobs are kept ``completed_retention`` (completed and cancelled, default 24 h) or
    ``failed_retention`` (dead, failed and expired, default 7 days) after they finish; ``None``
    keeps them forever. ``prune=False`` turns pruning off altogether. ``vacuum`` vacuums the
    jobs table as claims churn it (see :mod:`miniqueue.maintenance.vacuum`), on a connection of its own.
    """

    interval: float = 5.0
    batch_size: int = 1000
    prune: bool = True
    completed_retention: float | None = DAY
    failed_retention: float | None = 7 * DAY
    schema: str = "public"
    vacuum: bool = True
    #: A snapshot held longer than this (seconds) is logged as a warning, once.
    horizon_seconds: float = HORIZON_WARN_SECONDS
    #: Which periodic jobs this reaper enqueues, by their queue (None: all). Over a shard map each
    #: database's reaper takes those of the queues it is the first database of, so that each slot
    #: is enqueued once over the map (see docs/guides/shards.md).
    schedules_here: Callable[[str], bool] | None = None

    def validated(self) -> ReaperConfig:
        if not self.interval > 0:
            raise ConfigError(f"reaper interval {self.interval!r} is invalid: use a positive number of seconds")
        if self.batch_size < 1:
            raise ConfigError(f"reaper batch size {self.batch_size!r} is invalid: use 1 or more")
        for name in ("completed_retention", "failed_retention"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} {value!r} is invalid: use a non-negative number of seconds, or None")
        return self


@dataclass
class ReaperResult:
    """What one pass did."""

    recovered: int = 0
    dead: int = 0
    expired: int = 0
    pruned: int = 0
    scheduled: int = 0
    #: Pruning stopped at its time slice with more to delete: the next pass should come at once.
    more_to_prune: bool = False
    #: Rows moved from the jobs table an upgrade found (see miniqueue.store.history).
    moved: int = 0
    #: Jobs that waited for a signal past their timeout, resumed.
    timed_out: int = 0
    #: Jobs whose priority aging raised (see miniqueue.store.aging).
    aged: int = 0


class Reaper:
    """Recovers expired leases and prunes finished jobs, on a connection of its own."""

    def __init__(self, dsn: str, config: ReaperConfig | None = None, *, app: App | None = None) -> None:
        self.dsn = dsn
        self.config = (config or ReaperConfig()).validated()
        self.store = Store(self.config.schema)
        specs = {s.name: app.task_spec(s.task, s.payload) for s in app.schedules.values()} if app else {}
        here = self.config.schedules_here or (lambda queue: True)
        self.specs = {name: spec for name, spec in specs.items() if here(spec.queue or DEFAULT_QUEUE)}
        self.schedules = [s for s in app.schedules.values() if s.name in self.specs] if app else []
        self.app, self._here = app, here
        # The runtime schedules this reaper logged as skipped (each is named once).
        self._runtime_warned: set[str] = set()
        self._stopping = threading.Event()
        self._conn: Connection | None = None
        # What _watch_horizon has warned about and still sees (a holder is named once).
        self._horizon_warned: set[tuple[object, ...]] = set()
        # Why the role may not keep the history's partitions, as last logged (said once).
        self._history_refused: str | None = None
        # Where the sweep of the aging queues stopped at its time slice: the queue and its position.
        self._aging_at: tuple[str, AgingPosition] | None = None
        # The aging queues' top priorities among their jobs with limits, as last read, and when.
        self._limited_tops: dict[str, int | None] = {}
        self._limited_tops_at = -math.inf

    def stop(self) -> None:
        """Make :meth:`run` return after the current pass (thread-safe)."""
        self._stopping.set()

    def run_once(self) -> ReaperResult:
        """One pass: recover every expired lease, then prune, each in batches."""
        result = ReaperResult()
        if self._conn is None:
            self._conn = connect(self.dsn, purpose="reaper", schema=self.config.schema)
        conn = self._conn
        for states in self._batches(lambda size: self.store.recover_expired_leases(conn, size)):
            back = sorted(i for i, s in states.items() if s == State.AVAILABLE)
            dead = sorted(i for i, s in states.items() if s == State.DEAD)
            # Each is a failed attempt (its worker vanished), so each leaves a log line.
            if back:
                log.warning(
                    "lease expired without renewal (worker lost): job(s) %s available again, charged an attempt",
                    ", ".join(map(str, back)),
                )
            if dead:
                log.error(
                    "lease expired without renewal (worker lost): job(s) %s dead, no attempts left",
                    ", ".join(map(str, dead)),
                )
            result.recovered += len(back)
            result.dead += len(dead)
        self._expire(conn, result)
        self._time_out_waits(conn, result)
        self._age(conn, result)
        self.store.drop_ended_keys(conn, self.config.batch_size)
        self._watch_horizon(conn)
        self._keep_history(conn, result)
        self._move_legacy(conn, result)
        result.scheduled = len(self.schedule_periodic())
        self.store.trim_throughput(conn)
        return result

    def schedule_periodic(self, now: dt.datetime | None = None) -> list[int]:
        """Enqueue the due slot of each schedule, the code's and those created at run time (read
        now, so a change takes effect at this pass); return the jobs' ids. Slots fall due by the
        database clock, or by ``now`` (tests travel in time with it)."""
        if self._conn is None:
            self._conn = connect(self.dsn, purpose="reaper", schema=self.config.schema)
        runtime = read_runtime(self._conn, self.store, self.app, self._here, self._runtime_warned)
        schedules = self.schedules + runtime.schedules
        specs = self.specs | runtime.specs
        middleware = self.app.middleware_stack if self.app else None
        return schedule_due(self._conn, self.store, schedules, specs, now, runtime.revisions, middleware)

    def _expire(self, conn: Connection, result: ReaperResult) -> None:
        """Expire every job whose deadline passed before it was claimed, in batches; each leaves a log line."""
        for expired in self._batches(lambda size: self.store.expire_jobs(conn, size)):
            if expired:
                log.warning("job(s) %s expired: not started by their deadline", ", ".join(map(str, expired)))
            result.expired += len(expired)

    def _time_out_waits(self, conn: Connection, result: ReaperResult) -> None:
        """Resume, in batches, every job whose wait for a signal timed out: its handler runs
        again and its wait raises SignalTimeout (see docs/guides/durable.md)."""
        for resumed in self._batches(lambda size: run(conn, self.store.time_out_waits_steps(size))):
            if resumed:
                log.info("job(s) %s: no signal before the timeout; they run again", ", ".join(map(str, resumed)))
            result.timed_out += len(resumed)

    def _batches(self, batch: Callable[[int], S]) -> Iterator[S]:
        """What ``batch(batch_size)`` does, again and again, until a batch does less than a whole
        batch (the last) or the reaper stops."""
        while not self._stopping.is_set():
            done = batch(self.config.batch_size)
            yield done
            if len(done) < self.config.batch_size:
                return

    def _age(self, conn: Connection, result: ReaperResult) -> None:
        """Raise the priority of the jobs that have waited another interval, in the queues whose
        jobs age (see miniqueue.store.aging): a sweep of each queue in batches, for at most
        AGING_SLICE seconds a pass. A sweep cut short goes on from where it stopped at the next
        pass, and the queues after it come next: a long backlog in one queue holds up neither the
        rest of its own jobs nor the other queues' for more than a turn."""
        deadline = time.monotonic() + AGING_SLICE
        tops = self._aging_tops(conn)
        stopped = dict([self._aging_at]) if self._aging_at is not None and self._aging_at[0] in tops else {}
        self._aging_at = None
        first = next(iter(stopped), "")
        for queue in sorted(tops, key=lambda name: (name < first, name)):  # from the queue it stopped in
            position = stopped.get(queue) or AgingPosition.start(tops[queue])
            while not self._stopping.is_set():
                batch = self.store.age_jobs(conn, queue, tops[queue], position, self.config.batch_size)
                result.aged += batch.raised
                if batch.read < self.config.batch_size:
                    break
                position = batch.position
                if time.monotonic() >= deadline:
                    self._aging_at = (queue, position)
                    return

    def _aging_tops(self, conn: Connection) -> dict[str, int]:
        """Each aging queue with a job waiting, and its top: the highest priority among its
        available jobs (among those with limits, as read within LIMITED_TOP_SECONDS)."""
        limited = time.monotonic() - self._limited_tops_at >= LIMITED_TOP_SECONDS
        found = self.store.aging_queues(conn, limited=limited)
        if limited:
            self._limited_tops = {queue: with_limits for queue, (_, with_limits) in found.items()}
            self._limited_tops_at = time.monotonic()
        tops = {}
        for queue, (plain, _) in found.items():
            known = [top for top in (plain, self._limited_tops.get(queue)) if top is not None]
            if known:
                tops[queue] = max(known)
        return tops

    def _watch_horizon(self, conn: Connection) -> None:
        """Warn once about each snapshot held past the threshold (see miniqueue.core.health): no
        vacuum can remove the jobs table's dead rows while it is."""
        holders = self.store.horizon(conn)
        late = {(h.kind, h.pid, h.name, h.since): h for h in holders if held_too_long(h, self.config.horizon_seconds)}
        for key in late.keys() - self._horizon_warned:
            log.warning(
                "the MVCC horizon is held back by %s: no vacuum can remove the rows that died since, and claims "
                "slow down as they pile up (see docs/operations/health.md; `miniqueue doctor` for more)",
                late[key].describe(),
            )
        self._horizon_warned = set(late)

    def _keep_history(self, conn: Connection, result: ReaperResult) -> None:
        """Make the history's partitions ahead, and prune what is past retention. A role that
        may not (PostgreSQL lets only the tables' owner make and drop partitions) is told so
        once, and the pass goes on: leases are still recovered and schedules still enqueued,
        and finished jobs land in the default partitions meanwhile, never refused."""
        try:
            self.store.ensure_partitions(conn)
            if self.config.prune:
                result.pruned, result.more_to_prune = self._prune(conn)
        except ConfigError as exc:
            if str(exc) != self._history_refused:
                log.error("reaper: cannot keep the history's partitions: %s", exc)
            self._history_refused = str(exc)
        else:
            self._history_refused = None

    def _prune(self, conn: Connection) -> tuple[int, bool]:
        """Drop the history's partitions past retention, then delete, in batches, the jobs past it
        in the default partitions, for at most PRUNE_SLICE seconds: a backlog of millions there
        (finished while no reaper ran to make partitions) must not hold up
        lease recovery and periodic scheduling, which come first in every pass; :meth:`run` then
        rests as long before the next pass. Returns how many were deleted and whether more are due."""
        deadline = time.monotonic() + PRUNE_SLICE
        pruned = 0
        for kind, retention in self._retention().items():
            dropped = self.store.drop_partitions(conn, kind, retention)
            if dropped:
                log.info(
                    "detached history partition(s) past retention (their tables are dropped one a pass): %s",
                    ", ".join(dropped),
                )
            states = CLASSES[kind]
            while not self._stopping.is_set():
                deleted = self.store.prune(conn, states, retention, self.config.batch_size, outside_partitions=True)
                pruned += deleted
                if deleted < self.config.batch_size:
                    break
                if time.monotonic() >= deadline:
                    return pruned, True
        return pruned, False

    def _retention(self) -> dict[str, float]:
        """Each history table's retention (seconds), for those that have one."""
        kept = {"done": self.config.completed_retention, "failed": self.config.failed_retention}
        return {kind: keep for kind, keep in kept.items() if keep is not None}

    def _move_legacy(self, conn: Connection, result: ReaperResult) -> None:
        """Move the rows an upgrade found in the old jobs table, in batches, for at most
        PRUNE_SLICE seconds a pass (see miniqueue.store.history)."""
        if not self.store.has_legacy(conn):
            return
        deadline = time.monotonic() + PRUNE_SLICE
        back = {kind: self._retention().get(kind, 7 * DAY) for kind in CLASSES}
        while not self._stopping.is_set() and time.monotonic() < deadline:
            moved = self.store.move_legacy(conn, back, self.config.batch_size * 10)
            result.moved += moved
            if moved == 0:
                log.info("the finished jobs from before the upgrade have all moved to the history")
                return
        result.more_to_prune = True

    def run(self) -> None:
        """Run a pass every ``interval`` seconds until :meth:`stop`; database errors are retried."""
        retention = (
            "off"
            if not self.config.prune
            else (
                f"{self.config.completed_retention}s completed/cancelled, {self.config.failed_retention}s dead/failed"
            )
        )
        log.info(
            "reaper started: every %gs; retention %s; %d periodic schedule(s); vacuum %s",
            self.config.interval,
            retention,
            len(self.schedules),
            "on" if self.config.vacuum else "off",
        )
        vacuum = None
        if self.config.vacuum:
            vacuum = Vacuum(self.dsn, self.store, self._stopping)
            vacuum.start()
        while not self._stopping.is_set():
            more = False
            started = time.monotonic()
            try:
                more = self.run_once().more_to_prune
            except DatabaseUnavailable as exc:
                log.warning("reaper: %s; retrying", exc)
                self.close()
            # With more to prune, rest as long as the pass took before the next: pruning is
            # maintenance, and on a small host it must leave the database's time to the jobs.
            self._stopping.wait(min(time.monotonic() - started, self.config.interval) if more else self.config.interval)
        if vacuum is not None:
            vacuum.join(timeout=1.0)  # a VACUUM under way finishes on the server all the same
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
