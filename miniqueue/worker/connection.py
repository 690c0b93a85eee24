"""The claim loop's connection: its claims, completions, failures and hand-backs.

Opened on first use, and then the app's task declarations are published (once per worker:
producers without the app fill their jobs' options from them, see "Tasks and
their options" in docs/guides/tasks.md). Closed after a database error, and opened again by the next use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ..core.db import Connection, connect, tolerate_bad_json
from ..store.store import Store
from ..tasks.app import App


class ClaimConnection:
    """One worker's claim connection to ``dsn``, publishing ``app``'s declarations for ``queues``."""

    def __init__(self, dsn: str, store: Store, app: App, queues: Sequence[str], *, schema: str) -> None:
        self.dsn, self.store, self.app, self.queues, self.schema = dsn, store, app, queues, schema
        self._conn: Connection | None = None
        self._published = False

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def get(self) -> Connection:
        """The connection, opened (and the tasks published) if need be; raises
        DatabaseUnavailable if the database cannot be reached."""
        if self._conn is None:
            # Timestamps in UTC: the claimed jobs' (behind a pooler, the server's zone), and each
            # statement planned once, the claim above all (see conninfo).
            self._conn = connect(self.dsn, purpose="worker", schema=self.schema, utc=True, generic_plans=True)
            tolerate_bad_json(self._conn)  # one job's payload never fails the claim of the others
            if not self._published:
                self.store.publish_tasks(self._conn, self.app.declarations(), self.queues)
                self._published = True
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
