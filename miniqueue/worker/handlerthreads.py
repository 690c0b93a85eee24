"""The worker's handler threads: daemon threads, started as they are needed.

Unlike :class:`concurrent.futures.ThreadPoolExecutor`'s threads, which the interpreter joins at
exit, these are daemon threads: a handler that never returns (one the worker abandoned at its
shutdown timeout, or one a test's ``run_jobs`` gave up on) cannot keep the process alive once
everything else has ended. Its job stays leased, as an abandoned job always does, until the
lease expires or the supervisor hands it back.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("miniqueue.worker")


class HandlerThreads:
    """Up to ``size`` daemon threads running the calls given to :meth:`submit`, in order."""

    def __init__(self, size: int, name: str) -> None:
        self._size, self._name = size, name
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._closed = False

    def submit(self, call: Callable[[], None]) -> None:
        """Run ``call`` on an idle thread, or a new one while fewer than ``size`` exist (else it
        waits for a thread to free)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the handler threads were shut down")
            self._calls.append(call)
            if self._idle >= len(self._calls):
                self._cond.notify()
            elif len(self._threads) < self._size:
                thread = threading.Thread(target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def shutdown(self) -> None:
        """Drop the calls not started and let idle threads end; running calls go on (nothing
        waits for them)."""
        with self._cond:
            self._closed = True
            self._calls.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._calls and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if not self._calls:
                    return
                call = self._calls.popleft()
            try:
                call()
            except BaseException:  # the calls handle their own errors; never lose a thread silently
                log.exception("a handler thread's call raised")
