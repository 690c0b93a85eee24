"""Requeue, cancel and delete applied to a selection of jobs or to every job matching a filter.

A selection may hold jobs the action does not apply to (a completed job cannot be cancelled):
those are left out and the confirmation says so. Jobs move on while an operator reads the
confirmation, so the ids are re-checked when the action runs, and an action on a filter applies
to at most the number of jobs the operator confirmed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import ImmutableMultiDict

from ..client.client import Client
from ..core.db import Connection
from ..core.errors import InvalidInput, InvalidTransition, JobNotFound
from ..core.records import CANCELLABLE_STATES, REQUEUEABLE_STATES, State
from .filters import JobFilter, parse_id

BATCH = 1000
MAX_SELECTION = 10_000
RETRIES = 3


@dataclass(frozen=True)
class JobAction:
    """An operator action on jobs: the states it applies to and the client call that does it."""

    name: str
    verb: str
    states: frozenset[State]
    run: Callable[[Client, Connection, Sequence[int]], list[int]]
    warning: str = ""


ACTIONS = {
    "requeue": JobAction(
        "requeue",
        "Requeue",
        REQUEUEABLE_STATES,
        lambda c, conn, ids: c.requeue(ids, conn=conn),
        "They become available at once, with a fresh attempt budget.",
    ),
    "cancel": JobAction(
        "cancel",
        "Cancel",
        CANCELLABLE_STATES,
        lambda c, conn, ids: c.cancel(ids, conn=conn),
        "A running handler is told to stop at its next heartbeat; jobs waiting for them are cancelled too.",
    ),
    "delete": JobAction(
        "delete",
        "Delete",
        frozenset(State) - {State.RUNNING},
        lambda c, conn, ids: c.delete(ids, conn=conn),
        "Deleted jobs and their error history are gone for good.",
    ),
}


def action_named(name: str) -> JobAction:
    if name not in ACTIONS:
        raise InvalidInput(f"action {name!r} is invalid: use requeue, cancel or delete")
    return ACTIONS[name]


@dataclass(frozen=True)
class Target:
    """The jobs an action applies to: the selected ``ids``, or (ids None) every job matching ``filter``."""

    ids: tuple[int, ...] | None
    filter: JobFilter

    @classmethod
    def parse(cls, params: ImmutableMultiDict[str, Any]) -> Target:
        """Read ``ids`` (repeated) or ``scope=matching`` plus the filter fields."""
        flt = JobFilter.parse(params)
        if params.get("scope") == "matching":
            return cls(None, flt)
        texts = [str(v) for v in params.getlist("ids")]
        if not texts:
            raise InvalidInput("no job selected: tick the jobs to act on, or act on all matching jobs")
        if len(texts) > MAX_SELECTION:
            raise InvalidInput(f"the selection has {len(texts)} jobs: select at most {MAX_SELECTION}")
        return cls(tuple(dict.fromkeys(parse_id(t) for t in texts)), flt)

    def fields(self) -> list[tuple[str, str]]:
        """Hidden form fields that carry this target to the next request."""
        if self.ids is None:
            return [("scope", "matching"), *self.filter.items()]
        return [*(("ids", str(i)) for i in self.ids), *self.filter.items()]

    def describe(self) -> str:
        if self.ids is None:
            return f"every job matching: {self.filter.describe()}"
        return f"{len(self.ids)} selected job(s)"


@dataclass(frozen=True)
class Preview:
    """What the confirmation page shows: how many jobs the action will touch, and which it skips."""

    count: int
    skipped: dict[str, int]

    @classmethod
    def total(cls, previews: Sequence[Preview]) -> Preview:
        """The previews of an action's parts (one per database of a map) added up."""
        skipped: dict[str, int] = {}
        for part in previews:
            for label, n in part.skipped.items():
                skipped[label] = skipped.get(label, 0) + n
        return cls(sum(p.count for p in previews), skipped)


def preview(client: Client, conn: Connection, action: JobAction, target: Target) -> Preview:
    """Count the jobs ``action`` would apply to now."""
    if target.ids is None:
        counts = (client.count_jobs(conn=conn, **f.client_kwargs()) for f in _state_filters(action, target))
        return Preview(sum(counts), {})
    states = client.job_states(target.ids, conn=conn)
    skipped: dict[str, int] = {}
    for job_id in target.ids:
        state = states.get(job_id)
        if state not in action.states:
            label = state.value if state else "deleted"
            skipped[label] = skipped.get(label, 0) + 1
    return Preview(len(target.ids) - sum(skipped.values()), skipped)


def apply(client: Client, conn: Connection, action: JobAction, target: Target, limit: int) -> list[int]:
    """Apply ``action`` to at most ``limit`` jobs of ``target`` that are in a state it applies to;
    return the ids it applied to."""
    if target.ids is not None:
        return apply_to_ids(client, conn, action, list(target.ids)[:limit])
    done: list[int] = []
    for flt in _state_filters(action, target):
        while len(done) < limit:
            ids = client.job_ids(limit=min(BATCH, limit - len(done)), conn=conn, **flt.client_kwargs())
            if not ids:
                break
            applied = apply_to_ids(client, conn, action, ids)
            done += applied
            if not applied:
                break
    return done


def apply_to_ids(client: Client, conn: Connection, action: JobAction, ids: list[int]) -> list[int]:
    """Apply ``action`` to those of ``ids`` it applies to. Requeue and cancel are all-or-nothing,
    so a job that changed state since it was checked makes the client refuse the batch: check
    again and retry."""
    for _ in range(RETRIES):
        states = client.job_states(ids, conn=conn)
        eligible = [i for i in ids if states.get(i) in action.states]
        if not eligible:
            return []
        try:
            return list(action.run(client, conn, eligible))
        except (InvalidTransition, JobNotFound):
            continue
    raise InvalidTransition(f"cannot {action.name} these jobs: they keep changing state; try again")


def _state_filters(action: JobAction, target: Target) -> list[JobFilter]:
    """The target's filter split into one filter per state the action applies to; none when no
    job can match it (see :meth:`JobFilter.matchable`)."""
    if not target.filter.matchable():
        return []
    wanted = {target.filter.state} if target.filter.state else set(State)
    return [target.filter.with_state(s) for s in sorted(action.states & wanted, key=lambda s: s.value)]
