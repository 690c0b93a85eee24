"""One background thread and its stop event: the shape of every helper thread miniqueue runs.

A worker's heartbeat, listener and event loop, the reaper's vacuum, a supervised child's
reporter and gauge reader, and the supervisor's HTTP acceptor each run a loop on a daemon
thread of their own until told to stop. :class:`Service` is that thread: ``start``, ``stop``
(set the event, then join) and ``join``, and a body, :meth:`Service.run`, that the subclass
writes. Whatever escapes the body is logged with the thread's name and kept in
:attr:`Service.error`: a helper that dies says so rather than leaving its process to go on
without it in silence.

The threads are daemons: a loop stuck in a call that never returns (a query to a server that
vanished) cannot keep its process alive once everything else has ended.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("miniqueue.service")


class Service:
    """A loop on a daemon thread named ``name``, until :attr:`stopping` is set.

    Subclass and write :meth:`run` (it should return soon after ``stopping`` is set), or pass
    ``target``, a callable that is the whole body. ``stopping`` may be an event shared with an
    owner that stops several things at once (the reaper stops its vacuum with its own). An
    error that ends the thread goes to ``log`` (by default the class's :attr:`log`).
    """

    #: Seconds :meth:`stop` waits for the thread by default.
    stop_timeout: float = 5.0
    #: Where an error that ended the thread is logged.
    log: logging.Logger = log

    def __init__(
        self,
        name: str,
        *,
        stopping: threading.Event | None = None,
        target: Callable[[], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.stopping = stopping if stopping is not None else threading.Event()
        if log is not None:
            self.log = log
        #: What ended the thread, if it did not return.
        self.error: BaseException | None = None
        self._target = target
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    @property
    def name(self) -> str:
        return self._thread.name

    def run(self) -> None:
        """The thread's body."""
        if self._target is None:
            raise NotImplementedError(f"{type(self).__name__} has no body: override run() or pass target")
        self._target()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end, and wait up to ``timeout`` seconds (``stop_timeout`` when None)
        for its thread."""
        self.stopping.set()
        self.join(self.stop_timeout if timeout is None else timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the thread; True once it has ended (or never started)."""
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def on_thread(self) -> bool:
        """Whether the caller runs on this service's thread."""
        return threading.get_ident() == self._thread.ident

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # the thread's end, whatever it was: said, never lost
            self.error = exc
            self.log.exception("%s: the thread ended on an error", self.name)
