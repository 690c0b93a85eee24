"""The supervisors of a run: started, watched every tick, replaced when they die, stopped at the end.

Whatever the harness did not ask for is recorded as a problem: a supervisor that exits on its
own, a child left a zombie under a live supervisor, an orphan that outlives its dead supervisor,
a graceful stop that does not exit 0 in time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from harness import SupervisorFailed

from .options import Options
from .processes import Supervisor, Tracker, reap_adopted

#: How long a child may stay a zombie under a live supervisor before it counts as unreaped.
ZOMBIE_GRACE = 3.0
#: A supervisor that exits this soon after starting, while the database is down, is retried.
EARLY_EXIT_SECONDS = 15.0
#: This many supervisors in a row exiting before they were ever ready is a crash loop: the
#: run stops instead of starting supervisors forever.
CRASH_LOOP_LIMIT = 5


class CrashLoop(RuntimeError):
    """Supervisors keep exiting before they are ready; the run cannot go on."""


class Fleet:
    """Starts and watches ``miniqueue-supervise`` processes."""

    def __init__(
        self,
        dsn: str,
        options: Options,
        logdir: Path,
        code: Path,
        say: Callable[[str], None],
        shards: Path | None = None,
    ) -> None:
        self.dsn, self.options, self.logdir, self.code, self.say = dsn, options, logdir, code, say
        #: With --databases: the shard map's file, which every supervisor runs over (--shards).
        self.shards = shards
        self.supervisors: list[Supervisor] = []
        self.tracker = Tracker()
        self.problems: list[str] = []
        #: Supervisors stopped by a signal this harness did not send (another process on the
        #: machine): not a failure of miniqueue, which must still drain and exit 0 for it.
        self.external_stops: list[str] = []
        self.retried_starts = 0
        self._start_at: float | None = None
        self._failed_in_a_row = 0
        self._flagged: set[tuple[str, int]] = set()

    # -- supervisors ---------------------------------------------------------------------------

    def start(self) -> Supervisor:
        supervisor = Supervisor(len(self.supervisors) + 1, self.dsn, self.options, self.logdir, self.code, self.shards)
        self.supervisors.append(supervisor)
        self.say(f"started supervisor {supervisor.number} (pid {supervisor.pid})")
        return supervisor

    def wait_ready(self, supervisor: Supervisor, timeout: float) -> None:
        """Until ``supervisor`` has said READY=1 (over a shard map, each database's supervisor under
        it); SupervisorFailed if it exits first, RuntimeError at ``timeout``."""
        deadline = time.monotonic() + timeout
        supervisor.wait_ready(timeout=timeout)
        while not supervisor.ready:
            if time.monotonic() > deadline or not supervisor.alive:
                raise RuntimeError(f"not every database's supervisor became ready:\n{supervisor.log_tail()}")
            time.sleep(0.05)

    def running(self) -> list[Supervisor]:
        """Supervisors alive and not being stopped: the ones faults may target."""
        return [s for s in self.supervisors if s.alive and s.ended_by is None]

    # -- every tick ----------------------------------------------------------------------------

    def monitor(self, keep_alive: bool = True) -> None:
        """Reap adopted orphans, follow every child, notice deaths nobody asked for."""
        reaped = reap_adopted({s.pid for s in self.supervisors if s.proc.returncode is None})
        self.tracker.reaped_orphans += sum(1 for pid, _ in reaped if pid in self.tracker.processes)
        for supervisor in self.supervisors:
            if supervisor.alive:
                self.tracker.observe(supervisor, supervisor.children())
                if self._failed_in_a_row and supervisor.ready:
                    self._failed_in_a_row = 0
            elif supervisor.ended is None:
                self._on_exit(supervisor)
        self.tracker.refresh()
        self._check_zombies()
        self._check_orphans()
        if keep_alive and not self.running():
            now = time.monotonic()
            if self._start_at is None:
                self._start_at = now
            if now >= self._start_at:
                self._start_at = None
                self.start()

    def _on_exit(self, supervisor: Supervisor) -> None:
        supervisor.ended = time.time()
        code = supervisor.proc.returncode
        self.tracker.orphaned(supervisor)
        if supervisor.ended_by == "stopped":
            if code != 0:
                self.problems.append(f"supervisor {supervisor.number} exited {code} after SIGTERM (expected 0)")
            self.say(f"supervisor {supervisor.number} stopped gracefully (exit {code})")
            return
        if supervisor.ended_by == "killed":
            return
        lived = supervisor.ended - supervisor.started
        tail = supervisor.output()[-2000:]
        if not supervisor.ready:
            self._failed_in_a_row += 1
            if self._failed_in_a_row >= CRASH_LOOP_LIMIT:
                raise CrashLoop(
                    f"{self._failed_in_a_row} supervisors in a row exited (code {code}) before becoming ready; "
                    f"the last one said:\n{_indent(tail)}"
                )
        if code != 0 and lived < EARLY_EXIT_SECONDS and "database unavailable" in tail:
            # Started while PostgreSQL was restarting: the supervisor refuses to start
            # without a database, which is its documented behaviour. Try again shortly.
            self.retried_starts += 1
            supervisor.ended_by = "failed to start (database down)"
            self._start_at = time.monotonic() + 1.0
            self.say(f"supervisor {supervisor.number} could not reach the database at start; retrying")
            return
        received = re.findall(r"received (SIG[A-Z]+)", tail)
        if received and code == 0:
            supervisor.ended_by = f"stopped by an outside {received[0]}"
            self.external_stops.append(
                f"supervisor {supervisor.number} (pid {supervisor.pid}) received {received[0]}, which this harness "
                f"did not send, after {lived:.1f}s; it drained and exited 0"
            )
            self.say(f"supervisor {supervisor.number} was stopped by a {received[0]} from outside the harness")
            return
        supervisor.ended_by = f"exited {code} on its own"
        self.problems.append(
            f"supervisor {supervisor.number} (pid {supervisor.pid}) exited with code {code} after {lived:.1f}s "
            f"without being asked to; last output:\n{_indent(tail)}"
        )
        self.say(f"PROBLEM: supervisor {supervisor.number} exited with code {code} on its own")

    def _check_zombies(self) -> None:
        for tracked in self.tracker.stale_zombies(ZOMBIE_GRACE):
            if ("zombie", tracked.pid) not in self._flagged:
                self._flagged.add(("zombie", tracked.pid))
                self.problems.append(
                    f"supervisor {tracked.supervisor} left its child {tracked.slot} (pid "
                    f"{tracked.pid}) a zombie for over {ZOMBIE_GRACE:g}s"
                )

    def _check_orphans(self) -> None:
        limit = self.options.shutdown_timeout + 8.0
        now = time.time()
        for tracked in self.tracker.processes.values():
            if tracked.orphaned_at is None or ("orphan", tracked.pid) in self._flagged:
                continue
            end = tracked.gone_at or now
            if end - tracked.orphaned_at > limit:
                self._flagged.add(("orphan", tracked.pid))
                self.problems.append(
                    f"{tracked.slot} (pid {tracked.pid}) outlived its supervisor "
                    f"{tracked.supervisor} by more than {limit:g}s"
                )

    # -- the end -------------------------------------------------------------------------------

    def stop_all(self, monitor_seconds: float = 5.0) -> None:
        """SIGTERM every live supervisor; each must drain and exit 0 within the shutdown timeout."""
        grace = self.options.shutdown_timeout + 15.0
        for supervisor in self.supervisors:
            if supervisor.alive and supervisor.term_deadline is None:
                # Until it is ready a supervisor has no TERM handler: let it get there first.
                with contextlib.suppress(SupervisorFailed):
                    supervisor.wait_ready(timeout=30.0)
                supervisor.terminate(grace)
        while any(s.alive for s in self.supervisors):
            self.monitor(keep_alive=False)
            for supervisor in self.supervisors:
                if supervisor.alive and supervisor.term_deadline and time.monotonic() > supervisor.term_deadline:
                    self.problems.append(f"supervisor {supervisor.number} did not exit within {grace:g}s of SIGTERM")
                    supervisor.kill_group()
            time.sleep(0.1)
        deadline = time.monotonic() + monitor_seconds
        while time.monotonic() < deadline and self.tracker.survivors():
            self.monitor(keep_alive=False)
            time.sleep(0.1)
        self.monitor(keep_alive=False)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """At the end: the children seen during the run that still exist, as (alive, zombies)."""
        survivors, zombies = [], []
        for tracked in self.tracker.survivors():
            label = f"{tracked.slot} pid {tracked.pid} (supervisor {tracked.supervisor})"
            with contextlib.suppress(psutil.Error):
                if psutil.Process(tracked.pid).status() == psutil.STATUS_ZOMBIE:
                    zombies.append(label)
                    continue
            survivors.append(label)
        return survivors, zombies

    def kill_everything(self) -> None:
        """Cleanup after an error: no process of this run may outlive the harness."""
        for supervisor in self.supervisors:
            supervisor.kill_group()
        for tracked in self.tracker.survivors():
            with contextlib.suppress(OSError):
                os.kill(tracked.pid, signal.SIGKILL)
        reap_adopted(set())


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines())
