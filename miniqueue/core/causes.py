"""Why a job has not run, in words: the facts the store reads (:mod:`miniqueue.core.job_facts`)
made into a :class:`~miniqueue.core.diagnosis.Diagnosis`, one :class:`~miniqueue.core.diagnosis.Cause`
per thing that holds the job back, most decisive first.

The order: what the job can never get past by itself (its deadline passed, a failed job blocks
its sequence, its queue is paused, no worker serves it), then what passes with time or another
job (parents, a signal, its turn in a sequence, a sleep, a schedule, a full limit). A job that
ran, runs, or is due and held back by nothing gets the one cause that says so. Pure functions:
every time in a sentence is the database's, relative to its ``now()``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from .diagnosis import Cause, CauseKind, Diagnosis
from .job_facts import MAX_COUNTED, JobFacts, ScopeFacts, SequenceFacts, WhyFacts, WorkerFacts
from .records import State, describe_attempts

#: The reaper's interval when none is known (``miniqueue-supervise --reaper-interval``'s default).
REAPER_INTERVAL = 5.0

_FINISHED = {
    State.COMPLETED: "ran: it completed",
    State.FAILED: "ran and failed for good",
    State.DEAD: "ran out of attempts: it died",
    State.CANCELLED: "will not run: it was cancelled",
    State.EXPIRED: "never ran: it expired",
}


def diagnose(facts: WhyFacts) -> Diagnosis:
    """The diagnosis the facts read by :meth:`~miniqueue.store.holdbacks.Why.why_steps` make."""
    job = facts.job
    if job.state is State.RUNNING:
        causes = [_running(job, facts.workers)]
    elif job.state in _FINISHED:
        causes = [_finished(job)]
    else:
        causes = list(_holding_back(facts)) or [_due(job, facts.ahead, facts.keys_ahead)]
    return Diagnosis(
        job_id=job.id,
        queue=job.queue,
        task=job.task,
        state=job.state,
        attempts=describe_attempts(job.attempt, job.max_attempts, job.attempt_budget),
        checked_at=job.now,
        causes=tuple(causes),
    )


def _holding_back(facts: WhyFacts) -> Iterator[Cause]:
    """Each cause that holds a waiting or available job back, most decisive first."""
    job = facts.job
    if job.expires_at is not None and job.expires_at <= job.now:
        yield _deadline_passed(job, job.expires_at)
    if facts.sequence is not None and _blocks(facts.sequence):
        yield _sequence_blocked(job, facts.sequence)
    if job.paused:
        yield _paused(job)
    if facts.workers is not None and _unserved(job, facts.workers):
        yield _no_worker(job, facts.workers)
    elif facts.workers is not None and _no_handler(job, facts.workers):
        yield _task_unknown(job, facts.workers)
    if facts.parents or (job.state is State.WAITING and job.pending_parents > 0):
        yield _parents(job, facts)
    if job.state is State.WAITING and job.signal_key is not None:
        yield _signal(job)
    if facts.sequence is not None and not _blocks(facts.sequence) and job.pending_parents == 0:
        yield _sequence_turn(job, facts.sequence)
    if job.state is State.AVAILABLE and job.scheduled_at > job.now:
        yield _scheduled(job)
    for scope in facts.limits:
        full = _full_limit(job, scope)
        if full is not None:
            yield full


# -- what the job's state says ------------------------------------------------------------------


def _finished(job: JobFacts) -> Cause:
    attempts = describe_attempts(job.attempt, job.max_attempts, job.attempt_budget)
    at = job.finished_at or job.completed_at or job.now
    sentence = f"Job {job.id} {_FINISHED[job.state]} at {when(at, job.now)}, {attempts}"
    if job.state is State.EXPIRED and job.expires_at is not None:
        sentence += f" (its deadline, {_at(job.expires_at)}, passed before a worker claimed it)"
    if job.state is not State.COMPLETED and job.last_error:
        sentence += f"; last error: {_last_line(job.last_error)}"
    if job.state is not State.COMPLETED:
        sentence += f". `miniqueue requeue {job.id}` makes it available again"
    details = {
        "state": job.state.value,
        "finished_at": at,
        "attempt": job.attempt,
        "attempts": attempts,
        "last_error": job.last_error,
    }
    return Cause(CauseKind.FINISHED, sentence + ".", details)


def _running(job: JobFacts, workers: WorkerFacts | None) -> Cause:
    assert job.lease_expires_at is not None, "a running job has a lease"
    seen = None if workers is None else workers.holder_seen_at
    attempts = describe_attempts(job.attempt, job.max_attempts, job.attempt_budget)
    details: dict[str, Any] = {
        "worker": job.leased_by,
        "attempt": job.attempt,
        "lease_expires_at": job.lease_expires_at,
        "worker_seen_at": seen,
    }
    if job.lease_expires_at > job.now:
        sentence = (
            f"Job {job.id} is running: {attempts} on worker {job.leased_by}, "
            f"its lease renewed until {when(job.lease_expires_at, job.now)}."
        )
        return Cause(CauseKind.RUNNING, sentence, details)
    return _lease_expired(job, workers, details)


def _lease_expired(job: JobFacts, workers: WorkerFacts | None, details: dict[str, Any]) -> Cause:
    assert job.lease_expires_at is not None
    recover_by = job.lease_expires_at + dt.timedelta(seconds=REAPER_INTERVAL)
    overdue = recover_by < job.now
    live_reapers = 0 if workers is None else workers.live_reapers
    reaper_seen = None if workers is None else workers.reaper_seen_at
    details.update(recover_by=recover_by, overdue=overdue, live_reapers=live_reapers, reaper_seen_at=reaper_seen)
    seen = details["worker_seen_at"]
    sentence = (
        f"Job {job.id} is leased by a process that stopped renewing it: worker {job.leased_by} took attempt "
        f"{job.attempt}, and its lease expired at {when(job.lease_expires_at, job.now)}; "
        + (f"the registry last saw that worker at {when(seen, job.now)}. " if seen else "it is not in the registry. ")
        + "Its supervisor hands a dead worker's jobs back as it reaps it, else the reaper recovers the lease "
        f"at its next pass: by {when(recover_by, job.now)} (the lease's expiry plus the reaper's interval, "
        f"{REAPER_INTERVAL:g} s by default)"
    )
    if overdue:
        sentence += ". That pass is overdue: " + _reapers(live_reapers, reaper_seen, job.now)
    return Cause(CauseKind.LEASE_EXPIRED, sentence + ".", details)


def _reapers(live: int, seen: dt.datetime | None, now: dt.datetime) -> str:
    if live:
        reapers = _count(live, "live reaper")
        return f"the registry shows {reapers}: a longer --reaper-interval, or failing passes (its log says which)"
    if seen is not None:
        return f"no live reaper is registered (the last was seen at {when(seen, now)}); start miniqueue-supervise"
    return "no reaper is registered; start miniqueue-supervise, or run a Reaper"


def _due(job: JobFacts, ahead: int | None, keys_ahead: int | None) -> Cause:
    count = ahead or 0
    more = "or more " if count >= MAX_COUNTED else ""
    before = "no job is" if count == 0 else f"{count} {more}due job{'s are' if count != 1 else ' is'}"
    if job.fair_key is not None and keys_ahead:
        return _fair_turn(job, before, count, keys_ahead)
    sentence = (
        f"Nothing holds job {job.id} back: it has been due since {when(job.scheduled_at, job.now)} and runs "
        f"when a worker of queue {job.queue!r} has a free slot; {before} ahead of it in the claim's order."
    )
    return Cause(CauseKind.DUE, sentence, {"due_since": job.scheduled_at, "ahead": count, "ahead_capped": bool(more)})


def _fair_turn(job: JobFacts, before: str, ahead: int, keys_ahead: int) -> Cause:
    """A due fair job whose key's turn has not come: other keys' turns are first."""
    key = "without a key" if job.fair_key == "" else f"of key {job.fair_key!r}"
    keys = f"{keys_ahead}{' or more' if keys_ahead >= MAX_COUNTED else ''} other key{'s' if keys_ahead != 1 else ''}"
    sentence = (
        f"Job {job.id} takes turns by key with the other fair jobs of queue {job.queue!r}, and its key has had "
        f"its share for now: it is {key}, and {before} ahead of it, of {keys} (see docs/guides/fairness.md)."
    )
    details = {"fair_key": job.fair_key, "turn": job.turn, "ahead": ahead, "keys_ahead": keys_ahead}
    return Cause(CauseKind.FAIR_SHARE, sentence, details)


# -- queue and workers --------------------------------------------------------------------------


def _unserved(job: JobFacts, workers: WorkerFacts) -> bool:
    """Whether no worker serves the job's queue: none ever has; or none is live by the registry,
    none is connected to the database, and no job of the queue runs under a live lease; or every
    live worker reported its queues (miniqueue-supervise's do), none claims from this one, and no
    job of it runs under a live lease."""
    if job.served_at is None:
        return True
    if workers.queue_lease_until:
        return False
    if workers.live_workers and workers.reporting_workers == workers.live_workers:
        return not workers.queue_workers
    return not (workers.live_workers or workers.worker_connections)


def _no_handler(job: JobFacts, workers: WorkerFacts) -> bool:
    """Whether the live workers of the job's queue all reported their tasks and none declares the
    job's: each that claims it hands it back (another app's task, on a shared queue)."""
    declared = workers.queue_tasks
    return bool(workers.queue_workers) and declared is not None and job.task not in declared


def _task_unknown(job: JobFacts, workers: WorkerFacts) -> Cause:
    declared = workers.queue_tasks or []
    count = _count(workers.queue_workers, "live worker")
    sentence = (
        f"No live worker runs task {job.task!r}: the {count} of queue {job.queue!r} "
        f"{'declares' if workers.queue_workers == 1 else 'declare'} "
        f"{', '.join(repr(t) for t in declared)}, and each that claims the job hands it back without spending an "
        "attempt; start a worker whose app declares the task (another app's, on a shared queue?)."
    )
    details = {"queue": job.queue, "task": job.task, "queue_workers": workers.queue_workers, "tasks": declared}
    return Cause(CauseKind.NO_HANDLER, sentence, details)


def _no_worker(job: JobFacts, workers: WorkerFacts) -> Cause:
    details = {
        "queue": job.queue,
        "served_at": job.served_at,
        "live_workers": workers.live_workers,
        "worker_connections": workers.worker_connections,
        "worker_seen_at": workers.worker_seen_at,
    }
    if job.served_at is None:
        sentence = (
            f"No worker has ever served queue {job.queue!r}: its jobs wait for nobody until a worker that serves "
            "it starts (a task's jobs go to the queue it declares; see docs/guides/tasks.md)."
        )
        return Cause(CauseKind.NO_WORKER, sentence, details)
    if workers.live_workers and workers.reporting_workers == workers.live_workers:
        sentence = (
            f"No live worker serves queue {job.queue!r}: a worker last started serving it at "
            f"{when(job.served_at, job.now)}, and the process registry's {_count(workers.live_workers, 'live worker')} "
            f"{'serves' if workers.live_workers == 1 else 'serve'} other queues only."
        )
        return Cause(CauseKind.NO_WORKER, sentence, details)
    seen = workers.worker_seen_at
    last = f"last saw one at {when(seen, job.now)}" if seen else "has no worker"
    sentence = (
        f"No live worker serves queue {job.queue!r}: a worker last started serving it at "
        f"{when(job.served_at, job.now)}, and none is connected to the database now (the process registry {last})."
    )
    return Cause(CauseKind.NO_WORKER, sentence, details)


# -- what it waits for --------------------------------------------------------------------------


def _parents(job: JobFacts, facts: WhyFacts) -> Cause:
    total = len(job.parents or ())
    listed = ", ".join(f"job {p.id} ({p.task}, {p.state.value})" for p in facts.parents)
    more = job.pending_parents - len(facts.parents)
    if more > 0:
        listed += f" and {more} more"
    goal = "to finish, however they end" if job.run_when else "to complete"
    if job.run_when == "failed":
        goal += " (it runs only if one does not complete)"
    sentence = f"Job {job.id} waits for {job.pending_parents} of its {_count(total, 'parent')} {goal}: {listed}."
    details = {
        "pending": job.pending_parents,
        "total": total,
        "run_when": job.run_when,
        "parents": [{"id": p.id, "task": p.task, "state": p.state.value} for p in facts.parents],
    }
    return Cause(CauseKind.PARENTS, sentence, details)


def _signal(job: JobFacts) -> Cause:
    step = (job.last_step or {}).get("name")
    timeout = job.signal_timeout_at
    until = f"it times out at {when(timeout, job.now)}" if timeout else "it has no timeout"
    sentence = (
        f"Job {job.id} is parked until signal {job.signal_key!r} comes"
        + (f" (step {step!r})" if step else "")
        + f", with no worker and no lease; {until}. `miniqueue signal {job.signal_key}` sends it."
    )
    return Cause(CauseKind.SIGNAL, sentence, {"key": job.signal_key, "step": step, "timeout_at": timeout})


def _blocks(sequence: SequenceFacts) -> bool:
    return sequence.head_state in (State.FAILED, State.DEAD) and sequence.on_failure == "block"


def _sequence_blocked(job: JobFacts, sequence: SequenceFacts) -> Cause:
    assert sequence.head_state is not None
    key = job.sequence_key
    error = f"; last error: {_last_line(sequence.head_error)}" if sequence.head_error else ""
    sentence = (
        f"Sequence {key!r} is blocked by job {sequence.head} ({sequence.head_task}), which ended "
        f"{sequence.head_state.value}{error}. Release the key with `miniqueue sequences release {key}`, or "
        f"requeue, cancel or delete job {sequence.head}; {_jobs_ahead(sequence.ahead)} ahead of job {job.id}."
    )
    return Cause(CauseKind.SEQUENCE_BLOCKED, sentence, _sequence_details(key, sequence))


def _sequence_turn(job: JobFacts, sequence: SequenceFacts) -> Cause:
    key = job.sequence_key
    if sequence.head is None or sequence.head_state is None:
        holder = "no job holds it now: the next job of the key to finish hands it on"
    else:
        holder = f"job {sequence.head} ({sequence.head_task}, {sequence.head_state.value}) holds it"
        if sequence.head_state is State.AVAILABLE and sequence.head_scheduled_at is not None:
            holder += f", due {when(sequence.head_scheduled_at, job.now)}"
    sentence = (
        f"Job {job.id} waits its turn in sequence {key!r}: {holder}, and {_jobs_ahead(sequence.ahead)} ahead of it."
    )
    return Cause(CauseKind.SEQUENCE_TURN, sentence, _sequence_details(key, sequence))


def _sequence_details(key: str | None, sequence: SequenceFacts) -> dict[str, Any]:
    return {
        "key": key,
        "head": sequence.head,
        "head_state": None if sequence.head_state is None else sequence.head_state.value,
        "head_error": sequence.head_error,
        "ahead": sequence.ahead,
    }


def _jobs_ahead(count: int) -> str:
    more = " or more" if count >= MAX_COUNTED else ""
    return "no job waits" if count == 0 else f"{count}{more} job{'s wait' if count != 1 else ' waits'}"


def _scheduled(job: JobFacts) -> Cause:
    step = job.last_step or {}
    due = when(job.scheduled_at, job.now)
    seconds = (job.scheduled_at - job.now).total_seconds()
    if step.get("kind") == "sleep" and step.get("attempt") == job.attempt:
        sentence = f"Job {job.id} sleeps (durable sleep {step.get('name')!r}) until {due}, with no worker and no lease."
        return Cause(CauseKind.SLEEP, sentence, {"step": step.get("name"), "until": job.scheduled_at})
    failure = job.last_failure or {}
    if job.attempt > 0 and failure.get("attempt") == job.attempt:
        reason = "retry"
        sentence = f"Job {job.id} waits out its retry delay after run {job.attempt} failed: it is due at {due}"
        if job.last_error:
            sentence += f" (last error: {_last_line(job.last_error)})"
    elif job.attempt > 0:
        reason, sentence = "snoozed", f"Job {job.id} was handed back for later by its last run (a snooze): due at {due}"
    else:
        reason, sentence = "run at", f"Job {job.id} is scheduled for later: it is due at {due}, by the database's clock"
    details = {"scheduled_at": job.scheduled_at, "seconds": seconds, "reason": reason, "last_error": job.last_error}
    return Cause(CauseKind.SCHEDULED, sentence + ".", details)


def _full_limit(job: JobFacts, scope: ScopeFacts) -> Cause | None:
    """The cause a limit gives, if it holds the job back now."""
    if scope.rate is not None:
        if scope.tokens >= 1 or scope.next_token_at is None:
            return None
        sentence = (
            f"Rate limit {scope.scope!r} ({_rate(scope.rate)}) has no token for job {job.id} until "
            f"{when(scope.next_token_at, job.now)}."
        )
        details = {
            "scope": scope.scope,
            "rate": scope.rate,
            "tokens": scope.tokens,
            "next_token_at": scope.next_token_at,
        }
        return Cause(CauseKind.RATE_LIMIT, sentence, details)
    if scope.max_running is None or len(scope.holders) < scope.max_running:
        return None
    holders = ("job " if len(scope.holders) == 1 else "jobs ") + ", ".join(str(h) for h in scope.holders)
    details = {"scope": scope.scope, "max_running": scope.max_running, "holders": list(scope.holders)}
    if job.queue_cap is not None and scope.scope == f"queue {job.queue}":
        sentence = (
            f"Queue {job.queue!r} is at its cap of {_count(scope.max_running, 'running job')}, held by {holders}."
        )
        return Cause(CauseKind.QUEUE_CAP, sentence, {"queue": job.queue, **details})
    sentence = (
        f"Concurrency limit {scope.scope!r} is full: {min(len(scope.holders), scope.max_running)} of "
        f"{_count(scope.max_running, 'slot')}, held by {holders}."
    )
    return Cause(CauseKind.CONCURRENCY_LIMIT, sentence, details)


# -- the queue's settings, and words for times -------------------------------------------------


def _deadline_passed(job: JobFacts, expires_at: dt.datetime) -> Cause:
    sentence = (
        f"Job {job.id} will never run: its deadline passed at {when(expires_at, job.now)} before a worker claimed "
        "it, and the reaper marks it expired at its next pass."
    )
    return Cause(CauseKind.DEADLINE_PASSED, sentence, {"expires_at": expires_at})


def _paused(job: JobFacts) -> Cause:
    changed = job.settings_changed_at
    since = f" (its settings last changed at {when(changed, job.now)})" if changed else ""
    sentence = (
        f"Queue {job.queue!r} is paused{since}: no worker on any host claims its jobs until "
        f"`miniqueue queues resume {job.queue}`."
    )
    return Cause(CauseKind.PAUSED, sentence, {"queue": job.queue, "settings_changed_at": changed})


def _rate(per_second: float) -> str:
    for unit, seconds in (("second", 1), ("minute", 60), ("hour", 3600)):
        if per_second * seconds >= 1:
            return f"{per_second * seconds:g} per {unit}"
    return f"{per_second * 3600:g} per hour"


def when(at: dt.datetime, now: dt.datetime) -> str:
    """``2026-01-02 09:30:00 UTC (in 5 min)``: a time and how far it is from ``now``."""
    seconds = (at - now).total_seconds()
    relative = "now" if abs(seconds) < 0.5 else (f"in {_span(seconds)}" if seconds > 0 else f"{_span(-seconds)} ago")
    return f"{_at(at)} ({relative})"


def _at(at: dt.datetime) -> str:
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    """A duration in its two largest units: ``45 s``, ``3 min 20 s``, ``2 h 5 min``, ``3 d 4 h``."""
    whole = round(seconds)
    for size, unit, small, small_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")):
        if whole >= size:
            rest = (whole % size) // small
            return f"{whole // size} {unit}" + (f" {rest} {small_unit}" if rest else "")
    return f"{whole} s"


def _count(n: int, noun: str) -> str:
    """``1 slot``, ``2 slots``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _last_line(error: str) -> str:
    lines = error.strip().splitlines()
    return lines[-1][:200] if lines else ""
