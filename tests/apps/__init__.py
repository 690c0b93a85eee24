"""Apps that real ``miniqueue-supervise`` processes load in the tests; each records what it ran
on a connection of its worker process's own."""

from __future__ import annotations

import os
from typing import Any

import psycopg

_conn: psycopg.Connection[Any] | None = None


def own_connection() -> psycopg.Connection[Any]:
    """This process's autocommit connection to ``$DATABASE_URL``: opened on first use, so after
    the fork (no connection crosses one), once per worker process."""
    global _conn
    if _conn is None:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    return _conn
