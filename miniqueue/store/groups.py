"""Groups that grow: a running member enqueues a job into its own group, in the transaction that
completes it (:meth:`miniqueue.Job.add_to_group`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.errors import InvalidInput, LeaseLost
from ..core.records import EnqueueResult
from ..core.steps import Query, Steps
from ..core.validation import NewJob
from .base import Statement, StoreBase
from .enqueue import _LOCK_PARENTS

# The jobs waiting for a running member (its group's callbacks), fenced by its lease; locked so
# that its own finish, which releases them, waits for the job added beside it.
_DEPENDENTS_OF_HELD = """
SELECT dependents FROM {jobs}
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
   FOR NO KEY UPDATE
"""

# A job added to a running member's group: each callback still waiting waits for it too, and it
# names them as its dependents (which its finish releases, as a member's does).
_JOIN_GROUP = """
WITH joined AS (
    UPDATE {jobs} SET parents = array_append(parents, %(id)s::bigint), pending_parents = pending_parents + 1
     WHERE id = ANY(%(callbacks)s::bigint[]) AND state = 'waiting'
    RETURNING id
)
UPDATE {jobs} SET dependents = ARRAY(SELECT id FROM joined ORDER BY id) WHERE id = %(id)s
"""


class Groups(StoreBase):
    """Jobs added to a running member's group."""

    _lock_callbacks = Statement(_LOCK_PARENTS)
    _dependents_of_held = Statement(_DEPENDENTS_OF_HELD)
    _join_group = Statement(_JOIN_GROUP)
    #: The plain enqueue (:class:`~miniqueue.store.enqueue.Enqueuing`, beside this in the Store).
    enqueue_steps: Callable[..., Steps[EnqueueResult]]

    def add_to_group_steps(self, member: int, worker_id: str, attempt: int, job: NewJob) -> Steps[EnqueueResult]:
        """Enqueue ``job`` beside running job ``member`` (held by ``worker_id`` at ``attempt``,
        else LeaseLost): the jobs that wait for the member (its group's callbacks) wait for it
        too. Run it in the member's completing transaction, so that both happen or neither."""
        held: list[tuple[Any, ...]] = yield Query(
            self._dependents_of_held, {"id": member, "attempt": attempt, "worker": worker_id}
        )
        if not held:
            raise LeaseLost(member, worker_id, attempt)
        callbacks = list(held[0][0] or [])
        if not callbacks:
            raise InvalidInput(f"job {member} is in no group (no job waits for it): there is nothing to add to")
        yield Query(self._lock_callbacks, {"ids": callbacks})
        result = yield from self.enqueue_steps(job)
        if not result.duplicate:
            yield Query(self._join_group, {"id": result.id, "callbacks": callbacks})
        return result
