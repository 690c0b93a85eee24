"""A real ``miniqueue-supervise`` for the supervised rows: started, waited for, measured, stopped.

The supervisor runs as ``python -m miniqueue.cli supervise`` from the repository root (so
``bench.apps`` imports), with ``DATABASE_URL`` set to the run's scratch database, in a session
of its own. A run starts only once every worker is idle and waiting: the supervisor logged
"supervisor ready", every worker's title says ``idle``, and the database shows each worker's
claim connection (its first poll is done) and, unless ``--poll-only``, its listener after LISTEN.
At the end the supervisor gets SIGTERM, then its whole process group SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from miniqueue.db import Connection, connect

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_SECONDS = 120.0  # eight workers booting on two busy cores
STOP_TIMEOUT_SECONDS = 30.0
READY_LINE = "supervisor ready"
WORKER_TITLE = "miniqueue worker-"

# Each worker's claim connection exists once its first poll ran; its listener once LISTEN ran.
_CONNECTIONS = """
SELECT count(*) FILTER (WHERE application_name = 'miniqueue:worker'),
       count(*) FILTER (WHERE application_name = 'miniqueue:listen' AND query ILIKE 'LISTEN %%')
  FROM pg_stat_activity
 WHERE datname = current_database()
"""


class SupervisorFailed(RuntimeError):
    """The supervisor exited early or never became ready; the message carries its log's tail."""


@dataclass(frozen=True)
class SuperviseOptions:
    """The ``miniqueue-supervise`` command line of a row. An option left at None is not passed
    at all, so a row of defaults runs exactly what a user who typed only ``--app`` and
    ``--workers`` runs."""

    app: str
    workers: int
    concurrency: int | None = None
    prefetch: int | str | None = None
    poll_only: bool = False
    poll_interval: float | None = None

    def argv(self) -> list[str]:
        flags = ["--app", self.app, "--workers", str(self.workers)]
        for flag, value in (("--concurrency", self.concurrency), ("--prefetch", self.prefetch),
                            ("--poll-interval", self.poll_interval)):  # fmt: skip
            if value is not None:
                flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return [*flags, "--poll-only"] if self.poll_only else flags


class Supervisor:
    """A running supervisor subprocess, its log and its worker processes."""

    def __init__(self, dsn: str, options: SuperviseOptions, log_path: Path) -> None:
        self.dsn, self.options, self.log_path = dsn, options, log_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIQUEUE_")}  # options come from argv only
        env["DATABASE_URL"] = dsn
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "miniqueue.cli", "supervise", *options.argv(), "--log-level", "INFO"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def workers(self) -> list[psutil.Process]:
        """The worker processes (by title: ``miniqueue worker-N ...``)."""
        found = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.process.pid).children():
                with contextlib.suppress(psutil.Error):
                    if " ".join(child.cmdline()).startswith(WORKER_TITLE):
                        found.append(child)
        return found

    def worker_rss_mb(self) -> float | None:
        """The largest resident set among the worker processes now, in MiB."""
        sizes = []
        for worker in self.workers():
            with contextlib.suppress(psutil.Error):
                sizes.append(worker.memory_info().rss / 1_048_576)
        return max(sizes, default=None)

    def worker_cpu_seconds(self) -> float:
        """User plus system CPU time the worker processes have used so far."""
        total = 0.0
        for worker in self.workers():
            with contextlib.suppress(psutil.Error):
                times = worker.cpu_times()
                total += times.user + times.system
        return total

    def wait_ready(self) -> None:
        """Return once every worker is idle and waiting; raise SupervisorFailed otherwise."""
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        with connect(self.dsn, purpose="bench-watch") as conn:
            while True:
                if self.process.poll() is not None:
                    raise SupervisorFailed(f"the supervisor exited with {self.process.returncode}:\n{self.log_tail()}")
                if READY_LINE in self.log_tail(chars=1 << 20) and self._idle() and self._connected(conn):
                    return
                if time.monotonic() > deadline:
                    raise SupervisorFailed(f"not ready within {READY_TIMEOUT_SECONDS:.0f} s:\n{self.log_tail()}")
                time.sleep(0.05)

    def _idle(self) -> bool:
        titles = []
        for worker in self.workers():
            with contextlib.suppress(psutil.Error):
                titles.append(" ".join(worker.cmdline()).strip())
        return len(titles) == self.options.workers and all(t.endswith(" idle") for t in titles)

    def _connected(self, conn: Connection) -> bool:
        row = conn.execute(_CONNECTIONS).fetchone()
        claimers, listeners = (int(row[0]), int(row[1])) if row else (0, 0)
        wanted_listeners = 0 if self.options.poll_only else self.options.workers
        return claimers == self.options.workers and listeners == wanted_listeners

    def stop(self) -> None:
        """SIGTERM (graceful: idle workers exit at once), then SIGKILL whatever is left of the group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT_SECONDS)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@contextlib.contextmanager
def supervised(dsn: str, options: SuperviseOptions) -> Iterator[Supervisor]:
    """Start a supervisor on ``dsn``, yield it once its workers are idle, stop it on exit."""
    with tempfile.TemporaryDirectory(prefix="miniqueue-bench-") as folder:
        supervisor = Supervisor(dsn, options, Path(folder) / "supervisor.log")
        try:
            supervisor.wait_ready()
            yield supervisor
        finally:
            supervisor.stop()
