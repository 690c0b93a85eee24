"""What a forked child does: reset what it inherited, boot, run a worker or the reaper, and exit.

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

from .app import App, load_app
from .context import Job
from .process import EXIT_BOOT_ERROR, die_with_parent, set_label, set_title, write_report
from .reaper import Reaper, ReaperConfig
from .worker import Outcome, Worker, WorkerConfig, WorkerHooks, new_worker_id

log = logging.getLogger("miniqueue.child")

#: Signals the supervisor handles; children put them back to their defaults after fork.
SUPERVISOR_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)  # fmt: skip


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


def run_child(spec: ChildSpec, close_fds: list[int]) -> None:
    """The body of a forked child. Never returns."""
    code = 1
    try:
        _reset_after_fork(spec, close_fds)
        code = _run_worker(spec) if spec.worker else _run_reaper(spec)
    except BaseException:  # anything at all: report it, then leave without unwinding into the parent's code
        write_report(spec.report_fd, "error", traceback.format_exc(limit=8).strip())
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def _reset_after_fork(spec: ChildSpec, close_fds: list[int]) -> None:
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
    set_label(spec.name)
    set_title(f"{spec.name} booting")


def _run_worker(spec: ChildSpec) -> int:
    assert spec.worker is not None
    try:
        app = spec.app or load_app(spec.app_ref or "")
        config = dataclasses.replace(
            spec.worker, worker_id=new_worker_id(suffix=spec.worker_suffix), max_jobs=spec.max_jobs
        )
        worker = Worker(app, spec.dsn, config)
    except Exception as exc:
        write_report(spec.report_fd, "error", f"{type(exc).__name__}: {exc}")
        return EXIT_BOOT_ERROR
    titles = _Titles(spec.name)
    worker.hooks = WorkerHooks(
        on_job_start=lambda job: _on_start(spec, app, titles, job),
        on_job_end=lambda job, outcome: _on_end(spec, titles, job, outcome),
    )
    _install_stop_signals(worker.stop)
    _start_reporter(spec, worker.stop, lambda: {True: "1", False: "0", None: "-"}[worker.listening])
    titles.idle()
    write_report(spec.report_fd, "ready", worker.worker_id)
    worker.run()
    return 0


def _run_reaper(spec: ChildSpec) -> int:
    assert spec.reaper is not None
    try:
        reaper = Reaper(spec.dsn, spec.reaper, app=spec.app or load_app(spec.app_ref or ""))
    except Exception as exc:
        write_report(spec.report_fd, "error", f"{type(exc).__name__}: {exc}")
        return EXIT_BOOT_ERROR
    _install_stop_signals(reaper.stop)
    _start_reporter(spec, reaper.stop, lambda: "-")
    set_title(spec.name)
    write_report(spec.report_fd, "ready", "-")
    reaper.run()
    return 0


def _install_stop_signals(stop: Callable[[], None]) -> None:
    """TERM/INT: drain and exit (``stop`` only sets a flag). QUIT: leave at once."""
    signal.signal(signal.SIGTERM, lambda signum, frame: stop())
    signal.signal(signal.SIGINT, lambda signum, frame: stop())
    signal.signal(signal.SIGQUIT, lambda signum, frame: os._exit(0))


def _start_reporter(spec: ChildSpec, stop: Callable[[], None], listening: Callable[[], str]) -> None:
    """Report liveness (and whether the LISTEN connection is up) every ``report_interval``
    seconds, and stop if the supervisor is gone."""
    parent = os.getppid()

    def report() -> None:
        orphaned_at: float | None = None
        while True:
            time.sleep(spec.report_interval)
            if os.getppid() != parent:
                if orphaned_at is None:
                    log.warning("the supervisor (pid %d) is gone: stopping", parent)
                    orphaned_at = time.monotonic()
                    stop()
                elif time.monotonic() - orphaned_at > spec.shutdown_timeout + 2:
                    os._exit(0)
                continue
            write_report(spec.report_fd, "beat", listening())

    threading.Thread(target=report, name="miniqueue-reporter", daemon=True).start()


class _Titles:
    """Keeps the process title saying what the worker is doing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.running: dict[int, str] = {}

    def idle(self) -> None:
        if not self.running:
            set_title(f"{self.name} idle")
        else:
            jobs = ", ".join(f"job {job_id} {task}" for job_id, task in list(self.running.items())[:3])
            set_title(f"{self.name} {jobs}")


def _on_start(spec: ChildSpec, app: App, titles: _Titles, job: Job) -> None:
    task = app.tasks.get(job.task)
    timeout = task.timeout if task and task.timeout else "-"
    write_report(spec.report_fd, "start", job.id, job.attempt, timeout, job.task)
    titles.running[job.id] = job.task
    titles.idle()


def _on_end(spec: ChildSpec, titles: _Titles, job: Job, outcome: Outcome) -> None:
    label = "completed" if outcome.kind == "completed_in_transaction" else outcome.kind
    write_report(spec.report_fd, "end", job.id, label, f"{outcome.duration:.6f}", job.queue, job.task)
    titles.running.pop(job.id, None)
    titles.idle()
