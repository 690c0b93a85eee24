"""What a forked child does: reset what it inherited, boot, run a worker or the reaper (or only
check that the app loads), and exit.

Every child ends with ``os._exit()`` so it never returns into the supervisor's stack, never
runs the parent's atexit handlers, and never touches a connection the parent opened (it has
none: the supervisor holds no connection across fork).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..core.db import Connection, connect
from ..core.errors import AppLoadError, DatabaseUnavailable, MiniqueueError, SchemaOutOfDate
from ..core.process import EXIT_BOOT_ERROR, EXIT_SCHEMA_REFUSED, die_with_parent, set_label, set_title, settle_collector
from ..core.service import Service
from ..maintenance.reaper import Reaper, ReaperConfig
from ..observability import tracing
from ..store.migrate import check_workers_from
from ..store.store import Store
from ..tasks.app import App
from ..tasks.job import Job
from ..tasks.loading import load_app
from ..tasks.outcomes import Outcome, WorkerHooks
from ..worker.claiming import goes_down
from ..worker.inflight import InflightBoard
from ..worker.worker import Worker, WorkerConfig, new_worker_id
from . import reports
from .signals import SUPERVISOR_SIGNALS

log = logging.getLogger("miniqueue.child")


@dataclass(frozen=True)
class ChildSpec:
    """Everything a child needs, fixed by the supervisor before fork."""

    name: str  # worker-3, reaper
    dsn: str
    report_fd: int
    report_interval: float
    app_ref: str | None = None
    app: App | None = None  # set when the supervisor preloaded the app
    worker_suffix: str | None = None
    worker: WorkerConfig | None = None
    reaper: ReaperConfig | None = None
    max_jobs: int | None = None
    shutdown_timeout: float = 10.0
    board: InflightBoard | None = None  # a worker's running handlers, shared with the supervisor
    gauge_interval: float | None = None  # the reaper reads the queue gauges this often (for /metrics)
    scale: ScaleWatch | None = None  # the reaper reads the served queues' backlog (autoscaling)


@dataclass(frozen=True)
class ScaleWatch:
    """What the reaper reads for an autoscaling supervisor, and how often."""

    #: The queues the workers serve (None: the app's).
    queues: tuple[str, ...] | None
    interval: float
    target: float
    max_workers: int


def run_child(spec: ChildSpec, close_fds: list[int]) -> None:
    """The body of a forked child. Never returns."""
    code = 1
    try:
        _reset_after_fork(spec.name, close_fds)
        code = _refuse_a_schema_moved_on(spec) or (_run_worker(spec) if spec.worker else _run_reaper(spec))
    except BaseException:  # anything at all: report it, then leave without unwinding into the parent's code
        # A worker of an older version whose statements fail once the schema moved on (a migration
        # that says which workers it needs) says so in one line, and its supervisor stops.
        code = _refuse_a_schema_moved_on(spec) or 1
        if code == 1:
            reports.write(spec.report_fd, [reports.Error(traceback.format_exc(limit=8).strip())])
    finally:
        logging.shutdown()
        os._exit(code)


def _refuse_a_schema_moved_on(spec: ChildSpec) -> int:
    """EXIT_SCHEMA_REFUSED, its one line reported, if a migration applied says this version's
    workers cannot serve the schema (see "Rolling deploys" in docs/operations/schema.md); 0 if
    none does, or if the database cannot be asked now (the child then runs, or fails, as it
    would have: a schema not yet migrated, or dropped, is an error it reports and is restarted
    after, as before)."""
    config = spec.worker or spec.reaper
    schema = config.schema if config is not None else "public"
    try:
        with connect(spec.dsn, purpose="schema-check", schema=schema, connect_timeout=5) as conn:
            check_workers_from(conn, schema)
    except SchemaOutOfDate as exc:
        reports.write(spec.report_fd, [reports.Error(str(exc))])
        return EXIT_SCHEMA_REFUSED
    except MiniqueueError:
        return 0
    return 0


def run_app_check(app_ref: str, error_fd: int, close_fds: list[int]) -> None:
    """The body of the child the supervisor forks, before any other, to import the app once:
    writes why it cannot load (one line) to ``error_fd`` and exits non-zero, or exits 0. Never
    returns."""
    code = 0
    try:
        _reset_after_fork("app-check", close_fds)
        load_app(app_ref)
    except BaseException as exc:  # anything at all: report it, then leave without unwinding into the parent's code
        reason = str(exc) if isinstance(exc, AppLoadError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):
            os.write(error_fd, reason.encode(errors="replace"))
        code = EXIT_BOOT_ERROR
    finally:
        logging.shutdown()
        os._exit(code)


def _reset_after_fork(name: str, close_fds: list[int]) -> None:
    signal.set_wakeup_fd(-1)
    for sig in SUPERVISOR_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(0)
    set_label(name)
    set_title(f"{name} booting")


def _run_worker(spec: ChildSpec) -> int:
    assert spec.worker is not None and spec.board is not None
    board = spec.board
    try:
        app = spec.app or load_app(spec.app_ref or "")
        config = dataclasses.replace(
            spec.worker,
            worker_id=new_worker_id(suffix=spec.worker_suffix),
            max_jobs=spec.max_jobs,
            descending=goes_down(spec.name),
        )
        worker = Worker(app, spec.dsn, config)
    except Exception as exc:
        reports.write(spec.report_fd, [reports.Error(f"{type(exc).__name__}: {exc}")])
        return EXIT_BOOT_ERROR
    progress = _Progress(spec, app, board)
    # A span per attempt when tracing is on (miniqueue.tracing), around the supervisor's hooks.
    worker.hooks = tracing.worker_hooks(
        WorkerHooks(
            on_job_end=progress.job_ended,
            on_handler_start=progress.handler_started,
            on_handler_end=progress.handler_ended,
        )
    )
    _install_stop_signals(worker.stop, board)
    _start_reporter(spec, worker.stop, beat=lambda: progress.beat(worker.listening), tick=progress.tick)
    progress.retitle()
    with contextlib.suppress(DatabaseUnavailable):  # else the worker retries as it runs
        worker.publish()
    serves = [reports.Serves("queue", queue) for queue in worker.queues]
    serves += [reports.Serves("task", task) for task in sorted(worker.app.tasks)]
    reports.write(spec.report_fd, [*serves, reports.Ready(worker.worker_id)])
    settle_collector()
    worker.run()
    board.stop_requested()  # also when it stopped itself (max_jobs): handlers left running were not a crash
    progress.flush()
    tracing.flush()  # the spans still buffered: this process ends with os._exit, which runs no atexit flush
    return 0


def _run_reaper(spec: ChildSpec) -> int:
    assert spec.reaper is not None
    try:
        reaper = Reaper(spec.dsn, spec.reaper, app=spec.app or load_app(spec.app_ref or ""))
    except Exception as exc:
        reports.write(spec.report_fd, [reports.Error(f"{type(exc).__name__}: {exc}")])
        return EXIT_BOOT_ERROR
    _install_stop_signals(reaper.stop)
    if spec.scale is not None:
        queues = spec.scale.queues or tuple(reaper.app.queues if reaper.app else ())
        _BacklogWatch(spec, spec.scale, queues, spec.reaper.schema).start()
    beat = [reports.Beat(None)]
    _start_reporter(spec, reaper.stop, beat=lambda: reports.write(spec.report_fd, beat), tick=lambda: None)
    if spec.gauge_interval is not None:
        _Gauges(spec, spec.gauge_interval, spec.reaper.schema).start()
    set_title(spec.name)
    reports.write(spec.report_fd, [reports.Ready("-")])
    reaper.run()
    return 0


#: The most limits /metrics reports jobs waiting on (those with the most waiting).
LIMIT_GAUGES = 100


class _Reader(Service):
    """A reaper's thread that reads the database every ``interval`` seconds, on a connection of
    its own (opened again after an error), and sends what it read to the supervisor: the
    supervisor then never waits on the database, nor holds a connection for it. It runs until
    the process exits. A subclass says what it reads (:meth:`read`) and what it sends when a
    reading fails (:meth:`unread`)."""

    log = log
    #: What is read, as the log names it when a reading fails; the connection's purpose.
    what, purpose = "", ""

    def __init__(self, name: str, spec: ChildSpec, interval: float, schema: str) -> None:
        super().__init__(name)
        self.spec, self.interval, self.schema = spec, interval, schema

    def read(self, store: Store, conn: Connection) -> list[reports.Report]:
        raise NotImplementedError

    def unread(self) -> list[reports.Report]:
        return []

    def run(self) -> None:
        store = Store(self.schema)
        conn: Connection | None = None
        while True:
            try:
                if conn is None:
                    conn = connect(self.spec.dsn, purpose=self.purpose, schema=self.schema, connect_timeout=5)
                reports.write(self.spec.report_fd, self.read(store, conn))
            except MiniqueueError as exc:
                log.warning("cannot read %s: %s", self.what, exc)
                reports.write(self.spec.report_fd, self.unread())
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
            if self.stopping.wait(self.interval):
                break
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class _Gauges(_Reader):
    """The queue gauges that /metrics serves, read every ``interval`` seconds."""

    what, purpose = "the queue gauges", "gauges"

    def __init__(self, spec: ChildSpec, interval: float, schema: str) -> None:
        super().__init__("miniqueue-gauges", spec, interval, schema)

    def read(self, store: Store, conn: Connection) -> list[reports.Report]:
        stats = store.queue_stats(conn)
        waits = [reports.LimitGauge(w.scope, w.waiting) for w in store.limit_waits(conn, LIMIT_GAUGES) if w.waiting]
        blocked = [
            reports.SequenceGauge(b.key, b.job_id, b.waiting) for b in store.blocked_sequences(conn, LIMIT_GAUGES)
        ]
        horizon = [reports.HorizonGauge(h.kind, h.pid, h.name, h.seconds) for h in store.horizon(conn)]
        return [
            *map(reports.QueueGauges, stats),
            *waits,
            *blocked,
            *horizon,
            reports.DeadRowsGauge(store.table_health(conn).dead_rows),
            reports.GaugesSent(True),
        ]

    def unread(self) -> list[reports.Report]:
        return [reports.GaugesSent(False)]


class _BacklogWatch(_Reader):
    """The served queues' backlog (and ``miniqueue_desired_workers``, which /metrics serves), read
    every ``scale.interval`` seconds for an autoscaling supervisor, which decides on each reading;
    a reading that fails is skipped (the supervisor holds its workers meanwhile)."""

    what, purpose = "the backlog for autoscaling", "backlog"

    def __init__(self, spec: ChildSpec, scale: ScaleWatch, queues: tuple[str, ...], schema: str) -> None:
        super().__init__("miniqueue-backlog", spec, scale.interval, schema)
        self.scale, self.queues = scale, queues

    def read(self, store: Store, conn: Connection) -> list[reports.Report]:
        backlog = store.backlog(conn, self.queues)
        desired = store.desired_workers(conn, self.queues, self.scale.target, self.scale.max_workers)
        return [reports.BacklogReading(backlog, desired)]


def _install_stop_signals(stop: Callable[[], None], board: InflightBoard | None = None) -> None:
    """TERM/INT: drain and exit (``stop`` only sets a flag). QUIT: leave at once. Either way the
    board records that the stop was asked for, so the jobs left behind are not charged."""

    def graceful(signum: int, frame: object) -> None:
        if board is not None:
            board.stop_requested()
        stop()

    def fast(signum: int, frame: object) -> None:
        if board is not None:
            board.stop_requested()
        os._exit(0)

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGINT, graceful)
    signal.signal(signal.SIGQUIT, fast)


def _start_reporter(
    spec: ChildSpec, stop: Callable[[], None], *, beat: Callable[[], None], tick: Callable[[], None]
) -> None:
    """A thread that flushes batched reports every 0.1 s, beats every ``report_interval``
    seconds, and stops the child if the supervisor is gone."""
    _Reporter(spec, stop, beat=beat, tick=tick).start()


class _Reporter(Service):
    """The body of :func:`_start_reporter`'s thread; it runs until the process exits."""

    log = log

    def __init__(
        self, spec: ChildSpec, stop: Callable[[], None], *, beat: Callable[[], None], tick: Callable[[], None]
    ) -> None:
        super().__init__("miniqueue-reporter")
        self.spec, self.stop_child, self.beat, self.tick = spec, stop, beat, tick
        self.parent = os.getppid()

    def run(self) -> None:
        spec, parent = self.spec, self.parent
        orphaned_at: float | None = None
        next_beat = time.monotonic()
        while not self.stopping.wait(0.1):
            self.tick()
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + spec.report_interval
            if os.getppid() != parent:
                if orphaned_at is None:
                    log.warning("the supervisor (pid %d) is gone: stopping", parent)
                    orphaned_at = time.monotonic()
                    self.stop_child()
                elif time.monotonic() - orphaned_at > spec.shutdown_timeout + 2:
                    os._exit(0)
                continue
            self.beat()


class _Progress:
    """What a worker tells the world about its jobs: report lines to the supervisor and its
    process title, at a cost that does not grow with the job rate, and its running handlers on
    its :class:`~miniqueue.worker.inflight.InflightBoard`. Per job, the hooks only touch a few
    dicts; every flush (the reporter's 0.1 s tick) sends

    - ``start`` for each job whose handler is still running, once (at once for a task with a
      hard timeout, since the supervisor times it), and ``end`` for such a job once its handler
      returned;
    - ``done`` per (outcome, queue, task): a :class:`~miniqueue.supervise.reports.Tally` of every job
      whose outcome was recorded since.

    A job whose handler starts and returns between two flushes is only counted. (Its outcome is
    recorded with the next claim, up to a batch later: counting it as running until then had
    a drain of no-op jobs send two lines per job, a tenth of a core in the supervisor.) Hooks
    run on handler threads, the event loop and the claim loop, hence the lock (the board's too)."""

    TITLE_SECONDS = 0.25

    def __init__(self, spec: ChildSpec, app: App, board: InflightBoard) -> None:
        self.spec, self.board = spec, board
        self.timeouts = {name: task.timeout for name, task in app.tasks.items() if task.timeout}
        self.lock = threading.Lock()
        self.pending: list[reports.Report] = []
        self.running: dict[int, Job] = {}
        self.reported: set[int] = set()  # running jobs whose start the supervisor knows
        self.tallies: dict[tuple[str, str, str], reports.Tally] = {}
        self.titled_at = 0.0

    def handler_started(self, job: Job) -> None:
        with self.lock:
            self.board.handler_started(job)
            self.running[job.id] = job
        if job.task in self.timeouts:
            self.flush()

    def handler_ended(self, job: Job) -> None:
        with self.lock:
            self.board.handler_finished(job)
            if self.running.pop(job.id, None) is not None and job.id in self.reported:
                self.reported.discard(job.id)
                self.pending.append(reports.End(job.id))

    def job_ended(self, job: Job, outcome: Outcome) -> None:
        label = "completed" if outcome.kind == "completed_in_transaction" else outcome.kind
        key = (label, job.queue, job.task)
        with self.lock:
            tally = self.tallies.get(key)
            if tally is None:
                tally = self.tallies[key] = reports.Tally()
            tally.add(outcome.duration)

    def beat(self, listening: bool | None) -> None:
        with self.lock:
            self.pending.append(reports.Beat(listening))
        self.tick()

    def tick(self) -> None:
        self.flush()
        if time.monotonic() - self.titled_at >= self.TITLE_SECONDS:
            self.retitle()

    def flush(self) -> None:
        with self.lock:  # held while writing, so lines from several threads never interleave
            batch, self.pending = self.pending, []  # "end" reports first: a job id may start again
            for job in self.running.values():
                if job.id not in self.reported:
                    self.reported.add(job.id)
                    batch.append(reports.Start(job.id, job.run, self.timeouts.get(job.task), job.task))
            batch += [reports.Done(*key, tally) for key, tally in self.tallies.items()]
            self.tallies = {}
            reports.write(self.spec.report_fd, batch)

    def retitle(self) -> None:
        with self.lock:
            running = list(self.running.values())[:3]
            self.titled_at = time.monotonic()
        jobs = ", ".join(f"job {job.id} {job.task}" for job in running)
        set_title(f"{self.spec.name} {jobs or 'idle'}")
