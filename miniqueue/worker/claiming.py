"""The claim loop's policy: when a worker claims, how many jobs, and where among limited jobs.

Every decision that steers a worker's claims is made here, from what the worker holds (its
:class:`~miniqueue.worker.slots.Slots`), what it was told and the clock it is given. None runs
SQL, so each is tested without a database:

- how many jobs to hold, the handler slots plus the prefetch (see
  :mod:`miniqueue.worker.prefetch`), and so how many to claim now, in batches of at least half
  of that;
- the reasons to claim: a notification (or a reconnection: the worker is *nudged*), a last
  claim that came back full (a backlog), a concurrency slot this worker freed (no
  notification announces one), or the poll timer; and, after the worker handed jobs back
  because its every handler of a kind was stuck, the poll timer alone;
- the limited-jobs cursor: where the next claim's sweep of limited jobs' groups starts, and
  which way it goes (:func:`goes_down`: neighbouring supervised workers go opposite ways);
- while limited jobs flow, a shorter poll and claims planned for their parameters.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..core.limits import holds_a_slot
from ..core.records import Lease
from ..store.store import MAX_GROUPS_PER_CLAIM, groups_needed
from ..tasks.job import Job
from ..tasks.outcomes import Outcome
from .batching import batch_capacity
from .config import WorkerConfig
from .prefetch import PrefetchPolicy, parse_prefetch
from .slots import Slots

#: While limited jobs flow (one was claimed within the window, in seconds), poll at least this
#: often: a slot freed by another worker or a refilled rate bucket sends no notification.
LIMITED_POLL_INTERVAL = 0.1
LIMITED_POLL_WINDOW = 5.0
#: The most jobs :attr:`ClaimPolicy.spent` remembers (a job handed back unstarted never leaves
#: it otherwise); forgetting them costs a probe each.
SPENT_HELD = 10 * MAX_GROUPS_PER_CLAIM


def goes_down(slot: str) -> bool:
    """Whether the worker in supervisor slot ``slot`` goes round limited jobs' groups downwards
    (``WorkerConfig.descending``): every other one does (worker-2, worker-4, ...). Two workers
    going the same way end up one behind the other, each claim passing over the keys the
    other's last claim just took."""
    number = slot.rpartition("-")[2]
    return number.isdigit() and int(number) % 2 == 0


class ClaimPolicy:
    """When and how much one worker claims, and where its sweep of limited jobs goes next.

    Called from the claim loop, except :meth:`note_finished` (handler threads and the event
    loop) and :attr:`claim_batch` (read there to decide when to wake the loop). ``kinds`` are the
    kinds of handler (True: async) the worker runs jobs on; ``handler_kinds`` how many of them
    its app's tasks use (2 for an app with ``def`` and ``async def`` tasks).
    """

    def __init__(
        self, config: WorkerConfig, slots: Slots, *, kinds: tuple[bool, ...] = (False,), handler_kinds: int = 1
    ) -> None:
        self.config = config
        self.slots = slots
        self.kinds = kinds
        #: Handlers the worker runs at once, every kind counted.
        self.handler_slots = config.concurrency * handler_kinds
        self.prefetch = PrefetchPolicy(
            parse_prefetch(config.prefetch),
            concurrency=config.concurrency,
            kinds=handler_kinds,
            budget=config.prefetch_budget,
        )
        #: Which way the sweep of limited jobs' groups goes (see :func:`goes_down`).
        self.descending = config.descending
        #: A notification came, or the worker reconnected: look once (at start, too).
        self.nudged = True
        #: The last claim came back full: there is probably more.
        self.backlog = False
        #: The last claim that took jobs took fair ones: hold fewer (see PrefetchPolicy.size).
        self.fair = False
        #: A job holding a concurrency slot finished since the last claim: its slot is free for
        #: the key's next job, a reason to claim that no notification announces.
        self.freed_slot = False
        #: Kinds of handler whose jobs the worker handed back because its every handler of that
        #: kind was busy past the budget: while that lasts, the jobs at the head of its queues
        #: are likely more of them, so it claims at its poll only, leaving them to idle workers
        #: rather than claiming them back at once.
        self.handed_back: set[bool] = set()
        #: The smallest claim worth a statement of its own: half the jobs held at most (running
        #: and prefetched), so that claims come in batches.
        self.claim_batch = 1
        #: Where the next claim's sweep of limited jobs starts (after the last group claimed).
        self.cursor: list[str] = []
        #: When (monotonic) a limited job was last claimed.
        self.limited_at = float("-inf")
        #: How many jobs a group of limited jobs gave the last claim that took jobs together, on
        #: average (see :meth:`together`): the next claim locks the limits of about as many groups
        #: as it needs. Rounded, not floored: a group the claim's size cut short would otherwise
        #: have the next claim lock a tenth more groups than it takes (at 10 jobs a group).
        self.per_group = 1
        #: The jobs held whose claim took every job of their group it found (fewer than it could
        #: take together): the claim that completes them does not look first for more of their
        #: group (see :meth:`kept`).
        self.spent: set[int] = set()

    # -- reasons -------------------------------------------------------------------------------

    def nudge(self) -> None:
        self.nudged = True

    def note_finished(self, limits: list[str] | None) -> None:
        """A handler finished a job subject to ``limits``."""
        if not self.freed_slot and holds_a_slot(limits):
            self.freed_slot = True

    def begin_claim(self) -> None:
        """A claim is about to be sent: the reasons it answers are spent. Called before the
        outcomes that go with it are read, so that a job finishing after that is a reason again."""
        self.freed_slot = False
        self.nudged = False

    # -- how many ------------------------------------------------------------------------------

    def claim_size(self, poll_due: bool, *, finishing: int, jobs_done: int, now: float) -> int:
        """How many jobs to claim now (0: not now).

        Claim when there is room (counting the slots that the ``finishing`` outcomes about to be
        recorded will free) and a reason: a notification, a full last batch, a concurrency slot
        this worker freed, or the poll timer (``poll_due``). With prefetch, wait until half the
        buffer is free (or it ran dry) so that claims come in batches rather than one statement
        per finished job. With ``max_jobs``, never claim a job the worker will not run (the jobs
        held, finishing ones included, will all count as done).
        """
        busy = self.busy_kinds(now)
        # Batch tasks hold whole batches, enough to fill them whatever the prefetch says.
        extra = self.prefetch.size(stuck=bool(busy), fair=self.fair)
        capacity = batch_capacity(self.handler_slots + extra, self.slots.batches)
        self.claim_batch = max(1, capacity // 2)
        held = self.slots.held()
        free = capacity - held + finishing
        if self.config.max_jobs is not None:
            free = min(free, self.config.max_jobs - jobs_done - held)
        self.handed_back &= busy
        reason = poll_due if self.handed_back else self.nudged or self.backlog or self.freed_slot or poll_due
        if free <= 0 or not reason:
            return 0
        ran_dry = not self.slots.has_ready()
        return free if ran_dry or free >= self.claim_batch else 0

    def kept(self, outcomes: Sequence[tuple[Job, Outcome]]) -> dict[int, tuple[str, ...]]:
        """The limited jobs completing among ``outcomes`` whose groups the claim sent with their
        completion looks at first, each with its limits: their slots free in that statement, and
        the worker stays with a key while it has jobs. A job whose claim took every job of its
        group it found is left out: its group most likely has none left, and the probe for one
        would walk past the entries of the jobs just taken (the sweep still finds any). Forgets
        the jobs ``outcomes`` end."""
        kept = {
            job.id: tuple(job.limits)
            for job, outcome in outcomes
            if outcome.kind == "completed" and job.limits and job.id not in self.spent
        }
        if self.spent:
            self.spent.difference_update(job.id for job, _ in outcomes)
        return kept

    def claimed(self, leases: list[Lease], asked: int, kept: Collection[tuple[str, ...]], now: float) -> None:
        """A claim of ``asked`` jobs took ``leases`` at ``now``, completing jobs of the limit
        groups ``kept``: note whether there is more, and move the limited-jobs cursor."""
        self._note_limited(leases, asked, kept, now)
        self.backlog = len(leases) == asked
        if leases:
            self.fair = any(lease.fair_key is not None for lease in leases)

    def _note_limited(self, leases: list[Lease], asked: int, kept: Collection[tuple[str, ...]], now: float) -> None:
        """Move the limited-jobs cursor past the groups just claimed (the last one, in the
        direction this worker goes). A claim that took as many groups as one claim takes goes on
        from there at once; one that came back short from a cursor may have run out of groups
        after it: the next claim starts again from the first group (the last one, going down), at
        once rather than at the next poll. The groups of the jobs the claim completed (``kept``)
        came first, wherever they lie, so they do not move the cursor."""
        groups: set[tuple[str, ...]] = set()
        lanes: dict[tuple[str, ...], list[int]] = {}  # the jobs of each group taken together
        for lease in leases:
            if lease.limits:
                group = tuple(lease.limits)
                groups.add(group)
                if lease.together:
                    lanes.setdefault(group, []).append(lease.id)
        lane = self.together(asked)
        wanted = groups_needed(asked, lane, self.per_group)  # the groups it looked for
        if groups:
            self.limited_at = now
            # A group beyond those the claim needed gives one job at most (see claim.sql): only
            # the groups that gave more tell how many a group gives.
            several = [len(ids) for ids in lanes.values() if len(ids) > 1]
            self.per_group = max(1, round(sum(several) / len(several))) if several else 1
            # A group that gave more than one job but fewer than it could gave every job it had
            # due and unlocked (one job alone may be a spare group's: see claim.sql).
            if len(self.spent) > SPENT_HELD:
                self.spent.clear()  # jobs handed back unstarted are never finished here
            for ids in lanes.values():
                if 1 < len(ids) < lane:
                    self.spent.update(ids)
        swept = groups.difference(kept)
        last = min if self.descending else max
        if len(groups) >= MAX_GROUPS_PER_CLAIM:
            self.cursor = list(last(swept)) if swept else self.cursor
            self.nudged = True
        elif len(leases) < asked and len(groups) < wanted and self.cursor:
            self.cursor = []
            self.nudged = True
        elif swept:
            self.cursor = list(last(swept))
        elif not groups:
            self.cursor = []

    def together(self, claim: int) -> int:
        """How many jobs of one group a claim of ``claim`` jobs may take together, to run one
        after another in a slot of their limits (see :class:`~miniqueue.worker.slots.Slots`): as
        many as one handler is expected to run of the claim, so that a worker never holds more
        of one key than a handler of its can get through while its other handlers run others."""
        return max(1, claim // self.handler_slots)

    # -- timing --------------------------------------------------------------------------------

    def limited_flowing(self, now: float) -> bool:
        """Whether a limited job was claimed within the last ``LIMITED_POLL_WINDOW`` seconds."""
        return now - self.limited_at < LIMITED_POLL_WINDOW

    def poll_interval(self, now: float) -> float:
        """Seconds until the next poll: shorter while limited jobs are flowing."""
        if self.limited_flowing(now):
            return min(self.config.poll_interval, LIMITED_POLL_INTERVAL)
        return self.config.poll_interval

    # -- handing back --------------------------------------------------------------------------

    def busy_kinds(self, now: float) -> set[bool]:
        """The kinds of handler (True: async) whose every handler is busy with a job that has
        outlived the prefetch budget (``auto`` only): jobs of such a kind held here would wait
        longer than the budget. Each kind is judged alone: in an app with both, busy threads
        are no reason to hold a thread job while the event loop idles, nor the reverse."""
        if not self.prefetch.adaptive:
            return set()
        running_for = self.slots.running_for(now)
        return {kind for kind in self.kinds if self.prefetch.stuck(running_for[kind])}

    def stuck_in(self, now: float) -> float:
        """Seconds until every handler of a kind will have outlived the prefetch budget while
        jobs of that kind wait here (when they are handed back); infinity when that cannot happen."""
        if not self.prefetch.adaptive:
            return float("inf")
        running_for = self.slots.running_for(now)
        return min(
            (
                max(0.0, self.config.prefetch_budget - min(running_for[kind])) + 0.001
                for kind in self.slots.ready_kinds()
                if len(running_for[kind]) >= self.config.concurrency
            ),
            default=float("inf"),
        )

    def to_hand_back(self, now: float) -> set[bool]:
        """Work-conserving prefetch: the kinds whose ready jobs wait behind handlers of their
        kind that all outlived the budget, and so should go back unstarted for an idle worker
        to take."""
        return self.busy_kinds(now) & self.slots.ready_kinds()

    def handed_back_kinds(self, kinds: set[bool]) -> None:
        """The ready jobs of ``kinds`` went back: claim those kinds at the poll only, while
        their handlers stay stuck."""
        self.handed_back |= kinds
