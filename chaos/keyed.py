"""What the database recorded of the keyed jobs (``--unique``, ``--sequences``), computed in SQL
from the harness's tables and loaded with the rest of the evidence.

Every stamp is the server's ``clock_timestamp()`` where it was taken: a job stored
(``chaos_keyed``, after its unique index let it in), a handler's start and end of its work
(``chaos_executions``: the end before the job's completion commits), each claim, release and end
of a lease (``chaos_transitions``). Times are converted to this host's epoch seconds, as in
:mod:`chaos.evidence`.

- **Runs.** An execution of a keyed job lasts from its start to its recorded end; a handler that
  never recorded one (killed, cut off by a dead connection, cancelled) to the end of its lease,
  which it cannot have outlived unless its process was frozen (then: open, to the end of time).
- **Overlaps.** Two runs of one unique key, or of one sequence key, that were under way at once
  (the later one started before the earlier one's end). Whether an overlap is a stale attempt
  running past a lease it lost is judged by the checks, which know the faults.
- **Holding.** A job of a unique key holds it from the stamp that stored it to the transition
  that finished it (completed, failed, dead, cancelled, expired or deleted); two jobs of one key
  holding it at once is what the unique index exists to prevent.
- **Order.** Per sequence key, by job id (enqueue order): each completed job's completing run
  (the execution of the attempt and process that completed it) must start after the previous
  completed job's completing run started and after that job completed; and no job may be released
  from ``waiting``, or claimed, before the previous job of its key finished (a release in the
  very transaction that finished it is the hand-over, whatever its stamp: see
  ``chaos_transitions.xact`` in :mod:`chaos.schema`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol


class Rows(Protocol):
    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]: ...


#: The transitions that finish a job (and hand a sequence key on, or free a unique key).
FINISHED = "('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')"


def _epoch(column: str) -> str:
    return f"extract(epoch FROM {column})::float8"


_JOBS = f"""
SELECT k.job_id, k.unique_key, k.sequence_key, {_epoch("k.at")},
       (SELECT {_epoch("min(t.at)")} FROM chaos_transitions t WHERE t.job_id = k.job_id AND t.to_state IN {FINISHED})
  FROM chaos_keyed k ORDER BY k.job_id
"""

_RUNS = """
WITH runs AS (
    SELECT e.token, e.job_id, e.attempt, e.pid, k.unique_key, k.sequence_key, e.at AS started, e.ended,
           coalesce(e.ended, (SELECT min(t.at) FROM chaos_transitions t
                               WHERE t.job_id = e.job_id AND t.attempt = e.attempt AND t.from_state = 'running'
                                 AND split_part(t.worker, ':', 2) = e.pid::text AND t.at >= e.at)) AS until
      FROM chaos_executions e JOIN chaos_keyed k ON k.job_id = e.job_id
)
"""


def _run_columns(run: str) -> str:
    """A run's columns in an overlap row: job, attempt, pid, start, end, whether the end was recorded."""
    return f"{run}.job_id, {run}.attempt, {run}.pid, {_epoch(run + '.started')}, {_epoch(run + '.until')}, " + (
        f"{run}.ended IS NOT NULL"
    )


def _overlaps(kind: str, column: str) -> str:
    return f"""
SELECT '{kind}', a.{column}, {_run_columns("a")}, {_run_columns("b")}
  FROM runs a JOIN runs b ON b.{column} = a.{column} AND (b.started, b.token) > (a.started, a.token)
 WHERE b.started < coalesce(a.until, 'infinity')
"""


_OVERLAPS = (
    _RUNS + _overlaps("unique", "unique_key") + "UNION ALL" + _overlaps("sequence", "sequence_key") + "ORDER BY 1, 2, 6"
)

_HELD_AT_ONCE = f"""
WITH held AS (
    SELECT k.job_id, k.unique_key, k.at AS since,
           (SELECT min(t.at) FROM chaos_transitions t WHERE t.job_id = k.job_id AND t.to_state IN {FINISHED}) AS until
      FROM chaos_keyed k WHERE k.unique_key IS NOT NULL
)
SELECT a.unique_key, a.job_id, {_epoch("a.since")}, {_epoch("a.until")},
       b.job_id, {_epoch("b.since")}, {_epoch("b.until")}
  FROM held a JOIN held b ON b.unique_key = a.unique_key AND b.job_id > a.job_id
 WHERE b.since < coalesce(a.until, 'infinity') AND a.since < coalesce(b.until, 'infinity')
 ORDER BY a.unique_key, a.job_id, b.job_id
"""

_OUT_OF_ORDER = f"""
WITH done AS (
    SELECT k.sequence_key AS key, k.job_id AS job, e.at AS started, t.at AS completed
      FROM chaos_keyed k
      JOIN chaos_transitions t ON t.job_id = k.job_id AND t.to_state = 'completed'
      LEFT JOIN chaos_executions e ON e.job_id = t.job_id AND e.attempt = t.attempt
                                  AND e.pid::text = split_part(t.worker, ':', 2)
     WHERE k.sequence_key IS NOT NULL
), ordered AS (
    SELECT key, job, started, completed,
           lag(job) OVER w AS prev, lag(started) OVER w AS prev_started, lag(completed) OVER w AS prev_completed
      FROM done WINDOW w AS (PARTITION BY key ORDER BY job, started)
)
SELECT key, prev, {_epoch("prev_started")}, {_epoch("prev_completed")}, job, {_epoch("started")}, {_epoch("completed")}
  FROM ordered
 WHERE prev IS NOT NULL
   AND (started IS NULL OR prev_started IS NULL OR started <= prev_started OR started < prev_completed)
 ORDER BY key, job
"""

# A release in the very transaction that finished the previous job is the hand-over itself (its
# stamp may come first: see chaos_transitions.xact); any other must be stamped after that finish.
# A claim is a transaction of its own, which could only take the job once the hand-over committed.
_EARLY = f"""
WITH seq AS (
    SELECT sequence_key AS key, job_id AS job, lag(job_id) OVER (PARTITION BY sequence_key ORDER BY job_id) AS prev
      FROM chaos_keyed WHERE sequence_key IS NOT NULL
), released AS (
    SELECT DISTINCT ON (job_id) job_id, at, xact FROM chaos_transitions
     WHERE from_state = 'waiting' AND to_state = 'available' ORDER BY job_id, at
), claimed AS (
    SELECT job_id, min(at) AS at FROM chaos_transitions WHERE to_state = 'running' GROUP BY job_id
), finished AS (
    SELECT DISTINCT ON (job_id) job_id, at, xact FROM chaos_transitions WHERE to_state IN {FINISHED} ORDER BY job_id, at
)
SELECT s.key, s.prev, {_epoch("p.at")}, s.job, {_epoch("r.at")}, {_epoch("c.at")}
  FROM seq s
  LEFT JOIN released r ON r.job_id = s.job
  LEFT JOIN claimed c ON c.job_id = s.job
  LEFT JOIN finished p ON p.job_id = s.prev
 WHERE s.prev IS NOT NULL AND (r.at IS NOT NULL OR c.at IS NOT NULL)
   AND (p.at IS NULL OR (r.at < p.at AND r.xact <> p.xact) OR c.at < p.at)
 ORDER BY s.key, s.job
"""


@dataclass(frozen=True)
class Run:
    """One execution of a keyed job: from its start to its end (``ended``: recorded by the
    handler, else the end of its lease; None: open)."""

    job: int
    attempt: int
    pid: int
    started: float
    ended: float | None
    recorded_end: bool = True


@dataclass(frozen=True)
class Overlap:
    """Two runs of one key under way at once; ``first`` started first."""

    kind: str  # "unique" or "sequence"
    key: str
    first: Run
    second: Run


@dataclass(frozen=True)
class Holding:
    """A unique job's hold on its key: from its storing to its finish (None: never finished)."""

    key: str
    job: int
    since: float
    until: float | None


@dataclass(frozen=True)
class OutOfOrder:
    """A completed sequence job whose completing run started before the previous completed job's
    (or before that job completed); None for a stamp that is missing."""

    key: str
    previous: int
    previous_started: float | None
    previous_completed: float | None
    job: int
    started: float | None
    completed: float | None


@dataclass(frozen=True)
class Early:
    """A sequence job released or claimed before the previous job of its key finished."""

    key: str
    previous: int
    previous_finished: float | None
    job: int
    released: float | None
    claimed: float | None


@dataclass
class KeyedEvidence:
    """The database's account of the keyed jobs."""

    unique: dict[int, str] = field(default_factory=dict)  # job -> unique key, every stored one
    sequence: dict[int, str] = field(default_factory=dict)  # job -> sequence key
    stored: dict[int, float] = field(default_factory=dict)  # job -> when it was stored
    finished: dict[int, float] = field(default_factory=dict)  # job -> its finishing transition
    overlaps: list[Overlap] = field(default_factory=list)
    held_at_once: list[tuple[Holding, Holding]] = field(default_factory=list)
    out_of_order: list[OutOfOrder] = field(default_factory=list)
    early: list[Early] = field(default_factory=list)

    def extend(self, other: KeyedEvidence) -> None:
        """Add another database's account (over several: no job, and so no key's record, is on two)."""
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, dict):
                mine.update(theirs)
            else:
                mine.extend(theirs)

    @classmethod
    def load(cls, db: Rows, clock_offset: float) -> KeyedEvidence:
        found = cls()

        def at(value: Any) -> float | None:
            return None if value is None else float(value) - clock_offset

        for job, unique, sequence, stored, finished in db.rows(_JOBS):
            job = int(job)
            if unique is not None:
                found.unique[job] = str(unique)
            if sequence is not None:
                found.sequence[job] = str(sequence)
            found.stored[job] = float(stored) - clock_offset
            if finished is not None:
                found.finished[job] = float(finished) - clock_offset
        if not found.stored:
            return found

        def run(row: tuple[Any, ...]) -> Run:
            job, attempt, pid, started, until, recorded = row
            return Run(int(job), int(attempt), int(pid), float(started) - clock_offset, at(until), bool(recorded))

        for row in db.rows(_OVERLAPS):
            found.overlaps.append(Overlap(str(row[0]), str(row[1]), run(row[2:8]), run(row[8:14])))
        for key, a, a_since, a_until, b, b_since, b_until in db.rows(_HELD_AT_ONCE):
            found.held_at_once.append(
                (
                    Holding(str(key), int(a), float(a_since) - clock_offset, at(a_until)),
                    Holding(str(key), int(b), float(b_since) - clock_offset, at(b_until)),
                )
            )
        for key, prev, prev_started, prev_completed, job, started, completed in db.rows(_OUT_OF_ORDER):
            found.out_of_order.append(
                OutOfOrder(
                    str(key), int(prev), at(prev_started), at(prev_completed), int(job), at(started), at(completed)
                )
            )
        for key, prev, prev_finished, job, released, claimed in db.rows(_EARLY):
            found.early.append(Early(str(key), int(prev), at(prev_finished), int(job), at(released), at(claimed)))
        return found
