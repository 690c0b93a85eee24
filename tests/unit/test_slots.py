"""The worker's slots: a prefetched job never starts once its lease may have ended, and a job
that runs alone starts with no other handler running and nothing beside it."""

from __future__ import annotations

import datetime as dt
import time

from miniqueue import Batch
from miniqueue.core.records import Lease
from miniqueue.tasks.job import Job
from miniqueue.worker.slots import Slots

NOW = dt.datetime.now(dt.timezone.utc)


def lease(job_id: int) -> Lease:
    return Lease(job_id, "default", "t", {}, 0, 1, 5, NOW, NOW, NOW)


def make_job(lease: Lease) -> Job:
    return Job(lease, worker_id="w")


def test_a_ready_lease_past_its_start_by_time_is_never_started() -> None:
    slots = Slots()
    stale, fresh = lease(1), lease(2)
    slots.add_ready([stale], start_by=time.monotonic() - 0.001)  # a stall outlived its lease
    slots.add_ready([fresh], start_by=time.monotonic() + 60)
    job = slots.start_next(make_job, limit=2)
    assert job is not None and job.id == 2, "the overdue lease is passed over, the next one starts"
    assert slots.start_next(make_job, limit=2) is None
    assert slots.take_overdue() == [stale]
    assert slots.leases() == [(2, 1)], "an overdue lease is no longer held (nor renewed)"


def test_a_renewal_gives_a_ready_lease_more_time() -> None:
    slots = Slots()
    slots.add_ready([lease(1)], start_by=time.monotonic() - 0.001)
    slots.renewed([1], start_by=time.monotonic() + 60)
    job = slots.start_next(make_job, limit=1)
    assert job is not None and job.id == 1
    assert slots.take_overdue() == []


def test_a_job_that_runs_alone_waits_for_the_running_handlers_and_nothing_starts_beside_it() -> None:
    slots = Slots()
    later = time.monotonic() + 60
    slots.add_ready([lease(1), lease(2)], start_by=later)
    first = slots.start_next(make_job, limit=4)
    assert first is not None and first.id == 1
    slots.add_ready([lease(3)._replace(run_alone=True), lease(4)], start_by=later)
    assert slots.start_next(make_job, limit=4) is None, "job 3 waits to run alone: nothing starts meanwhile"
    slots.finish(first)
    alone = slots.start_next(make_job, limit=4)
    assert alone is not None and alone.id == 3, "alone once no handler runs, ahead of those before it"
    assert slots.start_next(make_job, limit=4) is None, "nothing starts beside it"
    slots.finish(alone)
    started = [slots.start_next(make_job, limit=4), slots.start_next(make_job, limit=4)]
    assert [job.id for job in started if job is not None] == [2, 4], "then the others, in claim order"
    assert slots.start_next(make_job, limit=4) is None and not slots.may_hold_alone


def test_a_batch_tasks_job_that_runs_alone_starts_as_a_batch_of_one() -> None:
    slots = Slots(batches={"b": Batch(size=10, wait=0.0)})
    later = time.monotonic() + 60
    leases = [lease(n)._replace(task="b", run_alone=n == 2) for n in (1, 2, 3)]
    slots.add_ready(leases, start_by=later)
    alone = slots.start_batch(make_job, limit=2)
    assert [job.id for job in alone] == [2]
    assert slots.start_batch(make_job, limit=2) == [], "nothing starts beside it"
    slots.finish(alone[0])
    assert [job.id for job in slots.start_batch(make_job, limit=2)] == [1, 3]


def test_jobs_taken_together_run_one_at_a_time_and_others_pass_them() -> None:
    slots = Slots()
    key, other = ["concurrency t A"], ["concurrency t B"]
    together = [lease(n)._replace(limits=key, together=True) for n in (1, 2)]
    apart = [lease(3)._replace(limits=key), lease(4)._replace(limits=other, together=True)]
    slots.add_ready([*together, *apart], start_by=time.monotonic() + 60)
    started = [slots.start_next(make_job, limit=4) for _ in range(4)]
    assert [job.id if job else None for job in started] == [1, 3, 4, None], "2 waits for 1; 3 holds a slot of its own"
    first = started[0]
    assert first is not None
    slots.finish(first)
    second = slots.start_next(make_job, limit=4)
    assert second is not None and second.id == 2


def test_a_batch_takes_one_job_of_a_group_taken_together() -> None:
    slots = Slots(batches={"b": Batch(size=10, wait=0.0)})
    key = ["concurrency b A"]
    leases = [lease(n)._replace(task="b", limits=key, together=True) for n in (1, 2)] + [lease(3)._replace(task="b")]
    slots.add_ready(leases, start_by=time.monotonic() + 60)
    batch = slots.start_batch(make_job, limit=2)
    assert [job.id for job in batch] == [1, 3]
    assert slots.start_batch(make_job, limit=2) == [], "2 waits while 1 runs"
    slots.finish(batch[0])
    assert [job.id for job in slots.start_batch(make_job, limit=2)] == [2]


def test_a_batch_waiting_on_a_job_taken_together_is_not_due_until_that_job_ends() -> None:
    slots = Slots(batches={"b": Batch(size=10, wait=0.0)})
    key = ["concurrency b A"]
    slots.add_ready([lease(n)._replace(task="b", limits=key, together=True) for n in (1, 2)], time.monotonic() + 60)
    [first] = slots.start_batch(make_job, limit=2)
    assert slots.batch_due_in(time.monotonic(), limit=2) == float("inf"), "2 cannot start: the loop does not spin"
    slots.finish(first)
    assert slots.batch_due_in(time.monotonic(), limit=2) == 0.0
