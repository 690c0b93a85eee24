"""The producer of the keyed jobs (``--unique``, ``--sequences``): it enqueues their bursts while
the faults fly, finds afterwards the jobs whose enqueue reply was lost, and, once the run is
quiet, checks the sequence key a dead job blocks and releases it.

The feeder is a thread of the harness with a :class:`~miniqueue.Client` of its own (over several
databases a :class:`~miniqueue.ShardedClient`: each key's jobs go to the database of its hash), so
its connections are ``miniqueue:client`` ones, which ``terminate-backend`` may pick, and a restart
cuts them too: an enqueue that fails on a dead connection is retried (for up to
:data:`RETRY_SECONDS`). A retry after a reply that was lost may find its first try committed: a
sequence job's idempotency key then returns that job, and a unique job's key returns it as the
holder (or, if it has finished meanwhile, stores a second job; :func:`reconcile` finds every
keyed job the database holds, whatever the replies said).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from miniqueue import Client, EnqueueResult
from miniqueue.client.sharded import ShardedClient
from miniqueue.core.errors import DatabaseUnavailable, MiniqueueError

from .app import app as chaos_app
from .faults import Injector
from .fleet import Fleet
from .keyed import Rows
from .site import Site
from .workload import Feed, KeyedEnqueue, Planned, Workload

#: How long one enqueue is retried through connection errors before it counts as failed.
RETRY_SECONDS = 60.0
#: How long the released key's remaining jobs may take to complete.
RELEASE_TIMEOUT = 60.0

_RETRIABLE = (DatabaseUnavailable, psycopg.OperationalError)


class Feeder:
    """Enqueues the workload's feeds at their times (seconds after :meth:`start`), in a thread."""

    def __init__(
        self, open_client: Callable[[], Client | ShardedClient], workload: Workload, say: Callable[[str], None]
    ) -> None:
        self.open_client, self.workload, self.say = open_client, workload, say
        self.stopping = threading.Event()
        self.crashed: str | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-feeder", daemon=True)
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float) -> bool:
        """Wait for the last feed; False if it is still going after ``timeout`` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            client: Client | ShardedClient | None = self._retrying(self.open_client)[0]
            if client is None:
                self.crashed = "could not open a client"
                return
            with client:
                for feed in self.workload.feeds:
                    if self.stopping.wait(max(0.0, self._t0 + feed.at - time.monotonic())):
                        return
                    self._feed(client, feed)
        except BaseException as exc:  # reported as a problem, never lost in a thread
            self.crashed = f"{type(exc).__name__}: {exc}"

    def _feed(self, client: Client | ShardedClient, feed: Feed) -> None:
        if feed.method == "client.enqueue_many":
            started = time.time()
            results, retries, error = self._retrying(lambda: client.enqueue_many([p.spec for p in feed.jobs]))
            for index, planned in enumerate(feed.jobs):
                result = results[index] if results is not None else None
                self._record(feed, planned, started, result, retries, error)
            return
        for planned, gap in zip(feed.jobs, feed.gaps, strict=True):
            if gap and self.stopping.wait(gap):
                return
            started = time.time()
            one, retries, error = self._retrying(functools.partial(_enqueue_one, client, feed.method, planned))
            self._record(feed, planned, started, one, retries, error)

    def _record(
        self,
        feed: Feed,
        planned: Planned,
        started: float,
        result: EnqueueResult | None,
        retries: int,
        error: str | None,
    ) -> None:
        payload: dict[str, Any] = planned.spec.payload
        entry = KeyedEnqueue(feed.kind, feed.key, feed.method, int(payload["n"]), started, time.time())
        entry.retries, entry.error = retries, error
        workload = self.workload
        if result is not None:
            entry.id, entry.duplicate = result.id, result.duplicate
            if result.id not in workload.sleep_ms and (not result.duplicate or feed.kind == "sequence"):
                # A new job; or, for a sequence job, its own (a retry's idempotency key found it).
                workload.add(result.id, planned)
                if payload.get("fail"):
                    workload.failing[result.id] = feed.key
            if feed.kind == "sequence":
                order = workload.sequence_order.setdefault(feed.key, [])
                if result.id not in order:
                    order.append(result.id)
        workload.enqueues.append(entry)

    def _retrying(self, call: Callable[[], Any]) -> tuple[Any, int, str | None]:
        """``(result, retries, None)``, or ``(None, retries, error)``: connection errors are retried
        until RETRY_SECONDS have passed; any other error is the enqueue's answer."""
        deadline = time.monotonic() + RETRY_SECONDS
        retries, delay = 0, 0.05
        while True:
            try:
                return call(), retries, None
            except _RETRIABLE as exc:
                if time.monotonic() > deadline or self.stopping.is_set():
                    return None, retries, f"{type(exc).__name__}: {exc}"
                retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except (MiniqueueError, psycopg.Error) as exc:
                return None, retries, f"{type(exc).__name__}: {exc}"


def _enqueue_one(client: Client | ShardedClient, method: str, planned: Planned) -> EnqueueResult:
    """One job, through the app (which computes its key from the payload) or the client (key given)."""
    spec = planned.spec
    options: dict[str, Any] = {
        "queue": spec.queue,
        "max_attempts": spec.max_attempts,
        "idempotency_key": spec.idempotency_key,
    }
    if method == "app.enqueue":
        return chaos_app.enqueue(client, spec.task, spec.payload, **options)
    return client.enqueue(
        spec.task, spec.payload, unique_key=spec.unique_key, sequence_key=spec.sequence_key, **options
    )


_KEYED_JOBS = """
SELECT k.job_id, j.payload FROM chaos_keyed k JOIN miniqueue_jobs j ON j.id = k.job_id ORDER BY k.job_id
"""


def reconcile(db: Rows, workload: Workload) -> list[int]:
    """Add to the workload every keyed job the database stored that no enqueue returned."""
    found = []
    for job, payload in db.rows(_KEYED_JOBS):
        if int(job) not in workload.sleep_ms:
            workload.add_found(int(job), dict(payload))
            found.append(int(job))
    return found


@dataclass
class Blocked:
    """The blocked sequence key, as the harness found it once the run was quiet, and its release."""

    key: str
    job: int | None  # the job planned to die
    state: str | None = None  # its state then
    behind: dict[int, str] = field(default_factory=dict)  # the key's later jobs and their states then
    claimed_behind: list[int] = field(default_factory=list)  # later jobs claimed before the release
    #: What client.blocked_sequences() listed: (key, blocking job, its state, jobs waiting).
    listed: list[tuple[str, int, str, int]] = field(default_factory=list)
    released: tuple[int, int | None] | None = None  # release_sequence(key): (blocking job, holder now)
    completed_after: float | None = None  # seconds from the release until the rest had completed
    listed_after: bool = False  # the key still listed as blocked after the release
    error: str | None = None


_KEY_JOBS = "SELECT id, state FROM miniqueue_jobs WHERE sequence_key = %s ORDER BY id"
_CLAIMED = "SELECT DISTINCT job_id FROM chaos_transitions WHERE to_state = 'running' AND job_id = ANY(%s) ORDER BY 1"
_NOT_COMPLETED = "SELECT count(*) FROM miniqueue_jobs WHERE id = ANY(%s) AND state <> 'completed'"


def release_blocked(
    site: Site, workload: Workload, fleet: Fleet, injector: Injector, say: Callable[[str], None]
) -> Blocked:
    """With the run quiet (drained, no fault in progress): the key's dead job still blocks it (its
    later jobs waiting, never claimed), ``client.blocked_sequences()`` names it; then
    ``client.release_sequence(key)``, and wait for the rest of the key to complete. Over several
    databases, all on the key's database (its jobs went to the database of its hash)."""
    key = workload.blocked_key or ""
    job = next((j for j, k in sorted(workload.failing.items()) if k == key), None)
    blocked = Blocked(key, job)
    if job is None:
        blocked.error = "the job planned to die was never enqueued"
        return blocked
    shard = site.shard_of(job)
    db, dsn = shard.db, shard.server.dsn
    states = {int(j): str(state) for j, state in db.rows(_KEY_JOBS, (key,))}
    blocked.state = states.get(job)
    blocked.behind = {j: state for j, state in states.items() if j > job}
    behind = sorted(blocked.behind)
    blocked.claimed_behind = [int(r[0]) for r in db.rows(_CLAIMED, (behind,))]
    with Client(dsn) as client:
        blocked.listed = [(b.key, b.job_id, b.state, b.waiting) for b in client.blocked_sequences()]
        say(f"sequences: {key} blocked by job {job} ({blocked.state}), {len(behind)} waiting; releasing it")
        try:
            blocked.released = client.release_sequence(key)
        except MiniqueueError as exc:
            blocked.error = f"release_sequence({key!r}) raised {type(exc).__name__}: {exc}"
            return blocked
        started = time.monotonic()
        while True:
            fleet.monitor()
            injector.tick()
            left = int(db.value(_NOT_COMPLETED, (behind,)))
            if left == 0:
                blocked.completed_after = time.monotonic() - started
                break
            if time.monotonic() - started > RELEASE_TIMEOUT:
                blocked.error = f"{left} of the key's later jobs not completed {RELEASE_TIMEOUT:g}s after the release"
                break
            time.sleep(0.1)
        blocked.listed_after = any(b.key == key for b in client.blocked_sequences())
    if blocked.completed_after is not None:
        say(f"sequences: {key} released, its {len(behind)} later jobs completed in {blocked.completed_after:.1f}s")
    return blocked
