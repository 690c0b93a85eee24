"""The supervisor's signals: handlers only record them, the main loop acts on them.

Logging or taking a lock inside a signal handler can deadlock (the handler runs between two
bytecodes of whatever the main thread was doing, possibly inside the logging module's own
lock), so a handler only puts the signal number on a queue. ``signal.set_wakeup_fd`` writes a
byte to a pipe as well, which wakes the loop out of ``select`` at once.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
from collections.abc import Iterator

#: Signals the supervisor handles; children put them back to their defaults after fork.
SUPERVISOR_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGCHLD,
)


class SignalQueue:
    """Recorded signals, and a file descriptor that becomes readable when one arrives."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    def install(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in SUPERVISOR_SIGNALS:
            signal.signal(sig, lambda signum, frame: self._queue.put(signum))

    def pending(self) -> Iterator[int]:
        """The signals received since the last call, oldest first (SIGCHLD left out: the loop
        reaps every tick anyway)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass
        while not self._queue.empty():
            signum = self._queue.get()
            if signum != signal.SIGCHLD:
                yield signum

    def filenos(self) -> list[int]:
        """What a forked child must close."""
        return [self.wake_r, self.wake_w]

    def uninstall(self) -> None:
        signal.set_wakeup_fd(-1)
