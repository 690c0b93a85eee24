"""The prefork supervisor behind ``miniqueue-supervise``.

The supervisor (the arbiter) forks N worker processes and one reaper, then runs a loop that
ticks at least once a second: drain recorded signals → read children's reports → reap dead
children with ``waitpid`` → kill stale ones → spawn missing ones. It holds no database
connection across ``fork()``: it opens one only to check the schema at start and to release
the leases of a child it has reaped, and closes it at once.

When a worker dies (SIGKILL, segfault, ``os._exit``, OOM), the supervisor charges an attempt
to every job that worker still held, right after reaping it, so recovery takes one tick
rather than lease duration plus reaper interval. The reaper stays as the backstop for hosts
that vanish whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import queue
import secrets
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field

import psutil

from .app import App, load_app
from .child import SUPERVISOR_SIGNALS, ChildSpec, run_child
from .db import connect, mask_dsn
from .errors import ConfigError, MiniqueueError
from .httpserver import TinyHTTPServer
from .inflight import InflightBoard
from .job import ProcessInfo, State
from .metrics import Metrics
from .migrate import check_schema_version
from .process import EXIT_BOOT_ERROR, Tally, describe_exit, set_title, signal_name
from .reaper import ReaperConfig
from .retry import default_backoff
from .store import Failure, Release, Store
from .systemd import Notifier
from .worker import WorkerConfig, new_worker_id

log = logging.getLogger("miniqueue.supervisor")

TICK_SECONDS = 1.0
REGISTRY_SECONDS = 5.0
MAX_RESTART_DELAY = 10.0
STABLE_AFTER_SECONDS = 10.0


@dataclass(frozen=True)
class SupervisorConfig:
    """How ``miniqueue-supervise`` runs. Durations in seconds; memory in MB."""

    dsn: str
    app_ref: str
    workers: int = os.cpu_count() or 1
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    max_jobs_per_child: int | None = None
    max_memory_mb: float | None = None
    preload: bool = False
    timeout_grace: float = 5.0
    liveness_timeout: float = 30.0
    report_interval: float = 1.0
    boot_failure_limit: int = 3
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None

    def validated(self) -> SupervisorConfig:
        if self.workers < 1:
            raise ConfigError(f"--workers {self.workers} is invalid: run at least 1 worker process")
        if self.max_jobs_per_child is not None and self.max_jobs_per_child < 1:
            raise ConfigError(f"--max-jobs-per-child {self.max_jobs_per_child} is invalid: use 1 or more")
        if self.max_memory_mb is not None and not self.max_memory_mb > 0:
            raise ConfigError(f"--max-memory-per-child {self.max_memory_mb} is invalid: use a positive number of MB")
        if self.liveness_timeout <= 2 * self.report_interval:
            raise ConfigError("the liveness timeout must exceed two report intervals")
        self.worker.validated()
        self.reaper.validated()
        return self


@dataclass
class RunningJob:
    attempt: int
    task: str
    started: float
    timeout: float | None


@dataclass
class Child:
    """A forked child as the supervisor sees it."""

    slot: str
    pid: int
    read_fd: int
    worker_id: str | None  # None for the reaper
    started: float
    last_report: float
    ready: bool = False
    retiring: bool = False
    #: Why we asked it to stop (TERM, HUP, TTOU...): what it leaves behind is not charged.
    stop_reason: str | None = None
    #: Why we killed it or made it leave in a way that charges the job it ran (a hard timeout,
    #: silence, the memory ceiling): that job may be what went wrong.
    kill_reason: str | None = None
    board: InflightBoard | None = None  # a worker's running handlers (see miniqueue.inflight)
    error: str | None = None
    jobs: dict[int, RunningJob] = field(default_factory=dict)
    buffer: bytes = b""
    listening: bool | None = None  # the worker's LISTEN connection, as last reported
    jobs_done: int = 0


class Supervisor:
    """Forks and supervises worker processes and a reaper until told to stop."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config.validated()
        self.store = Store(config.worker.schema)
        self.app: App | None = None
        self.children: dict[int, Child] = {}
        self.slots: dict[str, Child | None] = {}
        self.restart_at: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.boot_failures = 0
        self.fatal_error: str | None = None
        self.stopping: str | None = None  # None, "graceful" or "fast"
        self.stop_deadline = 0.0
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.wake_r, self.wake_w = -1, -1
        self.announced_ready = False
        self.metrics: Metrics | None = None
        self.http: TinyHTTPServer | None = None
        self.host = socket.gethostname()
        self.supervisor_id = f"{self.host}:{os.getpid()}:{secrets.token_hex(3)}"
        self.restarts: dict[str, int] = {}
        self.last_tick = time.monotonic()
        self.db_ok = True
        self.next_refresh = 0.0
        self.notifier = Notifier()

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until stopped; return the exit code (0 after a graceful stop)."""
        set_title("supervisor")
        self.install_signals()  # first: a TERM during start-up must stop us cleanly, not kill us
        self.check_database()
        if self.config.preload:
            self.app = load_app(self.config.app_ref)
        self.slots = dict.fromkeys([*(f"worker-{i}" for i in range(1, self.config.workers + 1)), "reaper"])
        self.start_http()
        log.info("supervisor starting %d worker(s) and a reaper for %s on %s", self.config.workers,
                 self.config.app_ref, mask_dsn(self.config.dsn))  # fmt: skip
        try:
            while self.children or not self.stopping:
                self.last_tick = time.monotonic()
                self.notifier.watchdog()
                self.handle_signals()
                self.read_reports()
                self.reap_children()
                if self.stopping:
                    self.enforce_stop_deadline()
                else:
                    self.murder_workers()
                    self.spawn_missing()
                self.refresh_registry()
                self.sleep()
        finally:
            signal.set_wakeup_fd(-1)
            if self.http:
                self.http.close()
            self.unregister()
        if self.fatal_error:
            log.error("%s", self.fatal_error)
            return EXIT_BOOT_ERROR
        log.info("supervisor stopped")
        return 0

    def check_database(self) -> None:
        """Fail fast, before forking, if the schema is old or the connections cannot fit."""
        worker = self.config.worker
        # The claim loop's, the heartbeat's and (unless poll-only) the listener's, plus the pool
        # that job.transaction() opens on demand, up to one per handler thread.
        own = 2 if worker.poll_only else 3
        per_worker = own + worker.concurrency
        needed = self.config.workers * per_worker + 2
        with connect(self.config.dsn, purpose="supervisor", schema=self.store.schema) as conn:
            check_schema_version(conn, self.store.schema)
            limit, reserved, in_use = self.store.connection_capacity(conn)
        available = limit - reserved - in_use + 1  # +1: this check's own connection is closed now
        if needed > available:
            fit = max(0, (available - 2) // per_worker)
            raise ConfigError(
                f"--workers {self.config.workers} --concurrency {worker.concurrency} needs {needed} connections "
                f"({per_worker} per worker: {own} of its own and up to {worker.concurrency} for job.transaction(); "
                f"plus the reaper and the supervisor) but the server has {available} free "
                f"(max_connections {limit}, {reserved} reserved, {in_use} in use): run at most {fit} worker(s) "
                "at this concurrency, lower --concurrency, or raise max_connections"
            )

    def start_http(self) -> None:
        """Serve /metrics, /livez and /readyz (when --metrics-port is set) on threads of their own,
        so that neither a slow client nor the scrape's database query holds up the loop. Those
        threads read only ``last_tick`` and what ``sleep`` publishes, never the loop's dicts."""
        if self.config.metrics_port is None:
            return
        self.published = self.readyz(), self.process_counts()
        self.metrics = Metrics(self.config.dsn, self.store, lambda: self.published[1])
        routes = {"/metrics": self.metrics.render, "/livez": self.livez, "/readyz": lambda: self.published[0]}
        try:
            self.http = TinyHTTPServer(self.config.metrics_host, self.config.metrics_port, routes)
        except OSError as exc:
            where = f"{self.config.metrics_host}:{self.config.metrics_port}"
            raise ConfigError(f"cannot serve metrics on {where}: {exc.strerror or exc}") from None
        self.http.start()
        log.info("serving /metrics, /livez and /readyz on http://%s:%d", *self.http.address[:2])

    def livez(self) -> tuple[int, str, bytes]:
        """Alive: the main loop ticked recently (no database check: a database outage must not
        get the supervisor restarted). Runs on an HTTP thread, so it answers while the loop is stuck."""
        stale = time.monotonic() - self.last_tick > 5 * TICK_SECONDS
        return (503, "text/plain", b"supervisor loop stalled\n") if stale else (200, "text/plain", b"ok\n")

    def readyz(self) -> tuple[int, str, bytes]:
        """Ready: not draining, the database answered the last registry refresh, a worker is up,
        and every ready worker's LISTEN connection is healthy (unless --poll-only). Computed on
        the loop each tick (see ``sleep``); /readyz serves the latest answer."""
        workers = [c for c in self.children.values() if c.worker_id and c.ready and not c.retiring]
        problems = []
        if self.stopping:
            problems.append("draining")
        if not self.db_ok:
            problems.append("database unreachable")
        if not workers:
            problems.append("no worker ready")
        if not self.config.worker.poll_only and any(c.listening is False for c in workers):
            problems.append("a worker's LISTEN connection is down")
        if problems:
            return 503, "text/plain", ("; ".join(problems) + "\n").encode()
        return 200, "text/plain", b"ok\n"

    def process_counts(self) -> dict[str, int]:
        workers = sum(1 for c in self.children.values() if c.worker_id and not c.retiring)
        return {"worker": workers, "reaper": sum(1 for c in self.children.values() if c.worker_id is None)}

    def install_signals(self) -> None:
        """Signal handlers only record the signal; the main loop acts on it (no logging or
        locking inside a handler, which can deadlock). The wakeup fd interrupts the loop's sleep."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in SUPERVISOR_SIGNALS:
            signal.signal(sig, lambda signum, frame: self.signals.put(signum))

    def sleep(self) -> None:
        if self.http:  # a snapshot for the HTTP threads, which must not iterate dicts the loop mutates
            self.published = self.readyz(), self.process_counts()
        now = time.monotonic()
        wake_at = [now + TICK_SECONDS, *self.restart_at.values()]
        if self.stopping:
            wake_at.append(self.stop_deadline)
        timeout = max(0.0, min(wake_at) - now)
        fds = [self.wake_r, *(c.read_fd for c in self.children.values())]
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return
        if self.wake_r in readable:
            try:
                while os.read(self.wake_r, 512):
                    pass
            except BlockingIOError:
                pass

    # -- signals -------------------------------------------------------------------------------

    def handle_signals(self) -> None:
        while not self.signals.empty():
            signum = self.signals.get()
            if signum == signal.SIGCHLD:
                continue  # reaping happens every tick anyway
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
        for child in self.children.values():
            child.stop_reason = child.stop_reason or f"the supervisor was asked to stop ({mode})"
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

    def resize(self, delta: int) -> None:
        """TTIN/TTOU: one worker more or fewer (never fewer than one)."""
        workers = sorted((s for s in self.slots if s != "reaper"), key=lambda s: int(s.split("-")[1]))
        if delta > 0:
            slot = f"worker-{int(workers[-1].split('-')[1]) + 1}"
            self.slots[slot] = None
            log.info("adding %s (now %d workers)", slot, len(workers) + 1)
        elif len(workers) > 1:
            slot = workers[-1]
            child = self.slots.pop(slot)
            self.restart_at.pop(slot, None)
            if child is not None:
                self.retire(child, "removed by TTOU")
            log.info("removing %s (now %d workers)", slot, len(workers) - 1)

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
        board = spec.board
        pid = os.fork()
        if pid == 0:
            inherited = [read_fd, self.wake_r, self.wake_w, *(c.read_fd for c in self.children.values())]
            if self.http:
                inherited.extend(self.http.filenos())
            run_child(spec, inherited)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        now = time.monotonic()
        worker_id = None if slot == "reaper" else new_worker_id(pid, suffix)
        child = Child(slot=slot, pid=pid, read_fd=read_fd, worker_id=worker_id, started=now, last_report=now,
                      board=board)  # fmt: skip
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
            return dataclasses.replace(spec, reaper=self.config.reaper)
        return dataclasses.replace(
            spec,
            worker_suffix=suffix,
            worker=self.config.worker,
            max_jobs=self.config.max_jobs_per_child,
            board=InflightBoard(self.config.worker.concurrency),
        )

    def read_reports(self) -> None:
        for child in list(self.children.values()):
            self.read_child(child)

    def read_child(self, child: Child) -> None:
        try:
            while chunk := os.read(child.read_fd, 65536):
                child.buffer += chunk
        except (BlockingIOError, OSError):
            pass
        *lines, child.buffer = child.buffer.split(b"\n")
        for line in lines:
            self.handle_report(child, line.decode("utf-8", "replace").split(" ", 1))

    def handle_report(self, child: Child, words: list[str]) -> None:
        child.last_report = now = time.monotonic()
        kind, rest = words[0], (words[1] if len(words) > 1 else "")
        if kind == "beat":
            child.listening = {"1": True, "0": False}.get(rest.strip())
        elif kind == "ready":
            child.ready = True
            self.boot_failures = 0
            log.info("%s (pid %d) ready", child.slot, child.pid)
        elif kind == "start":
            job_id, attempt, timeout, task = rest.split(" ", 3)
            limit = None if timeout == "-" else float(timeout)
            child.jobs[int(job_id)] = RunningJob(int(attempt), task, now, limit)
        elif kind == "end":
            child.jobs.pop(int(rest), None)
        elif kind == "done":
            outcome, queue, task, tally = Tally.parse(rest)
            child.jobs_done += tally.count
            if self.metrics:
                self.metrics.jobs_finished(queue, task, outcome, tally)
        elif kind == "error":
            child.error = rest.replace("\\n", "\n")

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
                self.read_child(child)  # its last words (a boot error) are still in the pipe
                os.close(child.read_fd)
                self.handle_exit(child, status)

    def handle_exit(self, child: Child, status: int) -> None:
        how = describe_exit(status)
        clean = os.WIFEXITED(status) and os.waitstatus_to_exitcode(status) == 0
        level = logging.INFO if clean or child.retiring or self.stopping else logging.WARNING
        log.log(level, "%s (pid %d) %s%s", child.slot, child.pid, how,
                f" ({child.kill_reason})" if child.kill_reason else "")  # fmt: skip
        if child.board is not None:
            self.release_leases(child, how)
        if self.slots.get(child.slot) is child:
            self.slots[child.slot] = None
            self.schedule_restart(child, clean)

    def schedule_restart(self, child: Child, clean: bool) -> None:
        if not child.ready and not self.stopping:
            self.boot_failures += 1
            if self.boot_failures >= self.config.boot_failure_limit:
                detail = child.error or "no error was reported"
                self.fatal_error = (f"{child.slot} failed to boot {self.boot_failures} times in a row; "
                                    f"giving up. Last error:\n{detail}")  # fmt: skip
                self.begin_stop("fast")
                return
        if not clean:
            self.restarts[child.slot] = self.restarts.get(child.slot, 0) + 1
            if self.metrics:
                self.metrics.restarts.labels("reaper" if child.worker_id is None else "worker").inc()
        lived = time.monotonic() - child.started
        if clean or lived >= STABLE_AFTER_SECONDS:
            self.failures[child.slot] = 0
        else:
            self.failures[child.slot] = self.failures.get(child.slot, 0) + 1
        failures = self.failures[child.slot]
        delay = 0.0 if failures == 0 else min(0.1 * 2 ** (failures - 1), MAX_RESTART_DELAY)
        self.restart_at[child.slot] = time.monotonic() + delay
        if delay:
            log.info("restarting %s in %.1fs", child.slot, delay)

    def release_leases(self, child: Child, how: str) -> None:
        """Return the jobs a reaped worker still held (its holder is known dead, so they may leave
        ``running``). Only a death nobody asked for (a crash, a kill from outside, a hard timeout,
        the memory ceiling) costs an attempt, and only to the jobs whose handler was running:
        the others (prefetched, or finished with the outcome not yet recorded) go back uncharged,
        as does everything a worker we asked to stop leaves behind (a worker that drained holds
        nothing, but one that hit its shutdown timeout may hold a job whose handler returned
        after the worker stopped recording outcomes)."""
        assert child.board is not None and child.worker_id is not None
        running, asked = child.board.running(), child.board.was_stop_requested() or child.stop_reason is not None
        child.board.close()
        charged = bool(child.kill_reason) or not asked
        died = child.kill_reason or f"worker process died: {how.removeprefix('killed by ')}"
        try:
            with connect(self.config.dsn, purpose="supervisor", schema=self.store.schema, connect_timeout=5) as conn:
                held = self.store.leases_of(conn, child.worker_id)
                failures = [Failure(i, a, f"{died} (pid {child.pid})", default_backoff(a))
                            for i, a in held if charged and i in running]  # fmt: skip
                releases = [Release(i, a, self.release_note(child, running.get(i), died, charged))
                            for i, a in held if not (charged and i in running)]  # fmt: skip
                states = self.store.record_failures(conn, child.worker_id, failures)
                released = self.store.release(conn, child.worker_id, releases)
        except MiniqueueError as exc:
            log.warning("could not release the leases of %s (%s); the reaper will recover them at expiry",
                        child.slot, exc)  # fmt: skip
            return
        for job_id, state in sorted(states.items()):
            level = logging.ERROR if state is State.DEAD else logging.WARNING
            log.log(level, "job %d charged an attempt (%s): %s", job_id, state.value, died)
        if released:
            log.info("handed back %d job(s) of %s (pid %d) uncharged: %s", len(released), child.slot,
                     child.pid, ", ".join(map(str, sorted(released))))  # fmt: skip

    @staticmethod
    def release_note(child: Child, run: tuple[int, float] | None, died: str, charged: bool) -> str:
        """The history entry of a job handed back uncharged."""
        if charged:
            return f"handed back: {died} (pid {child.pid}) while this job was not running; attempt not charged"
        ran = f" after {run[1]:.1f}s" if run else ""
        why = child.stop_reason or "the worker was asked to stop"
        return f"interrupted{ran}: {why} (pid {child.pid}); attempt not charged"

    def refresh_registry(self) -> None:
        """Every few seconds, record this supervisor and its children in the process registry
        (on a connection opened and closed here: none is held across fork). Its success is
        what /readyz reports as the database's health."""
        if time.monotonic() < self.next_refresh:
            return
        self.next_refresh = time.monotonic() + REGISTRY_SECONDS
        rows = [self.process_info(os.getpid(), self.supervisor_id, "supervisor", "miniqueue supervisor", 0, ())]
        for child in self.children.values():
            kind = "reaper" if child.worker_id is None else "worker"
            jobs = tuple(sorted(child.jobs))
            title = f"miniqueue {child.slot} " + (f"job {jobs[0]} {child.jobs[jobs[0]].task}" if jobs else "idle")
            rows.append(self.process_info(child.pid, child.worker_id or f"{self.host}:{child.pid}", kind,
                                          "miniqueue reaper" if kind == "reaper" else title, child.jobs_done, jobs,
                                          self.restarts.get(child.slot, 0)))  # fmt: skip
        try:
            with connect(self.config.dsn, purpose="supervisor", schema=self.store.schema, connect_timeout=2) as conn:
                self.store.register_processes(conn, self.supervisor_id, self.host, rows)
            self.db_ok = True
        except MiniqueueError as exc:
            if self.db_ok:
                log.warning("cannot reach the database to refresh the process registry: %s", exc)
            self.db_ok = False
        busy = sum(len(c.jobs) for c in self.children.values())
        self.notifier.send(
            f"STATUS={len(rows) - 2} workers, {busy} jobs running, database {'up' if self.db_ok else 'DOWN'}"
        )

    def process_info(
        self, pid: int, ident: str, kind: str, title: str, jobs_done: int, jobs: tuple[int, ...], restarts: int = 0
    ) -> ProcessInfo:
        try:
            proc = psutil.Process(pid)
            started = dt.datetime.fromtimestamp(proc.create_time(), dt.timezone.utc)
            rss: int | None = proc.memory_info().rss
        except psutil.Error:
            started, rss = dt.datetime.now(dt.timezone.utc), None
        return ProcessInfo(id=ident, kind=kind, pid=pid, title=title, started_at=started, rss_bytes=rss,
                           jobs_done=jobs_done, restarts=restarts, current_jobs=jobs)  # fmt: skip

    def unregister(self) -> None:
        with (
            contextlib.suppress(MiniqueueError),
            connect(self.config.dsn, purpose="supervisor", schema=self.store.schema, connect_timeout=2) as conn,
        ):
            self.store.unregister_processes(conn, self.supervisor_id)

    def murder_workers(self) -> None:
        """Kill children that stopped reporting or hold a job past its hard timeout; recycle
        workers over the memory limit."""
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.kill_reason and not child.retiring:
                continue
            silent = now - child.last_report
            if silent > self.config.liveness_timeout:
                self.murder(child, f"worker process killed: no report for {silent:.0f}s")
                continue
            for job_id, job in child.jobs.items():
                if job.timeout is not None and now - job.started > job.timeout + self.config.timeout_grace:
                    self.murder(child, f"worker process killed: job {job_id} ({job.task}) exceeded its "
                                       f"{job.timeout:g}s timeout")  # fmt: skip
                    break
            else:
                self.check_memory(child)

    def check_memory(self, child: Child) -> None:
        limit = self.config.max_memory_mb
        if limit is None or child.worker_id is None or child.retiring:
            return
        try:
            rss_mb = psutil.Process(child.pid).memory_info().rss / 1_048_576
        except psutil.Error:
            return
        if rss_mb > limit:
            self.retire(child, f"RSS {rss_mb:.0f} MB is over --max-memory-per-child {limit:g} MB", charge=True)

    def murder(self, child: Child, reason: str) -> None:
        log.warning("killing %s (pid %d): %s", child.slot, child.pid, reason)
        child.kill_reason = reason
        child.retiring = False  # a memory retirement that turned into a kill: charged either way
        self.kill(child.pid, signal.SIGKILL)

    @staticmethod
    def kill(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # already dead: waitpid will tell
            os.kill(pid, sig)
