"""Sequences as operators see them: the keys a failed or dead job blocks, and their release."""

from __future__ import annotations

from typing import Any

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.records import BlockedSequence
from ..core.steps import Query, Steps, atomic, run
from .base import Statement, StoreBase
from .rows import monitoring

# Hand a blocked sequence key on: its failed or dead head stays as it is, and the key's next job
# runs (miniqueue_sequence_advance, forced). Returns the job that blocked it (no row: the key is
# not blocked).
_RELEASE_SEQUENCE = """
WITH blocked AS (
    SELECT s.head FROM {sequences} s JOIN {jobs} h ON h.id = s.head
     WHERE s.key = %(key)s AND h.state IN ('failed', 'dead')
       FOR UPDATE OF s
), released AS (
    SELECT {advance}(ARRAY[%(key)s::text], {queue_channel}, force => true) WHERE EXISTS (SELECT 1 FROM blocked)
)
SELECT head FROM blocked WHERE (SELECT count(*) FROM released) >= 0
"""

# The sequence keys a failed or dead job blocks, with that job, its state and how many jobs wait
# behind it (read from the sequences' waiting index: its cost grows with the jobs waiting).
_BLOCKED_SEQUENCES = """
SELECT s.key, s.head, h.state, h.task, h.last_error,
       (SELECT count(*) FROM {jobs} w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM {sequences} s JOIN {jobs} h ON h.id = s.head
 WHERE h.state IN ('failed', 'dead') AND s.on_failure = 'block'
 ORDER BY s.key LIMIT %(limit)s
"""

# One sequence key: the job holding it (NULL: none) and its state, and the jobs waiting behind it.
_SEQUENCE = """
SELECT s.head, h.state, s.on_failure,
       (SELECT count(*) FROM {jobs} w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM {sequences} s LEFT JOIN {jobs} h ON h.id = s.head
 WHERE s.key = %(key)s
"""


class Sequences(StoreBase):
    """The sequence keys' state, and an operator's release of a blocked one."""

    _release_sequence = Statement(_RELEASE_SEQUENCE)
    _blocked_sequences = Statement(_BLOCKED_SEQUENCES)
    _sequence = Statement(_SEQUENCE)

    def release_sequence_steps(self, key: str) -> Steps[tuple[int, int | None]]:
        """Hand sequence ``key`` on from the failed or dead job that blocks it to its next job;
        return ``(blocking job, job holding it now or None)``. InvalidInput when it is not blocked."""
        return atomic(self._release_sequence_in_one(key))

    def _release_sequence_in_one(self, key: str) -> Steps[tuple[int, int | None]]:
        released: list[tuple[Any, ...]] = yield Query(self._release_sequence, {"key": key})
        found: list[tuple[Any, ...]] = yield Query(self._sequence, {"key": key})
        if released:
            return released[0][0], found[0][0]
        if not found:
            raise InvalidInput(f"sequence key {key!r} is unknown: no job of it is waiting, running or blocking it")
        head, state, _, waiting = found[0]
        holder = "no job holds it" if head is None else f"job {head} holds it ({state})"
        raise InvalidInput(f"sequence key {key!r} is not blocked: {holder}, {waiting} waiting")

    def blocked_sequences(self, conn: Connection, limit: int = 1000) -> list[BlockedSequence]:
        """The sequence keys a failed or dead job blocks, by key."""
        return run(conn, self.blocked_sequences_steps(limit))

    def blocked_sequences_steps(self, limit: int = 1000) -> Steps[list[BlockedSequence]]:
        """The sequence keys a failed or dead job blocks, by key."""
        found: list[tuple[Any, ...]] = yield from atomic(monitoring(Query(self._blocked_sequences, {"limit": limit})))
        return [BlockedSequence(*row) for row in found]
