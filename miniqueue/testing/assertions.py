"""Assertions on what is in the queue, read from the real rows (:meth:`Client.list_jobs`).

They read where the code under test wrote: on ``conn`` when given, and for the Django
integration's client (``get_client()``) on Django's connection, so inside
``django.test.TestCase`` (one transaction per test, never committed) they see the jobs the
test enqueued; otherwise on a connection of the client's pool, which sees committed jobs.
"""

from __future__ import annotations

import sys
from typing import Any

from ..client.client import Client
from ..core.db import Connection
from ..core.records import JobRecord, State

#: How many stored jobs an assertion's failure message lists.
_SHOWN = 20
#: Rows read per query while listing jobs.
_PAGE = 1000


class _Unset:
    def __repr__(self) -> str:
        return "<any>"


_ANY: Any = _Unset()


def enqueued_jobs(
    target: str | Client,
    *,
    task: str | None = None,
    queue: str | None = None,
    state: State | str | None = None,
    payload: Any = _ANY,
    conn: Connection | None = None,
) -> list[JobRecord]:
    """Stored jobs matching every filter given, oldest first, whatever their state unless
    ``state`` is given. ``payload`` matches by equality with the decoded JSON (so
    ``unittest.mock.ANY`` works inside it). Read on ``conn`` if given (with the jobs its open
    transaction enqueued), else as the module says."""
    client = target if isinstance(target, Client) else Client(target)
    try:
        on = conn if conn is not None else reading_connection(client)
        jobs: list[JobRecord] = []
        before: int | None = None
        while True:
            page = client.list_jobs(before_id=before, limit=_PAGE, task=task, queue=queue, state=state, conn=on)
            jobs.extend(page)
            if len(page) < _PAGE:
                break
            before = page[-1].id
    finally:
        if client is not target:
            client.close()
    jobs.reverse()
    return jobs if payload is _ANY else [job for job in jobs if payload == job.payload]


def assert_enqueued(
    target: str | Client,
    *,
    task: str | None = None,
    queue: str | None = None,
    state: State | str | None = None,
    payload: Any = _ANY,
    count: int | None = None,
    conn: Connection | None = None,
) -> list[JobRecord]:
    """Assert that stored jobs match (at least one, or exactly ``count``); return them, oldest
    first. The failure message lists the jobs that are stored, so a near miss shows. Read on
    ``conn`` as :func:`enqueued_jobs` does."""
    found = enqueued_jobs(target, task=task, queue=queue, state=state, payload=payload, conn=conn)
    if (count is None and found) or len(found) == count:
        return found
    wanted = ", ".join(
        f"{name}={value!r}"
        for name, value in (("task", task), ("queue", queue), ("state", state), ("payload", payload))
        if value is not None and value is not _ANY
    )
    expected = "at least 1" if count is None else str(count)
    raise AssertionError(
        f"expected {expected} job(s) matching {wanted or 'anything'}, found {len(found)}\n{_describe(target, conn)}"
    )


def reading_connection(client: Client) -> Connection | None:
    """Where the code under test's jobs are visible if not on the client's pool: for the Django
    integration's client, Django's connection (this thread's); else None. (The integration is
    looked up, not imported: a client it made exists only once it was imported.)"""
    django = sys.modules.get("miniqueue.integrations.django")
    if django is None:
        return None
    found: Connection | None = django.reading_connection(client)
    return found


def _describe(target: str | Client, conn: Connection | None) -> str:
    stored = enqueued_jobs(target, conn=conn)
    if not stored:
        return "the queue holds no job"
    lines = [
        f"  job {job.id}: task={job.task!r} queue={job.queue!r} state={job.state.value} payload={job.payload!r}"
        for job in stored[-_SHOWN:]
    ]
    more = f" (the last {_SHOWN})" if len(stored) > _SHOWN else ""
    return f"stored jobs{more}:\n" + "\n".join(lines)
