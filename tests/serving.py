"""Commands run as processes in the tests: ``miniqueue`` run to its end, a server started in a
session of its own, waiting until it answers, and stopping it with its children."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from .helpers import wait_until
from .supervised import free_port

#: The repository: the folder commands run in, so that ``tests.apps...`` and ``examples...`` import.
ROOT = Path(__file__).resolve().parents[1]


def run_miniqueue(*args: str, dsn: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``python -m miniqueue.cli ARGS`` with ``DATABASE_URL`` set to ``dsn``, run to its end in
    the repository's folder; its output as text."""
    return subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", *args],
        env={**os.environ, "DATABASE_URL": dsn},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(argv: list[str], log: Path, env: Mapping[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """``argv`` in the background, in a session of its own (:func:`stop` ends its children
    too), its output and errors to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )


def listening(url: str, server: subprocess.Popen[bytes], log: Path) -> bool:
    """Whether ``server`` answers ``url`` (whatever it answers); an AssertionError with its log
    if it exited."""
    assert server.poll() is None, f"{server.args!r} exited with {server.returncode}:\n{log.read_text()}"
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:  # an answer, whatever it says
        return True
    except (urllib.error.URLError, ConnectionError):
        return False


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the process's group; its exit status (SIGKILL after 20 s)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        raise


@contextlib.contextmanager
def read_only_dashboard(env: Mapping[str, str], log: Path) -> Iterator[str]:
    """``miniqueue web --read-only`` on a free port, run with ``env``: its address once it
    answers; stopped at the end."""
    port = free_port()
    server = start([sys.executable, "-m", "miniqueue.cli", "web", "--port", str(port), "--read-only"], log, env)
    try:
        address = f"http://127.0.0.1:{port}"
        wait_until(lambda: listening(f"{address}/jobs", server, log), timeout=20, what="miniqueue web to answer")
        yield address
    finally:
        stop(server)
