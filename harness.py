"""A real ``miniqueue-supervise`` for miniqueue's own test suite, benchmarks and chaos harness.

Not part of the package (it is not in the wheel): the three share this one copy, imported from
the repository's root, and it changes with them. It does the part they
share: start ``python -m miniqueue.cli supervise <args>`` in a session of its own with its
output in files, know when it is ready, find its children, and stop it for real.

Readiness is the supervisor's own announcement, systemd's notify protocol (``miniqueue.supervise.systemd``):
the harness binds a unix datagram socket, passes its path as ``NOTIFY_SOCKET``, and the
supervisor sends ``READY=1`` once every worker and the reaper have reported ready (then
``STATUS=...`` lines, and ``STOPPING=1`` when asked to stop). No log line is parsed for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import psutil

#: How often the listener looks whether the supervisor is gone while no datagram arrives.
_LISTEN_SECONDS = 0.1
#: How long a SIGKILLed process group may take to be waited for.
_KILL_WAIT_SECONDS = 10.0
WORKER_TITLE = "miniqueue worker-"
REAPER_TITLE = "miniqueue reaper"


class SupervisorFailed(RuntimeError):
    """The supervisor exited, or its deadline passed, before it was ready; the message carries
    the tail of its log."""


class SupervisorProcess:
    """One running ``miniqueue-supervise``.

    Its stderr goes to ``log`` (appended), and its stdout too unless ``stdout`` names a file of
    its own. ``env`` is the child's environment (default: this process's); ``dsn``, when given,
    becomes its ``DATABASE_URL``; ``NOTIFY_SOCKET`` is always the harness's.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        log: Path,
        dsn: str | None = None,
        stdout: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.log = log
        self._notify_dir = Path(tempfile.mkdtemp(prefix="mq-notify-"))  # short: unix socket paths stop at 107 bytes
        self.notify_socket = self._notify_dir / "notify"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(self.notify_socket))
        self._socket.settimeout(_LISTEN_SECONDS)
        child_env = dict(os.environ if env is None else env)
        child_env["NOTIFY_SOCKET"] = str(self.notify_socket)
        if dsn is not None:
            child_env["DATABASE_URL"] = dsn
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log.open("ab") as err, (stdout or log).open("ab") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "miniqueue.cli", "supervise", *args],
                    env=child_env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
        except BaseException:
            self._close_socket()
            raise
        self.pid = self.proc.pid
        self._heard: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closing = threading.Event()
        # A thread reads the socket all along: the kernel queues only ten datagrams per unix
        # socket (net.unix.max_dgram_qlen) and the supervisor drops what does not fit, so a
        # reader that only looked now and then could miss READY=1 or STOPPING=1.
        self._listener = threading.Thread(target=self._listen, name=f"notify-{self.pid}", daemon=True)
        self._listener.start()

    # -- readiness ---------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether the supervisor has sent READY=1 (also after it exited)."""
        if not self._ready.is_set() and self.proc.poll() is not None:
            self._listener.join()  # it exits once it has read what the supervisor sent
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> None:
        """Return once the supervisor has sent READY=1; raise :class:`SupervisorFailed` if it
        exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                if self.ready:
                    return
                raise SupervisorFailed(
                    f"the supervisor exited with {self.proc.returncode} before it was ready:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise SupervisorFailed(f"the supervisor was not ready within {timeout:g} s:\n{self.log_tail()}")

    def notifications(self) -> list[str]:
        """Every notify line the supervisor has sent so far (``READY=1``, ``STATUS=...``...)."""
        with self._lock:
            return list(self._heard)

    def _listen(self) -> None:
        try:
            while True:
                try:
                    data = self._socket.recv(4096)
                except TimeoutError:
                    if self._closing.is_set() or self.proc.poll() is not None:
                        return  # nothing is queued, and nothing more will come
                    continue
                lines = data.decode(errors="replace").splitlines()
                with self._lock:
                    self._heard.extend(lines)
                if "READY=1" in lines:
                    self._ready.set()
        finally:
            self._close_socket()

    def _close_socket(self) -> None:
        self._socket.close()
        shutil.rmtree(self._notify_dir, ignore_errors=True)

    # -- output and children -----------------------------------------------------------------------

    def output(self) -> str:
        """What the supervisor and its children wrote to the log."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def titles(self) -> dict[int, str]:
        """Each live (not zombie) child's pid and process title."""
        found: dict[int, str] = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children():
                with contextlib.suppress(psutil.Error):
                    if child.status() != psutil.STATUS_ZOMBIE:
                        found[child.pid] = " ".join(child.cmdline()).strip()
        return found

    def worker_pids(self) -> list[int]:
        """The workers (title ``miniqueue worker-N ...``), by pid."""
        return sorted(pid for pid, title in self.titles().items() if title.startswith(WORKER_TITLE))

    def reaper_pid(self) -> int | None:
        """The reaper (title ``miniqueue reaper``), if one is running."""
        return next((pid for pid, title in self.titles().items() if title.startswith(REAPER_TITLE)), None)

    # -- the end -----------------------------------------------------------------------------------

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM and up to ``grace`` seconds to exit (none with ``grace=0``), then SIGKILL
        whatever is left of its process group; then :meth:`close`."""
        if grace > 0 and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(_KILL_WAIT_SECONDS)
        self.close()

    def close(self) -> None:
        """Stop listening and remove the notify socket (what was heard stays readable)."""
        self._closing.set()
        self._listener.join()

    def __enter__(self) -> SupervisorProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
