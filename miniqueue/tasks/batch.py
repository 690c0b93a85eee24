"""The options of a batch task: its handler receives up to ``size`` of its jobs at once."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError
from .job import Job

#: What a batch handler returns: None (every job completes), or the outcome of each job by its
#: id: a value is that job's result, an exception instance is what that job raised (a
#: :class:`~miniqueue.Snooze`, a :class:`~miniqueue.PermanentError`, any other to retry it). A
#: job the mapping leaves out completes with the result it set, if any.
BatchOutcomes = Mapping[int, Any] | None
BatchHandler = Callable[[list[Job]], Any]

#: The largest batch: a batch's jobs are held, renewed and recorded together.
MAX_BATCH_SIZE = 1000


@dataclass(frozen=True)
class Batch:
    """Hand a task's jobs to its handler ``size`` at a time, as a ``list[Job]``.

    A batch starts once ``size`` jobs are ready on a worker, or once the oldest has waited
    ``wait`` seconds. Each job keeps its own attempts, limits, result and history: the handler
    returns the outcome of each job by id (see :data:`BatchOutcomes`), or raises to fail every
    job of the batch, each charged one attempt.
    """

    size: int = 100
    wait: float = 1.0

    def checked(self, task: str) -> Batch:
        """These options, or ConfigError naming the bad value and the rule."""
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 1 <= self.size <= MAX_BATCH_SIZE:
            raise ConfigError(
                f"task {task!r}: batch size {self.size!r} is invalid: use a whole number from 1 to {MAX_BATCH_SIZE}"
            )
        if isinstance(self.wait, bool) or not isinstance(self.wait, int | float) or not 0 <= self.wait < math.inf:
            raise ConfigError(f"task {task!r}: batch wait {self.wait!r} is invalid: use 0 or more seconds")
        return self


def each_outcome(jobs: Sequence[Job], returned: object) -> dict[int, tuple[Any, BaseException | None]]:
    """Each job's result (or the exception it counts as having raised) from what a batch
    handler returned (see :data:`BatchOutcomes`). Anything else fails every job: completing
    them without it could lose what the handler meant."""
    if returned is None:
        returned = {}
    if not isinstance(returned, Mapping):
        error = TypeError(
            f"the batch handler of task {jobs[0].task!r} returned {type(returned).__name__}: return None "
            "or a dict of each job's result (or exception) by job id"
        )
        return {job.id: (None, error) for job in jobs}
    outcomes: dict[int, tuple[Any, BaseException | None]] = {}
    for job in jobs:
        value = returned.get(job.id)
        outcomes[job.id] = (None, value) if isinstance(value, BaseException) else (value, None)
    return outcomes
