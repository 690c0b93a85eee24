"""One retry delay whoever charges the attempt: the worker, the supervisor (a crash) or the
reaper (an expired lease) (docs/guarantees.md, "Who pays an attempt"). The policy itself is
tests/unit/test_backoff.py's."""

from __future__ import annotations

import pytest

from miniqueue import App, Client, JobSpec, Snooze, exponential_backoff
from miniqueue.core.backoff import backoff_ceiling
from miniqueue.core.db import Connection
from miniqueue.core.validation import validate
from miniqueue.store.store import Failure, Store
from miniqueue.tasks.job import Job
from miniqueue.testing import run_jobs

from ..helpers import expire_lease


def _published(conn: Connection, app: App) -> None:
    Store().publish_tasks(conn, app.declarations(), app.queues)


def _charge_without_the_app(conn: Connection, how: str, tasks: list[str]) -> list[float]:
    """Claim a job of each of ``tasks`` and charge its attempt as the supervisor (a crash) or the
    reaper (an expired lease) does, neither of which has the app; each job's retry delay (read a
    moment after it was drawn: a delay drawn near 0 reads a little below it)."""
    store = Store()
    ids = [store.enqueue(conn, validate(JobSpec(task, queue="q"))).id for task in tasks]
    leases = store.claim(conn, ["q"], "w1", 30, len(ids))
    assert sorted(lease.id for lease in leases) == sorted(ids)
    if how == "crash":
        store.record_failures(conn, "w1", [Failure(lease.id, lease.attempt, "worker process died") for lease in leases])
    else:
        for job_id in ids:
            expire_lease(conn, job_id)
        store.recover_expired_leases(conn)
    delays = [
        conn.execute(
            "SELECT extract(epoch FROM scheduled_at - now())::float FROM miniqueue_jobs WHERE id = %s", [job_id]
        ).fetchone()[0]  # type: ignore[index]
        for job_id in ids
    ]
    conn.execute("DELETE FROM miniqueue_jobs WHERE id = ANY(%s)", [ids])
    return delays


@pytest.mark.parametrize("how", ["crash", "expired lease"])
def test_an_attempt_charged_without_the_app_waits_the_tasks_own_backoff(conn: Connection, how: str) -> None:
    """The worker charges a failure with the task's backoff; the supervisor (a crashed worker's
    job) and the reaper (an expired lease) charge with the same one, as the task's workers
    published it: full jitter on its base and cap."""
    app = App()
    app.task("patient", queue="q", backoff=exponential_backoff(base=10.0, cap=15.0))(lambda job: None)
    app.task("custom", queue="q", backoff=lambda attempt: 3600.0)(lambda job: None)
    _published(conn, app)
    patient = _charge_without_the_app(conn, how, ["patient"] * 40)
    assert all(-1.0 <= delay <= 15.0 for delay in patient), patient  # min(cap 15, 10 * 2^1)
    assert max(patient) > backoff_ceiling(1), "the default backoff was used, not the task's"
    # A function of the app's own cannot be published: the default applies, as for a task no app declared.
    for task in ("custom", "undeclared"):
        delays = _charge_without_the_app(conn, how, [task] * 40)
        assert all(-1.0 <= delay <= backoff_ceiling(1) for delay in delays), (task, delays)
        assert max(delays) > 0.0


@pytest.mark.parametrize("how", ["crash", "expired lease"])
def test_runs_handed_back_uncharged_do_not_lengthen_the_next_retry(conn: Connection, how: str) -> None:
    """The delay after a failure is the backoff of the attempts charged, not of the runs: a job
    snoozed five times (six runs) that then fails its first charged attempt waits attempt 1's
    delay (0-2 s by default), whoever charges it."""
    store = Store()
    ids = [store.enqueue(conn, validate(JobSpec("t", queue="q"))).id for _ in range(20)]
    for _ in range(5):
        leases = store.claim(conn, ["q"], "w1", 30, len(ids))
        for lease in leases:
            store.snooze(conn, lease.id, "w1", lease.attempt, 0.0)
    leases = store.claim(conn, ["q"], "w1", 30, len(ids))
    assert {lease.attempt for lease in leases} == {6}, "the sixth run of each job"
    if how == "expired lease":
        for lease in leases:
            expire_lease(conn, lease.id)
        store.recover_expired_leases(conn)
    else:
        store.record_failures(conn, "w1", [Failure(lease.id, lease.attempt, "worker process died") for lease in leases])
    rows = conn.execute(
        "SELECT attempt, extract(epoch FROM scheduled_at - now())::float FROM miniqueue_jobs WHERE id = ANY(%s)", [ids]
    ).fetchall()
    assert all(attempt == 6 and delay <= backoff_ceiling(1) for attempt, delay in rows), rows


def test_a_worker_draws_the_retry_delay_from_the_attempts_charged(conn: Connection, dsn: str) -> None:
    """The worker's own backoff call is given the attempt charged (1 here), not the run (6)."""
    app = App()
    runs: list[int] = []

    @app.task("flaky", queue="q", backoff=lambda attempt: 100.0 * attempt)
    def flaky(job: Job) -> None:
        runs.append(job.run)
        if job.run <= 5:
            raise Snooze(0)
        raise RuntimeError("boom")

    Client(dsn).enqueue("flaky", queue="q")
    run_jobs(app, dsn, retries="later", timeout=30)
    row = conn.execute("SELECT attempt, extract(epoch FROM scheduled_at - now())::float FROM miniqueue_jobs").fetchone()
    assert runs == [1, 2, 3, 4, 5, 6] and row is not None
    attempt, delay = row
    assert attempt == 6 and 90.0 <= delay <= 100.0, (attempt, delay)  # backoff(1), not backoff(6) = 600 s
