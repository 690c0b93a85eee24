"""Enqueue inside a SQLAlchemy transaction: the job exists only if the Session (or Connection)
commits, and workers are notified at that commit.

SQLAlchemy must drive psycopg 3 (``postgresql+psycopg://``): the job's ``INSERT`` runs on the
very psycopg connection that holds the session's transaction, so it commits and rolls back
with the session's own writes::

    from miniqueue.integrations.sqlalchemy import enqueue

    with Session(engine) as session, session.begin():
        session.add(Order(id=8))
        enqueue(client, session, "send_receipt", {"order": 8})

Any other :class:`miniqueue.Client` method that takes ``conn=`` works the same way with
:func:`psycopg_connection` (``client.enqueue_many(jobs, conn=psycopg_connection(session))``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.orm import Session

from ..client.client import Client
from ..core.db import Connection
from ..core.errors import ConfigError
from ..core.options import JobOptions
from ..core.records import EnqueueResult, JobSpec

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

__all__ = ["enqueue", "enqueue_many", "psycopg_connection"]


def psycopg_connection(bind: Session | SAConnection) -> Connection:
    """The psycopg connection under ``bind``'s current transaction (begun if none is).

    For a Session bound to several engines, the connection of its default bind. Raises
    ConfigError if the driver is not psycopg 3.
    """
    connection = bind.connection() if isinstance(bind, Session) else bind
    raw = connection.connection.dbapi_connection
    if not isinstance(raw, psycopg.Connection):
        dialect = connection.dialect
        raise ConfigError(
            f"SQLAlchemy connects with {dialect.name}+{dialect.driver}, and miniqueue enqueues on psycopg 3 "
            "connections only: use a postgresql+psycopg:// URL"
        )
    return raw


def enqueue(
    client: Client, bind: Session | SAConnection, task: str, payload: Any = None, **options: Unpack[JobOptions]
) -> EnqueueResult:
    """:meth:`Client.enqueue` inside ``bind``'s transaction (the job exists only if it commits);
    ``options`` are a job's (see :class:`~miniqueue.JobOptions`)."""
    return client.enqueue(task, payload, conn=psycopg_connection(bind), **options)


def enqueue_many(client: Client, bind: Session | SAConnection, jobs: Iterable[JobSpec]) -> list[EnqueueResult]:
    """:meth:`Client.enqueue_many` inside ``bind``'s transaction."""
    return client.enqueue_many(jobs, conn=psycopg_connection(bind))
