"""The faults: each scenario as one method that picks a target at random, hits it, and records
what it hit (pids, the leases they held, when), so every lost attempt can later be matched to
the fault that caused it.

Over several databases (a full run over a shard map) a database fault hits one database, drawn
among those up, and says which (``Fault.database``): it explains lost attempts of that database's
jobs only. ``kill-supervisor`` then kills a database's supervisor, which the process above starts
again: a SIGKILL of that process itself leaves every database's supervisor running (they are not
told their parent died), so the run would only count orphans that never exit.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg

from .app import BATCH_TASK, SEQUENCE_TASK, UNIQUE_TASK
from .databases import Shard
from .fleet import Fleet
from .options import PIN_SECONDS, STOP_DATABASE, STOP_DATABASE_SECONDS, Options
from .processes import Child, Supervisor
from .site import Site

#: A supervisor's log line for each child it forks (and, over a shard map, each database's supervisor).
_FORKED = re.compile(r"(?:spawned (?:worker-\d+|reaper)|started the supervisor of database \S+) \(pid (\d+)")
#: The connection that pins the horizon is the harness's (``chaos:*``): ``terminate-backend``
#: never picks it.
PIN_APP_NAME = "chaos:horizon"

#: Leases held by a process, read while it is frozen so the answer cannot change under us.
_HELD_BY = """
SELECT id, attempt FROM miniqueue_jobs
 WHERE state = 'running' AND split_part(leased_by, ':', 2) = %s
 ORDER BY id
"""
_MINIQUEUE_BACKENDS = """
SELECT pid, application_name FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE 'miniqueue:%' AND pid <> pg_backend_pid()
 ORDER BY pid
"""
_JOB_STATES = "SELECT id, state, attempt FROM miniqueue_jobs WHERE id = ANY(%s)"
#: The pinning session: a snapshot taken by a read of the queue's table, held by its transaction.
_PIN = "SELECT count(*) FROM miniqueue_jobs"
_XID = "SELECT txid_current()"
#: The tasks whose jobs carry a unique or sequence key (``--unique``, ``--sequences``).
KEYED_TASKS = frozenset({UNIQUE_TASK, SEQUENCE_TASK})
_RUNS_KEYED = """
SELECT count(*) FROM unnest(%s::bigint[], %s::int[]) AS l(job, attempt)
  JOIN chaos_keyed k ON k.job_id = l.job
  JOIN chaos_executions e ON e.job_id = l.job AND e.attempt = l.attempt AND e.pid = %s AND e.ended IS NULL
"""


@dataclass
class Fault:
    """One injected fault. Times are epoch seconds on this host."""

    kind: str
    at: float
    until: float
    pids: tuple[int, ...] = ()
    leases: tuple[tuple[int, int], ...] = ()
    detail: str = ""
    #: The index of the database it hit, over several (``--databases``); None: the run's only one.
    database: int | None = None


@dataclass
class Stop:
    """A worker frozen with SIGSTOP, waiting to be resumed."""

    fault: Fault
    pid: int
    supervisor: int
    frozen: float  # time.monotonic()
    resumed: float | None = None
    #: Its parent's pid: the supervisor, or over several databases its database's supervisor.
    parent: int = 0


@dataclass
class Pin:
    """A session holding a snapshot open on one database, until ``until`` (time.monotonic())."""

    fault: Fault
    shard: Shard
    conn: psycopg.Connection[Any]
    xid: int  # the database's transaction counter when the snapshot was taken
    until: float


@dataclass
class Down:
    """A database's server stopped, to be started again at ``until`` (time.monotonic())."""

    fault: Fault
    shard: Shard
    until: float


@dataclass
class Injector:
    """Injects faults into a fleet of supervisors and the servers under it."""

    options: Options
    fleet: Fleet
    site: Site
    rng: random.Random
    say: Callable[[str], None]
    faults: list[Fault] = field(default_factory=list)
    stops: list[Stop] = field(default_factory=list)
    restarts: int = 0
    pin: Pin | None = None
    down: Down | None = None
    extra_until: float | None = None  # when the second supervisor is stopped (time.monotonic())
    extra_fault: Fault | None = None
    #: Supervisors a fault stopped or killed, with the fault: once the run is over, the fault also
    #: names every child each had (one it forked as the fault struck, say a worker it was
    #: restarting, is told to stop too): see :meth:`settle`.
    ended: list[tuple[Fault, Supervisor]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    # -- dispatch ------------------------------------------------------------------------------

    def inject(self, kind: str) -> Fault | None:
        """Inject one fault of ``kind``; None if it had no target right now (try another)."""
        method = getattr(self, kind.replace("-", "_"))
        fault: Fault | None = method()
        if fault is not None:
            self.faults.append(fault)
        return fault

    def tick(self) -> None:
        """Finish what earlier faults started: resume a stopped worker, stop the second supervisor,
        release a pinned horizon, start a stopped database again."""
        for stop in self.stops:
            if stop.resumed is None:
                self._maybe_resume(stop)
        if self.extra_until is not None and time.monotonic() >= self.extra_until:
            self._stop_extra()
        if self.pin is not None and time.monotonic() >= self.pin.until:
            self._release_pin()
        if self.down is not None and time.monotonic() >= self.down.until:
            self._start_database()

    def finish(self) -> None:
        """Chaos is over: stop the second supervisor (now, or as soon as it is ready), release a
        pinned horizon, start a stopped database; stopped workers are resumed on their own schedule."""
        if self.extra_until is not None:
            self.extra_until = time.monotonic()
            self._stop_extra()
        if self.pin is not None:
            self._release_pin()
        if self.down is not None:
            self._start_database()

    def settle(self) -> None:
        """Once every supervisor is gone: each fault that stopped or killed one names every child
        it had, as the harness saw them and as its log says it forked them (its children when the
        fault struck, and any it forked after)."""
        for fault, supervisor in self.ended:
            seen = [t.pid for t in self.fleet.tracker.processes.values() if t.supervisor == supervisor.number]
            forked = [int(pid) for pid in _FORKED.findall(supervisor.output())]
            fault.pids = tuple(dict.fromkeys([*fault.pids, *seen, *forked]))

    @property
    def stopped_pids(self) -> set[int]:
        return {s.pid for s in self.stops if s.resumed is None}

    @property
    def busy(self) -> bool:
        """A fault is still in progress (a worker is frozen)."""
        return bool(self.stopped_pids)

    # -- targets -------------------------------------------------------------------------------

    def _workers(self) -> list[tuple[Supervisor, Child]]:
        frozen = self.stopped_pids
        return [
            (s, c)
            for s in self.fleet.running()
            for c in s.children()
            if c.is_worker and not c.zombie and c.pid not in frozen
        ]

    def _pick_worker(
        self, busy_share: float, wait: float = 1.0, task: str | None = None
    ) -> tuple[Supervisor, Child] | None:
        """A random worker; with probability ``busy_share`` one whose title names a job (of
        ``task``, when given), watched for up to ``wait`` seconds (a job lasts 10-100 ms, a lightly
        loaded worker is mostly idle, and a kill that hits a job is the one that tests something)."""
        want_busy = self.rng.random() < busy_share
        deadline = time.monotonic() + wait
        while True:
            workers = self._workers()
            busy = [w for w in workers if w[1].busy and (task is None or _runs_task(w[1], task))]
            if busy and want_busy:
                return self.rng.choice(busy)
            if not want_busy or time.monotonic() >= deadline:
                return self.rng.choice(workers) if workers else None
            time.sleep(0.02)

    def _up(self) -> list[Shard]:
        """The databases whose server is up (a query to one that is down would wait for it)."""
        return [s for s in self.site.shards if self.down is None or s is not self.down.shard]

    def _pick_up(self) -> Shard:
        """A database that is up, at random (the one database draws nothing)."""
        up = self._up()
        return up[0] if len(up) == 1 else self.rng.choice(up)

    def _rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """``query`` on every database that is up, the rows of each in turn."""
        return [row for shard in self._up() for row in shard.db.rows(query, params)]

    def _held(self, pid: int) -> tuple[tuple[int, int], ...]:
        return tuple((int(r[0]), int(r[1])) for r in self._rows(_HELD_BY, (str(pid),)))

    # -- scenarios -----------------------------------------------------------------------------

    def kill_worker(self) -> Fault | None:
        """SIGKILL a worker, preferring one that is running a job. It is frozen first for the
        moment it takes to read its leases, so the recorded leases are exactly those it died with."""
        # With --batches, half the kills wait for a worker running the batch task: a kill amid a
        # batch is what sends its jobs back uncharged, each to run alone next.
        batch = BATCH_TASK if self.options.batches and self.rng.random() < 0.5 else None
        picked = self._pick_worker(busy_share=0.8, task=batch)
        if picked is None:
            return None
        supervisor, child = picked
        if not _signal(child.pid, signal.SIGSTOP):
            return None
        time.sleep(0.02)
        leases = self._held(child.pid)
        now = time.time()
        _signal(child.pid, signal.SIGKILL)
        self.say(
            f"kill-worker: {child.slot} pid {child.pid} (supervisor {supervisor.number}) holding {_leases(leases)}"
        )
        return Fault("kill-worker", now, now, (child.pid,), leases, f"{child.slot} of supervisor {supervisor.number}")

    def kill_reaper(self) -> Fault | None:
        reapers = [(s, c) for s in self.fleet.running() for c in s.children() if c.is_reaper and not c.zombie]
        if not reapers:
            return None
        supervisor, child = self.rng.choice(reapers)
        now = time.time()
        if not _signal(child.pid, signal.SIGKILL):
            return None
        self.say(f"kill-reaper: pid {child.pid} (supervisor {supervisor.number})")
        return Fault("kill-reaper", now, now, (child.pid,), (), f"reaper of supervisor {supervisor.number}")

    def _keyed_holder(self) -> tuple[Supervisor, Child] | None:
        """A worker whose title names a job of a keyed task (its handler is running one: a lease
        only prefetched would not show a stale attempt running on), if there is one."""
        holders = [w for w in self._workers() if w[1].busy and any(_runs_task(w[1], t) for t in KEYED_TASKS)]
        return self.rng.choice(holders) if holders else None

    def _runs_keyed(self, pid: int, leases: tuple[tuple[int, int], ...]) -> bool:
        """Whether ``pid``'s handler has started one of these leases of a keyed job (a title can lag)."""
        return any(r[0] for r in self._rows(_RUNS_KEYED, ([job for job, _ in leases], [a for _, a in leases], pid)))

    def stop_worker(self) -> Fault | None:
        """SIGSTOP a worker that holds a job, for longer than its lease plus a reaper pass. With
        keyed jobs (``--unique``, ``--sequences``) it prefers a worker running one, so that a stale
        attempt of a key runs past its lease; the first stop waits for one during the first third
        of the chaos."""
        if self.stopped_pids:
            return None
        # The first stop of a keyed run waits a while for a worker running a keyed job.
        early = time.monotonic() - self.started < self.options.duration / 3
        keyed_only = self.options.keyed and not self.stops and early
        for _ in range(5):
            picked = self._keyed_holder() if self.options.keyed else None
            if picked is None and keyed_only:
                return None
            if picked is None:
                picked = self._pick_worker(busy_share=1.0, wait=0.0)
                if picked is None or not picked[1].busy:
                    return None
            supervisor, child = picked
            if not _signal(child.pid, signal.SIGSTOP):
                continue
            time.sleep(0.05)  # let a statement already on the wire land before reading the leases
            leases = self._held(child.pid)
            if leases and (not keyed_only or self._runs_keyed(child.pid, leases)):
                now = time.time()
                fault = Fault(
                    "stop-worker", now, now, (child.pid,), leases, f"{child.slot} of supervisor {supervisor.number}"
                )
                self.stops.append(Stop(fault, child.pid, supervisor.number, time.monotonic(), parent=child.parent))
                self.say(
                    f"stop-worker: SIGSTOP {child.slot} pid {child.pid} (supervisor {supervisor.number}) "
                    f"holding {_leases(leases)}"
                )
                return fault
            _signal(child.pid, signal.SIGCONT)  # it finished its (keyed) job meanwhile: pick again
        return None

    def _maybe_resume(self, stop: Stop) -> None:
        """Resume once every job it held was completed by another attempt (so its late outcome
        meets a finished job), or at the latest well inside the supervisor's liveness timeout."""
        shortest, longest = self.options.stop_bounds
        frozen_for = time.monotonic() - stop.frozen
        if frozen_for < shortest:
            return
        if frozen_for < longest:
            ids = [job for job, _ in stop.fault.leases]
            states = {int(r[0]): (r[1], int(r[2])) for r in self._rows(_JOB_STATES, (ids,))}
            attempts = dict(stop.fault.leases)
            if not all(states.get(j, ("", 0))[0] == "completed" and states[j][1] > a for j, a in attempts.items()):
                return
        _signal(stop.pid, signal.SIGCONT)
        stop.resumed = time.monotonic()
        stop.fault.until = time.time()
        self.say(f"stop-worker: SIGCONT pid {stop.pid} after {frozen_for:.1f}s")

    def terminate_backend(self) -> Fault | None:
        """pg_terminate_backend on one to three random miniqueue connections of one database."""
        shard = self._pick_up()
        backends = [(int(r[0]), str(r[1])) for r in shard.db.rows(_MINIQUEUE_BACKENDS)]
        if not backends:
            return None
        chosen = self.rng.sample(backends, k=min(len(backends), self.rng.randint(1, 3)))
        now = time.time()
        for pid, _ in chosen:
            shard.db.rows("SELECT pg_terminate_backend(%s)", (pid,))
        names = ", ".join(sorted(name.removeprefix("miniqueue:") for _, name in chosen))
        where = f" on {shard.name}" if self.site.sharded else ""
        self.say(f"terminate-backend{where}: {names}")
        return Fault("terminate-backend", now, time.time(), (), (), names + where, self.site.database_index(shard))

    def restart_postgres(self) -> Fault | None:
        """Restart an owned server: the first restart is fast, the second immediate, then either."""
        if not self.site.owned:
            return None
        shard = self._pick_up()
        mode = ("fast", "immediate")[self.restarts] if self.restarts < 2 else self.rng.choice(["fast", "immediate"])
        self.restarts += 1
        where = f" ({shard.name})" if self.site.sharded else ""
        self.say(f"restart-postgres{where}: pg_ctl restart -m {mode}")
        started = time.time()
        shard.server.restart(mode)
        ended = time.time()
        self.say(f"restart-postgres{where}: back after {ended - started:.1f}s")
        return Fault(
            "restart-postgres",
            started,
            ended,
            (),
            (),
            f"{mode}, {ended - started:.1f}s{where}",
            self.site.database_index(shard),
        )

    def pin_horizon(self) -> Fault | None:
        """Hold a snapshot open on one database for PIN_SECONDS: a REPEATABLE READ transaction
        that has read the queue's table, so no row version dead since can be vacuumed away (the
        xmin horizon stays where it was). Released by :meth:`tick`. It explains no lost attempt:
        a held snapshot must cost the queue nothing but bloat."""
        if self.pin is not None:
            return None
        shard = self._pick_up()
        try:
            conn = psycopg.connect(shard.server.dsn, autocommit=True, application_name=PIN_APP_NAME, connect_timeout=5)
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute(_PIN)
            xid = int(shard.db.value(_XID))
        except psycopg.Error:
            return None
        lasts = self.rng.uniform(*PIN_SECONDS)
        now = time.time()
        where = f" on {shard.name}" if self.site.sharded else ""
        fault = Fault("pin-horizon", now, now, detail=f"snapshot held{where}", database=self.site.database_index(shard))
        self.pin = Pin(fault, shard, conn, xid, time.monotonic() + lasts)
        self.say(f"pin-horizon: a REPEATABLE READ snapshot held open{where} for {lasts:.1f}s")
        return fault

    def _release_pin(self) -> None:
        pin, self.pin = self.pin, None
        if pin is None:
            return
        pin.fault.until = time.time()
        held = pin.fault.until - pin.fault.at
        behind = ""
        with contextlib.suppress(psycopg.Error):
            pin.conn.execute("ROLLBACK")
            behind = f", {int(pin.shard.db.value(_XID)) - pin.xid} transactions behind it when released"
        ended = "" if behind else ", its session ended by another fault first"
        with contextlib.suppress(psycopg.Error):
            pin.conn.close()
        pin.fault.detail += f" {held:.1f}s{behind}{ended}"
        self.say(f"pin-horizon: released after {held:.1f}s{behind}{ended}")

    def stop_database(self) -> Fault | None:
        """Over several databases: stop one database's server (``pg_ctl stop -m fast``) for
        STOP_DATABASE_SECONDS, then start it again (:meth:`tick`). Its workers wait, the others
        run on; the harness's own reads skip it meanwhile."""
        if not self.site.sharded or not self.site.owned or self.down is not None:
            return None
        shard = self.rng.choice(self.site.shards)
        lasts = self.rng.uniform(*STOP_DATABASE_SECONDS)
        if self.pin is not None and self.pin.shard is shard:
            self._release_pin()
        started = time.time()
        shard.server.halt()
        fault = Fault(STOP_DATABASE, started, started, detail=f"{shard.name}'s server stopped", database=shard.index)
        self.down = Down(fault, shard, time.monotonic() + lasts)
        self.say(f"stop-database: {shard.name}'s server stopped (pg_ctl stop -m fast) for {lasts:.1f}s")
        return fault

    def _start_database(self) -> None:
        down, self.down = self.down, None
        if down is None:
            return
        down.shard.server.resume()
        down.fault.until = time.time()
        down.fault.detail += f" for {down.fault.until - down.fault.at:.1f}s"
        self.say(f"stop-database: {down.shard.name}'s server up again after {down.fault.until - down.fault.at:.1f}s")

    def kill_supervisor(self) -> Fault | None:
        """SIGKILL a supervisor (never the one whose worker is frozen), then start a new one; over
        several databases, a database's supervisor, which the process above starts again."""
        if self.site.sharded:
            return self._kill_database_supervisor()
        frozen = {s.supervisor for s in self.stops if s.resumed is None}
        candidates = [s for s in self.fleet.running() if s.number not in frozen]
        if not candidates:
            return None
        supervisor = self.rng.choice(candidates)
        children = [c.pid for c in supervisor.children() if not c.zombie]
        leases = tuple(lease for pid in children for lease in self._held(pid))
        now = time.time()
        supervisor.kill()
        self.fleet.tracker.orphaned(supervisor)
        self.say(
            f"kill-supervisor: supervisor {supervisor.number} (pid {supervisor.pid}); its children "
            f"{children} held {_leases(leases)}"
        )
        replacement = self.fleet.start()
        if self.extra_until is not None and len(self.fleet.running()) > 1:
            self.say(f"supervisor {replacement.number} replaces it as the second supervisor")
        fault = Fault(
            "kill-supervisor", now, now, (supervisor.pid, *children), leases, f"supervisor {supervisor.number}"
        )
        self.ended.append((fault, supervisor))
        return fault

    def _kill_database_supervisor(self) -> Fault | None:
        frozen = {s.parent for s in self.stops if s.resumed is None}
        candidates = [
            (s, c)
            for s in self.fleet.running()
            for c in s.children()
            if c.database_supervisor and not c.zombie and c.pid not in frozen
        ]
        if not candidates:
            return None
        supervisor, target = self.rng.choice(candidates)
        children = [c.pid for c in supervisor.children() if c.parent == target.pid and not c.zombie]
        leases = tuple(lease for pid in children for lease in self._held(pid))
        now = time.time()
        if not _signal(target.pid, signal.SIGKILL):
            return None
        self.fleet.tracker.orphaned_pids(children)
        self.say(
            f"kill-supervisor: a database's supervisor (pid {target.pid}, under supervisor {supervisor.number}); "
            f"its children {children} held {_leases(leases)}"
        )
        return Fault(
            "kill-supervisor",
            now,
            now,
            (target.pid, *children),
            leases,
            f"a database's supervisor under supervisor {supervisor.number}",
        )

    def two_supervisors(self) -> Fault | None:
        """Run a second supervisor on the same database (a second host) for 5-15 s."""
        if self.extra_until is not None or len(self.fleet.running()) > 1:
            return None
        lasts = self.rng.uniform(5.0, 15.0)
        supervisor = self.fleet.start()
        self.extra_until = time.monotonic() + lasts
        now = time.time()
        self.say(f"two-supervisors: supervisor {supervisor.number} joins for {lasts:.0f}s")
        self.extra_fault = Fault("two-supervisors", now, now, (), (), f"supervisor {supervisor.number}, {lasts:.0f}s")
        return self.extra_fault

    def _stop_extra(self) -> None:
        """SIGTERM the newest supervisor; its children are recorded so a job it abandons is explained.
        A supervisor that is not ready yet is given until it is: before it has installed its
        signal handlers, TERM simply kills it, which tests nothing."""
        running = self.fleet.running()
        if len(running) > 1 and not running[-1].ready:
            return  # asked again next tick
        self.extra_until = None
        if len(running) > 1 and self.extra_fault is not None:
            newest = running[-1]
            children = tuple(c.pid for c in newest.children())
            self.extra_fault.at = time.time()
            self.extra_fault.pids = (newest.pid, *children)
            self.ended.append((self.extra_fault, newest))
            newest.terminate(self.options.shutdown_timeout + 15.0)
            self.extra_fault.until = time.time() + self.options.shutdown_timeout + 1.0
            self.say(f"two-supervisors: SIGTERM supervisor {newest.number}")


def _runs_task(child: Child, task: str) -> bool:
    """Whether the worker's title names a job of ``task`` (``miniqueue worker-1 job 7 chaos-batch, ...``)."""
    return task in child.title.replace(",", " ").split()


def _signal(pid: int, sig: int) -> bool:
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, psutil.Error):
        return False


def _leases(leases: tuple[tuple[int, int], ...]) -> str:
    if not leases:
        return "no job"
    return ", ".join(f"job {j} attempt {a}" for j, a in leases)
