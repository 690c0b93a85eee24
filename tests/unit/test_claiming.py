"""The claim policy on its own: when a worker claims, how many jobs, and where among limited
jobs. Pure decisions on fabricated slots and times: no database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from miniqueue.core.records import Lease
from miniqueue.store.store import MAX_GROUPS_PER_CLAIM
from miniqueue.tasks.job import Job
from miniqueue.tasks.outcomes import Outcome, OutcomeKind
from miniqueue.worker import claiming
from miniqueue.worker.claiming import ClaimPolicy, goes_down
from miniqueue.worker.config import WorkerConfig
from miniqueue.worker.slots import Slots, start_deadline

NOW = dt.datetime.now(dt.timezone.utc)
FAR = 1e12  # a start-by time no test reaches


def lease(job_id: int, *, task: str = "t", limits: list[str] | None = None) -> Lease:
    return Lease(job_id, "default", task, {}, 0, 1, 5, NOW, NOW, NOW, limits)


def policy(slots: Slots | None = None, **config: Any) -> ClaimPolicy:
    return ClaimPolicy(WorkerConfig(**config), slots or Slots())


def run(slots: Slots, job_id: int, *, started_at: float, task: str = "t") -> Job:
    """Put a job on the slots as running since ``started_at`` (monotonic)."""
    slots.add_ready([lease(job_id, task=task)], start_by=FAR)
    job = slots.start_next(lambda lease: Job(lease, worker_id="w"), limit=1000, run_async=slots.is_async(task))
    assert job is not None
    job.started_at = started_at
    return job


# -- how many ------------------------------------------------------------------------------------


def test_a_fresh_worker_claims_its_free_handlers_at_once() -> None:
    claims = policy(concurrency=4)
    assert claims.claim_size(False, finishing=0, jobs_done=0, now=0.0) == 4, "nudged at start; auto holds none yet"


def test_without_a_reason_nothing_is_claimed_until_the_poll() -> None:
    claims = policy(concurrency=4)
    claims.begin_claim()
    assert claims.claim_size(False, finishing=0, jobs_done=0, now=0.0) == 0
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=0.0) == 4


@pytest.mark.parametrize("reason", ["nudge", "backlog", "freed_slot"])
def test_each_reason_claims_without_waiting_for_the_poll(reason: str) -> None:
    claims = policy(concurrency=2)
    claims.begin_claim()
    if reason == "nudge":
        claims.nudge()
    elif reason == "backlog":
        claims.claimed([lease(1), lease(2)], 2, set(), now=0.0)
    else:
        claims.note_finished(["concurrency t A"])
    assert claims.claim_size(False, finishing=0, jobs_done=0, now=0.0) == 2


def test_a_rate_limited_job_finishing_frees_no_slot() -> None:
    claims = policy()
    claims.begin_claim()
    claims.note_finished(["rate t"])
    claims.note_finished(None)
    assert not claims.freed_slot
    claims.note_finished(["rate t", "concurrency t A"])
    assert claims.freed_slot
    claims.begin_claim()
    assert not claims.freed_slot and not claims.nudged, "a claim spends its reasons"


def test_a_short_claim_is_no_backlog() -> None:
    claims = policy()
    claims.claimed([lease(1)], 3, set(), now=0.0)
    assert not claims.backlog
    claims.claimed([lease(2), lease(3)], 2, set(), now=0.0)
    assert claims.backlog


def test_prefetch_claims_in_batches_of_half_what_it_holds() -> None:
    slots = Slots()
    claims = policy(slots, concurrency=2, prefetch=6)  # holds 8: claims at 4 free or when dry
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=0.0) == 8
    assert claims.claim_batch == 4
    slots.add_ready([lease(i) for i in range(5)], start_by=FAR)
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=0.0) == 0, "3 free: fewer than a batch"
    assert claims.claim_size(True, finishing=1, jobs_done=0, now=0.0) == 4, "an outcome about to be recorded frees one"
    dry = Slots()
    claims = policy(dry, concurrency=2, prefetch=6)
    for job_id in range(5):
        run(dry, job_id, started_at=0.0)
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=0.0) == 3, "the buffer ran dry: claim what is free"


def test_auto_prefetch_holds_what_the_handlers_finish_within_the_budget() -> None:
    claims = policy(concurrency=2, prefetch="auto", prefetch_budget=0.125)
    for _ in range(10):
        claims.prefetch.record(1 / 64)  # 2 threads x 1/8 s / (1/64 s) = 16 beyond the threads
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=0.0) == 18


def test_max_jobs_caps_the_claim_at_what_the_worker_will_still_run() -> None:
    slots = Slots()
    claims = policy(slots, concurrency=4, prefetch=0, max_jobs=10)
    assert claims.claim_size(True, finishing=0, jobs_done=8, now=0.0) == 2
    slots.add_ready([lease(1)], start_by=FAR)
    assert claims.claim_size(True, finishing=0, jobs_done=9, now=0.0) == 0, "the one held is the tenth"


# -- handing back --------------------------------------------------------------------------------


def test_every_handler_stuck_past_the_budget_hands_the_ready_jobs_back() -> None:
    slots = Slots()
    claims = policy(slots, concurrency=2, prefetch="auto", prefetch_budget=0.1)
    run(slots, 1, started_at=10.0)
    run(slots, 2, started_at=10.05)
    slots.add_ready([lease(3)], start_by=FAR)
    assert claims.to_hand_back(now=10.1) == set(), "one handler is still within the budget"
    assert claims.stuck_in(now=10.1) == pytest.approx(0.051)
    assert claims.to_hand_back(now=10.2) == {False}
    assert claims.stuck_in(now=10.2) == pytest.approx(0.001)


def test_after_a_hand_back_only_the_poll_claims_while_the_handlers_stay_stuck() -> None:
    # An app with both kinds: its one handler thread is stuck, its event loop idle.
    slots = Slots(frozenset({"a"}))
    cfg = WorkerConfig(concurrency=1, prefetch="auto", prefetch_budget=0.1)
    claims = ClaimPolicy(cfg, slots, kinds=(False, True), handler_kinds=2)
    job = run(slots, 1, started_at=0.0)
    claims.handed_back_kinds({False})
    claims.nudge()
    assert claims.claim_size(False, finishing=0, jobs_done=0, now=1.0) == 0, "a notification is no reason now"
    assert claims.claim_size(True, finishing=0, jobs_done=0, now=1.0) == 1, "the poll is"
    slots.finish(job)
    slots.forget(job)
    assert claims.claim_size(False, finishing=0, jobs_done=1, now=1.0) == 2, "unstuck: the notification counts again"
    assert claims.handed_back == set()


def test_a_fixed_prefetch_never_hands_back() -> None:
    slots = Slots()
    claims = policy(slots, concurrency=1, prefetch=4)
    run(slots, 1, started_at=0.0)
    slots.add_ready([lease(2)], start_by=FAR)
    assert claims.to_hand_back(now=100.0) == set()
    assert claims.stuck_in(now=100.0) == float("inf")


def test_each_kind_of_handler_is_judged_alone() -> None:
    slots = Slots(frozenset({"a"}))
    cfg = WorkerConfig(concurrency=1, prefetch="auto", prefetch_budget=0.1)
    claims = ClaimPolicy(cfg, slots, kinds=(False, True), handler_kinds=2)
    run(slots, 1, started_at=0.0)  # the one thread is stuck
    slots.add_ready([lease(2), lease(3, task="a")], start_by=FAR)
    assert claims.busy_kinds(now=1.0) == {False}
    assert claims.to_hand_back(now=1.0) == {False}, "the async job waits for an idle event loop, not a thread"


# -- the limited-jobs cursor ---------------------------------------------------------------------


def test_the_cursor_moves_past_the_last_group_claimed_in_the_workers_direction() -> None:
    groups = [lease(i, limits=[f"concurrency t k{i}"]) for i in range(3)]
    up, down = policy(), policy(descending=True)
    up.claimed(groups, 3, set(), now=5.0)
    down.claimed(groups, 3, set(), now=5.0)
    assert up.cursor == ["concurrency t k2"]
    assert down.cursor == ["concurrency t k0"]
    assert up.limited_at == 5.0


def test_a_claim_of_as_many_groups_as_a_claim_takes_goes_on_at_once() -> None:
    claims = policy()
    claims.begin_claim()
    groups = [lease(i, limits=[f"concurrency t k{i:03}"]) for i in range(MAX_GROUPS_PER_CLAIM)]
    claims.claimed(groups, MAX_GROUPS_PER_CLAIM + 5, set(), now=0.0)
    assert claims.cursor == [f"concurrency t k{MAX_GROUPS_PER_CLAIM - 1:03}"]
    assert claims.nudged


def test_a_short_claim_from_a_cursor_starts_over_from_the_first_group_at_once() -> None:
    claims = policy()
    claims.cursor = ["concurrency t k5"]
    claims.begin_claim()
    claims.claimed([lease(1, limits=["concurrency t k7"])], 3, set(), now=0.0)
    assert claims.cursor == [] and claims.nudged


def test_a_claim_of_no_limited_job_resets_the_cursor() -> None:
    claims = policy()
    claims.cursor = ["concurrency t k5"]
    claims.claimed([lease(1)], 1, set(), now=0.0)
    assert claims.cursor == [] and claims.limited_at == float("-inf")


def test_while_limited_jobs_flow_the_worker_polls_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    claims = policy(poll_interval=1.0)
    assert claims.poll_interval(now=100.0) == 1.0
    claims.claimed([lease(1, limits=["concurrency t A"])], 1, set(), now=100.0)
    assert claims.poll_interval(now=101.0) == claiming.LIMITED_POLL_INTERVAL
    later = 100.0 + claiming.LIMITED_POLL_WINDOW
    assert claims.poll_interval(now=later) == 1.0
    monkeypatch.setattr(claiming, "LIMITED_POLL_INTERVAL", 60.0)
    assert claims.poll_interval(now=101.0) == 1.0, "never slower than the worker's own poll"


def test_every_other_supervised_worker_goes_down() -> None:
    assert [goes_down(slot) for slot in ("worker-1", "worker-2", "worker-7", "worker-12", "reaper")] == [
        False,
        True,
        False,
        True,
        False,
    ]


def test_a_ready_lease_must_start_with_a_margin_before_it_ends() -> None:
    assert start_deadline(100.0, 30.0) == pytest.approx(127.0), "a tenth of a long lease"
    assert start_deadline(100.0, 5.0) == pytest.approx(104.0), "at least a second"
    assert start_deadline(100.0, 1.0) == pytest.approx(100.5), "at most half the lease"


def test_a_claim_takes_together_what_one_handler_runs_and_looks_for_as_many_groups_as_it_needs() -> None:
    claims = policy(concurrency=4)
    assert (claims.together(100), claims.together(3), claims.per_group) == (25, 1, 1)
    keyed = [lease(n, limits=[f"concurrency t k{n % 5}"])._replace(together=True) for n in range(50)]
    claims.claimed(keyed, 100, set(), now=1.0)
    assert (claims.per_group, claims.cursor) == (10, ["concurrency t k4"]), "50 jobs over 5 groups"
    keyed = [lease(n, limits=[f"concurrency t k{5 + n % 9}"])._replace(together=True) for n in range(90)]
    claims.claimed(keyed, 100, set(), now=2.0)
    assert claims.cursor == [], "short, having looked for 10 groups and found 9: back to the first group"
    keyed = [lease(n, limits=[f"concurrency t k{n % 10}"])._replace(together=True) for n in range(90)]
    claims.claimed(keyed, 100, set(), now=3.0)
    assert claims.cursor == ["concurrency t k9"], "short, but all 10 groups looked for were found: go on"
    spare = [lease(100 + n, limits=[f"concurrency t s{n}"])._replace(together=True) for n in range(16)]
    claims.claimed(keyed[:84] + spare, 100, set(), now=4.0)
    assert claims.per_group == 8, "84 jobs over 10 groups; the spare groups' one job each does not count"
    cut = [lease(n, limits=[f"concurrency t k{n // 10}"])._replace(together=True) for n in range(78)]
    claims.claimed(cut, 78, set(), now=4.5)
    assert claims.per_group == 10, "7 groups of 10 and the last cut to 8 by the claim's size: 10 a group"
    claims.claimed([lease(1, limits=["concurrency t k1"])], 100, set(), now=5.0)
    assert claims.per_group == 1, "no job taken together"


def test_a_claim_looks_first_at_the_groups_completing_but_not_at_those_its_last_claim_emptied() -> None:
    claims = policy(concurrency=1)  # a claim of 100 takes up to 100 jobs of a group together
    emptied = [lease(n, limits=["concurrency t A"])._replace(together=True) for n in range(3)]
    spare = [lease(10, limits=["concurrency t B"])._replace(together=True)]
    alone = [lease(20 + n, limits=["concurrency t C"]) for n in range(2)]  # a limit of 2: a slot each
    claims.claimed(emptied + spare + alone, 100, set(), now=1.0)
    assert claims.spent == {0, 1, 2}, "3 jobs of A, fewer than 100: every job A had"

    def done(job: Lease, kind: OutcomeKind = "completed") -> tuple[Job, Outcome]:
        return Job(job, worker_id="w"), Outcome(kind)

    outcomes = [done(emptied[0]), done(spare[0]), done(alone[0]), done(alone[1], "error"), done(lease(30))]
    assert claims.kept(outcomes) == {10: ("concurrency t B",), 20: ("concurrency t C",)}
    assert claims.spent == {1, 2}, "the jobs that ended are forgotten"
    assert claims.kept([done(emptied[1])]) == {} and claims.spent == {2}
    full = [lease(40 + n, limits=["concurrency t D"])._replace(together=True) for n in range(4)]
    claims.claimed(full, 4, set(), now=2.0)
    assert claims.spent == {2}, "4 jobs of D, as many as a claim of 4 takes together: D may have more"
