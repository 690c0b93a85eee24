"""Which jobs a worker process is running a handler for, readable after the process died.

When a worker dies, the supervisor must charge an attempt only to the jobs whose handler was
running (one of them is the likely cause), never to jobs the worker merely held: prefetched
ones waiting for a thread, or finished ones whose outcome was not yet recorded. Report lines
to the supervisor are batched every 0.1 s, so they cannot say which handler was running at
the instant of a crash. This board can: a page of memory shared between the supervisor and
one worker (an anonymous ``MAP_SHARED`` mapping made before ``fork()``), with one slot per
handler thread. A thread writes its job into its slot before calling the handler and clears
it after, with plain memory stores (no system call, no lock: each thread owns its slot). The
supervisor reads the board only after ``waitpid`` has reaped the worker, so it never sees a
half-written slot.

The header also records that the worker was asked to stop (TERM, INT, QUIT, or its own
``max_jobs``), so a death during a requested stop is not charged as a crash.
"""

from __future__ import annotations

import itertools
import mmap
import struct
import threading
import time

from .context import Job

_HEADER = struct.Struct("=q")  # 1 once the worker was asked to stop
_SLOT = struct.Struct("=qqd")  # job id (0: free), attempt, time.monotonic() when the handler started


class InflightBoard:
    """One worker's running handlers, in memory shared with the supervisor."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._map = mmap.mmap(-1, _HEADER.size + slots * _SLOT.size)
        self._local = threading.local()
        self._next_slot = itertools.count()
        self._lock = threading.Lock()

    # -- the worker's side -------------------------------------------------------------------

    def handler_started(self, job: Job) -> None:
        """Record that this thread now runs ``job``'s handler."""
        slot = self._slot()
        if slot is not None:
            _SLOT.pack_into(self._map, _HEADER.size + slot * _SLOT.size, job.id, job.attempt, job.started_at)

    def handler_finished(self, job: Job) -> None:
        """Record that this thread's handler returned (or raised)."""
        slot = self._slot()
        if slot is not None:
            _SLOT.pack_into(self._map, _HEADER.size + slot * _SLOT.size, 0, 0, 0.0)

    def stop_requested(self) -> None:
        """Record that the worker was asked to stop: what it leaves behind is not a crash."""
        _HEADER.pack_into(self._map, 0, 1)

    def _slot(self) -> int | None:
        slot: int | None = getattr(self._local, "slot", -1)
        if slot == -1:
            with self._lock:
                slot = next(self._next_slot)
            # More handler threads than slots cannot happen (a worker runs at most
            # `concurrency` of them); if it did, that thread's jobs would count as not running.
            slot = self._local.slot = slot if slot < self.slots else None
        return slot

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
