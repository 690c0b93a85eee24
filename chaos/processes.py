"""The processes under test: supervisors started as real ``miniqueue-supervise`` commands,
their children found with psutil, and every pid ever seen tracked to its end.

The harness makes itself a *child subreaper* (Linux): children orphaned by a killed supervisor
are re-parented to the harness instead of init, so it can see how long each one outlives its
supervisor and reap it, rather than leave zombies to a PID 1 that may not reap.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness import SupervisorProcess

from .app import SHARDS_ENV
from .options import Options
from .server import code_env

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); return whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


#: The slot of a database's supervisor under ``miniqueue-supervise --shards``.
DATABASE_SUPERVISOR = "database-supervisor"


@dataclass(frozen=True)
class Child:
    """A supervisor's child (over a shard map: a database's supervisor, or one of its children)
    as psutil sees it now."""

    pid: int
    title: str
    zombie: bool
    #: Its parent's pid: the supervisor started, or (over a shard map) a database's supervisor.
    parent: int = 0
    #: A database's supervisor, forked by ``miniqueue-supervise --shards``.
    database_supervisor: bool = False

    @property
    def slot(self) -> str:
        """``worker-3``, ``reaper`` or ``database-supervisor``; ``?`` before the child has named
        itself (just after fork its title is still its parent's, ``miniqueue supervisor``)."""
        if self.database_supervisor:
            return DATABASE_SUPERVISOR
        words = self.title.split()
        named = len(words) > 1 and words[0] == "miniqueue" and words[1] != "supervisor"
        return words[1] if named else "?"

    @property
    def is_worker(self) -> bool:
        return self.slot.startswith("worker-")

    @property
    def is_reaper(self) -> bool:
        return self.slot == "reaper"

    @property
    def busy(self) -> bool:
        """The title names a job (``miniqueue worker-3 job 812 chaos``)."""
        return self.is_worker and " job " in f" {self.title} "


class Supervisor(SupervisorProcess):
    """One ``miniqueue-supervise`` (started by ``harness``) in its own session, its
    output in a file, run from the code snapshot ``code``; with ``shards`` (a shard map's file),
    ``--shards``: a supervisor per database under it."""

    def __init__(
        self, number: int, dsn: str, options: Options, logdir: Path, code: Path, shards: Path | None = None
    ) -> None:
        self.number = number
        argv = [
            "--app",
            options.app,
            "--workers",
            str(options.workers),
            "--concurrency",
            str(options.concurrency),
            "--lease-duration",
            f"{options.lease_duration:g}",
            "--heartbeat-interval",
            f"{options.heartbeat:g}",
            "--poll-interval",
            f"{options.poll_interval:g}",
            "--reaper-interval",
            f"{options.reaper_interval:g}",
            "--shutdown-timeout",
            f"{options.shutdown_timeout:g}",
            "--log-level",
            "INFO",
        ]
        env = code_env(code)
        if shards is not None:
            argv += ["--shards", str(shards)]
            env[SHARDS_ENV] = str(shards)  # where the chaos app records each job's evidence
        super().__init__(argv, log=logdir / f"supervisor-{number}.log", dsn=dsn, env=env, cwd=code)
        #: Over a shard map, the READY=1 it takes: one from each database's supervisor.
        self.databases = options.databases if shards is not None else 1
        self.sharded = shards is not None
        self.started = time.time()
        self.ended: float | None = None
        #: Why the harness ended it ("killed", "stopped"), or None while it is ours to keep alive.
        self.ended_by: str | None = None
        self.term_deadline: float | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def ready(self) -> bool:
        """Whether it has said READY=1; over a shard map, once for each database (each database's
        supervisor says it for itself)."""
        if not super().ready:
            return False
        return self.databases == 1 or self.notifications().count("READY=1") >= self.databases

    def children(self) -> list[Child]:
        """Its children; over a shard map, each database's supervisor and that one's children."""
        try:
            kids = psutil.Process(self.pid).children(recursive=self.sharded)
        except psutil.Error:
            return []
        found = []
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                zombie = kid.status() == psutil.STATUS_ZOMBIE
                title = "" if zombie else " ".join(kid.cmdline()).strip()
                parent = kid.ppid()
                found.append(Child(kid.pid, title, zombie, parent, self.sharded and parent == self.pid))
        return found

    def kill(self) -> None:
        self.ended_by = "killed"
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.ended = time.time()

    def terminate(self, grace: float) -> None:
        """Ask for a graceful stop; :meth:`poll_stop` tells when it is done."""
        self.ended_by = "stopped"
        self.term_deadline = time.monotonic() + grace
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill_group(self) -> None:
        """Last resort at cleanup: everything in its session."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.stop(grace=0)


@dataclass
class Tracked:
    """A child of some supervisor, followed from first sight until it is gone."""

    pid: int
    create_time: float
    supervisor: int
    slot: str
    first_seen: float
    orphaned_at: float | None = None  # when its supervisor died under it
    gone_at: float | None = None
    zombie_since: float | None = None


@dataclass
class Tracker:
    """Every child pid seen during the run, and the orphans the harness adopted and reaped."""

    processes: dict[int, Tracked] = field(default_factory=dict)
    reaped_orphans: int = 0
    zombie_reports: list[str] = field(default_factory=list)

    def observe(self, supervisor: Supervisor, children: list[Child]) -> None:
        now = time.time()
        for child in children:
            try:
                create_time = psutil.Process(child.pid).create_time()
            except psutil.Error:
                continue
            tracked = self.processes.get(child.pid)
            if tracked is None or abs(tracked.create_time - create_time) >= 0.5:  # new, or a reused pid
                tracked = Tracked(child.pid, create_time, supervisor.number, child.slot, now)
                self.processes[child.pid] = tracked
            if tracked.slot == "?" and child.slot != "?":
                tracked.slot = child.slot
            if child.zombie and supervisor.alive:
                tracked.zombie_since = tracked.zombie_since or now
            else:
                tracked.zombie_since = None

    def orphaned(self, supervisor: Supervisor) -> None:
        now = time.time()
        for tracked in self.processes.values():
            if tracked.supervisor == supervisor.number and tracked.gone_at is None:
                tracked.orphaned_at = now

    def orphaned_pids(self, pids: list[int]) -> None:
        """These children lost their parent (a database's supervisor, killed) now."""
        now = time.time()
        for pid in pids:
            tracked = self.processes.get(pid)
            if tracked is not None and tracked.gone_at is None:
                tracked.orphaned_at = now

    def refresh(self) -> None:
        """Note which tracked processes are gone (a reaped zombie is gone too)."""
        now = time.time()
        for tracked in self.processes.values():
            if tracked.gone_at is None and not _exists(tracked):
                tracked.gone_at = now
                tracked.zombie_since = None

    def stale_zombies(self, older_than: float) -> list[Tracked]:
        """Children a live supervisor has left unreaped for ``older_than`` seconds."""
        now = time.time()
        return [
            t
            for t in self.processes.values()
            if t.gone_at is None and t.zombie_since is not None and now - t.zombie_since > older_than
        ]

    def survivors(self) -> list[Tracked]:
        return [t for t in self.processes.values() if _exists(t)]


def _exists(tracked: Tracked) -> bool:
    try:
        process = psutil.Process(tracked.pid)
        return abs(process.create_time() - tracked.create_time) < 0.5
    except psutil.Error:
        return False


def reap_adopted(own: set[int]) -> list[tuple[int, int]]:
    """Reap zombie children the harness adopted (orphans of a killed supervisor, a postmaster
    started by ``pg_ctl restart``), never a ``Popen`` the harness still waits on."""
    reaped: list[tuple[int, int]] = []
    try:
        kids = psutil.Process().children()
    except psutil.Error:
        return reaped
    for kid in kids:
        if kid.pid in own:
            continue
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if kid.status() == psutil.STATUS_ZOMBIE:
                pid, status = os.waitpid(kid.pid, os.WNOHANG)
                if pid:
                    reaped.append((pid, status))
    return reaped
