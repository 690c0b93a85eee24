"""A real ``miniqueue-supervise`` process tree for tests: started in its own session, children
found with psutil, output kept in files, killed for real at the end."""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import psutil
import psycopg

from harness import SupervisorProcess

from .helpers import wait_until

#: Short leases and intervals so process tests stay fast.
FAST = [
    "--lease-duration",
    "5",
    "--heartbeat-interval",
    "1",
    "--poll-interval",
    "0.2",
    "--reaper-interval",
    "1",
    "--shutdown-timeout",
    "5",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_ports_after(count: int) -> int:
    """A port ``P`` such that ``P + 1`` to ``P + count`` are free on 127.0.0.1 right now (for
    ``miniqueue-supervise --shards``, whose database number ``i`` serves on ``P + i``). Taken
    below the kernel's ephemeral range (from 32768 by default): a port there can be free now and
    taken a moment later as the local end of a TCP connection (to a PostgreSQL on 127.0.0.1),
    and a supervisor that cannot bind its port does not start."""
    rng = random.Random()
    for _ in range(100):
        base, taken = rng.randrange(20000, 32000), []
        try:
            for offset in range(1, count + 1):
                sock = socket.socket()
                taken.append(sock)
                sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in taken:
                sock.close()
    raise AssertionError(f"no {count} free ports in a row found on 127.0.0.1")


class Supervised:
    """A running miniqueue-supervise (see ``harness``); its stdout and stderr go to
    files in ``folder``. Without ``dsn`` it uses the embedded server (or ``env``'s DATABASE_URL)."""

    def __init__(
        self, dsn: str | None, args: list[str], folder: Path, cwd: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.stdout, self.stderr = folder / "stdout.log", folder / "stderr.log"
        self.harness = SupervisorProcess(args, log=self.stderr, stdout=self.stdout, dsn=dsn, env=env, cwd=cwd)
        self.proc = self.harness.proc
        self.process = psutil.Process(self.proc.pid)

    def output(self) -> str:
        """What the supervisor and its children logged (stderr)."""
        return self.harness.output()

    def notifications(self) -> list[str]:
        """What the supervisor told systemd's notify socket so far."""
        return self.harness.notifications()

    def titles(self) -> dict[int, str]:
        """Each live child's pid and process title."""
        return self.harness.titles()

    def workers(self) -> list[int]:
        return self.harness.worker_pids()

    def reaper(self) -> int | None:
        return self.harness.reaper_pid()

    def wait_ready(self, workers: int, timeout: float = 20) -> None:
        """The supervisor sent READY=1, and ``workers`` workers and a reaper are running."""
        self.harness.wait_ready(timeout)
        wait_until(
            lambda: len(self.workers()) == workers and self.reaper(),
            timeout=timeout,
            what=f"{workers} workers and a reaper",
        )

    def stop(self) -> None:
        """At once: SIGKILL to the whole process group."""
        self.harness.stop(grace=0)


class StartSupervisor(Protocol):
    """``Fleet.start``, as the ``supervise`` fixtures hand it to tests."""

    def __call__(self, *args: str, app: str | None = None, workers: int = 2) -> Supervised: ...


class Fleet:
    """Starts supervisors for one test (each with its own log folder) and kills them all at the
    end: ``with Fleet(...) as fleet:``, or in a ``supervise`` fixture ``yield fleet.start``."""

    def __init__(self, dsn: str, folder: Path, cwd: Path, app: str) -> None:
        self.dsn, self.folder, self.cwd, self.app = dsn, folder, cwd, app
        self.started: list[Supervised] = []

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, *args: str, app: str | None = None, workers: int = 2) -> Supervised:
        argv = ["--app", app or self.app, "--workers", str(workers), *FAST, *args]
        supervised = Supervised(self.dsn, argv, self.folder / f"supervisor-{len(self.started)}", self.cwd)
        self.started.append(supervised)
        return supervised

    def stop_all(self) -> None:
        for supervised in self.started:
            supervised.stop()


def create_executions(conn: psycopg.Connection[Any], *columns: str) -> None:
    """Make afresh the ``executions`` table the apps of ``tests/apps`` record each run in (job,
    attempt, pid, and ``columns``): another test in this database may have left one without a
    column its app writes."""
    conn.execute("DROP TABLE IF EXISTS executions")
    conn.execute(f"CREATE TABLE executions (job_id BIGINT, attempt INT, pid INT{''.join(', ' + c for c in columns)})")
