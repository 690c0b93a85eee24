"""Backoff: exponential with full jitter, capped at 30 minutes (docs/guides/tasks.md),
the same whoever charges the attempt (docs/guarantees.md, "Who pays an attempt")."""

from __future__ import annotations

import math
import random

import pytest

from miniqueue import App, Client, JobSpec, Snooze, default_backoff, exponential_backoff
from miniqueue.core.backoff import backoff_ceiling
from miniqueue.core.db import Connection
from miniqueue.core.validation import validate
from miniqueue.store.store import Failure, Store
from miniqueue.tasks.job import Job
from miniqueue.testing import run_jobs

from .helpers import expire_lease

THIRTY_MINUTES = 30 * 60.0


def test_default_backoff_is_bounded_per_attempt_and_capped() -> None:
    # As docs/guides/tasks.md states it: attempt 1 waits 0-2 s, 2 0-4 s, 3 0-8 s, 4 0-16 s, ..., never over 30 minutes.
    expected = {1: 2.0, 2: 4.0, 3: 8.0, 4: 16.0, 5: 32.0, 10: 1024.0, 11: THIRTY_MINUTES, 50: THIRTY_MINUTES}
    for attempt, ceiling in expected.items():
        assert backoff_ceiling(attempt) == ceiling
        delays = [default_backoff(attempt) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays), (attempt, max(delays))
    # Full jitter spreads over the whole range, not just near the ceiling.
    assert min(default_backoff(4) for _ in range(200)) < 8.0
    assert max(default_backoff(4) for _ in range(200)) > 8.0


def test_default_backoff_jitter() -> None:
    delays = [default_backoff(3) for _ in range(100)]
    assert len(set(delays)) >= 10


def test_huge_attempt_numbers_stay_capped() -> None:
    for attempt in (64, 1_000, 10_000, 2**40):
        assert backoff_ceiling(attempt) == THIRTY_MINUTES
        assert 0.0 <= default_backoff(attempt) <= THIRTY_MINUTES


def test_backoff_is_overridable() -> None:
    fast = exponential_backoff(base=0.01, cap=0.05)
    assert backoff_ceiling(1, base=0.01, cap=0.05) == 0.02
    assert backoff_ceiling(3, base=0.01, cap=0.05) == 0.05
    assert all(0.0 <= fast(attempt) <= 0.05 for attempt in range(1, 20) for _ in range(20))


def test_seeded_generator_makes_backoff_reproducible() -> None:
    one = exponential_backoff(rng=random.Random(42))
    two = exponential_backoff(rng=random.Random(42))
    assert [one(a) for a in range(1, 12)] == [two(a) for a in range(1, 12)]


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_attempts_count_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match=f"attempt {attempt} is invalid"):
        default_backoff(attempt)
    with pytest.raises(ValueError):
        backoff_ceiling(attempt)


@pytest.mark.parametrize(("base", "cap"), [(0.0, 60.0), (-1.0, 60.0), (1.0, 0.0), (1.0, -5.0)])
def test_base_and_cap_must_be_positive(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must both be positive"):
        exponential_backoff(base=base, cap=cap)


@pytest.mark.parametrize(("base", "cap"), [(math.nan, 60.0), (1.0, math.nan)])
def test_base_and_cap_must_not_be_nan(base: float, cap: float) -> None:
    # NaN slips past `<= 0` checks and would make every delay NaN (an invalid interval in SQL).
    with pytest.raises(ValueError):
        exponential_backoff(base=base, cap=cap)


# -- one retry delay, whoever charges the attempt --------------------------------------------


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


def test_a_task_publishes_its_exponential_backoff_only() -> None:
    app = App()
    app.task("a", backoff=exponential_backoff(base=0.5, cap=60))(lambda job: None)
    app.task("b", backoff=lambda attempt: 1.0)(lambda job: None)
    app.task("c")(lambda job: None)
    published = {d.task: (d.backoff_base, d.backoff_cap) for d in app.declarations()}
    assert published == {"a": (0.5, 60.0), "b": (None, None), "c": (1.0, THIRTY_MINUTES)}


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
