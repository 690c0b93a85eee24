"""A real ``miniqueue-supervise`` for the supervised rows: started, waited for, measured, stopped.

The supervisor is ``harness``'s: ``python -m miniqueue.cli supervise`` from the
repository root (so ``bench.apps`` imports), with ``DATABASE_URL`` set to the run's scratch
database, in a session of its own. A run starts only once every worker is idle and waiting: the
supervisor sent READY=1, every worker's title says ``idle``, and the database shows each
worker's claim connection (its first poll is done) and, unless ``--poll-only``, its listener
after LISTEN. With a shard map (``--shards``) that holds on every database: each database's
supervisor sent READY=1, and each database shows its share of the workers' connections (the
product's own split by weight). At the end the supervisor gets SIGTERM, then its whole process
group SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness import WORKER_TITLE, SupervisorFailed, SupervisorProcess
from miniqueue.core.db import Connection, connect
from miniqueue.core.shard_map import ShardMap
from miniqueue.supervise.shard_supervisor import split_workers

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_SECONDS = 120.0  # eight workers booting on two busy cores

# Each worker's claim connection exists once its first poll ran; its listener once LISTEN ran.
_CONNECTIONS = """
SELECT count(*) FILTER (WHERE application_name = 'miniqueue:worker'),
       count(*) FILTER (WHERE application_name = 'miniqueue:listen' AND query ILIKE 'LISTEN %%')
  FROM pg_stat_activity
 WHERE datname = current_database()
"""


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
    #: A shard map's file (``--shards``): one supervisor per database, the workers shared by weight.
    shards: str | None = None
    #: Any other flags, as given.
    extra: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        flags = ["--app", self.app, "--workers", str(self.workers)]
        for flag, value in (
            ("--concurrency", self.concurrency),
            ("--prefetch", self.prefetch),
            ("--poll-interval", self.poll_interval),
            ("--shards", self.shards),
        ):
            if value is not None:
                flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return [*flags, *(["--poll-only"] if self.poll_only else []), *self.extra]


class Supervisor(SupervisorProcess):
    """A running supervisor subprocess, its log and its worker processes."""

    def __init__(self, dsn: str, options: SuperviseOptions, log_path: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MINIQUEUE_")}  # options come from argv only
        super().__init__([*options.argv(), "--log-level", "INFO"], log=log_path, dsn=dsn, env=env, cwd=REPO_ROOT)
        self.dsn, self.options = dsn, options
        self.shares = workers_by_database(dsn, options)

    def titles(self) -> dict[int, str]:
        """Every live descendant's title: with ``--shards`` the workers are the children of each
        database's supervisor, not of the process started."""
        found: dict[int, str] = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        found[child.pid] = " ".join(child.cmdline()).strip()
        return found

    def workers(self) -> list[psutil.Process]:
        """The worker processes (by title: ``miniqueue worker-N ...``)."""
        found = []
        for pid in self.worker_pids():
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
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

    def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Return once every worker is idle and waiting; raise SupervisorFailed otherwise."""
        deadline = time.monotonic() + timeout
        super().wait_ready(timeout)  # the first READY=1: with --shards, one database's supervisor's
        with contextlib.ExitStack() as stack:
            conns = {dsn: stack.enter_context(connect(dsn, purpose="bench-watch")) for dsn in self.shares}
            while not (self._announced() and self._idle() and self._connected(conns)):
                if self.proc.poll() is not None:
                    raise SupervisorFailed(f"the supervisor exited with {self.proc.returncode}:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise SupervisorFailed(f"workers not idle within {timeout:.0f} s:\n{self.log_tail()}")
                time.sleep(0.05)

    def _announced(self) -> bool:
        # One READY=1 per database's supervisor (one in all without --shards).
        return self.notifications().count("READY=1") >= len(self.shares)

    def _idle(self) -> bool:
        titles = [title for title in self.titles().values() if title.startswith(WORKER_TITLE)]
        return len(titles) == self.options.workers and all(t.endswith(" idle") for t in titles)

    def _connected(self, conns: Mapping[str, Connection]) -> bool:
        return all(self._connected_to(conn, self.shares[dsn]) for dsn, conn in conns.items())

    def _connected_to(self, conn: Connection, workers: int) -> bool:
        row = conn.execute(_CONNECTIONS).fetchone()
        claimers, listeners = (int(row[0]), int(row[1])) if row else (0, 0)
        wanted_listeners = 0 if self.options.poll_only else workers
        return claimers == workers and listeners == wanted_listeners


def workers_by_database(dsn: str, options: SuperviseOptions) -> dict[str, int]:
    """Each database the workers claim from (its URL) and how many claim there: ``dsn`` for all
    of them, or with ``--shards`` each database of the map with its share by weight."""
    if options.shards is None:
        return {dsn: options.workers}
    shards = ShardMap.load(options.shards)
    assert shards is not None  # a path is given: load() reads it or raises
    shares = split_workers(options.workers, list(shards.databases.values()))
    return {shards.databases[name].url: count for name, count in shares.items()}


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
