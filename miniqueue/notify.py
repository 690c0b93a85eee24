"""LISTEN/NOTIFY: wake idle workers when a job is enqueued on one of their queues.

Enqueue sends ``NOTIFY miniqueue_<schema>, '<queue>'`` in the enqueuing transaction, so the
notification arrives when the job becomes visible. The listener runs on a connection of its
own; after any connection error it reconnects with backoff, listens again, and wakes the
worker once so that jobs enqueued while it was deaf are polled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from .db import Connection, connect, mask_dsn
from .store import Store

log = logging.getLogger("miniqueue.notify")


class Listener:
    """A thread that calls ``wake()`` on each notification for one of ``queues``."""

    def __init__(
        self,
        dsn: str,
        store: Store,
        queues: Collection[str],
        wake: Callable[[], None],
        *,
        max_backoff: float = 5.0,
    ) -> None:
        self.dsn, self.store, self.queues, self.wake = dsn, store, frozenset(queues), wake
        self.max_backoff = max_backoff
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="miniqueue-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            try:
                with connect(self.dsn, purpose="listen", schema=self.store.schema) as conn:
                    self._listen(conn)
                    delay = 0.1
            except Exception as exc:  # any failure of this connection: reconnect, never die
                self.connected.clear()
                log.warning(
                    "listener lost its connection to %s (%s); retrying in %.1fs", mask_dsn(self.dsn), exc, delay
                )
                self._stopping.wait(delay)
                delay = min(delay * 2, self.max_backoff)

    def _listen(self, conn: Connection) -> None:
        self.store.listen(conn)
        self.connected.set()
        self.wake()  # anything enqueued while we were not listening is found by one poll
        while not self._stopping.is_set():
            for note in conn.notifies(timeout=0.5):
                if note.payload in self.queues:
                    self.wake()
