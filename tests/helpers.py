"""Test helpers: polling with a deadline, direct row access for assertions, and the checks
several files make alike."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from miniqueue import Client, InvalidInput, JobSpec
from miniqueue.core.db import Connection
from miniqueue.core.records import Lease
from miniqueue.store.store import Store

T = TypeVar("T")


def wait_until(predicate: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass, and
    return that value (never None: a predicate of ``int | None`` gives an ``int``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def row(conn: Connection, job_id: int) -> dict[str, Any]:
    """Every column of one job, as a dict (tests assert on rows, not on API echoes)."""
    cur = conn.execute("SELECT * FROM miniqueue_jobs WHERE id = %s", [job_id])
    values = cur.fetchone()
    assert values is not None, f"job {job_id} does not exist"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, values, strict=True)}


def db_now(conn: Connection) -> dt.datetime:
    """The database clock's ``now()``, in UTC: the clock leases, schedules and delays are read on."""
    found = conn.execute("SELECT now()").fetchone()
    assert found is not None
    now: dt.datetime = found[0]
    return now.astimezone(dt.timezone.utc)


def count(conn: Connection, where: str = "true", params: Any = None) -> int:
    """How many jobs match a SQL condition."""
    result = conn.execute(f"SELECT count(*) FROM miniqueue_jobs WHERE {where}", params).fetchone()
    assert result is not None
    return int(result[0])


def expire_lease(conn: Connection, job_id: int) -> None:
    """Move a running job's lease expiry into the past (as if its worker died long ago)."""
    conn.execute("UPDATE miniqueue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job_id])


def make_running(conn: Connection, job_id: int, worker: str, lease_left: float) -> None:
    """Put a job in ``running`` at attempt 1, leased by ``worker`` for ``lease_left`` more seconds
    of the database's clock (negative: expired that long ago), as a claim would have left it."""
    conn.execute(
        "UPDATE miniqueue_jobs SET state = 'running', attempt = 1, leased_by = %s,"
        " lease_expires_at = now() + make_interval(secs => %s) WHERE id = %s",
        [worker, lease_left, job_id],
    )


def take_lease_away(conn: Connection, store: Store, job_id: int) -> None:
    """Expire a running job's lease and recover it as the reaper does, in one transaction.

    Its worker may still be heartbeating beside the test: done apart, a renewal landing
    between the expiry and the recovery would leave the job leased. Here the renewal waits
    for the row and then finds its lease gone.
    """
    with conn.transaction():
        expire_lease(conn, job_id)
        assert job_id in store.recover_expired_leases(conn), f"job {job_id} was not recovered"


def make_due(conn: Connection, job_id: int) -> None:
    """Bring a retried job's next run to now (as if its retry delay had passed)."""
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [job_id])


def take_over(conn: Connection, store: Store, job_id: int, worker_id: str) -> Lease:
    """Make a recovered job due and claim it for `worker_id` in one transaction.

    A worker still running beside the test cannot claim the job back in between: the job
    becomes due to others only when it is already leased to `worker_id`.
    """
    with conn.transaction():
        make_due(conn, job_id)
        (lease,) = store.claim(conn, ["default"], worker_id, 30, 1)
    assert lease.id == job_id
    return lease


def assert_refused_and_nothing_stored(client: Client, conn: Connection, options: dict[str, Any], message: str) -> None:
    """A job of ``options`` is refused, alone and second of a batch (the error names it), with
    ``message``; no job and no limit is stored."""
    with pytest.raises(InvalidInput, match=message):
        client.enqueue("t", {}, **options)
    with pytest.raises(InvalidInput, match=f"job 1: {message}"):
        client.enqueue_many([JobSpec("t", {}), JobSpec("t", {}, **options)])
    assert count(conn) == 0
    assert conn.execute("SELECT count(*) FROM miniqueue_limits").fetchone() == (0,)


def run_on_threads(target: Callable[[int], object], count: int, timeout: float = 60.0) -> None:
    """Call ``target(0)`` to ``target(count - 1)``, each on a thread of its own, all started
    before any is joined; fail with what they raised, if any did."""
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            target(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not errors, errors
