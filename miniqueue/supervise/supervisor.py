"""The prefork supervisor behind ``miniqueue-supervise``: the arbiter.

It has a child of its own check that the app loads, forks N worker processes and one reaper, then
runs a loop that ticks at least once a second:
act on recorded signals → read children's reports → reap dead children with ``waitpid`` (and
return the jobs a dead worker held) → kill stale ones → spawn missing ones. Each concern lives
in a module of its own: :mod:`~miniqueue.supervise.signals` (handlers that only record),
:mod:`~miniqueue.supervise.children` and :mod:`~miniqueue.supervise.reports` (what children say),
:mod:`~miniqueue.supervise.recovery` (a dead worker's jobs), :mod:`~miniqueue.supervise.registry` (the process
registry), :mod:`~miniqueue.supervise.probes` (``--metrics-port``), :mod:`~miniqueue.supervise.child` (what a
forked child does) and :mod:`~miniqueue.supervise.decisions` (when to restart a slot, which
slot TTIN/TTOU adds or removes, which child to kill or retire: decided there, done here). It
holds no database connection across ``fork()``: it opens one only to check the schema at
start, to return a reaped worker's jobs and to refresh the registry, and closes it at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import select
import signal
import sys
import time

import psutil

from ..core.db import mask_dsn
from ..core.errors import AppLoadError
from ..core.process import EXIT_BOOT_ERROR, EXIT_SCHEMA_REFUSED, describe_exit, host_name, set_title, signal_name
from ..core.scaling import Autoscaler, RateMeter, Reading
from ..store.store import Store
from ..tasks.app import App
from ..tasks.batch import MAX_BATCH_SIZE
from ..tasks.loading import load_app
from ..worker.inflight import InflightBoard
from ..worker.worker import new_worker_id
from . import decisions, reports
from .child import ChildSpec, ScaleWatch, run_app_check, run_child
from .children import Child
from .config import SupervisorConfig, check_database
from .decisions import RestartBackoff
from .probes import Probes
from .recovery import SECOND_LOOK_SECONDS, release_leases, release_stragglers
from .registry import ProcessRegistry
from .signals import SignalQueue
from .systemd import Notifier

log = logging.getLogger("miniqueue.supervisor")

TICK_SECONDS = 1.0
#: How often an autoscaling supervisor's reaper reads the backlog (each reading is decided on).
SCALE_READ_SECONDS = 1.0
#: The most workers /metrics' miniqueue_desired_workers says, for a fixed number of workers.
DESIRED_WORKERS_CAP = 100


class Supervisor:
    """Forks and supervises worker processes and a reaper until told to stop."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config.validated()
        self.store = Store(config.schema)
        self.app: App | None = None
        self.children: dict[int, Child] = {}
        self.slots: dict[str, Child | None] = {}
        self.restart_at: dict[str, float] = {}
        #: Dead workers whose leases are to be looked at again, and when (see look_again).
        self.second_looks: list[tuple[float, Child]] = []
        self.backoff = RestartBackoff(self.config.boot_failure_limit)
        self.fatal_error: str | None = None
        self.stopping: str | None = None  # None, "graceful" or "fast"
        self.stop_deadline = 0.0
        self.signals = SignalQueue()
        self.announced_ready = False
        self.probes: Probes | None = None
        host = host_name()
        self.registry = ProcessRegistry(config.dsn, self.store, host, f"{host}:{os.getpid()}:{secrets.token_hex(3)}")
        self.notifier = Notifier()
        #: With --workers MIN:MAX: the decisions, the rate the workers finish jobs at, and the
        #: reaper's latest reading of the backlog (decided on once, when it arrives).
        self.autoscaler = (
            None
            if config.max_workers is None
            else Autoscaler(
                config.workers,
                config.max_workers,
                config.scale_target,
                config.scale_cooldown,
                cpu_ceiling=config.scale_cpu_ceiling,
            )
        )
        self.finished = RateMeter()
        self.backlog: reports.BacklogReading | None = None
        self.desired: int | None = None
        self.held_by = ""

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped; return the exit code (0 after a graceful stop)."""
        set_title("supervisor")
        self.signals.install()  # first: a TERM during start-up must stop us cleanly, not kill us
        check_database(self.config, self.store)
        psutil.cpu_percent(None)  # the first reading of the host's CPU starts here
        self.slots = dict.fromkeys([*(f"worker-{i}" for i in range(1, self.config.workers + 1)), "reaper"])
        if self.config.preload:
            self.app = load_app(self.config.app_ref)
        else:
            self.check_app()
        if self.config.metrics_port is not None:
            self.probes = Probes(self.config.metrics_host, self.config.metrics_port, database=self.config.database)
        scaling = "" if self.config.max_workers is None else f" (autoscaling up to {self.config.max_workers})"
        log.info(
            "supervisor starting %d worker(s)%s and a reaper for %s on %s",
            self.config.workers,
            scaling,
            self.config.app_ref,
            mask_dsn(self.config.dsn),
        )
        try:
            while self.children or not self.stopping:
                self.tick()
        finally:
            self.signals.uninstall()
            if self.probes:
                self.probes.close()
            self.registry.unregister()
        if self.fatal_error:
            log.error("%s", self.fatal_error)
            return EXIT_BOOT_ERROR
        log.info("supervisor stopped")
        return 0

    def check_app(self) -> None:
        """Raise AppLoadError if the app does not load, before any worker is forked: a child of
        its own imports it once, so that the supervisor itself never does (workers that HUP
        starts import the code deployed since). A signal to stop meanwhile ends the check."""
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_app_check(self.config.app_ref, write_fd, [read_fd, *self.signals.filenos()])
        os.close(write_fd)
        said = b""
        try:
            while not self.stopping:
                readable, _, _ = select.select([read_fd, self.signals.wake_r], [], [])
                if self.signals.wake_r in readable:
                    self.handle_signals()
                if read_fd in readable:
                    if not (chunk := os.read(read_fd, 65536)):
                        break
                    said += chunk
            if self.stopping:
                self.kill(pid, signal.SIGKILL)
        finally:
            os.close(read_fd)
            _, status = os.waitpid(pid, 0)
        if status and not self.stopping:
            raise AppLoadError(said.decode(errors="replace").strip() or f"the app check {describe_exit(status)}")

    def tick(self) -> None:
        self.notifier.watchdog()
        self.handle_signals()
        for child in list(self.children.values()):
            self.take_reports(child)
        self.reap_children()
        self.look_again()
        if self.stopping:
            self.enforce_stop_deadline()
        else:
            self.murder_workers()
            self.spawn_missing()
            self.autoscale()
        if self.registry.due():
            busy = self.registry.refresh(self.children.values(), self.backoff.restarts)
            workers = len(self.slots) - 1
            database = "up" if self.registry.db_ok else "DOWN"
            self.notifier.send(f"STATUS={workers} workers, {busy} jobs running, database {database}")
        if self.probes:
            self.probes.publish(self.problems(), self.process_counts())
        self.sleep()

    def problems(self) -> list[str]:
        """Why /readyz would say not ready: draining, the database did not answer the last
        registry refresh, no worker is up, or a ready worker's LISTEN connection is down."""
        workers = [c for c in self.children.values() if c.worker_id and c.ready and not c.retiring]
        problems = []
        if self.stopping:
            problems.append("draining")
        if not self.registry.db_ok:
            name = self.config.database
            problems.append("database unreachable" if name is None else f"database {name} unreachable")
        if not workers:
            problems.append("no worker ready")
        if not self.config.worker.poll_only and any(c.listening is False for c in workers):
            problems.append("a worker's LISTEN connection is down")
        return problems

    def process_counts(self) -> dict[str, int]:
        workers = sum(1 for c in self.children.values() if c.worker_id and not c.retiring)
        return {"worker": workers, "reaper": sum(1 for c in self.children.values() if c.worker_id is None)}

    def sleep(self) -> None:
        """Wait for the next tick, a signal, a child's report or a due restart."""
        now = time.monotonic()
        wake_at = [now + TICK_SECONDS, *self.restart_at.values()]
        if self.stopping:
            wake_at.append(self.stop_deadline)
        fds = [self.signals.wake_r, *(c.read_fd for c in self.children.values())]
        with contextlib.suppress(InterruptedError):
            select.select(fds, [], [], max(0.0, min(wake_at) - now))

    # -- signals -------------------------------------------------------------------------------

    def handle_signals(self) -> None:
        for signum in self.signals.pending():
            log.info("received %s", signal_name(signum))
            if signum in (signal.SIGTERM, signal.SIGINT) and not self.stopping:
                self.begin_stop("graceful")
            elif signum in (signal.SIGINT, signal.SIGQUIT):
                self.begin_stop("fast")
            elif signum == signal.SIGHUP and not self.stopping:
                self.replace_workers()
            elif signum == signal.SIGTTIN and not self.stopping:
                self.resize(+1)
            elif signum == signal.SIGTTOU and not self.stopping:
                self.resize(-1)

    def begin_stop(self, mode: str) -> None:
        """Graceful: children drain up to the shutdown timeout. Fast: children leave now."""
        self.stopping = mode
        self.notifier.send("STOPPING=1", f"STATUS=stopping ({mode})")
        self.restart_at.clear()
        graceful = "the supervisor was asked to stop (graceful)"
        for child in self.children.values():  # a second Ctrl-C turns a graceful stop into a fast one
            if child.stop_reason in (None, graceful):
                child.stop_reason = f"the supervisor was asked to stop ({mode})"
        if mode == "graceful":
            self.stop_deadline = time.monotonic() + self.config.worker.shutdown_timeout + 5.0
            self.signal_children(signal.SIGTERM)
        else:
            self.stop_deadline = time.monotonic() + 3.0
            self.signal_children(signal.SIGQUIT)

    def enforce_stop_deadline(self) -> None:
        if self.children and time.monotonic() >= self.stop_deadline:
            log.warning("children still running at the stop deadline: killing %s", sorted(self.children))
            self.signal_children(signal.SIGKILL)
            self.stop_deadline = time.monotonic() + 5.0

    def signal_children(self, sig: int) -> None:
        for pid in list(self.children):
            self.kill(pid, sig)

    def replace_workers(self) -> None:
        """HUP: start a fresh generation of workers; the old ones drain and exit."""
        for slot, child in self.slots.items():
            if child is not None and slot != "reaper":
                self.retire(child, "replaced by HUP")
                self.slots[slot] = None

    def resize(self, delta: int, why: str = "removed by TTOU") -> None:
        """TTIN/TTOU, or autoscaling: one worker more or fewer (never fewer than one; see
        :func:`decisions.resize`); a worker removed is stopped gracefully, for ``why``."""
        change = decisions.resize(self.slots, delta)
        if change is None:
            return
        if change.add:
            self.slots[change.slot] = None
            log.info("adding %s (now %d workers)", change.slot, change.workers)
        else:
            child = self.slots.pop(change.slot)
            self.restart_at.pop(change.slot, None)
            if child is not None:
                self.retire(child, why)
            log.info("removing %s (now %d workers)", change.slot, change.workers)

    def autoscale(self) -> None:
        """On each reading of the backlog the reaper sends: with --workers MIN:MAX, one worker
        more or fewer, as :class:`~miniqueue.core.scaling.Autoscaler` decides (each change and
        each new reason to hold is logged); and the gauges /metrics serves."""
        if self.backlog is None or not self.announced_ready:
            return
        backlog, self.backlog = self.backlog.backlog, None
        if self.autoscaler is None:
            if self.probes:
                self.probes.scaling(None, None, self.desired)
            return
        now = time.monotonic()
        self.finished.add(0, now)  # the rate is measured from the first reading on
        workers = [slot for slot in self.slots if slot != "reaper"]
        busy = sum(1 for c in self.children.values() if c.board is not None and not c.retiring and c.board.running())
        cpu = psutil.cpu_percent(None) / 100
        reading = Reading(backlog, self.finished.rate(now), len(workers), busy, cpu, self.finished.measured_for(now))
        decision = self.autoscaler.decide(reading, now)
        if decision.change:
            self.held_by = ""
            log.info("autoscaling: %s", decision.reason)
            self.resize(decision.change, "retired by autoscaling")
        elif decision.hold != "starting" and decision.hold != self.held_by:
            self.held_by = decision.hold  # said once, until what holds the workers changes
            if decision.hold:
                log.info("autoscaling holds at %d worker(s): %s", len(workers), decision.reason)
        if self.probes:
            running = sum(1 for c in self.children.values() if c.worker_id and not c.retiring)
            self.probes.scaling(len(self.slots) - 1, running, self.desired)

    def retire(self, child: Child, why: str, *, charge: bool = False) -> None:
        """Stop ``child`` gracefully. With ``charge``, a job it is made to abandon is charged an
        attempt (the memory ceiling: that job may be the leak)."""
        log.info("stopping %s (pid %d) gracefully: %s", child.slot, child.pid, why)
        child.retiring = True
        child.stop_reason = why
        if charge:
            child.kill_reason = f"worker process stopped: {why}"
        self.kill(child.pid, signal.SIGTERM)

    # -- children --------------------------------------------------------------------------------

    def spawn_missing(self) -> None:
        now = time.monotonic()
        for slot, child in list(self.slots.items()):
            if child is None and self.restart_at.get(slot, 0.0) <= now:
                self.restart_at.pop(slot, None)
                self.slots[slot] = self.spawn_child(slot)
        if not self.announced_ready and self.slots and all(c and c.ready for c in self.slots.values()):
            self.announced_ready = True
            log.info("supervisor ready: %d worker(s) and the reaper are running", len(self.slots) - 1)
            self.notifier.send("READY=1", f"STATUS={len(self.slots) - 1} workers ready")

    def spawn_child(self, slot: str) -> Child:
        """Fork one child for ``slot``. The child never returns from here."""
        read_fd, write_fd = os.pipe()
        suffix = secrets.token_hex(3)
        spec = self.child_spec(slot, write_fd, suffix)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            inherited = [read_fd, *self.signals.filenos(), *(c.read_fd for c in self.children.values())]
            if self.probes:
                inherited.extend(self.probes.filenos())
            run_child(spec, inherited)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        now = time.monotonic()
        worker_id = None if slot == "reaper" else new_worker_id(pid, suffix)
        child = Child(
            slot=slot, pid=pid, read_fd=read_fd, worker_id=worker_id, started=now, last_report=now, board=spec.board
        )
        self.children[pid] = child
        log.info("spawned %s (pid %d)", slot, pid)
        return child

    def child_spec(self, slot: str, report_fd: int, suffix: str) -> ChildSpec:
        spec = ChildSpec(
            name=slot,
            dsn=self.config.dsn,
            report_fd=report_fd,
            report_interval=self.config.report_interval,
            shutdown_timeout=self.config.worker.shutdown_timeout,
            app_ref=self.config.app_ref,
            app=self.app,
        )
        if slot == "reaper":
            gauges = None if self.config.metrics_port is None else self.config.metrics_interval
            # Read when autoscaling (each reading is decided on) and for /metrics' desired workers.
            scale = None
            if self.config.max_workers is not None or self.config.metrics_port is not None:
                queues = tuple(self.config.worker.queues) if self.config.worker.queues else None
                interval = SCALE_READ_SECONDS if self.config.max_workers is not None else self.config.metrics_interval
                most = self.config.max_workers or DESIRED_WORKERS_CAP
                scale = ScaleWatch(queues, interval, self.config.scale_target, most)
            return dataclasses.replace(spec, reaper=self.config.reaper, gauge_interval=gauges, scale=scale)
        return dataclasses.replace(
            spec,
            worker_suffix=suffix,
            worker=self.config.worker,
            max_jobs=self.config.max_jobs_per_child,
            # Threads for def handlers and coroutines for async ones, each up to --concurrency,
            # each running one job or a batch of them: the supervisor must know every job that
            # ran when the worker died (none is charged if several ran; each runs alone next).
            board=InflightBoard(2 * self.config.worker.concurrency * self.largest_batch()),
        )

    def largest_batch(self) -> int:
        """How many jobs one handler may run at once: the app's largest batch when it was loaded
        here (``--preload``), else the largest any task may declare."""
        if self.app is None:
            return MAX_BATCH_SIZE
        return max((task.batch.size for task in self.app.tasks.values() if task.batch), default=1)

    def take_reports(self, child: Child) -> None:
        """Read what ``child`` said; act on what concerns more than the child itself."""
        for report in child.read():
            if isinstance(report, reports.Done):
                self.finished.add(report.tally.count, time.monotonic())
            if isinstance(report, reports.BacklogReading):
                self.backlog, self.desired = report, report.desired
            if isinstance(report, reports.Ready):
                self.backoff.booted()
                log.info("%s (pid %d) ready", child.slot, child.pid)
            elif self.probes and isinstance(report, reports.Done):
                self.probes.jobs_finished(report.queue, report.task, report.outcome, report.tally)
            elif self.probes and isinstance(report, reports.QueueGauges):
                self.probes.queue_gauges(report.stats)
            elif self.probes and isinstance(report, reports.LimitGauge):
                self.probes.limit_gauge(report.scope, report.waiting)
            elif self.probes and isinstance(report, reports.SequenceGauge):
                self.probes.sequence_gauge(report.key, report.job_id, report.waiting)
            elif self.probes and isinstance(report, (reports.HorizonGauge, reports.DeadRowsGauge)):
                self.probes.health_gauge(report)
            elif self.probes and isinstance(report, reports.GaugesSent):
                self.probes.gauges_sent(report.database_up)

    def reap_children(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is not None:
                self.take_reports(child)  # its last words (a boot error) are still in the pipe
                child.close()
                self.handle_exit(child, status)

    def look_again(self) -> None:
        """Return what dead workers' claims in flight leased to them (see :func:`release_stragglers`)."""
        now = time.monotonic()
        while self.second_looks and self.second_looks[0][0] <= now:
            _, child = self.second_looks.pop(0)
            assert child.worker_id is not None
            release_stragglers(self.config.dsn, self.store, child.worker_id, child.slot, child.pid)

    def handle_exit(self, child: Child, status: int) -> None:
        how = describe_exit(status)
        clean = os.WIFEXITED(status) and os.waitstatus_to_exitcode(status) == 0
        level = logging.INFO if clean or child.retiring or self.stopping else logging.WARNING
        log.log(
            level,
            "%s (pid %d) %s%s",
            child.slot,
            child.pid,
            how,
            f" ({child.kill_reason})" if child.kill_reason else "",
        )
        if child.error and not clean:  # what the child reported before it died: the cause, in the log
            cause = child.error.strip().splitlines()[-1]  # a traceback's last line, first
            trace = "" if cause == child.error.strip() else f"\n{child.error.strip()}"
            log.log(level, "%s (pid %d) reported: %s%s", child.slot, child.pid, cause, trace)
        if child.board is not None:
            release_leases(self.config.dsn, self.store, child, how)
            self.second_looks.append((time.monotonic() + SECOND_LOOK_SECONDS, child))
        if self.slots.get(child.slot) is not child:
            return
        self.slots[child.slot] = None
        if os.WIFEXITED(status) and os.waitstatus_to_exitcode(status) == EXIT_SCHEMA_REFUSED:
            # The schema moved on past this version: no child of it may serve it. The others
            # stop as in a deploy (their jobs go back unspent), and nothing is forked again.
            self.fatal_error = self.fatal_error or f"{child.slot} refused the schema: {(child.error or '').strip()}"
            if not self.stopping:
                self.begin_stop("graceful")
        else:
            self.schedule_restart(child, clean)

    def schedule_restart(self, child: Child, clean: bool) -> None:
        """When ``child``'s slot gets its next child (see :class:`decisions.RestartBackoff`), or
        give up when children keep failing to boot."""
        now = time.monotonic()
        restart = self.backoff.exited(child, clean=clean, stopping=bool(self.stopping), now=now)
        if restart.give_up is not None:
            self.fatal_error = restart.give_up
            self.begin_stop("fast")
            return
        if restart.counted and self.probes:
            self.probes.restarted(child.kind)
        self.restart_at[child.slot] = now + restart.delay
        if restart.delay:
            log.info("restarting %s in %.1fs", child.slot, restart.delay)

    def murder_workers(self) -> None:
        """Kill children that stopped reporting or hold a job past its hard timeout; recycle
        workers over the memory limit (see :func:`decisions.overdue`)."""
        actions = decisions.overdue(
            list(self.children.values()),
            time.monotonic(),
            liveness_timeout=self.config.liveness_timeout,
            timeout_grace=self.config.timeout_grace,
            max_memory_mb=self.config.max_memory_mb,
            rss_mb=_rss_mb,
        )
        for action in actions:
            if isinstance(action, decisions.Kill):
                self.murder(action.child, action.reason, killed_for=action.killed_for)
            else:
                self.retire(action.child, action.reason, charge=True)

    def murder(self, child: Child, reason: str, *, killed_for: int | None = None) -> None:
        """SIGKILL ``child``: the jobs its handlers ran are charged, or only ``killed_for`` when
        the kill is on that one job's account."""
        log.warning("killing %s (pid %d): %s", child.slot, child.pid, reason)
        child.kill_reason, child.killed_for = reason, killed_for
        child.retiring = False  # a memory retirement that turned into a kill: charged either way
        self.kill(child.pid, signal.SIGKILL)

    @staticmethod
    def kill(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # already dead: waitpid will tell
            os.kill(pid, sig)


def _rss_mb(pid: int) -> float | None:
    """The resident memory of process ``pid`` in MB; None when it cannot be read (it died)."""
    try:
        return float(psutil.Process(pid).memory_info().rss) / 1_048_576
    except psutil.Error:
        return None
