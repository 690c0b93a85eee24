"""What the database recorded during the run, loaded once at the end for the checks.

Times are converted to this host's epoch seconds (the server's clock minus the offset measured
at the start), so they compare with the times the harness recorded its faults at.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .app import DURABLE_TASK
from .keyed import KeyedEvidence
from .server import Harness


@dataclass
class Attempt:
    """One lease of one job: claimed by a worker, ended by completion, failure or recovery."""

    job: int
    attempt: int
    worker: str | None
    claimed: float
    ended: float | None = None
    end_state: str | None = None
    error: str | None = None
    #: Back to ``available``: when it was due again (this host's clock), and the attempts charged
    #: to the job by then.
    due: float | None = None
    charged: int | None = None
    #: The transaction that claimed it (``chaos_transitions.xact``): the leases of one key that
    #: one claim took together share it (see chaos.check_limits). None in records made by hand.
    claim_xact: int | None = None

    @property
    def pid(self) -> int | None:
        parts = (self.worker or "").split(":")
        return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


@dataclass(frozen=True)
class Execution:
    job: int
    attempt: int
    pid: int
    at: float
    #: A dependent's ``job.parent_results`` as it read them (parent id as text -> result).
    parents: dict[str, Any] | None = None
    #: A batch job's: the batch handler's call it ran in (``--batches``).
    batch: str | None = None


@dataclass
class Evidence:
    """The database's account of the run."""

    states: dict[int, tuple[str, int]] = field(default_factory=dict)  # job -> (state, attempt)
    #: Every lease, in claim order. Normally one per (job, attempt); a lease handed back
    #: unstarted with its attempt restored is followed by another with the same attempt.
    leases: list[Attempt] = field(default_factory=list)
    by_job: dict[int, list[Attempt]] = field(default_factory=lambda: collections.defaultdict(list))
    claims: collections.Counter[tuple[int, int]] = field(default_factory=collections.Counter)
    fences: collections.Counter[tuple[int, int, str | None]] = field(default_factory=collections.Counter)
    completions: dict[int, list[Attempt]] = field(default_factory=lambda: collections.defaultdict(list))
    odd_transitions: list[str] = field(default_factory=list)
    #: A dependent's way out of ``waiting``, as (state, time): ``available`` when its last
    #: parent completed, ``cancelled`` when one ended without completing.
    releases: dict[int, list[tuple[str, float]]] = field(default_factory=lambda: collections.defaultdict(list))
    executions: list[Execution] = field(default_factory=list)
    effects: dict[int, tuple[int, int]] = field(default_factory=dict)  # job -> (attempt, pid)
    duplicate_effects: list[tuple[int, int, int]] = field(default_factory=list)
    effect_conflicts: list[tuple[int, int, int]] = field(default_factory=list)
    #: The keyed jobs (``--unique``, ``--sequences``): their keys, holds, overlaps and order, from SQL.
    keyed: KeyedEvidence = field(default_factory=KeyedEvidence)

    @classmethod
    def load(cls, db: Harness, clock_offset: float) -> Evidence:
        found = cls()
        # The durable jobs sleep and wait by design (leases that end unfinished, with no fault):
        # chaos.durable_jobs judges them alone.
        for job, state, attempt in db.rows(
            "SELECT id, state, attempt FROM miniqueue_jobs WHERE task <> %s", [DURABLE_TASK]
        ):
            found.states[int(job)] = (str(state), int(attempt))
        transitions = db.rows(
            "SELECT job_id, attempt, from_state, to_state, worker, error, extract(epoch FROM at)::float8, "
            "extract(epoch FROM due)::float8, charged, xact "
            "FROM chaos_transitions WHERE job_id NOT IN (SELECT id FROM miniqueue_jobs WHERE task = %s) ORDER BY id",
            [DURABLE_TASK],
        )
        for job, attempt, before, after, worker, error, at, due, charged, xact in transitions:
            found._transition(int(job), int(attempt), before, after, worker, error, float(at) - clock_offset, int(xact))
            if due is not None and after == "available" and before == "running":
                lease = found.by_job[int(job)][-1] if found.by_job.get(int(job)) else None
                if lease is not None and lease.attempt == int(attempt) and lease.end_state == "available":
                    lease.due, lease.charged = float(due) - clock_offset, charged
        for job, attempt, pid, at, parents, batch in db.rows(
            "SELECT job_id, attempt, pid, extract(epoch FROM at)::float8, parents, batch FROM chaos_executions "
            "ORDER BY at"
        ):
            found.executions.append(
                Execution(int(job), int(attempt), int(pid), float(at) - clock_offset, parents, batch)
            )
        for job, attempt, pid in db.rows("SELECT job_id, attempt, pid FROM chaos_effects"):
            found.effects[int(job)] = (int(attempt), int(pid))
        for job, attempt, pid in db.rows("SELECT job_id, attempt, pid FROM chaos_duplicate_effects"):
            found.duplicate_effects.append((int(job), int(attempt), int(pid)))
        for job, attempt, pid in db.rows("SELECT job_id, attempt, pid FROM chaos_effect_conflicts"):
            found.effect_conflicts.append((int(job), int(attempt), int(pid)))
        found.keyed = KeyedEvidence.load(db, clock_offset)
        return found

    @classmethod
    def merged(cls, parts: list[Evidence]) -> Evidence:
        """The account of several databases as one (``--databases``). Every check reads it by
        job id, and no two databases of a map hold the same id, so each check judges each
        database's jobs by that database's own records. Times are already this host's."""
        whole = cls()
        for part in parts:
            for f in dataclasses.fields(cls):
                mine, theirs = getattr(whole, f.name), getattr(part, f.name)
                if isinstance(mine, list):
                    mine.extend(theirs)
                elif isinstance(mine, dict):
                    mine.update(theirs)  # a Counter's counts add up; a dict's keys are one database's jobs
                elif isinstance(mine, KeyedEvidence):
                    mine.extend(theirs)  # each key lives on one database (the map routes by the key's hash)
                else:
                    raise ValueError(f"evidence {f.name!r} cannot be merged over several databases")
        whole.leases.sort(key=lambda lease: lease.claimed)
        whole.executions.sort(key=lambda execution: execution.at)
        return whole

    def _transition(
        self,
        job: int,
        attempt: int,
        before: str | None,
        after: str,
        worker: str | None,
        error: str | None,
        at: float,
        xact: int | None = None,
    ) -> None:
        if after == "running":
            claim = Attempt(job, attempt, worker, at, claim_xact=xact)
            self.leases.append(claim)
            self.by_job[job].append(claim)
            self.claims[(job, attempt)] += 1
            self.fences[(job, attempt, worker)] += 1
            return
        if before == "waiting" and after in ("available", "cancelled"):
            self.releases[job].append((after, at))
            return
        if before != "running":
            # Only a claim (above) may leave 'available'; anything else is a transition the
            # contracts forbid, and a completion that did not come from a lease counts too.
            self.odd_transitions.append(f"job {job} attempt {attempt}: {before} -> {after}")
            if after == "completed":
                self.completions[job].append(Attempt(job, attempt, worker, at, at, after, error))
            return
        lease = next(
            (x for x in self.by_job.get(job, []) if x.attempt == attempt and x.worker == worker and x.ended is None),
            None,
        )
        if lease is None:
            self.odd_transitions.append(f"job {job} attempt {attempt}: {before} -> {after} without a claim")
            return
        lease.ended, lease.end_state, lease.error = at, after, error
        if after == "completed":
            self.completions[job].append(lease)

    def completing_attempt(self, job: int) -> Attempt | None:
        done = self.completions.get(job)
        return done[-1] if done else None

    def lease(self, job: int, attempt: int, pid: int | None = None) -> Attempt | None:
        """The lease of ``job`` at ``attempt`` (held by ``pid``, when given); the latest if several."""
        found = [x for x in self.by_job.get(job, []) if x.attempt == attempt and (pid is None or x.pid == pid)]
        return found[-1] if found else None

    def next_lease(self, lease: Attempt) -> Attempt | None:
        """The job's first lease claimed after ``lease``."""
        return next((x for x in self.by_job.get(lease.job, []) if x.claimed > lease.claimed), None)
