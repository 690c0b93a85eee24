"""The supervisor's decisions without forking: restart back-off, resizing, and which child is
killed or retired and on whose account, on fabricated children and times."""

from __future__ import annotations

from collections.abc import Callable

from miniqueue.supervise import decisions
from miniqueue.supervise.children import Child, RunningJob
from miniqueue.supervise.decisions import Kill, Restart, RestartBackoff, Retire, overdue, resize


def child(
    slot: str = "worker-1",
    *,
    started: float = 0.0,
    last_report: float = 0.0,
    ready: bool = True,
    pid: int = 100,
    reaper: bool = False,
) -> Child:
    worker_id = None if reaper else f"host:{pid}:abc"
    return Child(
        slot=slot, pid=pid, read_fd=-1, worker_id=worker_id, started=started, last_report=last_report, ready=ready
    )


# -- restarts ------------------------------------------------------------------------------------


def test_quick_crashes_in_a_row_double_the_wait_up_to_the_cap() -> None:
    backoff = RestartBackoff(boot_failure_limit=3)
    delays = [backoff.exited(child(started=t), clean=False, stopping=False, now=t + 1.0).delay for t in range(10)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    assert backoff.restarts == {"worker-1": 10}


def test_a_child_that_lived_past_stable_after_restarts_at_once() -> None:
    backoff = RestartBackoff(boot_failure_limit=3)
    for t in range(3):
        backoff.exited(child(started=t), clean=False, stopping=False, now=t + 1.0)
    lived = 100.0 + decisions.STABLE_AFTER_SECONDS
    stable = backoff.exited(child(started=100.0), clean=False, stopping=False, now=lived)
    assert stable == Restart(0.0, counted=True)
    assert backoff.exited(child(started=200.0), clean=False, stopping=False, now=201.0).delay == 0.1, "counted anew"


def test_a_clean_exit_restarts_at_once_and_is_no_restart() -> None:
    backoff = RestartBackoff(boot_failure_limit=3)
    backoff.exited(child(), clean=False, stopping=False, now=1.0)
    assert backoff.exited(child(), clean=True, stopping=False, now=1.0) == Restart(0.0, counted=False)
    assert backoff.restarts == {"worker-1": 1}


def test_each_slot_backs_off_on_its_own() -> None:
    backoff = RestartBackoff(boot_failure_limit=3)
    backoff.exited(child("worker-1"), clean=False, stopping=False, now=1.0)
    backoff.exited(child("worker-1"), clean=False, stopping=False, now=1.0)
    assert backoff.exited(child("worker-2"), clean=False, stopping=False, now=1.0).delay == 0.1
    assert backoff.failures == {"worker-1": 2, "worker-2": 1}


def test_children_that_keep_failing_to_boot_make_the_supervisor_give_up() -> None:
    backoff = RestartBackoff(boot_failure_limit=3)
    first = backoff.exited(child("worker-1", ready=False), clean=False, stopping=False, now=1.0)
    assert first.give_up is None and first.delay == 0.1
    backoff.exited(child("worker-2", ready=False), clean=False, stopping=False, now=1.0)
    broken = child("reaper", ready=False, reaper=True)
    broken.error = "ImportError: no module named app"
    third = backoff.exited(broken, clean=False, stopping=False, now=1.0)
    assert third.give_up == (
        "reaper failed to boot 3 times in a row; giving up. Last error:\nImportError: no module named app"
    )
    assert "reaper" not in backoff.restarts, "giving up restarts nothing"


def test_a_ready_child_ends_the_boot_failures_in_a_row() -> None:
    backoff = RestartBackoff(boot_failure_limit=2)
    backoff.exited(child(ready=False), clean=False, stopping=False, now=1.0)
    backoff.booted()
    assert backoff.exited(child(ready=False), clean=False, stopping=False, now=1.0).give_up is None
    assert backoff.boot_failures == 1


def test_a_child_that_exits_unready_while_stopping_is_no_boot_failure() -> None:
    backoff = RestartBackoff(boot_failure_limit=1)
    assert backoff.exited(child(ready=False), clean=True, stopping=True, now=1.0).give_up is None
    assert backoff.boot_failures == 0


# -- resizing ------------------------------------------------------------------------------------


def test_ttin_adds_a_slot_after_the_last_and_ttou_removes_the_last() -> None:
    slots = ["worker-1", "worker-2", "worker-10", "reaper"]
    assert resize(slots, +1) == decisions.Resize("worker-11", add=True, workers=4)
    assert resize(slots, -1) == decisions.Resize("worker-10", add=False, workers=2)


def test_ttou_never_removes_the_last_worker() -> None:
    assert resize(["worker-3", "reaper"], -1) is None
    assert resize(["worker-3", "reaper"], +1) == decisions.Resize("worker-4", add=True, workers=2)


# -- kills ---------------------------------------------------------------------------------------

LIVENESS, GRACE = 30.0, 5.0


def check(
    children: list[Child],
    now: float,
    *,
    max_memory_mb: float | None = None,
    rss_mb: Callable[[int], float | None] = lambda pid: None,
) -> list[Kill | Retire]:
    return overdue(
        children, now, liveness_timeout=LIVENESS, timeout_grace=GRACE, max_memory_mb=max_memory_mb, rss_mb=rss_mb
    )


def test_a_job_past_its_timeout_and_grace_gets_its_worker_killed_on_its_account() -> None:
    busy = child(last_report=100.0)
    busy.jobs = {
        7: RunningJob(attempt=1, task="quick", started=90.0, timeout=None),
        8: RunningJob(attempt=2, task="slow", started=90.0, timeout=4.0),
    }
    assert check([busy], now=99.0) == [], "4s timeout + 5s grace: not yet"
    assert check([busy], now=99.5) == [
        Kill(busy, "worker process killed: job 8 (slow) exceeded its 4s timeout", killed_for=8)
    ]


def test_one_kill_per_worker_for_the_first_job_past_its_timeout() -> None:
    busy = child(last_report=100.0)
    busy.jobs = {3: RunningJob(1, "a", 0.0, 1.0), 4: RunningJob(1, "b", 0.0, 1.0)}
    (kill,) = check([busy], now=100.0)
    assert isinstance(kill, Kill) and kill.killed_for == 3


def test_a_silent_child_is_killed_on_no_jobs_account() -> None:
    silent, talking = child("worker-1", last_report=0.0), child("worker-2", pid=101, last_report=20.0)
    silent.jobs = {5: RunningJob(1, "t", 0.0, 1.0)}
    assert check([silent, talking], now=31.0) == [Kill(silent, "worker process killed: no report for 31s")]


def test_a_child_already_killed_is_left_to_die_but_a_retiring_one_can_be_killed() -> None:
    killed, retiring = child("worker-1"), child("worker-2", pid=101)
    killed.kill_reason = "worker process killed: no report for 31s"
    retiring.kill_reason, retiring.retiring = "worker process stopped: RSS", True
    assert [action.child.slot for action in check([killed, retiring], now=40.0)] == ["worker-2"]


def test_a_worker_over_the_memory_ceiling_is_retired_not_killed() -> None:
    fat, thin, reaper = child("worker-1", pid=1), child("worker-2", pid=2), child("reaper", pid=3, reaper=True)
    rss = {1: 600.0, 2: 100.0, 3: 900.0}
    actions = check([fat, thin, reaper], now=1.0, max_memory_mb=512.0, rss_mb=rss.get)
    assert actions == [Retire(fat, "RSS 600 MB is over --max-memory-per-child 512 MB")], "the reaper is never retired"
    assert check([fat], now=1.0, max_memory_mb=None, rss_mb=rss.get) == []
    fat.retiring = True
    assert check([fat], now=1.0, max_memory_mb=512.0, rss_mb=rss.get) == [], "already retiring"


def test_memory_is_read_only_when_there_is_a_ceiling_and_no_kill() -> None:
    read: list[int] = []

    def rss_mb(pid: int) -> float | None:
        read.append(pid)
        return None  # the process is gone: nothing to do

    busy = child("worker-1", pid=1)
    busy.jobs = {9: RunningJob(1, "t", 0.0, 1.0)}
    assert check([busy, child("worker-2", pid=2)], now=10.0, max_memory_mb=512.0, rss_mb=rss_mb) == [
        Kill(busy, "worker process killed: job 9 (t) exceeded its 1s timeout", killed_for=9)
    ]
    assert read == [2]
