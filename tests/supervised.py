"""A real ``miniqueue-supervise`` process tree for tests: started in its own session, children
found with psutil, output kept in files, killed for real at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from .helpers import wait_until

#: Short leases and intervals so process tests stay fast.
FAST = ["--lease-duration", "5", "--heartbeat-interval", "1", "--poll-interval", "0.2", "--reaper-interval", "1",
        "--shutdown-timeout", "5"]  # fmt: skip


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Supervised:
    """A running miniqueue-supervise; its stdout and stderr go to files in ``folder``."""

    def __init__(self, dsn: str, args: list[str], folder: Path, cwd: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout, self.stderr = folder / "stdout.log", folder / "stderr.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "miniqueue.cli", "supervise", *args],
            env={**os.environ, "DATABASE_URL": dsn},
            stdout=self.stdout.open("wb"),
            stderr=self.stderr.open("wb"),
            start_new_session=True,
            cwd=cwd,
        )
        self.process = psutil.Process(self.proc.pid)

    def output(self) -> str:
        """What the supervisor and its children logged (stderr)."""
        return self.stderr.read_text(errors="replace")

    def titles(self) -> dict[int, str]:
        """Each live child's pid and process title."""
        found = {}
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in self.process.children():
                with contextlib.suppress(psutil.NoSuchProcess):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        found[child.pid] = " ".join(child.cmdline()).strip()
        return found

    def workers(self) -> list[int]:
        return sorted(pid for pid, title in self.titles().items() if "worker-" in title)

    def reaper(self) -> int | None:
        return next((pid for pid, title in self.titles().items() if "reaper" in title), None)

    def wait_ready(self, workers: int, timeout: float = 20) -> None:
        wait_until(
            lambda: len(self.workers()) == workers and self.reaper() and "supervisor ready" in self.output(),
            timeout=timeout,
            what=f"{workers} workers and a reaper ready",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Fleet:
    """Starts supervisors for one test (each with its own log folder) and kills them all at the end."""

    def __init__(self, dsn: str, folder: Path, cwd: Path, app: str) -> None:
        self.dsn, self.folder, self.cwd, self.app = dsn, folder, cwd, app
        self.started: list[Supervised] = []

    def start(self, *args: str, app: str | None = None, workers: int = 2) -> Supervised:
        argv = ["--app", app or self.app, "--workers", str(workers), *FAST, *args]
        supervised = Supervised(self.dsn, argv, self.folder / f"supervisor-{len(self.started)}", self.cwd)
        self.started.append(supervised)
        return supervised

    def stop_all(self) -> None:
        for supervised in self.started:
            supervised.stop()
