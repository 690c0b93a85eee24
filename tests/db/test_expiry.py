"""Expiry: a job not started by its deadline never starts; the reaper moves it to 'expired' (a
final state, counted, with a history entry, requeue-able like dead)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from miniqueue import App, Client, InvalidInput, JobSpec, Reaper, ReaperConfig
from miniqueue.core.db import Connection
from miniqueue.store.store import Store
from miniqueue.testing import run_jobs

from ..helpers import count, row, wait_until

W = "worker-1"


def past_deadline(conn: Connection, *ids: int) -> None:
    """Move the jobs' deadline to just past (as time passing would)."""
    conn.execute(
        "UPDATE miniqueue_jobs SET created_at = now() - interval '2 seconds', expires_at = now() - interval '1 second'"
        " WHERE id = ANY(%s)",
        [list(ids)],
    )


def test_a_job_past_its_deadline_is_never_claimed_and_the_reaper_expires_it(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    late = client.enqueue("t", expires_in=30).id
    fresh = client.enqueue("t", expires_in=3600).id
    past_deadline(conn, late)
    assert [lease.id for lease in store.claim(conn, ["default"], W, 30, 10)] == [fresh]
    result = Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    assert result.expired == 1
    job = client.get(late)
    assert job.state.value == "expired" and job.finished_at is not None
    assert job.errors[-1].error.startswith("expired: not started by its deadline")
    [stats] = client.queue_stats()
    assert stats.counts[job.state] == 1
    client.requeue([late])
    assert row(conn, late)["state"] == "available"


def test_a_retry_due_after_the_deadline_never_runs_and_expires(
    client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    job_id = client.enqueue("t", expires_in=30).id
    [lease] = store.claim(conn, ["default"], W, 30, 1)
    assert store.record_failure(conn, job_id, W, lease.attempt, "boom", 3600).value == "available"
    past_deadline(conn, job_id)
    conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE id = %s", [job_id])  # the retry is due
    assert store.claim(conn, ["default"], W, 30, 1) == []
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    assert row(conn, job_id)["state"] == "expired" and row(conn, job_id)["attempt"] == 1


def test_a_thousand_jobs_behind_a_paused_queue_all_expire_and_none_runs(dsn: str, conn: Connection) -> None:
    app = App()
    ran: list[int] = []

    @app.task("short_lived", queue="paused")
    def short_lived(job: Any) -> None:
        ran.append(job.id)

    with Client(dsn) as client:
        client.pause_queues(["paused"], create=True)
        ids = [r.id for r in client.enqueue_many([JobSpec("short_lived", queue="paused", expires_in=1)] * 1000)]
        reaper = Reaper(dsn, ReaperConfig(prune=False, vacuum=False))

        def all_expired() -> bool:
            reaper.run_once()
            return count(conn, "state = 'expired'") == 1000

        wait_until(all_expired, timeout=10, what="1,000 jobs expired")
        client.resume_queues(["paused"])
        run_jobs(app, client)
    assert ran == [] and count(conn, "state = 'expired'") == 1000 and len(ids) == 1000


def test_a_dependent_of_an_expired_job_is_cancelled(client: Client, conn: Connection, dsn: str) -> None:
    parent = client.enqueue("t", expires_in=30).id
    child = client.enqueue("t", depends_on=[parent]).id
    past_deadline(conn, parent)
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    assert row(conn, child)["state"] == "cancelled"
    assert row(conn, child)["last_error"] == f"cancelled: its parent job {parent} ended expired"


def test_an_expired_head_hands_its_sequence_on(client: Client, conn: Connection, dsn: str) -> None:
    head = client.enqueue("t", sequence_key="k", expires_in=30).id
    nxt = client.enqueue("t", sequence_key="k").id
    past_deadline(conn, head)
    Reaper(dsn, ReaperConfig(prune=False, vacuum=False)).run_once()
    assert (row(conn, head)["state"], row(conn, nxt)["state"]) == ("expired", "available")


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"expires_in": 0}, "expires_in"),
        ({"expires_in": -5}, "expires_in"),
        ({"expires_in": 10, "delay": 20}, "before it could start"),
        ({"expires_in": 10, "expires_at": dt.datetime.now(dt.timezone.utc)}, "mutually exclusive"),
        ({"expires_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"expires_at": dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)}, "not in the future"),
    ],
)
def test_a_bad_deadline_is_one_clear_error_and_stores_nothing(
    client: Client, conn: Connection, bad: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        client.enqueue("t", **bad)
    with pytest.raises(InvalidInput, match=message):
        client.enqueue_many([JobSpec("t"), JobSpec("t", **bad)])
    parent = client.enqueue("t").id
    with pytest.raises(InvalidInput, match=message):
        client.enqueue("t", depends_on=[parent], **bad)
    assert count(conn) == 1
