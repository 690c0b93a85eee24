"""``miniqueue-supervise --shards``: one supervisor per database of a shard map (see
docs/guides/shards.md).

The process forks a :class:`~miniqueue.supervise.supervisor.Supervisor` for each database with a
weight, each with its share of ``--workers`` (by weight, at least one) and a reaper of its own,
all its children claiming from that database only: a database that is down costs only its own
workers, which retry with back-off while the others run on. With ``--metrics-port P``, database
number ``i`` of the map serves its metrics and probes on ``P + i``. Signals go to every
supervisor (TERM/INT drain and exit, HUP replaces the workers, ...); one that dies is started
again after a second. This process opens no database connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import queue
import signal
import time

from setproctitle import setproctitle

from ..core.errors import ConfigError
from ..core.process import die_with_parent
from ..core.shard_map import Database, ShardMap
from .config import SupervisorConfig

log = logging.getLogger("miniqueue.supervisor")

#: The signals passed on to every database's supervisor.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU)
#: Signals after which a supervisor that exits is not started again.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
RESTART_DELAY = 1.0
MAX_RESTART_DELAY = 30.0


def split_workers(total: int, databases: list[Database]) -> dict[str, int]:
    """``total`` workers shared by weight (largest remainder), each database with a weight at
    least one; ConfigError when there are fewer workers than such databases."""
    weighted = [d for d in databases if d.weight > 0]
    if not weighted:
        raise ConfigError("the shard map gives no database a weight above 0: no worker would run")
    if total < len(weighted):
        raise ConfigError(f"--workers {total}: the shard map's {len(weighted)} databases need one worker each at least")
    spare = total - len(weighted)
    weights = sum(d.weight for d in weighted)
    shares = {d.name: 1 + spare * d.weight // weights for d in weighted}
    left = total - sum(shares.values())
    by_remainder = sorted(weighted, key=lambda d: (-(spare * d.weight % weights), d.index))
    for database in by_remainder[:left]:
        shares[database.name] += 1
    return shares


class ShardedSupervisor:
    """Runs one supervisor per database of ``shards``, from ``config`` (its ``dsn`` unused)."""

    def __init__(self, config: SupervisorConfig, shards: ShardMap) -> None:
        self.shards = shards
        databases = list(shards.databases.values())
        shares = split_workers(config.workers, databases)
        # --workers MIN:MAX: each database's supervisor scales its share on its own backlog.
        highs = None if config.max_workers is None else split_workers(config.max_workers, databases)
        self.plans: dict[str, SupervisorConfig] = {}
        for number, database in enumerate(shards.databases.values()):
            if database.name not in shares:
                continue
            port = None if config.metrics_port is None else config.metrics_port + number
            reaper = dataclasses.replace(
                config.reaper, schedules_here=functools.partial(_first_of, shards, database.name)
            )
            self.plans[database.name] = dataclasses.replace(
                config,
                dsn=database.url,
                workers=shares[database.name],
                max_workers=None if highs is None else max(highs[database.name], shares[database.name]),
                metrics_port=port,
                database=database.name,
                reaper=reaper,
            )
        self.pids: dict[int, str] = {}
        self.stopping = False
        self.exit_code = 0
        # Signal handlers only record the signal (a handler that logged or killed could run inside
        # the loop's own logging call); the loop passes them on.
        self.signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        # Restarts: when each database's supervisor last started, its back-off, when it is due.
        self.started_at: dict[str, float] = {}
        self.delays: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}

    def run(self) -> int:
        setproctitle("miniqueue supervisor (shards)")
        for sig in FORWARDED:
            signal.signal(sig, lambda signum, frame: self.signals.put(signum))
        for name in self.plans:
            self._start(name)
        while self.pids or (self.restart_at and not self.stopping):
            self._forward()
            self._restart_due()
            pid, status = _wait_a_while() if self.pids else _idle()
            if pid == 0 or pid not in self.pids:
                continue
            name = self.pids.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:  # the exit that counts: a restarted supervisor's earlier one does not
                self.exit_code = max(self.exit_code, code if code > 0 else 0)
            else:
                self._schedule_restart(name, pid, code)
        return self.exit_code

    def _schedule_restart(self, name: str, pid: int, code: int) -> None:
        """Start database ``name``'s supervisor again after a back-off that doubles while it keeps
        exiting soon after it started (its database down at boot, say), from 1 s up to 30 s."""
        ran = time.monotonic() - self.started_at.get(name, 0.0)
        delay = RESTART_DELAY if ran > MAX_RESTART_DELAY else min(self.delays.get(name, 0.5) * 2, MAX_RESTART_DELAY)
        self.delays[name] = delay
        self.restart_at[name] = time.monotonic() + delay
        log.error(
            "the supervisor of database %s (pid %d) exited with %d: starting it again in %gs", name, pid, code, delay
        )

    def _restart_due(self) -> None:
        if self.stopping:
            self.restart_at.clear()
        for name, due in list(self.restart_at.items()):
            if due <= time.monotonic():
                del self.restart_at[name]
                self._start(name)

    def _start(self, name: str) -> None:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            from .supervisor import Supervisor  # in the child: the parent never holds its state

            for sig in FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            # Killed outright (SIGKILL, the OOM killer), this process forwards nothing: each
            # database's supervisor then stops as on TERM, its workers' jobs handed back.
            die_with_parent(signal.SIGTERM)
            if os.getppid() != parent:  # it died before prctl took effect
                os._exit(0)
            code = 1
            try:
                code = Supervisor(self.plans[name]).run()
            except BaseException:  # said here: os._exit below ends the process before Python would
                log.exception("the supervisor of database %s failed", name)
            finally:
                os._exit(code)
        self.pids[pid] = name
        self.started_at[name] = time.monotonic()
        log.info("started the supervisor of database %s (pid %d, %d workers)", name, pid, self.plans[name].workers)

    def _forward(self) -> None:
        """Pass the signals received since the last turn on to every database's supervisor."""
        while not self.signals.empty():
            signum = self.signals.get()
            if signum in STOPPING:
                self.stopping = True
            for pid in self.pids:
                with contextlib.suppress(ProcessLookupError):  # it exited: waitpid will say so
                    os.kill(pid, signum)


def _first_of(shards: ShardMap, name: str, queue: str) -> bool:
    """Whether database ``name``'s reaper enqueues ``queue``'s periodic jobs (see ShardMap.scheduler_of)."""
    scheduler = shards.scheduler_of(queue)
    return scheduler is not None and scheduler.name == name


def _idle() -> tuple[int, int]:
    """A fifth of a second with no child to wait for (every supervisor waits for its restart)."""
    time.sleep(0.2)
    return 0, 0


def _wait_a_while() -> tuple[int, int]:
    """``waitpid`` without blocking past a fifth of a second (so a signal's flag is seen)."""
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        time.sleep(0.2)
    return pid, status
