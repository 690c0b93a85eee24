"""Enqueue: one job, one job waiting for others, a batch by one statement (a large batch goes by
COPY: :mod:`miniqueue.store.copying`).

Every insert that makes a job due at once notifies the queue's channel in the same statement (or
transaction), so the notification is delivered exactly when the job is there to claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import sql

from ..core.db import Connection, translate_errors
from ..core.errors import InvalidInput
from ..core.limits import Scope
from ..core.records import REQUEUEABLE_STATES, EnqueueResult, State
from ..core.steps import Query, Steps, atomic, run
from ..core.validation import NewJob
from .base import Statement, compose
from .copying import refusing_stale_deadlines
from .insertion import ENQUEUED, HELD, HELD_MANY, SCOPED, STORED_MANY
from .keyed import KeyedEnqueuing

# Insert one job (idempotently) and return its id, or the id of the job that already holds the key.
# NOTIFY is sent from the same statement, so it is delivered exactly when the insert commits.
# `held`, `scoped` and the result (`enqueued`): see miniqueue.store.insertion. One template in four
# variants (see _one_job): a job with limits also creates (or updates) the rows of its scopes, so
# that the claim finds them (`scoped`), and writes its rate cost (the others keep the column's
# default of 1, which no claim reads); a job with parents is inserted waiting for those not
# completed yet (`pending`; of a job that runs whatever their outcome, `run_when`, those not
# finished yet, and `failed` those that finished without completing), with its deadline if it has
# one.
_ONE_JOB = """
WITH {scoping}{held}, ins AS (
    INSERT INTO {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context{waiting_columns}{cost_column})
    SELECT coalesce((SELECT job_id FROM held), nextval({job_ids})),
           %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb{waiting_values}{cost_value}
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    RETURNING id, queue, scheduled_at
)
{enqueued}
"""
_WAITING_COLUMNS = """, state, parents, pending_parents, expires_at,
                        run_when, failed_parents"""
_WAITING_VALUES = """,
           CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(run_when)s, %(failed)s"""


def _one_job(*, limited: bool, waiting: bool) -> str:
    """_ONE_JOB for a job with limits or not, with parents or not."""
    return compose(
        _ONE_JOB,
        scoping=f"{SCOPED}, " if limited else "",
        held=HELD,
        waiting_columns=_WAITING_COLUMNS if waiting else "",
        cost_column=", rate_cost" if limited else "",
        waiting_values=_WAITING_VALUES if waiting else "",
        cost_value=", %(rate_cost)s" if limited else "",
        enqueued=ENQUEUED,
    )


# Lock a new job's parents (in id order, so concurrent enqueues never deadlock) and read their
# states. A completion of one of them that is under way finishes first; one that starts later
# waits for our commit and then reads the parent's dependents as we left them.
_LOCK_PARENTS = "SELECT id, state FROM {jobs} WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE"

# Record a new job on its parents' rows (which the parents' completions read).
_LINK_DEPENDENT = """
UPDATE {jobs} SET dependents = array_append(dependents, %(child)s::bigint) WHERE id = ANY(%(parents)s::bigint[])
"""

# Look up the job holding an idempotency key (when a concurrent insert won the race).
_BY_IDEMPOTENCY_KEY = "SELECT job_id FROM {idempotency_keys} WHERE key = %(key)s"

# Insert many jobs in one statement. Ids are drawn up front so each input row can be matched
# to its outcome (inserted, duplicate of an existing job, or duplicate within the batch: `held`
# takes each key once, for the first job of the batch that has it). A job's limits travel as one
# text, its scope names joined by U+001F (which no scope name holds); a job's rate cost NULL (an
# empty array: every job of the batch costs 1) for 1. A batch with limits also writes `scoped`,
# for every scope the batch names (see _many_jobs).
_MANY_JOBS = """
WITH {scoping}src AS MATERIALIZED (
    SELECT nextval({job_ids}) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(rate_costs)b::int[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, rate_cost,
                                ord)
), {held_many}, ins AS (
    INSERT INTO {live} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, rate_cost)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(rate_cost, 1)
      FROM src WHERE key IS NULL OR id IN (SELECT job_id FROM held) ORDER BY ord
    RETURNING id, queue, scheduled_at
), {stored_many}
"""


def _many_jobs(*, limited: bool) -> str:
    """_MANY_JOBS for a batch with limits or without."""
    return compose(_MANY_JOBS, scoping=f"{SCOPED},\n" if limited else "", held_many=HELD_MANY, stored_many=STORED_MANY)


class Enqueuing(KeyedEnqueuing):
    """Inserting jobs (those with keys or a deadline through :class:`KeyedEnqueuing`)."""

    _enqueue = Statement(_one_job(limited=False, waiting=False))
    _enqueue_limited = Statement(_one_job(limited=True, waiting=False))
    _enqueue_waiting = Statement(_one_job(limited=False, waiting=True))
    _enqueue_waiting_limited = Statement(_one_job(limited=True, waiting=True))
    _lock_parents = Statement(_LOCK_PARENTS)
    _link_dependent = Statement(_LINK_DEPENDENT)
    _by_key = Statement(_BY_IDEMPOTENCY_KEY)
    _enqueue_many = Statement(_many_jobs(limited=False))
    _enqueue_many_limited = Statement(_many_jobs(limited=True))

    def enqueue(
        self, conn: Connection, job: NewJob, *, notify: bool = True, trace_context: str | None = None
    ) -> EnqueueResult:
        """Insert one validated job; a repeated idempotency key returns the first job's id.
        ``trace_context`` is the JSON text of the enqueuing span's context (see
        miniqueue.observability.tracing)."""
        return run(conn, self.enqueue_steps(job, notify=notify, trace_context=trace_context))

    def enqueue_steps(
        self, job: NewJob, *, notify: bool = True, trace_context: str | None = None
    ) -> Steps[EnqueueResult]:
        """:meth:`enqueue` as steps."""
        if job.keys.keyed:
            params = {**self._job_params(job, notify, trace_context), **_scope_columns(job.scopes)}
            return (yield from self.enqueue_keyed_steps(job, params, notify=notify))
        query = self._enqueue_limited if job.scopes else self._enqueue
        rows: list[tuple[Any, ...]] = yield Query(query, self._job_params(job, notify, trace_context))
        if rows:
            return EnqueueResult(id=rows[0][0], duplicate=rows[0][1])
        # Another transaction inserted the same key while we waited on it; our statement's
        # snapshot could not see that row, a new statement can.
        rows = yield Query(self._by_key, {"key": job.idempotency_key})
        return EnqueueResult(id=rows[0][0], duplicate=True)

    def _job_params(self, job: NewJob, notify: bool, trace_context: str | None) -> dict[str, Any]:
        """The parameters of _ONE_JOB for one job (and of its limits, for a job with limits)."""
        params = {
            "queue": job.queue,
            "task": job.task,
            "payload": job.payload_json,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "run_at": job.run_at,
            "delay": job.delay_seconds,
            "key": job.idempotency_key,
            "notify": notify,
            "channel": self.channel,
            "limits": [scope.name for scope in job.scopes] or None,
            "trace": trace_context,
            "rate_cost": job.rate_cost,
        }
        return {**params, **_scope_columns(job.scopes)} if job.scopes else params

    def enqueue_waiting(
        self,
        conn: Connection,
        job: NewJob,
        parents: Sequence[int],
        *,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> EnqueueResult:
        """Insert one validated job that runs only once every job of ``parents`` completed.

        In one transaction (a savepoint inside the caller's): the parents are locked and read;
        an id that does not exist, or names a job that already ended failed, dead or cancelled,
        raises InvalidInput and nothing is stored. The job is ``waiting`` on the parents not
        completed yet (``available`` at once if all are), and each parent's row lists it as a
        dependent. Parents must exist before the job that names them, so every dependency
        points to an older job and no cycle can form. A repeated idempotency key returns the
        first job's id and links nothing (the first job keeps its own parents).
        """
        return run(conn, self.enqueue_waiting_steps(job, parents, notify=notify, trace_context=trace_context))

    def enqueue_waiting_steps(
        self,
        job: NewJob,
        parents: Sequence[int],
        *,
        notify: bool = True,
        trace_context: str | None = None,
        run_when: str | None = None,
    ) -> Steps[EnqueueResult]:
        """:meth:`enqueue_waiting` as steps. ``run_when`` (the column of that name): None, the job
        runs once every parent completed; ``"finished"``, once every parent finished, in any
        state; ``"failed"``, once every parent finished and one did not complete."""
        steps = self._enqueue_waiting_in_one(job, list(dict.fromkeys(parents)), notify, trace_context, run_when)
        return refusing_stale_deadlines(atomic(steps))

    def _enqueue_waiting_in_one(
        self, job: NewJob, ids: list[int], notify: bool, trace_context: str | None, run_when: str | None
    ) -> Steps[EnqueueResult]:
        locked: list[tuple[Any, ...]] = yield Query(self._lock_parents, {"ids": ids})
        states = {row[0]: State(row[1]) for row in locked}
        _check_parents(ids, states, tolerant=run_when is not None)
        failed = sum(1 for job_id in ids if states[job_id] in REQUEUEABLE_STATES)
        pending = sum(1 for job_id in ids if states[job_id] is not State.COMPLETED) - (failed if run_when else 0)
        if run_when == "failed" and not pending and not failed:
            raise InvalidInput("every parent completed already: a job that runs only if one does not would never run")
        params = {
            **self._job_params(job, notify and not pending, trace_context),
            "parents": ids,
            "pending": pending,
            "run_when": run_when,
            "failed": failed if run_when else 0,
            "expires_at": job.keys.expires_at,
            "expires_in": job.keys.expires_in,
        }
        rows: list[tuple[Any, ...]] = yield Query(
            self._enqueue_waiting_limited if job.scopes else self._enqueue_waiting, params
        )
        if not rows:  # the holder of its idempotency key committed while we waited on it
            found: list[tuple[Any, ...]] = yield Query(self._by_key, {"key": job.idempotency_key})
            return EnqueueResult(id=found[0][0], duplicate=True)
        result = EnqueueResult(id=rows[0][0], duplicate=rows[0][1])
        if not result.duplicate:
            yield Query(self._link_dependent, {"child": result.id, "parents": ids})
        return result

    def enqueue_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, notify: bool = True, trace_context: str | None = None
    ) -> list[EnqueueResult]:
        """Insert many validated jobs in one statement; results are in input order. Every job
        stores ``trace_context`` (see :meth:`enqueue`).

        Idempotency keys are honoured against stored jobs and within the batch (the first
        occurrence wins). A large batch without keys goes faster by :meth:`copy_many`.
        """
        return run(conn, self.enqueue_many_steps(jobs, notify=notify, trace_context=trace_context))

    def enqueue_many_steps(
        self, jobs: Sequence[NewJob], *, notify: bool = True, trace_context: str | None = None
    ) -> Steps[list[EnqueueResult]]:
        """:meth:`enqueue_many` as steps."""
        if not jobs:
            return []
        keys = [j.idempotency_key for j in jobs]
        limited = any(j.scopes for j in jobs)
        run_ats = [j.run_at for j in jobs]
        delays = [j.delay_seconds for j in jobs]
        params = {
            "queues": [j.queue for j in jobs],
            "tasks": [j.task for j in jobs],
            "payloads": [j.payload_json for j in jobs],
            "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            # A column every job leaves at its default goes as an empty array, which unnest()
            # pads with NULLs: most batches schedule nothing and carry no keys.
            "run_ats": run_ats if any(run_ats) else [],
            "delays": delays if any(delays) else [],
            "keys": keys if any(keys) else [],
            "limits": ["\x1f".join(scope.name for scope in j.scopes) or None for j in jobs] if limited else [],
            "rate_costs": [j.rate_cost for j in jobs] if any(j.rate_cost != 1 for j in jobs) else [],
            "notify": notify,
            "channel": self.channel,
            "trace": trace_context,
        }
        if limited or any(j.keys.keyed for j in jobs):
            params.update(_scope_columns({scope.name: scope for j in jobs for scope in j.scopes}.values()))
        if any(j.idempotency_key is not None and j.keys.unique_key is not None for j in jobs):
            # A job with both keys goes alone (see enqueue_keyed_steps): the batch, one by one, in
            # one transaction.
            return (yield from atomic(self._one_by_one(jobs, notify, trace_context)))
        if any(j.keys.keyed for j in jobs):
            return (yield from self.enqueue_many_keyed_steps(jobs, params, notify=notify))
        query = self._enqueue_many_limited if limited else self._enqueue_many
        rows: list[tuple[Any, ...]] = yield Query(query, params)
        results = [EnqueueResult(id=row[1], duplicate=row[2]) for row in rows]
        for i, result in enumerate(results):
            if result.id is None:  # the holder of the key committed while we waited on it
                held: list[tuple[Any, ...]] = yield Query(self._by_key, {"key": jobs[i].idempotency_key})
                results[i] = EnqueueResult(id=held[0][0], duplicate=True)
        return results

    def _one_by_one(
        self, jobs: Sequence[NewJob], notify: bool, trace_context: str | None
    ) -> Steps[list[EnqueueResult]]:
        results = []
        for job in jobs:
            results.append((yield from self.enqueue_steps(job, notify=notify, trace_context=trace_context)))
        return results

    def listen(self, conn: Connection) -> None:
        """Subscribe ``conn`` to this schema's enqueue notifications (payload: the queue name)."""
        with translate_errors():
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))


def _check_parents(ids: list[int], states: dict[int, State], *, tolerant: bool = False) -> None:
    """Reject parents that do not exist, or (unless the dependent is ``tolerant``: it runs
    whatever their outcome) that ended without completing (a dependent could never run)."""
    if not ids:
        raise InvalidInput("depends_on is empty: name at least one job, or leave it out")
    missing = [job_id for job_id in ids if job_id not in states]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise InvalidInput(
            f"depends_on names job(s) that do not exist: {shown}; a job can only depend on jobs enqueued before it"
        )
    ended = [(job_id, states[job_id]) for job_id in ids if states[job_id] in REQUEUEABLE_STATES]
    if ended and not tolerant:
        job_id, state = ended[0]
        raise InvalidInput(
            f"depends_on names job {job_id}, which ended {state.value}: a job waiting for it would "
            "never run (requeue it first)"
        )


def _scope_columns(scopes: Iterable[Scope]) -> dict[str, list[Any]]:
    """The parameters of `scoped` (_ONE_JOB with limits and the like): one array per column of the
    scope rows."""
    rows = list(scopes)
    return {
        "scopes": [s.name for s in rows],
        "maxes": [s.max_running for s in rows],
        "rates": [s.rate for s in rows],
        "bursts": [s.burst for s in rows],
    }
