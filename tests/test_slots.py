"""The worker's slots: a prefetched job never starts once its lease may have ended."""

from __future__ import annotations

import datetime as dt
import time

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
