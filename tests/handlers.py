"""Handlers of either kind, ``def`` or ``async def``, made from the same steps: a test of what
holds for both kinds is written once and runs once for each (as River runs one driver suite
against every driver). A step that blocks is the kind's own: ``time.sleep`` on a handler
thread, ``await asyncio.sleep`` on the event loop; ``job.transaction()`` or
``job.atransaction()``; told to stop by ``job.wait`` returning, or by ``CancelledError``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniqueue import LeaseLost
from miniqueue.tasks.job import Job

#: The kinds, as the ``kind`` fixtures' parameters name them.
KINDS = ("def", "async def")
#: The thread an ``async def`` handler runs on: its worker's event loop.
LOOP_THREAD = "miniqueue-loop"

Body = Callable[[Job], Any]
Handler = Callable[[Job], Any]


def nothing(job: Job) -> None:
    """A step that does nothing."""


@dataclass(frozen=True)
class Told:
    """What a handler saw when it was told to stop: the reason, ``job.should_stop()``, and (an
    ``async def`` handler's) the ``CancelledError``'s message."""

    reason: str | None
    should_stop: bool
    cancelled: str | None


class Stops:
    """What handlers saw when they were told to stop, for the test thread to wait on."""

    def __init__(self) -> None:
        self.seen: list[Told] = []

    async def sleep_until_cancelled(self, job: Job, seconds: float = 30) -> None:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError as exc:
            self.seen.append(Told(job.stop_reason, job.should_stop(), str(exc)))
            raise

    def wait_until_told(self, job: Job, seconds: float = 30) -> None:
        job.wait(seconds)
        self.seen.append(Told(job.stop_reason, job.should_stop(), None))


@dataclass(frozen=True)
class HandlerKind:
    """``def`` or ``async def``: handlers of that kind, and what tests expect of them."""

    name: str

    @property
    def is_async(self) -> bool:
        return self.name == "async def"

    def ran_on(self, thread: str) -> bool:
        """Whether a handler of this kind ran on ``thread`` (by its name)."""
        return thread == LOOP_THREAD if self.is_async else thread.startswith("miniqueue-handler")

    def told(self, reason: str) -> Told:
        """What a handler of this kind sees when told to stop for ``reason``."""
        return Told(reason, True, f"the job should stop: {reason}" if self.is_async else None)

    def calling(self, body: Body) -> Handler:
        """A handler that calls ``body`` (after an ``await``, for an ``async def``) and returns
        what it returns: raising what it raises."""
        if not self.is_async:
            return body

        async def handler(job: Job) -> Any:
            await asyncio.sleep(0)
            return body(job)

        return handler

    def sleeping(self, seconds: float, first: Body = nothing) -> Handler:
        """A handler that calls ``first``, then sleeps ``seconds`` the kind's way."""
        if not self.is_async:

            def blocking(job: Job) -> None:
                first(job)
                time.sleep(seconds)

            return blocking

        async def awaiting(job: Job) -> None:
            first(job)
            await asyncio.sleep(seconds)

        return awaiting

    def until_told(self, stops: Stops, first: Body = nothing, seconds: float = 30) -> Handler:
        """A handler that calls ``first``, then waits until told to stop (``seconds`` at the
        most) and records what it saw in ``stops``: ``job.wait`` returns, or the coroutine is
        cancelled (and re-raises)."""
        if not self.is_async:

            def waiting(job: Job) -> None:
                first(job)
                stops.wait_until_told(job, seconds)

            return waiting

        async def cancelled(job: Job) -> None:
            first(job)
            await stops.sleep_until_cancelled(job, seconds)

        return cancelled

    def writing(self, first: Body = nothing, lost: list[LeaseLost] | None = None) -> Handler:
        """A handler that calls ``first`` (off the event loop for an ``async def``: it may
        block), then inserts its job's id into ``effects`` in the transaction that completes the
        job; a ``LeaseLost`` it raises is recorded in ``lost`` first."""
        if not self.is_async:

            def transaction(job: Job) -> None:
                first(job)
                try:
                    with job.transaction() as tx:
                        tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])
                except LeaseLost as exc:
                    (lost if lost is not None else []).append(exc)
                    raise

            return transaction

        async def atransaction(job: Job) -> None:
            await asyncio.to_thread(first, job)
            try:
                async with job.atransaction() as tx:
                    await tx.execute("INSERT INTO effects (job_id) VALUES (%s)", [job.id])
            except LeaseLost as exc:
                (lost if lost is not None else []).append(exc)
                raise

        return atransaction
