"""Outcome recording on its own, on a real PostgreSQL: completions fenced by the attempt,
failures with their task's backoff, permanent failures, snoozes, lost leases, and a completion
that committed just before the connection dropped."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.core.errors import DatabaseUnavailable
from miniqueue.core.records import Lease
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.tasks.outcomes import Outcome, WorkerHooks
from miniqueue.worker.prefetch import PrefetchPolicy
from miniqueue.worker.recording import Batch, OutcomeRecorder
from miniqueue.worker.slots import Slots

from ..helpers import expire_lease, make_due, row

WORKER = "recorder-test"


class Recording:
    """A recorder for ``app`` whose jobs are claimed by :data:`WORKER` and started on its slots."""

    def __init__(self, app: App, store: Store, conn: Connection) -> None:
        self.store, self.conn = store, conn
        self.slots = Slots()
        self.prefetch = PrefetchPolicy("auto", concurrency=1, budget=0.1)
        self.recorder = OutcomeRecorder(app, store, WORKER, self.slots, self.prefetch)
        self.ended: list[tuple[int, Outcome]] = []
        self.recorder.hooks = WorkerHooks(on_job_end=lambda job, outcome: self.ended.append((job.id, outcome)))

    def claim(self, count: int) -> list[Job]:
        leases = self.store.claim(self.conn, ["default"], WORKER, 30.0, count)
        self.slots.add_ready(leases, start_by=1e12)
        jobs = []
        for _ in leases:
            job = self.slots.start_next(lambda lease: Job(lease, worker_id=WORKER), limit=count)
            assert job is not None
            jobs.append(job)
        return jobs

    def finished(self, job: Job, outcome: Outcome) -> None:
        self.slots.finish(job)
        self.recorder.add(job, outcome)

    def complete(self, batch: Batch) -> set[int]:
        return self.store.complete_many(self.conn, WORKER, batch.completions, results=batch.results)

    def flush(self) -> dict[int, str]:
        self.recorder.flush(self.conn, self.complete)
        return {job_id: outcome.kind for job_id, outcome in self.ended}


@pytest.fixture
def app() -> App:
    app = App()
    app.task("t", backoff=lambda attempt: 60.0)(lambda job: None)
    return app


def test_each_outcome_is_recorded_as_its_kind(app: App, client: Client, store: Store, conn: Connection) -> None:
    ids = [client.enqueue("t", {"i": i}).id for i in range(4)]
    last = client.enqueue("t", {}, max_attempts=1).id
    recording = Recording(app, store, conn)
    jobs = {job.id: job for job in recording.claim(5)}
    recording.finished(jobs[ids[0]], Outcome("completed", result='{"n": 1}', duration=0.5))
    recording.finished(jobs[ids[1]], Outcome("error", "Traceback ...\nValueError: boom"))
    recording.finished(jobs[ids[2]], Outcome("permanent", "PermanentError: no"))
    recording.finished(jobs[ids[3]], Outcome("snoozed", delay=30.0))
    recording.finished(jobs[last], Outcome("error", "ValueError: again"))
    assert recording.flush() == {
        ids[0]: "completed",
        ids[1]: "retried",
        ids[2]: "failed",
        ids[3]: "snoozed",
        last: "dead",
    }
    assert (row(conn, ids[0])["state"], row(conn, ids[0])["result"]) == ("completed", {"n": 1})
    retried = row(conn, ids[1])
    assert retried["state"] == "available"
    assert retried["scheduled_at"] > dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=50), "the task's backoff"
    assert dict(recording.ended)[ids[1]].delay == 60.0
    assert row(conn, ids[2])["state"] == "failed"
    snoozed = row(conn, ids[3])
    assert snoozed["state"] == "available" and snoozed["max_attempts"] == 6, "a snooze spends no attempt"
    assert row(conn, last)["state"] == "dead"
    assert len(recording.recorder) == 0 and recording.recorder.jobs_done == 5
    assert recording.slots.held() == 0, "recorded jobs leave the slots"
    assert recording.prefetch.size() > 0, "auto prefetch learned the run times"


def test_an_outcome_of_a_lost_lease_is_discarded_and_logged(
    app: App, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    done, failed = client.enqueue("t", {}).id, client.enqueue("t", {}).id
    recording = Recording(app, store, conn)
    jobs = {job.id: job for job in recording.claim(2)}
    for job_id in (done, failed):
        expire_lease(conn, job_id)
    store.recover_expired_leases(conn)
    for job_id in (done, failed):
        make_due(conn, job_id)
    assert len(store.claim(conn, ["default"], "another", 30.0, 2)) == 2, "another worker holds them now"
    recording.finished(jobs[done], Outcome("completed"))
    recording.finished(jobs[failed], Outcome("error", "ValueError: late"))
    with caplog.at_level(logging.WARNING, logger="miniqueue.worker"):
        assert recording.flush() == {done: "lease_lost", failed: "lease_lost"}
    assert row(conn, done)["state"] == row(conn, failed)["state"] == "running"
    assert row(conn, done)["leased_by"] == "another"
    assert caplog.text.count("outcome discarded") == 2


def test_a_retry_is_logged_with_the_errors_last_line_and_a_death_with_the_whole_error(
    app: App, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    retried, dead = client.enqueue("t", {}).id, client.enqueue("t", {}, max_attempts=1).id
    recording = Recording(app, store, conn)
    jobs = {job.id: job for job in recording.claim(2)}
    recording.finished(jobs[retried], Outcome("error", "Traceback (most recent call last):\nValueError: first"))
    recording.finished(jobs[dead], Outcome("error", "Traceback (most recent call last):\nValueError: last"))
    with caplog.at_level(logging.WARNING, logger="miniqueue.worker"):
        recording.flush()
    lines = {record.levelname: record.getMessage() for record in caplog.records}
    assert lines["WARNING"] == (
        f"job {retried} (t on default) attempt 1 of 5 failed; retrying in 60.0s: ValueError: first"
    )
    assert lines["ERROR"].startswith(f"job {dead} (t on default) attempt 1 of 1 failed; no attempts left")
    assert "Traceback (most recent call last)" in lines["ERROR"]


def test_a_completion_that_committed_before_the_connection_dropped_is_not_reported_lost(
    app: App, client: Client, store: Store, conn: Connection
) -> None:
    job_id = client.enqueue("t", {}).id
    recording = Recording(app, store, conn)
    (job,) = recording.claim(1)
    recording.finished(job, Outcome("completed"))

    def commits_then_drops(batch: Batch) -> set[int]:
        recording.complete(batch)
        raise DatabaseUnavailable("the connection dropped")

    with pytest.raises(DatabaseUnavailable):
        recording.recorder.flush(conn, commits_then_drops)
    assert len(recording.recorder) == 1, "the outcome stays queued until the database has it"
    assert recording.flush() == {job_id: "completed"}, "the retry matched nothing, yet the job is ours and completed"


def test_a_batch_sends_the_completions_and_their_results() -> None:
    def job(job_id: int, limits: list[str] | None) -> Job:
        now = dt.datetime.now(dt.timezone.utc)
        return Job(Lease(job_id, "default", "t", {}, 0, 1, 5, now, now, now, limits), worker_id=WORKER)

    batch = Batch.of(
        [
            (job(1, ["concurrency t A"]), Outcome("completed", result="1")),
            (job(2, ["concurrency t B"]), Outcome("error", "x")),
            (job(3, None), Outcome("completed")),
        ]
    )
    assert batch.completions == [(1, 1), (3, 1)]
    assert batch.results == {1: "1"}


def test_outcomes_a_flush_records_do_not_count_as_waiting(
    app: App, client: Client, store: Store, conn: Connection
) -> None:
    # Handlers wake the claim loop once enough outcomes wait for a claim: those of the flush
    # under way are not among them, nor, after it, those it recorded.
    for i in range(3):
        client.enqueue("t", {"i": i})
    recording = Recording(app, store, conn)
    first, second, third = recording.claim(3)
    recording.finished(first, Outcome("completed"))
    recording.finished(second, Outcome("completed"))
    seen = []

    def complete(batch: Batch) -> set[int]:
        recording.finished(third, Outcome("completed"))  # a handler finishing meanwhile
        seen.append(recording.recorder.unrecorded())
        return recording.complete(batch)

    recording.recorder.flush(conn, complete)
    assert seen == [1] and recording.recorder.unrecorded() == 1 and len(recording.recorder) == 1
    assert recording.flush() == {first.id: "completed", second.id: "completed", third.id: "completed"}
    assert recording.recorder.unrecorded() == 0
