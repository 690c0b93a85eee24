"""Returning the jobs of a worker the supervisor has reaped.

Its holder is known dead (``waitpid`` said so), so its jobs may leave ``running`` at once
instead of waiting for their leases to expire. Only a death nobody asked for (a crash, a kill
from outside, a hard timeout, the memory ceiling) costs an attempt, and only to the job whose
handler was running, as the worker's :class:`~miniqueue.worker.inflight.InflightBoard` shows: the
others (prefetched, or finished with the outcome not yet recorded) go back uncharged, as does
everything a worker we asked to stop leaves behind. When several handlers were running (a
batch, or handler threads), which of them killed the process is not known: none is charged,
and each runs alone next (no other handler in its process), where a death is its own. A worker
that drained holds nothing; one that hit its shutdown timeout may hold a job whose handler
returned after it stopped recording outcomes, so the database is always asked, and asked
again a moment later (:func:`release_stragglers`): a claim the worker sent just before it died
may commit after the first look, its jobs leased to nobody alive.
"""

from __future__ import annotations

import logging

from ..core.db import connect
from ..core.errors import MiniqueueError
from ..core.records import State
from ..store.store import Failure, Release, Store
from .children import Child

log = logging.getLogger("miniqueue.supervisor")


def release_leases(dsn: str, store: Store, child: Child, how: str) -> None:
    """Return every job the reaped worker ``child`` still held; ``how`` it ended
    (``killed by SIGKILL``, ``exited with code 0``)."""
    assert child.board is not None and child.worker_id is not None
    running, asked = child.board.running(), child.board.was_stop_requested() or child.stop_reason is not None
    child.board.close()
    charged = bool(child.kill_reason) or not asked
    died = child.kill_reason or f"worker process died: {how.removeprefix('killed by ')}"
    # A kill on one job's account (its hard timeout) charges that job only.
    culprits = set(running) if child.killed_for is None else {child.killed_for} & set(running)
    try:
        with connect(dsn, purpose="supervisor", schema=store.schema, connect_timeout=5) as conn:
            held = store.leases_of(conn, child.worker_id)
            suspects = culprits & {i for i, _ in held} if charged else set()
            # Several handlers ran (a batch, threads): which one killed the process is not known,
            # so none pays; each runs alone next, where a death is its own (docs/guarantees.md).
            alone = len(suspects) > 1
            # No backoff given: the task's, as its workers published it (the supervisor has no app).
            failures = [] if alone else [Failure(i, a, f"{died} (pid {child.pid})") for i, a in held if i in suspects]
            releases = [
                Release(i, a, _note(child, running.get(i), died, charged, len(suspects) if alone else 0), alone)
                for i, a in held
                if alone or i not in suspects
            ]
            states = store.record_failures(conn, child.worker_id, failures)
            released = store.release(conn, child.worker_id, releases)
    except MiniqueueError as exc:
        log.warning("could not release the leases of %s (%s); the reaper will recover them at expiry", child.slot, exc)
        return
    for job_id, state in sorted(states.items()):
        level = logging.ERROR if state is State.DEAD else logging.WARNING
        log.log(level, "job %d charged an attempt (%s): %s", job_id, state.value, died)
    if alone:
        log.warning(
            "%s (pid %d) died (%s) while %d jobs ran (%s): none is charged, each runs alone next to find the cause",
            child.slot,
            child.pid,
            died,
            len(suspects),
            ", ".join(map(str, sorted(suspects))),
        )
    if released:
        log.info(
            "handed back %d job(s) of %s (pid %d) uncharged: %s",
            len(released),
            child.slot,
            child.pid,
            ", ".join(map(str, sorted(released))),
        )


def _note(child: Child, run: tuple[int, float] | None, died: str, charged: bool, suspects: int) -> str:
    """The history entry of a job handed back uncharged; ``suspects``: the handlers that ran when
    the process died, when it was more than one (each runs alone next)."""
    if suspects and run is not None:
        return (
            f"interrupted after {run[1]:.1f}s: {died} (pid {child.pid}) while {suspects} jobs ran in the process; "
            "attempt not charged: it runs alone next, so that a death is charged to the job that causes it"
        )
    if charged and run is not None:  # a neighbour of the job a kill was for
        return f"interrupted after {run[1]:.1f}s: {died} (pid {child.pid}); attempt not charged"
    if charged:
        return f"handed back: {died} (pid {child.pid}) while this job was not running; attempt not charged"
    ran = f" after {run[1]:.1f}s" if run else ""
    why = child.stop_reason or "the worker was asked to stop"
    return f"interrupted{ran}: {why} (pid {child.pid}); attempt not charged"


#: Seconds after a dead worker's leases were first returned before the database is asked again.
SECOND_LOOK_SECONDS = 1.0


def release_stragglers(dsn: str, store: Store, worker_id: str, slot: str, pid: int) -> None:
    """Return, uncharged, the jobs still leased to the dead worker ``worker_id`` after
    :func:`release_leases` returned its leases: a claim it sent just before it died commits after
    its process is gone (the server finishes the statement), and its jobs would otherwise wait for
    their leases to expire and be charged by the reaper. None of them started."""
    note = f"handed back: claimed by a worker process that died (pid {pid}) before it started; attempt not charged"
    try:
        with connect(dsn, purpose="supervisor", schema=store.schema, connect_timeout=5) as conn:
            held = store.leases_of(conn, worker_id)
            released = store.release(conn, worker_id, [Release(i, a, note) for i, a in held])
    except MiniqueueError as exc:
        log.warning("could not look again at the leases of %s (%s); the reaper will recover them", slot, exc)
        return
    if released:
        log.info(
            "handed back %d job(s) claimed by %s (pid %d) as it died, uncharged: %s",
            len(released),
            slot,
            pid,
            ", ".join(map(str, sorted(released))),
        )
