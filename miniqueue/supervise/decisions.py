"""The supervisor's decisions, apart from acting on them: when a slot's next child starts, which
slot TTIN adds or TTOU removes, and which child is killed or retired and on whose account.

Each takes the state (:class:`~miniqueue.supervise.children.Child` records, slot names) and the
clock it is given, and returns what to do; the supervisor does it (forks, signals, logs). So
they are tested with fabricated children and times, without forking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .children import Child

#: The longest wait before a slot's next child, after quick failures in a row.
MAX_RESTART_DELAY = 10.0
#: A child that lived this long was stable: its exit starts the back-off over.
STABLE_AFTER_SECONDS = 10.0
#: The wait after the first quick failure; each further one in a row doubles it.
FIRST_RESTART_DELAY = 0.1


# -- restarts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restart:
    """What follows a child's exit."""

    #: Seconds until the slot's next child starts.
    delay: float
    #: The exit counts as a restart (the child did not exit cleanly).
    counted: bool
    #: Set when children failed to boot ``boot_failure_limit`` times in a row: the supervisor
    #: gives up with this error instead of restarting anything.
    give_up: str | None = None


@dataclass
class RestartBackoff:
    """Restart back-off per slot: a child that exits soon after it started, unclean, waits
    ``FIRST_RESTART_DELAY`` doubled for each such exit in a row, up to ``max_delay``; one that
    lived ``stable_after`` seconds, or exited cleanly, starts the count over. Children that
    never reported ready count as boot failures across every slot: ``boot_failure_limit`` in a
    row and the supervisor gives up (a broken deploy, rather than a crash loop)."""

    boot_failure_limit: int
    max_delay: float = MAX_RESTART_DELAY
    stable_after: float = STABLE_AFTER_SECONDS
    #: Per slot, quick unclean exits in a row.
    failures: dict[str, int] = field(default_factory=dict)
    #: Per slot, unclean exits (the process registry and /metrics show them).
    restarts: dict[str, int] = field(default_factory=dict)
    #: Children that exited before they were ready, in a row.
    boot_failures: int = 0

    def booted(self) -> None:
        """A child reported ready: the boot failures in a row end."""
        self.boot_failures = 0

    def exited(self, child: Child, *, clean: bool, stopping: bool, now: float) -> Restart:
        """``child`` exited at ``now`` (``clean``: with status 0), the supervisor ``stopping``
        or not: when its slot's next child starts, or whether to give up."""
        if not child.ready and not stopping:
            self.boot_failures += 1
            if self.boot_failures >= self.boot_failure_limit:
                detail = child.error or "no error was reported"
                return Restart(
                    0.0,
                    counted=False,
                    give_up=(
                        f"{child.slot} failed to boot {self.boot_failures} times in a row; giving up. "
                        f"Last error:\n{detail}"
                    ),
                )
        if not clean:
            self.restarts[child.slot] = self.restarts.get(child.slot, 0) + 1
        if clean or now - child.started >= self.stable_after:
            self.failures[child.slot] = 0
        else:
            self.failures[child.slot] = self.failures.get(child.slot, 0) + 1
        return Restart(self.delay(self.failures[child.slot]), counted=not clean)

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` quick failures in a row."""
        return 0.0 if failures == 0 else min(FIRST_RESTART_DELAY * 2 ** (failures - 1), self.max_delay)


# -- resizing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resize:
    """TTIN or TTOU: the worker slot added (``add``) or removed, and how many workers then."""

    slot: str
    add: bool
    workers: int


def worker_slots(slots: Iterable[str]) -> list[str]:
    """The worker slots (``worker-N``) among ``slots``, by number."""
    return sorted((s for s in slots if s != "reaper"), key=lambda s: int(s.split("-")[1]))


def resize(slots: Iterable[str], delta: int) -> Resize | None:
    """One worker more (``delta`` > 0: a slot numbered after the last) or fewer (the last slot;
    never fewer than one: None)."""
    workers = worker_slots(slots)
    if delta > 0:
        return Resize(f"worker-{int(workers[-1].split('-')[1]) + 1}", add=True, workers=len(workers) + 1)
    if len(workers) > 1:
        return Resize(workers[-1], add=False, workers=len(workers) - 1)
    return None


# -- kills ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    """SIGKILL ``child``: the jobs its handlers ran are charged, or only ``killed_for`` when
    the kill is on that one job's account (a hard timeout)."""

    child: Child
    reason: str
    killed_for: int | None = None


@dataclass(frozen=True)
class Retire:
    """Stop ``child`` gracefully, charging the job it is made to abandon (the memory ceiling:
    that job may be the leak)."""

    child: Child
    reason: str


def overdue(
    children: Iterable[Child],
    now: float,
    *,
    liveness_timeout: float,
    timeout_grace: float,
    max_memory_mb: float | None = None,
    rss_mb: Callable[[int], float | None] = lambda pid: None,
) -> list[Kill | Retire]:
    """The children to kill or retire at ``now``: one silent for more than
    ``liveness_timeout`` seconds, or running a job past its task's hard timeout plus
    ``timeout_grace`` (killed on that job's account), is killed; a worker whose resident memory
    (``rss_mb(pid)``, None when it cannot be read) is over ``max_memory_mb`` is retired. A
    child already killed is left to die; a retiring one can still be killed."""
    actions: list[Kill | Retire] = []
    for child in children:
        if child.kill_reason and not child.retiring:
            continue
        silent = now - child.last_report
        if silent > liveness_timeout:
            actions.append(Kill(child, f"worker process killed: no report for {silent:.0f}s"))
            continue
        for job_id, job in child.jobs.items():
            if job.timeout is not None and now - job.started > job.timeout + timeout_grace:
                actions.append(
                    Kill(
                        child,
                        f"worker process killed: job {job_id} ({job.task}) exceeded its {job.timeout:g}s timeout",
                        killed_for=job_id,
                    )
                )
                break
        else:
            if max_memory_mb is None or child.worker_id is None or child.retiring:
                continue
            rss = rss_mb(child.pid)
            if rss is not None and rss > max_memory_mb:
                actions.append(Retire(child, f"RSS {rss:.0f} MB is over --max-memory-per-child {max_memory_mb:g} MB"))
    return actions
