"""The example apps' servers in the tests: waiting until one answers, and stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path


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
