"""LISTEN/NOTIFY: wake idle workers when a job is enqueued on one of their queues.

Enqueue sends ``NOTIFY miniqueue_<schema>, '<queue>'`` in the enqueuing transaction, so the
notification arrives when the job becomes visible. The listener runs on a connection of its
own; after any connection error it reconnects with backoff, listens again, and wakes the
worker once so that jobs enqueued while it was deaf are polled.

LISTEN needs a session that stays on one server connection, which a transaction pooler does
not keep: behind one, the listener connects to a direct URL of its own, or the worker polls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection

from ..core.db import Connection, behind_pooler, connect, mask_dsn
from ..core.service import Service
from ..store.store import Store

log = logging.getLogger("miniqueue.notify")


def listener_for(
    dsn: str,
    listen_url: str | None,
    store: Store,
    queues: Collection[str],
    wake: Callable[[], None],
    *,
    poll_only: bool,
) -> Listener | None:
    """A worker's listener (not started): on ``listen_url`` if given, else on ``dsn``. None when
    the worker only polls: with ``poll_only``, or when ``dsn`` goes through a transaction
    pooler and no ``listen_url`` is given (LISTEN through it would hear nothing; a warning says so)."""
    if poll_only:
        return None
    if listen_url is None and behind_pooler():
        log.warning(
            "not listening for new jobs: LISTEN needs a session, which PgBouncer in transaction mode does "
            "not keep, so this worker polls instead (pass --listen-url with a direct PostgreSQL URL to be "
            "woken at once, or --poll-only to say polling is meant)"
        )
        return None
    return Listener(listen_url or dsn, store, queues, wake)


class Listener(Service):
    """A thread that calls ``wake()`` on each notification for one of ``queues``."""

    stop_timeout = 2.0
    log = log

    def __init__(
        self,
        dsn: str,
        store: Store,
        queues: Collection[str],
        wake: Callable[[], None],
        *,
        max_backoff: float = 5.0,
    ) -> None:
        super().__init__("miniqueue-listener")
        self.dsn, self.store, self.queues, self.wake = dsn, store, frozenset(queues), wake
        self.max_backoff = max_backoff
        self.connected = threading.Event()

    def run(self) -> None:
        delay = 0.1
        while not self.stopping.is_set():
            try:
                with connect(self.dsn, purpose="listen", schema=self.store.schema) as conn:
                    self._listen(conn)
                    delay = 0.1
            except Exception as exc:  # any failure of this connection: reconnect, never die
                self.connected.clear()
                log.warning(
                    "listener lost its connection to %s (%s); retrying in %.1fs", mask_dsn(self.dsn), exc, delay
                )
                self.stopping.wait(delay)
                delay = min(delay * 2, self.max_backoff)

    def _listen(self, conn: Connection) -> None:
        self.store.listen(conn)
        self.connected.set()
        self.wake()  # anything enqueued while we were not listening is found by one poll
        while not self.stopping.is_set():
            for note in conn.notifies(timeout=0.5):
                if note.payload in self.queues:
                    self.wake()
