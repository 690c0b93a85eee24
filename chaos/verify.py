"""The checks: from the database's records, the faults injected and the processes followed,
decide whether the run kept miniqueue's promises, and say which jobs did not."""

from __future__ import annotations

import collections
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from miniqueue.core.shard_map import MODULUS

from .app import PLANNED_FAILURE
from .check_batches import batch_rows
from .check_fair import fair_rows
from .check_leases import forgotten_rows, retry_rows
from .check_limits import limit_rows
from .check_sequences import sequence_rows
from .check_unique import Causes, unique_rows
from .check_workflow import workflow_rows
from .evidence import Attempt, Evidence
from .faults import Fault, Stop
from .feeder import Blocked
from .options import ALL_SCENARIOS, KILLS, STOP_DATABASE, Options
from .rows import Row, first_line, info, rule
from .workload import Workload

#: Faults that hit a process: they explain a lost attempt held by one of their pids.
PROCESS_FAULTS = ("kill-worker", "stop-worker", "kill-supervisor", "two-supervisors")
#: Faults that hit connections: they explain a lost attempt that overlapped them, and a later
#: one whose error is a dead connection (a pooled connection that went stale).
DATABASE_FAULTS = ("restart-postgres", "terminate-backend", STOP_DATABASE)
#: ``pin-horizon`` is in neither: a snapshot held open must cost the queue nothing but bloat, so
#: no lost attempt may be put down to it.
_CONNECTION_ERROR = re.compile(
    r"psycopg\.(OperationalError|errors\.\w+)|DatabaseUnavailable|server closed the connection|terminating connection"
)
GRACE = 1.0


@dataclass
class Verdict:
    rows: list[Row]
    data: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(row.ok is not False for row in self.rows)


@dataclass
class RunRecord:
    """What the harness knows besides the database: its faults, stops, processes and logs."""

    options: Options
    enqueued: list[int]
    effect_jobs: set[int]
    sleep_ms: dict[int, int]
    workload: Workload
    faults: list[Fault]
    stops: list[Stop]
    process_problems: list[str]
    external_stops: list[str]
    survivors: list[str]
    zombies_left: list[str]
    orphans_adopted: int
    logs: str
    drain_seconds: float | None
    drain_error: str | None
    #: With --sequences: the blocked key as the harness found and released it once the run was
    #: quiet (None: not checked, the run did not drain).
    blocked: Blocked | None = None
    #: With --unique and --sequences: the feeder's own failure, if it had one.
    feeder_problem: str | None = None


def judge(evidence: Evidence, run: RunRecord) -> Verdict:
    """Every check, in the order the table prints them."""
    rows: list[Row] = []
    data: dict[str, Any] = {}
    causes, unexplained = lost_attempt_causes(evidence, run.faults, set(run.workload.failing))
    rows += _job_rows(evidence, run, data)
    rows += _execution_rows(evidence, run, causes, unexplained, data)
    rows += forgotten_rows(evidence, causes, run.options.heartbeat, data)
    rows += retry_rows(evidence, data)
    rows += _effect_rows(evidence, run, data)
    if run.options.limits:
        rows += limit_rows(evidence, run.workload, data, per_database=run.options.sharded)
    if run.options.fair:
        rows += fair_rows(evidence, run.workload, data, per_database=run.options.sharded)
    if run.options.workflow:
        rows += workflow_rows(evidence, run.workload, data)
    if run.options.batches:
        rows += batch_rows(evidence, run.workload, data)
    if run.options.keyed:
        problems = [run.feeder_problem] if run.feeder_problem else []
        rows.append(rule("keyed jobs: the feeder (their enqueues over the run) failed", problems))
    if run.options.unique:
        rows += unique_rows(evidence, run.workload, causes, run.faults, data)
    if run.options.sequences:
        rows += sequence_rows(evidence, run.workload, causes, run.faults, run.blocked, data)
    rows += _recovery_rows(evidence, run, data)
    rows += _stop_rows(evidence, run, data)
    rows += _process_rows(run, data)
    return Verdict(rows, data)


# -- jobs ------------------------------------------------------------------------------------------


def _job_rows(ev: Evidence, run: RunRecord, data: dict[str, Any]) -> list[Row]:
    states = {job: ev.states.get(job, ("missing", 0))[0] for job in run.enqueued}
    completed = [j for j, s in states.items() if s == "completed"]
    dead = [j for j, s in states.items() if s == "dead"]
    lost = [j for j, s in states.items() if s not in ("completed", "dead")]
    planned = [j for j in dead if j in run.workload.failing]  # a sequence's job planned to die
    dead = [j for j in dead if j not in run.workload.failing]
    twice = [j for j, done in ev.completions.items() if len(done) > 1]
    same_fence = [f"job {j} attempt {a} by {w}" for (j, a, w), n in sorted(ev.fences.items(), key=str) if n > 1]
    reused = [
        f"job {j} attempt {a}: "
        + " then ".join(f"{x.worker} ({x.end_state or 'open'})" for x in ev.by_job[j] if x.attempt == a)
        for (j, a), n in sorted(ev.claims.items())
        if n > 1
    ]
    by_state = collections.Counter(states.values())
    data.update(
        enqueued=len(run.enqueued),
        completed=len(completed),
        dead=sorted(dead),
        planned_dead=sorted(planned),
        lost=sorted(lost),
        completed_more_than_once=sorted(twice),
        repeated_fences=same_fence,
        reused_attempts=reused,
        odd_transitions=ev.odd_transitions,
        states=dict(by_state),
    )
    lost_labels = [f"{j} ({states[j]})" for j in sorted(lost)]
    dead_row = Row(
        "dead" + (f" (and {len(planned)} planned to die: a sequence's failing job)" if planned else ""),
        str(len(dead)),
        "reported" if run.options.allow_dead else "must be 0",
        None if run.options.allow_dead else not dead,
        [str(j) for j in sorted(dead)],
    )
    return [
        info("jobs enqueued", len(run.enqueued)),
        info("jobs completed", len(completed)),
        rule("lost (not completed, not dead)", lost_labels),
        rule("completed more than once (completion transitions per job > 1)", [str(j) for j in sorted(twice)]),
        rule("  leases with a repeated fence (job, attempt, worker)", same_fence),
        Row("  attempt numbers reused by a later lease (contract: never)", str(len(reused)), "reported", None, reused),
        rule("  transitions the contracts forbid", ev.odd_transitions),
        dead_row,
    ]


# -- executions and their causes ---------------------------------------------------------------------


#: How the supervisor says a worker died under an attempt: charged (``worker process died: ...``),
#: interrupted beside others (``interrupted after 0.1s: worker process died: ...``: it runs alone
#: next), or claimed as it died (``claimed by a worker process that died ...``).
_DIED = re.compile(
    r"^(?:interrupted after [0-9.]+s: )?worker process (?:died|killed)|^claimed by a worker process that died"
)

#: How a job handed back by a worker that could not have renewed its lease in time begins.
OVERDUE_HAND_BACK = "handed back unstarted: its lease may have ended before it could start"

#: How a job handed back by a worker whose every handler of the job's kind (threads, or the
#: event loop's coroutines) was busy past its prefetch budget begins.
PREFETCH_HAND_BACK = tuple(
    f"handed back unstarted: every {kind} of its worker" for kind in ("handler thread", "async handler", "handler")
)


def explain(attempt: Attempt, faults: Iterable[Fault]) -> str | None:
    """The injected fault that ended an attempt without completion, or None.

    The attempt's recorded end reason says which faults could have caused it:

    - handed back unstarted by a worker that stopped, or interrupted by a requested stop
      (``... attempt not charged``): a worker told to stop (its supervisor killed or stopped);
    - handed back unstarted because every handler of its kind was busy past the prefetch budget:
      no fault, the prefetch doing its job (no handler ran, so nothing ran twice);
    - handed back unstarted because its lease may have ended before it could start (the worker
      stalled past it): a fault on that pid (frozen) or a database fault during the lease (no
      renewal got through);
    - ``worker process died: SIGKILL`` (released by the supervisor, charged or, for a job that
      was not running or ran beside others, handed back; or claimed as the worker died): a kill
      of that very pid;
    - ``worker lost: ... stopped renewing its lease`` (the reaper): a fault on that pid (killed,
      frozen, its supervisor killed or stopped), or a database fault during the lease;
    - a handler error that is a dead connection: a database fault during the lease, or an
      earlier one (a pooled connection that went stale);
    - anything else: no fault explains it.
    """
    error = (attempt.error or "").removeprefix("handed back: ")
    if error.startswith(PREFETCH_HAND_BACK):
        return "prefetch hand-back"
    if _DIED.search(error):
        process_kinds: tuple[str, ...] = ("kill-worker",)
        database, stale = False, False
    elif error.startswith(OVERDUE_HAND_BACK):
        # Its worker stalled past the lease (frozen), or could not renew it (its database down).
        process_kinds, database, stale = PROCESS_FAULTS, True, False
    elif attempt.end_state == "available" and error.startswith(("handed back unstarted", "interrupted")):
        # Handed back by a worker told to stop (its supervisor was killed or stopped).
        process_kinds = ("kill-supervisor", "two-supervisors")
        database, stale = False, False
    elif error.startswith("worker lost"):
        process_kinds, database, stale = PROCESS_FAULTS, True, False
    elif _CONNECTION_ERROR.search(error):
        process_kinds, database, stale = (), True, True
    else:
        return None
    ended = attempt.ended if attempt.ended is not None else float("inf")
    lo, hi = attempt.claimed - GRACE, ended + GRACE
    earlier: Fault | None = None
    for fault in faults:
        if fault.kind in process_kinds and attempt.pid in fault.pids and fault.at <= hi and fault.until >= lo:
            return fault.kind
    for fault in faults:
        if database and fault.kind in DATABASE_FAULTS and fault.at <= hi and _hit(fault, attempt.job):
            if fault.until + GRACE >= lo:
                return fault.kind
            earlier = fault
    if stale and earlier is not None:
        return f"{earlier.kind} (stale connection)"
    return None


def _hit(fault: Fault, job: int) -> bool:
    """Whether a database fault hit ``job``'s database: over several, the one its id names."""
    return fault.database is None or job % MODULUS == fault.database


#: The cause of an attempt of a job planned to fail (``--sequences``) that ended by its own error.
PLANNED = "planned failure"


def lost_attempt_causes(ev: Evidence, faults: list[Fault], failing: set[int]) -> tuple[Causes, list[str]]:
    """Every lease that ended without completion -> the fault that explains it ("UNEXPLAINED" if
    none); and the unexplained ones, described. An attempt of a job planned to fail that ended by
    its planned error is explained by that."""
    ordered = sorted(faults, key=lambda f: f.at)
    causes: Causes = {}
    unexplained: list[str] = []
    for lease in ev.leases:
        if lease.end_state == "completed" or lease.ended is None:
            continue
        planned = lease.job in failing and PLANNED_FAILURE in (lease.error or "")
        cause = PLANNED if planned else explain(lease, ordered)
        if cause is None:
            unexplained.append(
                f"job {lease.job} attempt {lease.attempt} ({lease.end_state}, {lease.worker}): "
                f"{first_line(lease.error)}"
            )
        causes[(lease.job, lease.attempt, lease.pid)] = cause or "UNEXPLAINED"
    return causes, unexplained


def _execution_rows(
    ev: Evidence, run: RunRecord, causes: Causes, unexplained: list[str], data: dict[str, Any]
) -> list[Row]:
    per_attempt = collections.Counter((e.job, e.attempt) for e in ev.executions)
    twice = [f"{j}/{a}" for (j, a), n in sorted(per_attempt.items()) if n > 1]
    executed_jobs = {e.job for e in ev.executions}
    re_executions = len(ev.executions) - len(executed_jobs)
    by_cause: collections.Counter[str] = collections.Counter()
    for execution in ev.executions:
        done = ev.completing_attempt(execution.job)
        if done is None or done.attempt != execution.attempt or done.pid != execution.pid:
            by_cause[causes.get((execution.job, execution.attempt, execution.pid), "not ended")] += 1
    lost_attempts = collections.Counter(causes.values())
    data.update(
        executions=len(ev.executions),
        executed_twice=twice,
        re_executions=re_executions,
        re_executions_by_cause=dict(by_cause),
        attempts_lost_by_cause=dict(lost_attempts),
        unexplained=unexplained,
    )
    rows = [
        info("executions (handler runs recorded)", len(ev.executions)),
        info("re-executions", re_executions),
        *[info(f"  caused by {cause}", n) for cause, n in sorted(by_cause.items(), key=lambda kv: -kv[1])],
        rule("  attempts executed twice", twice),
        info("attempts ended without completion", sum(lost_attempts.values())),
        *[info(f"  by {cause}", n) for cause, n in sorted(lost_attempts.items(), key=lambda kv: -kv[1])],
        rule("  not explained by an injected fault", unexplained),
    ]
    return rows


# -- transactional effects -------------------------------------------------------------------------


def _effect_rows(ev: Evidence, run: RunRecord, data: dict[str, Any]) -> list[Row]:
    duplicates = sorted({f"{j} (attempt {a}, pid {p})" for j, a, p in ev.duplicate_effects})
    mismatched: list[str] = []
    for job in sorted(run.effect_jobs):
        done, effect = ev.completing_attempt(job), ev.effects.get(job)
        if done is None and effect is not None:
            mismatched.append(f"{job}: effect of attempt {effect[0]} but the job never completed")
        elif done is not None and effect is None:
            mismatched.append(f"{job}: completed by attempt {done.attempt} without its effect")
        elif done is not None and effect is not None and effect[0] != done.attempt:
            mismatched.append(f"{job}: effect of attempt {effect[0]}, completion of attempt {done.attempt}")
    stray = [str(j) for j in sorted(set(ev.effects) - run.effect_jobs)]
    data.update(
        effect_jobs=len(run.effect_jobs),
        effects=len(ev.effects),
        duplicated_effects=duplicates,
        effect_mismatches=mismatched,
    )
    return [
        info("transactional effects written (jobs with an effect)", f"{len(ev.effects)} of {len(run.effect_jobs)}"),
        info("  late attempts that found the effect done (rolled back)", len(ev.effect_conflicts)),
        rule("duplicated transactional effects", duplicates),
        rule("  effect and completion from different attempts", mismatched),
        rule("  effects of jobs that write none", stray),
    ]


# -- recovery --------------------------------------------------------------------------------------


def _recovery_rows(ev: Evidence, run: RunRecord, data: dict[str, Any]) -> list[Row]:
    """Per worker kill that held jobs: seconds until every job it held was released (available
    again, or dead) or completed; and until each was running again."""
    released: list[float] = []
    rerun: list[float] = []
    how: collections.Counter[str] = collections.Counter()
    landed: collections.Counter[str] = collections.Counter()
    executed = {(e.job, e.attempt): e.at for e in ev.executions}
    for fault in run.faults:
        if fault.kind != "kill-worker" or not fault.leases:
            continue
        ends, starts = [], []
        for job, attempt in fault.leases:
            effect = job in run.effect_jobs
            landed[_where_it_landed(fault, executed.get((job, attempt)), run.sleep_ms.get(job, 0), effect)] += 1
            lease = ev.lease(job, attempt, pid=fault.pids[0])
            if lease is None or lease.ended is None:
                continue
            ends.append(max(0.0, lease.ended - fault.at))
            how[_release_kind(lease)] += 1
            following = ev.next_lease(lease)
            if following is not None:
                starts.append(max(0.0, following.claimed - fault.at))
        if ends:
            released.append(max(ends))
        if starts:
            rerun.append(max(starts))
    data.update(recovery_seconds=released, rerun_seconds=rerun, released_by=dict(how), kills_landed=dict(landed))
    return [
        info(
            "worker kills that hit a running job (of all worker kills)",
            f"{len(released)} of {sum(1 for f in run.faults if f.kind == 'kill-worker')}",
        ),
        info("  where the jobs were", ", ".join(f"{k} {n}" for k, n in landed.most_common()) or "-"),
        info("recovery after a worker kill (jobs released)", _spread(released)),
        info("  released by", ", ".join(f"{k} {n}" for k, n in how.most_common()) or "-"),
        info("  killed jobs running again after", _spread(rerun)),
    ]


def _where_it_landed(fault: Fault, executed_at: float | None, sleep_ms: int, effect: bool) -> str:
    """Where in its job a kill caught the worker, estimated from when the handler recorded its
    execution and how long it then sleeps (what follows the sleep takes a few ms)."""
    if executed_at is None or executed_at > fault.at:
        return "before the handler ran"
    if fault.at < executed_at + sleep_ms / 1000:
        return "mid-handler"
    if effect:
        return "in the effect+completion transaction"
    return "handler returned, completion not committed"


def _ran(ev: Evidence, job: int, attempt: int, pid: int) -> bool:
    """Whether the handler ran ``job``'s ``attempt`` in process ``pid`` (it recorded an execution)."""
    return any(e.job == job and e.attempt == attempt and e.pid == pid for e in ev.executions)


def _release_kind(lease: Attempt) -> str:
    error = (lease.error or "").removeprefix("handed back: ")
    if lease.end_state == "completed":
        return "completion already on the wire"
    if error.startswith("worker process died"):
        return "the supervisor"
    if error.startswith("worker lost"):
        return "the reaper (lease expiry)"
    return f"other ({first_line(error)[:40]})"


# -- SIGSTOP past the lease ------------------------------------------------------------------------


def _stop_rows(ev: Evidence, run: RunRecord, data: dict[str, Any]) -> list[Row]:
    """Each job a frozen worker held: completed exactly once (but a job planned to die), and if
    another worker took it over, the completion is another lease's (the resumed worker may have
    claimed the job anew) and the frozen one's late outcome was discarded."""
    bad: list[str] = []
    report: list[dict[str, Any]] = []
    taken_over = rejected_logged = 0
    for stop in run.stops:
        for job, attempt in stop.fault.leases:
            if job not in ev.states:  # a durable job: chaos.durable_jobs judges its stops
                continue
            own = ev.lease(job, attempt, pid=stop.pid)
            done = ev.completing_attempt(job)
            takeover = own is not None and own.end_state not in (None, "completed")
            logged = _discarded_in_log(run.logs, stop.pid, job)
            entry = {
                "job": job,
                "attempt": attempt,
                "pid": stop.pid,
                "taken_over": takeover,
                "late_outcome_logged": logged,
                "completed_by_attempt": done.attempt if done else None,
                "completed_by_pid": done.pid if done else None,
            }
            report.append(entry)
            if done is None:
                if job not in run.workload.failing:  # a job planned to die ends dead, not completed
                    bad.append(f"job {job}: never completed after the stop")
            elif takeover:
                taken_over += 1
                rejected_logged += logged
                # The frozen lease's attempt completing is its late completion standing. The same
                # process completing a later attempt is not: once resumed, it may claim the job anew.
                if done.attempt == attempt:
                    bad.append(f"job {job}: the stopped worker's late completion (attempt {attempt}) stood")
                elif (
                    not logged
                    and stop.resumed is not None
                    and not _killed_after(run.faults, stop)
                    and _ran(ev, job, attempt, stop.pid)
                ):  # a prefetched job never started has no outcome
                    bad.append(f"job {job}: no sign that pid {stop.pid}'s late outcome was discarded")
    data["stops"] = report
    data["late_completions"] = bad
    held = len(report)
    return [
        info("SIGSTOP past the lease: jobs held by a frozen worker", held),
        info("  taken over by another worker while frozen", taken_over),
        info("  late outcome rejected (worker log: 'outcome discarded')", rejected_logged),
        rule("  late completion stood, or job not completed once", bad),
    ]


def _discarded_in_log(logs: str, pid: int, job: int) -> bool:
    """Whether worker ``pid`` logged discarding its outcome of ``job``. The line reads attempts
    as charged of the budget (``attempt 1 of 5, 3 runs``), not by the attempt number: one
    process holds one lease of a job at a time, so its pid and the job name the attempt."""
    pattern = rf"\[worker-\d+ {pid}\] WARNING [\w.]+: job {job} \([^)]*\) attempt \d+ of \d+[^:]*: outcome discarded"
    return re.search(pattern, logs) is not None


def _killed_after(faults: list[Fault], stop: Stop) -> bool:
    return any(f is not stop.fault and stop.pid in f.pids and f.at >= stop.fault.at for f in faults)


# -- faults and processes --------------------------------------------------------------------------


def _process_rows(run: RunRecord, data: dict[str, Any]) -> list[Row]:
    kinds = collections.Counter(f.kind for f in run.faults)
    kills = sum(kinds[k] for k in KILLS)
    tracebacks = len(re.findall(r"^Traceback|Exception in thread", run.logs, re.MULTILINE))
    data.update(
        external_stops=run.external_stops,
        faults=dict(kinds),
        zombies_left=run.zombies_left,
        orphans_left=run.survivors,
        kills=kills,
        process_problems=run.process_problems,
        orphans_adopted=run.orphans_adopted,
        drain_seconds=run.drain_seconds,
    )
    faults = ", ".join(f"{k} {kinds[k]}" for k in ALL_SCENARIOS if kinds[k])
    return [
        info("faults injected", f"{sum(kinds.values())} ({kills} SIGKILLs)"),
        info("  by kind", faults or "none"),
        info("drain after the chaos", f"{run.drain_seconds:.1f}s" if run.drain_seconds is not None else "-"),
        rule(
            "  drain finished before its deadline",
            [run.drain_error] if run.drain_error else [],
            "must finish",
            "yes" if not run.drain_error else "no",
        ),
        rule("zombie processes left", run.zombies_left),
        rule("orphan processes left", run.survivors),
        rule("process problems (unexpected exits, unreaped or lingering children)", run.process_problems),
        info("orphans adopted from killed supervisors (all exited)", run.orphans_adopted),
        Row(
            "supervisors stopped by a signal from outside the harness",
            str(len(run.external_stops)),
            "reported",
            None,
            run.external_stops,
        ),
        info("tracebacks in supervisor logs", tracebacks),
    ]


# -- helpers ---------------------------------------------------------------------------------------


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.2f}s, max {max(values):.2f}s (n={len(values)})"
