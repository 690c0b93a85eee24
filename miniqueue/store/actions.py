"""Operator actions: requeue, cancel and delete jobs (from the CLI, the dashboard or a client).

Requeue and cancel apply to every id given or to none: one that does not exist, or is in a
state the action does not take, rolls the whole action back with an error naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import psycopg

from ..core.db import Connection
from ..core.errors import InvalidInput, InvalidTransition, JobNotFound
from ..core.records import CANCELLABLE_STATES, REQUEUEABLE_STATES, State
from ..core.steps import Query, Steps, atomic, rows, run
from .base import Statement, compose
from .finishing import counted_off, finishing, settled, unkeyed
from .inspection import Inspection
from .rows import bigints

T = TypeVar("T")

# Requeue finished jobs by id or by filter, with a fresh attempt budget (attempt keeps counting).
# `counted` takes them off the finished counts (see miniqueue.store.finishing). A job of a
# sequence goes back into its key's line, by its id (`advanced`: a blocking head that is
# requeued runs next; a job the key went on without runs after the one holding it now). A job
# whose unique key another job holds now cannot be requeued: the unique index refuses it (see
# :meth:`OperatorActions.requeue`).
_REQUEUE = compose(
    """
WITH picked AS (
    SELECT id, queue, state, finished_at FROM {jobs}
     WHERE state = ANY(%(states)s::text[])
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       FOR UPDATE
), requeued AS (
    UPDATE {jobs} j
       SET state = CASE WHEN j.sequence_key IS NULL THEN 'available' ELSE 'waiting' END, scheduled_at = now(),
           max_attempts = j.attempt + j.attempt_budget,
           finished_at = NULL, completed_at = NULL, lease_expires_at = NULL, leased_by = NULL,
           errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'at', now(), 'worker', NULL, 'error', format('requeued: it was %%s', p.state),
               'charged', false, 'requeued', p.state, 'finished', p.finished_at))
      FROM picked p WHERE j.id = p.id
    RETURNING j.id, p.queue, p.state, p.finished_at, j.sequence_key
), {counted_off}, advanced AS (
SELECT {advance}(ARRAY(SELECT DISTINCT sequence_key FROM requeued WHERE sequence_key IS NOT NULL), {queue_channel})
 WHERE EXISTS (SELECT 1 FROM requeued WHERE sequence_key IS NOT NULL))
SELECT id FROM requeued WHERE (SELECT count(*) FROM advanced) >= 0
""",
    counted_off=counted_off("requeued"),
)

# Cancel jobs that have not finished. A running job's worker finds out at its next heartbeat;
# a waiting job's dependents are cancelled with it (`settled`); a parked one stops waiting for
# its signal. `counted`, `per_minute` and
# `settled` (see miniqueue.store.finishing).
_CANCEL = compose(
    """
WITH cancelled AS (
UPDATE {jobs}
   SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL, leased_by = NULL, pending_parents = 0,
       signal_key = NULL, signal_timeout_at = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'running', 'waiting')
RETURNING id, queue, state, dependents, awaited, sequence_key
), {finishing}
""",
    finishing=finishing("cancelled", select="id"),
)

# Delete jobs that are not running, and the idempotency keys they held (`unkeyed`). `counted`
# takes the finished ones off the counts (see miniqueue.store.finishing). The dependents of a
# job deleted before it finished are cancelled (`settled` of `unfinished`): it will never
# complete. A deleted job of a sequence, finished or not, hands its key on.
_DELETE = compose(
    """
WITH deleted AS (
    DELETE FROM {jobs} WHERE id = ANY(%(ids)b::bigint[]) AND state <> 'running'
    RETURNING id, queue, state, finished_at, dependents, awaited, sequence_key, idempotency_key
), {unkeyed}, {counted_off}, unfinished AS (
    SELECT id, 'deleted' AS state, CASE WHEN state IN ('available', 'waiting') THEN dependents END AS dependents,
           awaited AND state IN ('available', 'waiting') AS awaited, sequence_key
      FROM deleted WHERE state IN ('available', 'waiting') OR sequence_key IS NOT NULL
), {settled}
SELECT id FROM deleted WHERE (SELECT count(*) FROM settled) >= 0
""",
    unkeyed=unkeyed("deleted"),
    counted_off=counted_off("deleted"),
    settled=settled("unfinished"),
)


class OperatorActions(Inspection):
    """What an operator does to jobs (an action that fails names the job's state, read as
    :class:`~miniqueue.store.inspection.Inspection` reads it)."""

    _requeue = Statement(_REQUEUE)
    _cancel = Statement(_CANCEL)
    _delete = Statement(_DELETE)

    def requeue(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Make the given ``failed``, ``dead`` or ``cancelled`` jobs available now.

        ``attempt`` is kept (it is the fencing token and must never repeat) and ``max_attempts``
        is raised to ``attempt + <the attempts the job was enqueued with>``, so the job gets its
        full budget again. Raises JobNotFound or InvalidTransition (naming the state) if any id
        cannot be requeued; then nothing is requeued.
        """
        return run(conn, self.requeue_steps(job_ids))

    def requeue_steps(self, job_ids: Sequence[int]) -> Steps[list[int]]:
        """:meth:`requeue` as steps."""
        return atomic(
            _refusing_held_keys(
                self._apply_to_all(
                    job_ids, self._requeue, _requeue_filter(REQUEUEABLE_STATES), "requeue", REQUEUEABLE_STATES
                )
            )
        )

    def requeue_matching(
        self, conn: Connection, states: Iterable[State], *, queue: str | None = None, task: str | None = None
    ) -> int:
        """Requeue every job in ``states`` (failed/dead/cancelled), optionally of one queue or task."""
        return run(conn, self.requeue_matching_steps(states, queue=queue, task=task))

    def requeue_matching_steps(
        self, states: Iterable[State], *, queue: str | None = None, task: str | None = None
    ) -> Steps[int]:
        """:meth:`requeue_matching` as steps."""
        chosen = {State(s) for s in states}
        if not chosen or not chosen <= REQUEUEABLE_STATES:
            raise InvalidInput(
                f"requeue states {sorted(s.value for s in chosen)} are invalid: choose among failed, dead, cancelled"
            )
        params = {**_requeue_filter(chosen), "ids": None, "queue": queue, "task": task}
        requeued = yield from _refusing_held_keys(rows(self._requeue, params))
        return len(requeued)

    def cancel(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Cancel the given ``available``, ``running`` or ``waiting`` jobs.

        A running job's lease ends at once: its worker's next heartbeat or completion finds the
        lease gone and tells the handler to stop; its outcome is discarded. Jobs waiting for a
        cancelled job are cancelled too (and theirs), each with an error naming its parent.
        Raises JobNotFound or InvalidTransition if any id cannot be cancelled; then nothing is
        cancelled.
        """
        return run(conn, self.cancel_steps(job_ids))

    def cancel_steps(self, job_ids: Sequence[int]) -> Steps[list[int]]:
        """:meth:`cancel` as steps."""
        return atomic(self._apply_to_all(job_ids, self._cancel, {}, "cancel", CANCELLABLE_STATES))

    def _apply_to_all(
        self, job_ids: Sequence[int], query: str, params: dict[str, Any], verb: str, allowed: frozenset[State]
    ) -> Steps[list[int]]:
        """Run ``query`` on every id (once each), and fail (rolling back) unless it applied to all."""
        ids = list(dict.fromkeys(job_ids))
        rows: list[tuple[Any, ...]] = yield Query(query, {**params, "ids": bigints(ids)})
        done = {row[0] for row in rows}
        missing = [i for i in ids if i not in done]
        if not missing:
            return ids
        found: list[tuple[Any, ...]] = yield Query(self._states, {"ids": bigints(missing)})
        states = {row[0]: row[1] for row in found}
        for job_id in missing:
            if job_id not in states:
                raise JobNotFound(job_id)
        job_id = missing[0]
        names = ", ".join(sorted(s.value for s in allowed))
        past = "cancelled" if verb == "cancel" else f"{verb}d"
        raise InvalidTransition(f"cannot {verb} job {job_id}: it is {states[job_id]}; only {names} jobs can be {past}")

    def delete(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Delete jobs that are not running; return the ids deleted (a running job is left alone:
        cancel it first)."""
        return sorted(row[0] for row in self._rows(conn, self._delete, {"ids": bigints(job_ids)}))


def _refusing_held_keys(steps: Steps[T]) -> Steps[T]:
    """A requeue's ``steps``, with a job whose unique key another job holds now refused as bad
    input (the unique index refuses it: two jobs would hold one key)."""
    try:
        return (yield from steps)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "idx_miniqueue_jobs_unique_key":
            raise
        detail = exc.diag.message_detail or ""
        held = detail.removeprefix("Key (unique_key)=(").removesuffix(") already exists.")
        raise InvalidInput(
            f"cannot requeue: another job holds its unique key {held!r} now; wait for that job to finish, "
            "or cancel it, then requeue"
        ) from exc


def _requeue_filter(states: Iterable[State]) -> dict[str, Any]:
    return {"states": sorted(s.value for s in states), "queue": None, "task": None}
