"""Which jobs a worker process is running a handler for, readable after the process died.

When a worker dies, the supervisor must charge an attempt only to the jobs whose handler was
running (one of them is the likely cause), never to jobs the worker merely held: prefetched
ones waiting for a thread, or finished ones whose outcome was not yet recorded. Report lines
to the supervisor are batched every 0.1 s, so they cannot say which handler was running at
the instant of a crash. This board can: a page of memory shared between the supervisor and
one worker (an anonymous ``MAP_SHARED`` mapping made before ``fork()``), with a slot per
running handler, thread or coroutine alike. A handler takes a free slot and writes its job
there before it runs and clears it after, with plain memory stores (no system call; the
worker's calls come one at a time, under the lock of its progress reports). The supervisor reads
the board only after ``waitpid`` has reaped the worker, so it never sees a half-written slot.

The header also records that the worker was asked to stop (TERM, INT, QUIT, or its own
``max_jobs``), so a death during a requested stop is not charged as a crash.
"""

from __future__ import annotations

import mmap
import struct
import time

from ..tasks.job import Job

_HEADER = struct.Struct("=q")  # 1 once the worker was asked to stop
_SLOT = struct.Struct("=qqd")  # job id (0: free), attempt, time.monotonic() when the handler started


class InflightBoard:
    """One worker's running handlers, in memory shared with the supervisor. The worker's calls
    must come one at a time (its caller holds a lock)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._map = mmap.mmap(-1, _HEADER.size + slots * _SLOT.size)
        self._free = list(range(slots - 1, -1, -1))
        self._taken: dict[int, int] = {}  # job id -> slot

    # -- the worker's side -------------------------------------------------------------------

    def handler_started(self, job: Job) -> None:
        """Record that ``job``'s handler now runs."""
        # More running handlers than slots cannot happen (the supervisor sizes the board for
        # both kinds at full concurrency); if it did, that job would count as not running.
        if not self._free:
            return
        slot = self._taken[job.id] = self._free.pop()
        _SLOT.pack_into(self._map, _HEADER.size + slot * _SLOT.size, job.id, job.run, job.started_at)

    def handler_finished(self, job: Job) -> None:
        """Record that ``job``'s handler returned (or raised)."""
        slot = self._taken.pop(job.id, None)
        if slot is None:
            return
        _SLOT.pack_into(self._map, _HEADER.size + slot * _SLOT.size, 0, 0, 0.0)
        self._free.append(slot)

    def stop_requested(self) -> None:
        """Record that the worker was asked to stop: what it leaves behind is not a crash."""
        _HEADER.pack_into(self._map, 0, 1)

    # -- the supervisor's side (after waitpid) ------------------------------------------------

    def was_stop_requested(self) -> bool:
        return bool(_HEADER.unpack_from(self._map, 0)[0])

    def running(self) -> dict[int, tuple[int, float]]:
        """Job id → (attempt, seconds its handler had run) for every handler running at the end."""
        now = time.monotonic()
        found = {}
        for slot in range(self.slots):
            job_id, attempt, started = _SLOT.unpack_from(self._map, _HEADER.size + slot * _SLOT.size)
            if job_id:
                found[job_id] = (attempt, max(0.0, now - started))
        return found

    def close(self) -> None:
        self._map.close()
