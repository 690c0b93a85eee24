"""Dispatch and handler runs on their own: ready jobs handed to handler threads and the event
loop, their outcomes queued and classified, stop requests passed on. No database: the jobs come
from fabricated leases, and the outcomes stay in the queue the claim loop would record."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from miniqueue import PermanentError, Snooze
from miniqueue.core.records import Lease
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.tasks.outcomes import Outcome, WorkerHooks
from miniqueue.tasks.task import is_async_handler
from miniqueue.worker.aio import EventLoop
from miniqueue.worker.claiming import ClaimPolicy
from miniqueue.worker.config import WorkerConfig
from miniqueue.worker.dispatch import Dispatcher
from miniqueue.worker.execute import Executor
from miniqueue.worker.handlerthreads import HandlerThreads
from miniqueue.worker.recording import OutcomeRecorder
from miniqueue.worker.slots import Slots

from ..helpers import wait_until

NOW = dt.datetime.now(dt.timezone.utc)
FAR = 1e12


def lease(job_id: int, task: str = "t", *, limits: list[str] | None = None) -> Lease:
    return Lease(job_id, "default", task, {"n": job_id}, 0, 1, 5, NOW, NOW, NOW, limits)


def job(task: str = "t", job_id: int = 1) -> Job:
    return Job(lease(job_id, task), worker_id="w")


def no_transaction(job: Job) -> Any:
    raise AssertionError("no handler here opens a transaction")


class Parts:
    """A dispatcher and what it works with, for ``app``."""

    def __init__(self, app: App, *, concurrency: int = 2) -> None:
        async_tasks = frozenset(name for name, task in app.tasks.items() if is_async_handler(task.handler))
        kinds = (False, True) if async_tasks else (False,)
        self.slots = Slots(async_tasks)
        self.claims = ClaimPolicy(WorkerConfig(concurrency=concurrency, prefetch=0), self.slots, kinds=kinds)
        self.outcomes = OutcomeRecorder(app, Store(), "w", self.slots, self.claims.prefetch)
        self.wake = threading.Event()
        self.started: list[int] = []
        self.dispatcher = Dispatcher(
            app=app,
            slots=self.slots,
            claims=self.claims,
            outcomes=self.outcomes,
            executor=Executor(app, max_result_bytes=1000),
            wake=self.wake,
            worker_id="w",
            concurrency=concurrency,
            kinds=kinds,
            transaction=no_transaction,
            atransaction=no_transaction,
            read_results=lambda job: [],
            max_result_bytes=1000,
        )
        self.dispatcher.hooks = WorkerHooks(on_job_start=lambda job: self.started.append(job.id))
        self.dispatcher.threads = HandlerThreads(concurrency, "test-handler")

    def recorded(self) -> dict[int, Outcome]:
        return {job.id: outcome for job, outcome in self.outcomes.queue}


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    aio = EventLoop("test-loop")
    aio.start()
    yield aio
    aio.stop(1.0)


# -- dispatch ------------------------------------------------------------------------------------


def test_ready_jobs_run_on_handler_threads_and_their_outcomes_wait_to_be_recorded() -> None:
    app = App()
    ran: list[tuple[int, str]] = []
    app.task("t")(lambda job: ran.append((job.id, threading.current_thread().name)))
    parts = Parts(app)
    parts.slots.add_ready([lease(i) for i in range(1, 6)], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: len(parts.outcomes) == 5, what="five outcomes queued")
    assert sorted(job_id for job_id, _ in ran) == [1, 2, 3, 4, 5]
    assert {name for _, name in ran} <= {"test-handler_0", "test-handler_1"}
    assert {outcome.kind for outcome in parts.recorded().values()} == {"completed"}
    assert sorted(parts.started) == [1, 2, 3, 4, 5], "every start is told, by the loop or the handler"
    assert parts.wake.is_set()
    assert sorted(job_id for job_id, _ in parts.slots.finishing) == [1, 2, 3, 4, 5] and not parts.slots.running


def test_a_finished_job_holding_a_concurrency_slot_is_a_reason_to_claim() -> None:
    app = App()
    app.task("t")(lambda job: None)
    parts = Parts(app)
    parts.claims.begin_claim()
    parts.slots.add_ready([lease(1, limits=["concurrency t A"])], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: len(parts.outcomes) == 1, what="the outcome queued")
    assert parts.claims.freed_slot


def test_nothing_starts_once_stopping() -> None:
    app = App()
    gate = threading.Event()
    app.task("t")(lambda job: gate.wait(5))
    parts = Parts(app, concurrency=1)
    parts.slots.add_ready([lease(1), lease(2)], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: parts.started == [1], what="the first job started")
    parts.dispatcher.stopping = True
    gate.set()
    wait_until(lambda: len(parts.outcomes) == 1, what="the first outcome queued")
    parts.dispatcher.dispatch()
    assert parts.started == [1] and parts.slots.has_ready(), "the second job stays ready, to be handed back"
    assert parts.wake.is_set()


def test_a_lease_past_its_start_by_time_is_not_started_but_set_aside_to_be_handed_back() -> None:
    app = App()
    app.task("t")(lambda job: None)
    parts = Parts(app)
    stale = lease(1)
    parts.slots.add_ready([stale], start_by=time.monotonic() - 1)
    parts.dispatcher.dispatch()
    assert parts.started == []
    assert parts.slots.take_overdue() == [stale]


def test_async_jobs_run_on_the_event_loop_each_as_a_task_of_its_own(loop: EventLoop) -> None:
    app = App()
    threads: set[str] = set()

    @app.task("a")
    async def handler(job: Job) -> int:
        threads.add(threading.current_thread().name)
        await asyncio.sleep(0.01)
        return job.id * 10

    parts = Parts(app)
    parts.dispatcher.aio = loop
    parts.slots.add_ready([lease(i, "a") for i in range(1, 5)], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: len(parts.outcomes) == 4, what="four async outcomes queued")
    assert threads == {"test-loop"}
    assert {job_id: outcome.result for job_id, outcome in parts.recorded().items()} == {
        1: "10",
        2: "20",
        3: "30",
        4: "40",
    }


def test_a_lost_lease_stops_its_handler_and_drops_an_unstarted_one() -> None:
    app = App()
    app.task("t")(lambda job: job.wait(5))
    parts = Parts(app, concurrency=1)
    parts.slots.add_ready([lease(1), lease(2)], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: parts.started == [1], what="the first job started")
    parts.dispatcher.stop_lost({(1, 1): "cancelled", (2, 1): "lease lost"})
    wait_until(lambda: len(parts.outcomes) == 1, what="the stopped handler's outcome")
    running = parts.slots.running_jobs()
    assert running == [] and not parts.slots.has_ready(), "the unstarted job is forgotten, not run"
    (stopped,) = [job for job, _ in parts.outcomes.queue]
    assert stopped.stop_reason == "cancelled"


def test_a_lost_lease_leaves_a_newer_lease_of_the_same_job_alone() -> None:
    """The heartbeat reports a lease lost by its run: the job claimed again by the same worker
    since (its old lease expired and was recovered) keeps its new lease, started or not."""
    app = App()
    app.task("t")(lambda job: job.wait(5))
    parts = Parts(app, concurrency=1)
    again = Lease(1, "default", "t", {"n": 1}, 0, 2, 5, NOW, NOW, NOW, None)
    parts.slots.add_ready([again, lease(2)], start_by=FAR)
    parts.dispatcher.stop_lost({(2, 1): "lease lost", (1, 1): "lease lost"})
    assert [held for held in parts.slots.leases()] == [(1, 2)], "only the lost run is forgotten"
    parts.dispatcher.dispatch()
    wait_until(lambda: parts.started == [1], what="the newer lease started")
    parts.dispatcher.stop_lost({(1, 1): "lease lost"})
    (running,) = parts.slots.running_jobs()
    assert running.run == 2 and running.stop_reason is None
    parts.dispatcher.stop_lost({(1, 2): "lease lost"})
    wait_until(lambda: len(parts.outcomes) == 1, what="the stopped handler's outcome")


def test_a_stale_handler_that_ends_leaves_the_newer_run_of_its_job_held() -> None:
    """A worker runs a job's new lease beside its stale handler (the old lease lost, the job
    claimed again): the stale one ending takes nothing of the new run's, which stays held."""
    app = App()
    app.task("t")(lambda job: None)
    slots = Parts(app, concurrency=2).slots
    again = Lease(1, "default", "t", {"n": 1}, 0, 2, 5, NOW, NOW, NOW, None)
    stale, new = Job(lease(1), worker_id="w"), Job(again, worker_id="w")
    slots.running[(1, 1)], slots.running[(1, 2)] = stale, new
    slots.finish(stale)
    slots.forget(stale)
    assert slots.running_jobs() == [new] and list(slots.leases()) == [(1, 2)]


def test_a_handler_past_its_timeout_is_told_to_stop() -> None:
    app = App()
    app.task("slow", timeout=60)(lambda job: job.wait(5))
    parts = Parts(app, concurrency=1)
    parts.slots.add_ready([lease(1, "slow")], start_by=FAR)
    parts.dispatcher.dispatch()
    wait_until(lambda: parts.started == [1], what="the job started")
    (running,) = parts.slots.running_jobs()
    parts.dispatcher.stop_timed_out()
    assert running.stop_reason is None, "not yet past its timeout"
    running.started_at -= 61.0  # as if it had run past its timeout (no waiting on the clock)
    parts.dispatcher.stop_timed_out()
    wait_until(lambda: len(parts.outcomes) == 1, what="the stopped handler's outcome")
    assert running.stop_reason == "timeout"


# -- what a handler did --------------------------------------------------------------------------


def run_one(handler: Any, *, task: str = "t", max_result_bytes: int = 1000) -> Outcome:
    app = App()
    app.task(task)(handler)
    return Executor(app, max_result_bytes=max_result_bytes).run(job(task))


def test_a_return_is_a_completion_with_its_result() -> None:
    outcome = run_one(lambda job: {"ok": True})
    assert outcome.kind == "completed" and json.loads(outcome.result or "") == {"ok": True}
    assert outcome.duration >= 0


def test_a_result_set_by_the_handler_is_kept_when_it_returns_nothing() -> None:
    outcome = run_one(lambda job: job.set_result([1, 2]))
    assert outcome.kind == "completed" and json.loads(outcome.result or "") == [1, 2]


def test_a_result_that_cannot_be_stored_fails_the_attempt() -> None:
    assert run_one(lambda job: "x" * 2000).kind == "error"
    outcome = run_one(lambda job: object())
    assert outcome.kind == "error" and "cannot be stored as its result" in (outcome.error or "")


def test_what_a_handler_raises_is_its_outcome() -> None:
    def fails(job: Job) -> None:
        raise ValueError("boom")

    def gives_up(job: Job) -> None:
        raise PermanentError("no")

    def snoozes(job: Job) -> None:
        raise Snooze(7)

    error = run_one(fails)
    assert error.kind == "error" and "ValueError: boom" in (error.error or "")
    assert isinstance(error.exception, ValueError)
    assert run_one(gives_up).kind == "permanent"
    snoozed = run_one(snoozes)
    assert (snoozed.kind, snoozed.delay) == ("snoozed", 7.0)


def test_a_def_handler_that_returns_a_coroutine_did_not_run() -> None:
    async def body() -> None:
        pass

    outcome = run_one(lambda job: body())
    assert outcome.kind == "error" and "awaits only handlers defined with 'async def'" in (outcome.error or "")


def test_a_job_of_an_unknown_task_is_handed_back_uncharged_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    executor = Executor(App(), max_result_bytes=1000)
    runs = [executor.run(job("gone", 1)), executor.run(job("gone", 2))]
    assert [(r.kind, r.delay) for r in runs] == [("snoozed", 5.0), ("snoozed", 5.0)]
    assert caplog.text.count("no handler is registered for task 'gone'") == 1


def test_the_hooks_see_each_handler_start_and_end() -> None:
    app = App()
    app.task("t")(lambda job: None)
    seen: list[str] = []
    hooks = WorkerHooks(
        on_handler_start=lambda job: seen.append("start"), on_handler_end=lambda job: seen.append("end")
    )
    Executor(app, max_result_bytes=1000, hooks=hooks).run(job())
    assert seen == ["start", "end"]


def test_an_async_handler_cancelled_has_that_as_its_outcome() -> None:
    app = App()

    @app.task("a")
    async def waits(job: Job) -> None:
        await asyncio.sleep(10)

    async def cancel_it() -> Outcome:
        task = asyncio.ensure_future(Executor(app, max_result_bytes=1000).run_async(job("a")))
        await asyncio.sleep(0.01)
        task.cancel("the job should stop")
        return await task

    outcome = asyncio.run(cancel_it())
    assert outcome.kind == "error" and "CancelledError" in (outcome.error or "")
